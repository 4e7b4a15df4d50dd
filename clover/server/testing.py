"""Tiny model directories and scripted models for server tests and the load benchmark.

`build_tiny_model_dir` writes a random `tiny` model with a small trained tokenizer (seconds, no
downloads). `ScriptedModel` is that model with a rigged output layer: positions listed in its
`script` (absolute position -> token id) get that token with near-certainty, so a test can make a
random model emit an exact answer (a tool call, say) through the real engine and server.
`serving` runs a server on a free loopback port for the length of a `with` block;
`load_tiny_server` loads one over such a model directory, scripted and greedy by default. It is
for tests only; nothing in the server imports it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import torch

from clover.config import get_preset
from clover.model import CloverModel, build_model

SAMPLE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    'Call get_weather with {"city": "Paris", "unit": "celsius"} and report the answer.',
    "Drone no-fly zone: radius 5 NM around the airport, surface to 3000 ft, 0600-1800 UTC.",
    "Hello! How can I help you today? The weather in Paris is sunny and 21 degrees.",
    '{"name": "draw_zone", "arguments": {"lat": 48.85, "lon": 2.35, "radius_km": 9.3}}',
]


TINY_MODEL = "tiny-chat"  # the served name of the tests' tiny model directory


def build_tiny_model_dir(path: str | Path, *, seed: int = 0, sharpen: float = 6.0,
                         max_seq_len: int | None = None) -> Path:
    """A `tiny` preset model (random weights, lm_head scaled by `sharpen` so greedy decoding is
    confident and stable) saved with a 512-token tokenizer at `path`; `max_seq_len` overrides
    the preset's context (512) for prompts that carry long tool schemas."""
    from clover.checkpoint import save
    from clover.tokenizer import train_tokenizer

    tok = train_tokenizer(SAMPLE_TEXTS * 20, vocab_size=512)
    context = {} if max_seq_len is None else {"max_seq_len": max_seq_len}
    model = build_model(get_preset("tiny", **context), seed=seed).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return save(model, tok, path)


class ScriptedModel(CloverModel):
    """A CloverModel whose logits obey `script` where it has an entry; `bias` (token id ->
    added logit) tilts every position toward some tokens (digits, say); `delay_s` slows every
    forward (to hold batch rows busy in tests)."""

    script: dict[int, int]
    bias: dict[int, float]
    delay_s: float

    @classmethod
    def wrap(cls, model: CloverModel) -> ScriptedModel:
        model.__class__ = cls
        model.script, model.bias, model.delay_s = {}, {}, 0.0
        return model

    def forward(self, ids_BL, pos_BL=None, **kw):
        out = super().forward(ids_BL, pos_BL, **kw)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.bias:
            ids = list(self.bias)
            out.logits[..., ids] += torch.tensor([self.bias[t] for t in ids],
                                                 dtype=out.logits.dtype)
        if not self.script or pos_BL is None or kw.get("logits_mask_BL") is None:
            return out
        shift = 1 if self.config.attention == "causal" or self.config.shift_logits else 0
        target_N = (pos_BL[kw["logits_mask_BL"]] + shift).tolist()
        for n, p in enumerate(target_N):
            if p in self.script:
                out.logits[n] = -30.0
                out.logits[n, self.script[p]] = 30.0
        return out


@contextlib.contextmanager
def serving(server):
    """Run `server` (a `CloverServer`) under uvicorn in a thread on a free loopback port, with its
    timeouts; yield its base URL; stop it on exit."""
    from clover.server import create_app
    from clover.server.http import build_uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = build_uvicorn(create_app(server), server, log_level="warning")
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()


def load_tiny_server(model_dir: str | Path, **config):
    """A CloverServer over `model_dir` with its model wrapped in `ScriptedModel`. Tests compare
    answers, so requests without a temperature are greedy (the OpenAI default of 1.0 has its own
    test); `config` overrides any `ServerConfig` field."""
    from clover.server import CloverServer, ServerConfig

    config = {"default_temperature": 0.0} | config
    server = CloverServer.load(ServerConfig(model=str(model_dir), device="cpu", **config))
    ScriptedModel.wrap(server.engine.model)
    return server
