"""OpenAI response bodies: envelopes, choices, usage and logprobs, for plain and streamed answers.

`Responder` knows the served model's name and fingerprint and how to turn token ids into token
strings; it builds `chat.completion` / `text_completion` bodies from engine outputs, stream
chunks, and the `logprobs` objects. Logprobs (see clover/engine/logprobs.py) are the model's
log-probabilities at the step each token was committed. Usage counts the prompt once and every
choice's generated tokens (up to and including EOS, and up to the stop string). Pure: no HTTP,
no engine loop.
"""

from __future__ import annotations

import math
from typing import Any

from clover.server import output as out_


class Responder:
    def __init__(self, model_name: str, fingerprint: str, decode: Any) -> None:
        self.model_name, self.fingerprint, self.decode = model_name, fingerprint, decode

    def envelope(self, plan: Any, obj: str, choices: list[dict]) -> dict[str, Any]:
        prefix = "chatcmpl-" if plan.kind == "chat" else "cmpl-"
        return {"id": prefix + plan.request_id, "object": obj, "created": plan.created,
                "model": self.model_name, "system_fingerprint": self.fingerprint,
                "choices": choices}

    def body(self, plan: Any, outputs: list[Any]) -> dict[str, Any]:
        """The non-streamed answer for the n outputs of one request."""
        stats = outputs[0].stats.as_dict()
        if plan.kind == "completion":
            choices = [{"index": i, "text": o.text, "finish_reason": o.finish_reason,
                        "logprobs": self.completion_logprobs(o.logprobs)}
                       for i, o in enumerate(outputs)]
            return self.envelope(plan, "text_completion", choices) | {
                "usage": usage(plan, outputs), "clover": stats}
        choices, errors = [], []
        for i, o in enumerate(outputs):
            deltas = out_.ChatDeltas(plan.tools, plan.parallel, plan.prefix)
            deltas.update(o.text, final=True)
            calls = deltas.openai_calls()
            message = {"role": "assistant", "content": chat_content(deltas), "refusal": None}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": i, "message": message,
                            "logprobs": self.chat_logprobs(o.logprobs),
                            "finish_reason": out_.finish_reason(o.finish_reason, calls)})
            errors += deltas.errors
        body = self.envelope(plan, "chat.completion", choices)
        body |= {"usage": usage(plan, outputs), "clover": stats}
        return body | ({"clover_errors": errors} if errors else {})

    # ---- logprobs ---------------------------------------------------------------------------
    def token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.decode([token_id])
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    def chat_logprobs(self, entries: list | None) -> dict | None:
        if entries is None:
            return None
        return {"content": [self.token_entry(e.token_id, e.logprob) | {
            "top_logprobs": [self.token_entry(t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}

    def completion_logprobs(self, entries: list | None, offset: int = 0) -> dict | None:
        if entries is None:
            return None
        tokens = [self.decode([e.token_id]) for e in entries]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {"tokens": tokens, "token_logprobs": [_finite(e.logprob) for e in entries],
                "top_logprobs": [{self.decode([t]): _finite(lp) for t, lp in e.top}
                                 for e in entries], "text_offset": offsets}


def usage(plan: Any, outputs: list[Any]) -> dict[str, int]:
    return out_.usage(len(plan.prompt_ids), sum(o.stats.generated_tokens for o in outputs))


def chat_content(deltas: out_.ChatDeltas) -> str | None:
    return None if deltas.tools and deltas.calls and not deltas.content else deltas.content


def _finite(x: float) -> float:
    """JSON has no -Infinity: a token the grammar forbade is reported at the float minimum."""
    return x if math.isfinite(x) else -9999.0
