"""Training throughput probe: tokens/s of full training steps on synthetic SFT-shaped batches.

`measure(config, ...)` runs a few warm-up and timed optimizer steps of the real loop (objective,
backward, AdamW) on random tokens with a fixed prompt/response split, fp32 or bf16 autocast.
It prints a table and one JSON line when run as a module:
`python -m clover.train.throughput --preset clover-tiny --seq-len 1400 --prompt-len 1200`.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from clover.config import ModelConfig, get_preset
from clover.model import build_model
from clover.train import TrainConfig, Trainer
from clover.train.data import sft_example


def synthetic(config: ModelConfig, n: int, seq_len: int, prompt_len: int,
              shared_len: int = 0) -> list:
    """Random SFT examples whose first `shared_len` tokens (a system prompt) are identical."""
    g = torch.Generator().manual_seed(0)
    ids_NL = torch.randint(16, config.vocab_size, (n, seq_len), generator=g)
    ids_NL[:, :shared_len] = ids_NL[0, :shared_len]
    return [sft_example(row[:prompt_len], row[prompt_len:-1] + [config.eos_id])
            for row in ids_NL.tolist()]


def measure(config: ModelConfig, *, seq_len: int, prompt_len: int, batch_size: int = 4,
            shared_len: int = 0, steps: int = 3, warmup: int = 1, bf16: bool = False) -> dict:
    """Data tokens (prompt + response) per second over `steps` timed training steps."""
    model = build_model(config, seed=0)
    data = synthetic(config, batch_size * (steps + warmup), seq_len, prompt_len, shared_len)
    trainer = Trainer(model, data, TrainConfig(steps=steps + warmup, batch_size=batch_size,
                                               bf16=bf16, device="cpu", progress=False))
    for _ in range(warmup):
        trainer.train_step()
        trainer.state.step += 1
    start, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += trainer.train_step().tokens
        trainer.state.step += 1
    seconds = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    return {"model": config.name, "attention": config.attention, "params": params,
            "dim": config.dim, "layers": config.num_layers, "bf16": bf16, "seq_len": seq_len,
            "prompt_len": prompt_len, "shared_len": shared_len, "batch": batch_size,
            "tok_s": round(tokens / seconds, 1),
            "s_per_step": round(seconds / steps, 3)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="clover-tiny")
    p.add_argument("--override", default="{}", help="JSON of ModelConfig field overrides")
    p.add_argument("--seq-len", type=int, default=1400)
    p.add_argument("--prompt-len", type=int, default=1200)
    p.add_argument("--shared-len", type=int, default=0, help="common prompt prefix (system+tools)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args(argv)
    config = get_preset(args.preset).replace(**json.loads(args.override))
    r = measure(config, seq_len=args.seq_len, prompt_len=args.prompt_len, batch_size=args.batch,
                shared_len=args.shared_len,
                steps=args.steps, bf16=args.bf16)
    print(" | ".join(f"{k}={v}" for k, v in r.items()))
    print(json.dumps({**r, "cpu": platform.processor() or platform.machine(),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
