"""The core demo: build a preset, train a tokenizer, save a model directory, reload and verify it.

A real, small job that exercises every core piece end to end on a fresh machine: config, model
(all three attention masks share this code), tokenizer with its chat template, the checkpoint
format, and `inspect`. The airspace agent demo replaces this as `make demo` once it lands.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from clover.checkpoint import load, save
from clover.config import get_preset
from clover.inspect import describe, render_table
from clover.model import build_model
from clover.tokenizer import parse_tool_calls, render_chat, train_tokenizer

_CORPUS = [
    "A1234/26 NOTAMN Q) EGTT/QRTCA/IV/BO/W/000/004/5129N00036W001 "
    "E) TEMPORARY RESTRICTED AREA WI 0.5NM RADIUS: 512107N 0003608W",
    "!FDC 6/4321 ZNY NY..AIRSPACE UAS WI AN AREA DEFINED AS 1.5NM RADIUS OF 430205N0753903W",
    "临时禁飞通告：以北纬31°08′36″、东经121°48′18″为中心，半径5公里，真高120米以下。",
    "Drone flights are prohibited within 2 km of 48.8566N 2.3522E from 0600 to 1800 UTC.",
]


def _corpus(n: int = 400) -> list[str]:
    return [f"{text} #{i}" for i in range(n) for text in _CORPUS]


def run_core_demo(out: str | Path, preset: str = "clover-tiny") -> int:
    out = Path(out)
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(_corpus(), vocab_size=get_preset(preset).vocab_size)
    model = build_model(get_preset(preset), seed=0)
    path = save(model, tokenizer, out / preset)
    loaded, loaded_tok = load(path)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  loaded.state_dict().values(), strict=True))
    chat = render_chat(loaded_tok, [{"role": "user", "content": _CORPUS[0]}])
    ids = torch.tensor([loaded_tok.encode(chat)])
    with torch.no_grad():
        match = torch.equal(model(ids).logits, loaded(ids).logits)
    call = '<tool_call>{"name": "set_no_fly_zone", "arguments": {"lat": 51.35}}</tool_call>'
    parsed = parse_tool_calls(call)
    print(render_table(describe(loaded.config)))
    print(f"saved {path} ({sum(f.stat().st_size for f in path.iterdir()) / 1e6:.1f} MB); "
          f"reload bit-exact: {same}; logits equal: {match}; prompt tokens: {ids.shape[1]}; "
          f"parsed tool calls: {len(parsed.tool_calls)}; {time.perf_counter() - t0:.1f} s")
    return 0 if same and match and parsed.tool_calls else 1
