"""Copy probe: can a preset's architecture learn to copy a digit string, and how does context
before the string slow it down?

Trains a fresh causal model (next-token loss on the copy only) and prints the per-digit copy
accuracy as it trains, then one JSON line. The airspace task needs exactly this skill
(coordinates are digit tokens).

`--mode offset`: `[filler] d1..dD SEP d1..dD`. The source always sits right before SEP, so a head
that looks a fixed distance back solves it: this measures position-based copying only.
`--mode marker`: `filler MARK d1..dD filler SEP MARK d1..dD`, MARK at a random place in a filler
of `--filler` tokens, `--digit-share` of them digits. Like a coordinate in a message, the source
must be found by content and copied digit after digit among look-alikes (induction heads).

    python benchmarks/copy_probe.py [--mode marker] [--filler 200] [--steps 400]
    python benchmarks/copy_probe.py --mode marker --tokenizer models/clover-tiny-ar --save DIR ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from clover.config import get_preset
from clover.model import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="clover-tiny-ar")
    ap.add_argument("--qk-norm", choices=["preset", "on", "off"], default="preset")
    ap.add_argument("--mode", choices=["offset", "marker"], default="offset")
    ap.add_argument("--digit-share", type=float, default=0.0,
                    help="marker mode: share of filler tokens that are digits (look-alikes)")
    ap.add_argument("--ramp", type=int, default=0, metavar="STEPS",
                    help="marker mode: raise the look-alike share linearly from 0 to --digit-share "
                         "over the first STEPS steps (a curriculum)")
    ap.add_argument("--digits", type=int, default=12)
    ap.add_argument("--filler", type=int, default=0, help="random tokens before the string")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0, help="weights and data")
    ap.add_argument("--token-conv", type=int, default=0, metavar="K",
                    help="the model's token_conv: a causal depthwise conv of width K on each "
                         "attention input (a 'canon layer'), so positions see their neighbours")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                    help="override a config field, e.g. --set num_experts=0 (repeatable)")
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="use this model directory's tokenizer: its digit tokens are the digits, "
                         "its ordinary tokens the filler (default: stand-in ids)")
    ap.add_argument("--save", metavar="DIR",
                    help="write the trained model (with --tokenizer's tokenizer) as a model "
                         "directory, e.g. to start `clover train --init-from DIR` from it")
    args = ap.parse_args()
    if args.save and not args.tokenizer:
        raise SystemExit("--save needs --tokenizer: a model directory must carry its tokenizer")
    over = {} if args.qk_norm == "preset" else {"qk_norm": args.qk_norm == "on"}
    if args.token_conv:
        over["token_conv"] = args.token_conv
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: use FIELD=VALUE, e.g. --set num_experts=0")
        over[field] = json.loads(value)
    config = get_preset(args.preset, attention="causal", block_size=1, **over)
    torch.manual_seed(args.seed)
    model = build_model(config, seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    D, B = args.digits, args.batch
    tokens = _tokens(args.tokenizer, config.vocab_size)
    t0, acc, history = time.perf_counter(), 0.0, []
    for step in range(1, args.steps + 1):
        share = args.digit_share * min(1.0, step / args.ramp) if args.ramp else args.digit_share
        ids = _batch(args, tokens, share)
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
    print(json.dumps({"probe": "copy", "mode": args.mode, "digit_share": args.digit_share,
                      "ramp": args.ramp,
                      "preset": args.preset, "overrides": over, "token_conv": args.token_conv,
                      "qk_norm": config.qk_norm,
                      "digits": D, "filler": args.filler, "seed": args.seed,
                      "steps": args.steps, "batch": B,
                      "tokenizer": args.tokenizer, "final_copy_acc": round(acc, 4),
                      "history": history}))
    if args.save:
        from clover import checkpoint
        from clover.tokenizer import load_tokenizer

        info = {"probe": "copy", "command": " ".join(sys.argv), "steps": args.steps,
                "final_copy_acc": round(acc, 4)}
        checkpoint.save(model, load_tokenizer(args.tokenizer), args.save,
                        extra={"training.json": json.dumps(info, indent=2) + "\n"})
        print(f"saved {args.save}", file=sys.stderr)


def _tokens(tokenizer_dir: str | None, vocab_size: int) -> dict[str, torch.Tensor]:
    """Token ids for the batches: ten digits, the filler pool, SEP and MARK."""
    if tokenizer_dir is None:  # any ten ordinary ids stand in for the digits
        return {"digits": torch.arange(10, 20), "filler": torch.arange(100, vocab_size),
                "sep": torch.tensor(30), "mark": torch.tensor(31)}
    from clover.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    if len(tok) != vocab_size:
        raise SystemExit(f"--tokenizer {tokenizer_dir}: {len(tok)} tokens, the model has "
                         f"{vocab_size}; pass a matching --preset")
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    if tok.unk_token_id in digits:
        raise SystemExit(f"--tokenizer {tokenizer_dir}: the digits are not single tokens")
    sep, mark = tok.convert_tokens_to_ids('"'), tok.convert_tokens_to_ids(":")
    special = set(tok.all_special_ids) | set(digits) | {sep, mark}
    filler = [i for i in range(vocab_size) if i not in special]
    return {"digits": torch.tensor(digits), "filler": torch.tensor(filler),
            "sep": torch.tensor(sep), "mark": torch.tensor(mark)}


def _pick(pool: torch.Tensor, *shape: int) -> torch.Tensor:
    return pool[torch.randint(len(pool), shape)]


def _batch(args: argparse.Namespace, tokens: dict[str, torch.Tensor],
           digit_share: float) -> torch.Tensor:
    """One batch of token ids; the last `digits` tokens are the copy the loss is over."""
    B, D, sep, mark = args.batch, args.digits, tokens["sep"], tokens["mark"]
    filler = _pick(tokens["filler"], B, args.filler)
    src = _pick(tokens["digits"], B, D)
    if args.mode == "offset":
        return torch.cat([filler, src, torch.full((B, 1), sep), src], 1)
    if args.filler < D + 1:
        raise SystemExit(f"--filler={args.filler} must be at least --digits + 1 in marker mode")
    look_alike = torch.rand(B, args.filler) < digit_share
    filler[look_alike] = _pick(tokens["digits"], int(look_alike.sum()))
    for b, at in enumerate(torch.randint(0, args.filler - D, (B,)).tolist()):
        filler[b, at], filler[b, at + 1:at + 1 + D] = mark, src[b]
    return torch.cat([filler, torch.full((B, 1), sep), torch.full((B, 1), mark), src], 1)


if __name__ == "__main__":
    main()
