"""Copy probe: can a preset's architecture learn to copy a digit string, and how does context
before the string slow it down?

Trains a fresh causal model (next-token loss on the copy only) on `[filler] d1..dD SEP d1..dD`
with random digits and random filler tokens, and prints the per-digit copy accuracy as it trains,
then one JSON line. The airspace task needs exactly this skill (coordinates are digit tokens).

    python benchmarks/copy_probe.py [--preset clover-tiny-ar] [--filler 600] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from clover.config import get_preset
from clover.model import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="clover-tiny-ar")
    ap.add_argument("--qk-norm", choices=["preset", "on", "off"], default="preset")
    ap.add_argument("--digits", type=int, default=12)
    ap.add_argument("--filler", type=int, default=0, help="random tokens before the string")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    over = {} if args.qk_norm == "preset" else {"qk_norm": args.qk_norm == "on"}
    config = get_preset(args.preset, attention="causal", block_size=1, **over)
    torch.manual_seed(0)
    model = build_model(config, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    D, B = args.digits, args.batch
    digit_ids = (10, 20)  # any ten ordinary token ids stand in for the digits
    t0, acc, history = time.perf_counter(), 0.0, []
    for step in range(1, args.steps + 1):
        filler = torch.randint(100, config.vocab_size, (B, args.filler))
        src = torch.randint(*digit_ids, (B, D))
        ids = torch.cat([filler, src, torch.full((B, 1), 30), src], 1)
        out = model(ids[:, :-1])
        logits = out.logits.view(B, ids.shape[1] - 1, -1)[:, -D:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, -D:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc = (logits.argmax(-1) == ids[:, -D:]).float().mean().item()
        if step % 25 == 0 or step == args.steps:
            history.append({"step": step, "loss": round(loss.item(), 4), "copy_acc": round(acc, 4)})
            print(f"step {step:5d}  loss {loss.item():.3f}  copy accuracy {acc:.3f}  "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(json.dumps({"probe": "copy", "preset": args.preset, "qk_norm": config.qk_norm,
                      "digits": D, "filler": args.filler, "steps": args.steps, "batch": B,
                      "final_copy_acc": round(acc, 4), "history": history}))


if __name__ == "__main__":
    main()
