"""The airspace agent: messages in, tool calls executed into no-fly zones, timings and scores out.

All messages go through the engine as one batch (its continuous batching, not a Python loop over
single requests). As soon as a request finishes, its tool calls are parsed, validated against the
tool schema and executed into that message's `ZoneRegistry`; if it made calls, the tool results
go back to the model as a new turn, which joins the running batch; a message is done when the
model answers without a call (or after `max_turns`). The same code runs the diffusion model and
the AR baseline, so their timings are comparable.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

from clover.engine import LLM, SamplingParams
from clover.engine.request import Request
from clover.engine.stats import EngineStats
from clover.tasks.airspace.data import Example
from clover.tasks.airspace.tools import TOOLS, ZoneRegistry
from clover.tokenizer import parse_tool_calls, render_chat


@dataclass
class MessageRun:
    example: Example
    conversation: list[dict]
    registry: ZoneRegistry = field(default_factory=ZoneRegistry)
    calls: list[dict] = field(default_factory=list)  # every call the model made, in order
    results: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # the model's text, one per turn
    turns: int = 0
    errors: list[str] = field(default_factory=list)
    done_s: float | None = None


@dataclass
class AgentRun:
    messages: list[MessageRun]
    full_task_s: float
    first_usable_s: float | None  # first valid tool call executed, from the start
    generated_tokens: int
    forwards: int  # engine steps (batched forward passes)
    request_forwards: int  # forwards summed over requests
    engine_stats: dict[str, Any]
    totals: EngineStats  # the engine's raw totals behind engine_stats

    @property
    def tps(self) -> float:
        return self.generated_tokens / self.full_task_s if self.full_task_s else 0.0

    @property
    def tpf(self) -> float:
        """Tokens committed per request forward (hardware-independent)."""
        return self.generated_tokens / max(self.request_forwards, 1)


def initial_conversation(example: Example) -> list[dict]:
    """The example's conversation up to (not including) the assistant's answer."""
    messages = example.messages()
    return messages[:-1] if messages and messages[-1]["role"] == "assistant" else messages


def run_agent(llm: LLM, examples: list[Example], params: SamplingParams, *,
              max_turns: int = 2) -> AgentRun:  # fmt: skip
    """Run every message to completion through one engine; see the module docstring."""
    engine, tok = llm.engine, llm.tokenizer
    engine.stats = type(engine.stats)()
    runs = [MessageRun(e, initial_conversation(e)) for e in examples]
    owner: dict[str, MessageRun] = {}
    t0 = time.perf_counter()
    first_usable, tokens, request_forwards = None, 0, 0

    def submit(run: MessageRun) -> bool:
        prompt = tok.encode(render_chat(tok, run.conversation, tools=TOOLS,
                                         fixed_task_prompt=True))
        room = engine.max_model_len - len(prompt)
        if room <= 0:  # a later turn that no longer fits: the conversation ends here
            run.errors.append(f"context full: {len(prompt)} prompt tokens")
            return False
        turn_params = params.replace(max_tokens=min(params.max_tokens, room))
        owner[engine.add_request(prompt, turn_params).request_id] = run
        return True

    for run in runs:
        if not submit(run):
            run.done_s = 0.0
    while engine.has_unfinished():
        for request in engine.step():
            run = owner.pop(request.request_id)
            tokens += request.stats.generated_tokens
            request_forwards += request.stats.forwards
            executed = _execute(run, request, tok)
            if executed and first_usable is None:
                first_usable = time.perf_counter() - t0
            if not (executed is not None and run.turns < max_turns and submit(run)):
                run.done_s = time.perf_counter() - t0
    return AgentRun(runs, time.perf_counter() - t0, first_usable, tokens,
                    engine.stats.forwards, request_forwards, engine.stats.as_dict(),
                    copy.copy(engine.stats))


def _execute(run: MessageRun, request: Request, tok) -> bool | None:
    """Parse one finished turn and execute its calls. True if a valid call ran, False if only
    invalid ones did, None if the turn made no readable call (the conversation is over; broken
    calls are kept in `errors`)."""
    run.turns += 1
    text = request.text or tok.decode(request.output_ids({tok.eos_token_id}),
                                      skip_special_tokens=False)
    run.outputs.append(text)
    parsed = parse_tool_calls(text)
    run.errors += parsed.errors
    if not parsed.tool_calls:
        return None
    results = []
    for tool_call in parsed.tool_calls:
        fn = tool_call["function"]
        call = {"name": fn["name"], "arguments": json.loads(fn["arguments"])}
        results.append(run.registry.execute(call))
        run.calls.append(call)
    run.results += results
    run.conversation = run.conversation + [
        {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls},
        *({"role": "tool", "content": r, "tool_call_id": c["id"]}
          for r, c in zip(results, parsed.tool_calls, strict=True)),
    ]
    return any(json.loads(r).get("ok") for r in results)


def predictions(run: AgentRun) -> list[dict]:
    """Per message, everything the model wrote (all turns), in the scorer's prediction form: the
    scorer parses it again, so unreadable calls count as invalid instead of vanishing."""
    return [{"output": "\n".join(m.outputs)} for m in run.messages]
