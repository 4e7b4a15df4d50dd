"""Server-sent events: the chunks one streamed request sends, from engine events to `[DONE]`.

`StreamState` keeps, per choice (`n` of them), what has been sent: content, tool-call pieces
(id and name first, then arguments, as OpenAI streams them), text, and logprobs of the tokens
settled so far. `sse_events` drives it from the request's event queue, where the engine loop
posts `(choice index, event)`; it always ends with `data: [DONE]`, after a final chunk per
choice with its finish_reason, or after an error event when generation failed or the server
shut down. Choices still running when the client leaves are aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from clover.server import output as out_
from clover.server.protocol import ApiError
from clover.server.responses import usage
from clover.server.worker import Failed, Finished, Update


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def sse_events(server: Any, plan: Any, jobs: list, queue: Any) -> AsyncIterator[str]:
    state = StreamState(plan, server)
    running = {job.index: job for job in jobs}
    try:
        for chunk in state.opening():
            yield sse(chunk)
        failed = False
        while running and not failed:
            index, event = await queue.get()
            if isinstance(event, Finished | Failed):
                running.pop(index, None)
                failed = isinstance(event, Failed)
            for chunk in state.chunks(index, event):
                yield sse(chunk)
        if not failed:
            for chunk in state.closing_usage():
                yield sse(chunk)
        yield "data: [DONE]\n\n"
    finally:
        for job in running.values():
            server.worker.abort(job.request_id)


class _Choice:
    """What one choice of a stream has sent so far."""

    def __init__(self, plan: Any) -> None:
        self.deltas = out_.ChatDeltas(plan.tools, plan.parallel, plan.prefix)
        self.text = out_.TextDeltas()
        self.logprobs_sent = 0
        self.output: Any = None


class StreamState:
    def __init__(self, plan: Any, server: Any) -> None:
        self.plan, self.server = plan, server
        self.responder = server.responder
        self.chat = plan.kind == "chat"
        self.choices = [_Choice(plan) for _ in range(plan.n)]
        self.stop_ids = server.engine.stop_ids(plan.params)
        self.obj = "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, index: int, delta: dict | str | None = None, finish: str | None = None,
              logprobs: list | None = None, **extra: Any) -> dict[str, Any]:
        r = self.responder
        if self.chat:
            choice = {"index": index, "delta": delta or {}, "finish_reason": finish,
                      "logprobs": r.chat_logprobs(logprobs) if logprobs else None}
        else:
            offset = len(self.choices[index].text.text) - len(delta or "")
            choice = {"index": index, "text": delta or "", "finish_reason": finish,
                      "logprobs": r.completion_logprobs(logprobs, offset) if logprobs else None}
        body = r.envelope(self.plan, self.obj, [choice]) | extra
        return body | ({"usage": None} if self.plan.include_usage else {})

    def opening(self) -> list[dict]:
        if not self.chat:
            return []
        return [self.chunk(i, {"role": "assistant", "content": ""})
                for i in range(self.plan.n)]

    def chunks(self, index: int, event: Any) -> list[dict]:
        if isinstance(event, Update):
            text = out_.visible_text(self.server.decode, event.settled_ids, self.stop_ids,
                                     self.plan.params.stop, final=False)
            logprobs = self._new_logprobs(index, event.logprobs)
            return self._deltas(index, text, False, logprobs) + self._provisional(index, event)
        if isinstance(event, Finished):
            return self._closing(index, event.output)
        if isinstance(event, Failed):
            return [ApiError(event.status, event.message, code=event.code).body()]
        return []

    def _new_logprobs(self, index: int, entries: list | None) -> list | None:
        """Entries of settled tokens not sent yet (stop tokens are not part of the answer)."""
        if not entries:
            return None
        choice = self.choices[index]
        usable = [e for e in entries if e.token_id not in self.stop_ids]
        new = usable[choice.logprobs_sent:]
        choice.logprobs_sent += len(new)
        return new or None

    def _deltas(self, index: int, text: str, final: bool, logprobs: list | None) -> list[dict]:
        choice = self.choices[index]
        if not self.chat:
            piece = choice.text.update(text)
            return [self.chunk(index, piece, logprobs=logprobs)] if piece or logprobs else []
        content, calls = choice.deltas.update(text, final)
        out = [self.chunk(index, {"content": content}, logprobs=logprobs)] if (
            content or logprobs) else []
        out += [self.chunk(index, {"tool_calls": [c]}) for c in calls]
        return out

    def _provisional(self, index: int, event: Update) -> list[dict]:
        if not self.plan.provisional or event.block is None:
            return []
        draft = out_.provisional(self.server.decode, event.block, event.settled_in_block,
                                 self.server.engine.config.mask_id)
        return [self.chunk(index, clover_provisional=draft)]

    def _closing(self, index: int, output: Any) -> list[dict]:
        choice = self.choices[index]
        choice.output = output
        rest = None
        if output.logprobs is not None:
            rest = output.logprobs[choice.logprobs_sent:] or None
            choice.logprobs_sent = len(output.logprobs)
        out = self._deltas(index, output.text, True, rest)
        calls = choice.deltas.calls if self.chat else []
        extra = {"clover": output.stats.as_dict()}
        if self.chat and choice.deltas.errors:
            extra["clover_errors"] = choice.deltas.errors
        reason = out_.finish_reason(output.finish_reason, calls)
        out.append(self.chunk(index, None, reason, **extra))
        return out

    def closing_usage(self) -> list[dict]:
        if not self.plan.include_usage:
            return []
        outputs = [c.output for c in self.choices]
        return [self.responder.envelope(self.plan, self.obj, []) | {
            "usage": usage(self.plan, outputs)}]
