"""`clover generate` and `clover chat`: decode from the command line.

`register(subparsers)` adds both commands. Sampling flags come from `clover.engine.flags` (one per
`SamplingParams` field), `--show-steps` from `clover.engine.steps_view`, `--stats` tables from
`clover.engine.tables`; this file loads the model, turns prompts into ids and prints results
(stdout keeps only results). Handlers return an exit status; user mistakes raise ValueError for
`clover.cli`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clover.engine.flags import add_sampling_flags, sampling_params
from clover.engine.params import SamplingParams
from clover.engine.steps_view import generate_with_steps, step_view
from clover.engine.tables import print_stats


# ---- model and prompts ---------------------------------------------------------------------------
def load_llm(args: argparse.Namespace):
    from clover.bench.quant import cli_dtype
    from clover.config import PRESETS
    from clover.engine.llm import LLM

    if args.model not in PRESETS and not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model!r} is neither a preset ({', '.join(PRESETS)}) "
                         "nor a model directory")
    if args.model in PRESETS:
        print(f"note: preset {args.model!r} has random weights", file=sys.stderr)
    draft = getattr(args, "draft", None)
    if draft is not None:
        _check_draft(args)
    return LLM(args.model, device=args.device, dtype=cli_dtype(args.dtype, args.device),
               compile=args.compile, draft=draft)


def _check_draft(args: argparse.Namespace) -> None:
    """--draft: a drafter directory for an AR model directory, greedy, eager, no step view."""
    refused = [(not Path(args.draft, "config.json").is_file(), "is not a model directory (no "
                "config.json)"),
               (not Path(args.model).is_dir(), f"needs --model to be the AR model's directory "
                f"(got {args.model!r})"),
               (args.compile, "is not supported with --compile"),
               (getattr(args, "show_steps", False), "has no denoising steps to show: drop "
                "--show-steps")]
    for bad, why in refused:
        if bad:
            raise ValueError(f"--draft {args.draft} {why}")


def _parse_ids(text: str, vocab_size: int) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be integers separated by spaces (got {text!r})"
                         ) from None
    if not ids or not all(0 <= i < vocab_size for i in ids):
        raise ValueError(f"--prompt-ids must be a non-empty list of ids in [0, {vocab_size}) "
                         f"(got {text!r})")
    return ids


def _text_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompt_file:
        lines = Path(args.prompt_file).read_text(encoding="utf-8").splitlines()
        prompts += [line for line in lines if line.strip()]
    return prompts


def prompt_ids(llm, args: argparse.Namespace) -> list[list[int]]:
    """Token ids of every prompt: text prompts (chat-wrapped with --chat), then --prompt-ids."""
    texts, tok = _text_prompts(args), llm.tokenizer
    ids = [_parse_ids(s, llm.config.vocab_size) for s in args.prompt_ids or []]
    if not texts and not ids:
        raise ValueError("no prompt: give --prompt, --prompt-file or --prompt-ids")
    if texts and tok is None:
        flag = "--prompt" if args.prompt else "--prompt-file"
        raise ValueError(f"{flag} needs a tokenizer and model {args.model!r} has none: "
                         'pass token ids with --prompt-ids "5 6 7", or a model directory')
    if args.chat and ids:
        raise ValueError("--chat wraps text prompts; it cannot be used with --prompt-ids")
    if args.chat:
        from clover.tokenizer import render_chat
        texts = [render_chat(tok, [{"role": "user", "content": s}]) for s in texts]
    return [tok.encode(s) for s in texts] + ids


# ---- output --------------------------------------------------------------------------------------
def _result(out, llm, index: int, chat: bool) -> dict[str, Any]:
    obj = {"index": index, "request_id": out.request_id, "text": out.text,
           "token_ids": out.token_ids, "finish_reason": out.finish_reason,
           "prompt_tokens": len(out.prompt_token_ids), "stats": out.stats.as_dict()}
    if llm.tokenizer is None:
        obj.pop("text")
    if chat:
        obj |= {"content": out.content, "tool_calls": out.tool_calls, "errors": out.errors}
    return obj


def print_results(outputs: list, llm, args: argparse.Namespace) -> None:
    for i, out in enumerate(outputs):
        if args.json:
            print(json.dumps(_result(out, llm, i, args.chat), ensure_ascii=False))
            continue
        if len(outputs) > 1:
            print(f"--- {i} ---")
        print(out.text if llm.tokenizer is not None else " ".join(map(str, out.token_ids)))


# ---- commands ------------------------------------------------------------------------------------
def _generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = load_llm(args)
    ids = prompt_ids(llm, args)
    if args.show_steps:
        outputs = generate_with_steps(llm, ids, params, step_view(sys.stderr))
    else:
        outputs = llm.generate(ids, params)
    if args.chat:
        from clover.engine.llm import with_tool_calls

        for out in outputs:
            with_tool_calls(out)
    print_results(outputs, llm, args)
    if args.stats:
        print_stats(outputs, llm.engine.stats, sys.stderr if args.json else sys.stdout)
    return 0


def _load_tools(path: str | None) -> list[dict] | None:
    if path is None:
        return None
    try:
        tools = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"--tools {path}: not valid JSON ({e})") from None
    tools = tools.get("tools") if isinstance(tools, dict) else tools
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"--tools {path}: expected a JSON list of tool objects")
    return tools


def print_reply(out) -> None:
    if out.content:
        print(f"assistant> {out.content}")
    for call in out.tool_calls:
        fn = call["function"]
        print(f"tool call> {fn['name']}({fn['arguments']})  [not executed]")
    for error in out.errors:
        print(f"error> {error}")
    if not (out.content or out.tool_calls or out.errors):
        print(f"assistant> (empty reply, finish reason {out.finish_reason})")


def _history_entry(out) -> dict:
    return {"role": "assistant", "content": out.content or "", "tool_calls": out.tool_calls}


def _chat(args: argparse.Namespace) -> int:
    params, tools = sampling_params(args), _load_tools(args.tools)
    llm = load_llm(args)
    if llm.tokenizer is None:
        raise ValueError(f"--model {args.model!r} has no tokenizer; clover chat needs a model "
                         "directory with tokenizer.json")
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    print("chat: /reset clears the history, /exit or Ctrl-D quits", file=sys.stderr)
    while (line := _read_line()) is not None and line.strip() != "/exit":
        if line.strip() == "/reset":
            messages = list(start)
            print("(history cleared)")
        elif line.strip():
            messages = _chat_turn(llm, messages, line, params, tools)
    return 0


def _chat_turn(llm, messages: list[dict], line: str, params: SamplingParams,
               tools: list[dict] | None) -> list[dict]:
    """Answer one user line; returns the history with the turn, or unchanged on an error."""
    turn = messages + [{"role": "user", "content": line}]
    try:
        out = llm.chat(turn, params, tools)[0]
    except ValueError as e:
        print(f"error> {e}")
        return messages
    print_reply(out)
    return turn + [_history_entry(out)]


def _read_line() -> str | None:
    try:
        return input("you> ")
    except EOFError:
        print()
        return None


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory or preset name (e.g. tiny)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 on CUDA and on CPUs with AVX-512 BF16 or AMX, else float32) "
                        "| float32 | bfloat16 | int8 (torchao weight-only; default: auto)")
    p.add_argument("--compile", action="store_true",
                   help="cached forwards of a dense model as one compiled graph (torch.compile; "
                        "worth its 3-5 minutes of compiling only for long jobs)")
    p.add_argument("--draft", default=None, metavar="DIR",
                   help="a drafter adapter for the AR --model (e.g. models/clover-smol-draft): "
                        "self-speculative decoding, the AR model's output (greedy, or sampled "
                        "by speculative sampling) in fewer forwards; no --structured")
    add_sampling_flags(p)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `generate` and `chat` to the `clover` subcommands."""
    g = sub.add_parser("generate", help="decode prompts with a model and print the text")
    _common_flags(g)
    g.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    g.add_argument("--prompt-file", help="a file with one prompt per line")
    g.add_argument("--prompt-ids", action="append",
                   help='a prompt as token ids, e.g. "5 6 7" (repeatable; for tokenizer-less '
                        "presets)")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user chat turn")
    g.add_argument("--stats", action="store_true", help="per-request and engine statistics")
    g.add_argument("--show-steps", action="store_true",
                   help="draw the denoising after every step on stderr (a line per step when "
                        "stderr is not a terminal)")
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g.set_defaults(func=_generate)
    c = sub.add_parser("chat", help="chat with a model in the terminal (tool calls are shown)")
    _common_flags(c)
    c.add_argument("--system", help="system message")
    c.add_argument("--tools", help="JSON file with a list of tools (OpenAI function schemas)")
    c.set_defaults(func=_chat)
