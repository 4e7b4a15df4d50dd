"""Grammar engines side by side: llguidance (Clover's backend) against xgrammar, on this CPU,
with the project's tokenizer and the project's grammars.

Two workloads built from the airspace test split's gold answers:
- `tool call`: each gold call body (`{"name": ..., "arguments": {...}}`, as the model writes it)
  under its tool's strict call schema (`clover.tasks.airspace.contract`: patterns, ranges, an
  enum of 4,000+ place names), compiled as a JSON Schema;
- `coordinates`: each gold centre that is a coordinate string, under the `COORDINATES` regex.

For each engine: the one-off tokenizer set-up, the cold compile of each grammar, and, walking
every gold sequence token by token, the time to fill the next-token bitmask and to accept the
token. Both engines must accept every gold sequence; the masks they produce are compared
position by position (tokens the tokenizer does not have and the stop token are left out).
llguidance is driven through `clover.grammar.backend` (the path the engine uses); xgrammar
directly. xgrammar is optional: `pip install --no-deps xgrammar apache-tvm-ffi` (its declared
dependencies pull in a 1 GB triton that it does not need on a CPU).
Prints a table, then one JSON line.

    python benchmarks/grammar_backends.py [--model models/clover-tiny] [--n 100]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from clover.config import ModelConfig
from clover.grammar.backend import (
    JSON_STYLE,
    GrammarSpec,
    LLGuidanceBackend,
    bitmask_words,
    unpack_bitmask,
)
from clover.grammar.tools import call_schema
from clover.tasks.airspace import generate_examples, reference_calls
from clover.tasks.airspace.contract import COORDINATES, strict_tools
from clover.tokenizer import load_tokenizer


@dataclass
class Workload:
    name: str
    kind: str  # json_schema | regex
    sources: dict[str, str]  # grammar key -> source
    sequences: list[tuple[str, list[int]]]  # (grammar key, gold tokens)


@dataclass
class Result:
    setup_s: float = 0.0
    compile_s: dict[str, float] = field(default_factory=dict)
    mask_us: list[float] = field(default_factory=list)
    accept_us: list[float] = field(default_factory=list)
    accepted: int = 0  # gold sequences accepted whole, ending in a complete match
    masks: list[list[torch.Tensor] | None] = field(default_factory=list)  # per sequence (None:
    # rejected), allowed_V per position
    rejected: list[str] = field(default_factory=list)  # where gold was refused: text|rest


def workloads(tok, n: int) -> list[Workload]:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in strict_tools()}
    calls = [c for e in generate_examples("test", n, 0) for c in reference_calls(e)]
    body = [(c["name"], tok.encode(json.dumps({"name": c["name"], "arguments": c["arguments"]},
                                              ensure_ascii=False), add_special_tokens=False))
            for c in calls]
    centres = [c["arguments"]["centre"] for c in calls if "centre" in c["arguments"]]
    coords = [s for s in centres if re.fullmatch(COORDINATES, s)]
    pattern = COORDINATES.removeprefix("^").removesuffix("$")
    return [
        Workload("tool call (JSON Schema)", "json_schema",
                 {name: json.dumps(call_schema(name, s)) for name, s in schemas.items()}, body),
        Workload("coordinates (regex)", "regex", {"centre": pattern},
                 [("centre", tok.encode(s, add_special_tokens=False)) for s in coords]),
    ]


def run_llguidance(tok, vocab: int, eos: int, work: Workload) -> Result:
    r = Result()
    t = time.perf_counter()
    backend = LLGuidanceBackend(tok, vocab, eos)
    r.setup_s = time.perf_counter() - t
    for key, src in work.sources.items():
        t = time.perf_counter()
        backend.matcher(GrammarSpec(work.kind, src))
        r.compile_s[key] = time.perf_counter() - t
    bitmask_W = torch.zeros(bitmask_words(vocab), dtype=torch.int32)
    for key, tokens in work.sequences:
        m = backend.matcher(GrammarSpec(work.kind, work.sources[key]))  # cached: a copy
        masks = []
        for token in tokens:
            t0 = time.perf_counter()
            m.fill_bitmask(bitmask_W)
            t1 = time.perf_counter()
            taken = m.accept([token])
            t2 = time.perf_counter()
            r.mask_us.append((t1 - t0) * 1e6)
            r.accept_us.append((t2 - t1) * 1e6)
            masks.append(unpack_bitmask(bitmask_W, vocab))
            if taken != 1:
                break
        _record(r, tok, tokens, masks, len(masks) - 1, taken == 1 and m.is_accepting())
    return r


def run_xgrammar(tok, vocab: int, eos: int, work: Workload) -> Result | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    r = Result()
    t = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[eos])
    r.setup_s = time.perf_counter() - t
    compiled = {}
    for key, src in work.sources.items():
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        t = time.perf_counter()
        if work.kind == "json_schema":
            compiled[key] = compiler.compile_json_schema(
                src, any_whitespace=JSON_STYLE["whitespace_flexible"], strict_mode=True,
                separators=(JSON_STYLE["item_separator"], JSON_STYLE["key_separator"]))
        else:
            compiled[key] = compiler.compile_regex(src)
        r.compile_s[key] = time.perf_counter() - t
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    for key, tokens in work.sequences:
        m = xgr.GrammarMatcher(compiled[key])
        masks = []
        for token in tokens:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bitmask, 0)
            t1 = time.perf_counter()
            taken = m.accept_token(token)
            t2 = time.perf_counter()
            r.mask_us.append((t1 - t0) * 1e6)
            r.accept_us.append((t2 - t1) * 1e6)
            masks.append(unpack_bitmask(bitmask[0].contiguous(), vocab))
            if not taken:
                break
        whole = taken and m.accept_token(eos) and m.is_terminated()
        _record(r, tok, tokens, masks, len(masks) - 1, whole)
    return r


def _record(r: Result, tok, tokens: list[int], masks: list, stop: int, whole: bool) -> None:
    r.accepted += bool(whole)
    r.masks.append(masks if whole else None)
    if not whole:
        r.rejected.append(tok.decode(tokens[:stop]) + " | " + tok.decode(tokens[stop:]))


def mask_agreement(a: Result, b: Result, real_V: torch.Tensor) -> float | None:
    """Share of positions, over the gold sequences both engines accept, where the two allow
    exactly the same tokens."""
    pairs = [(x, y) for ma, mb in zip(a.masks, b.masks, strict=True) if ma and mb
             for x, y in zip(ma, mb, strict=True)]
    if not pairs:
        return None
    return sum(bool(torch.equal(x[real_V], y[real_V])) for x, y in pairs) / len(pairs)


def disagreements(a: Result, b: Result, real_V: torch.Tensor, tok, limit: int = 5) -> list[str]:
    """A few tokens one engine allows and the other does not, for the notes."""
    out: set[str] = set()
    for ma, mb in zip(a.masks, b.masks, strict=True):
        for x, y in zip(ma or [], mb or [], strict=False):
            diff = (x ^ y) & real_V
            for t in diff.nonzero().flatten().tolist()[:2]:
                out.add(f"{tok.convert_ids_to_tokens(t)!r}: "
                        f"{'llguidance' if x[t] else 'xgrammar'} only")
            if len(out) >= limit:
                return sorted(out)
    return sorted(out)


def summary(r: Result, work: Workload) -> dict:
    return {"setup_s": round(r.setup_s, 3),
            "compile_s": {k: round(v, 3) for k, v in r.compile_s.items()},
            "mask_us_mean": round(statistics.fmean(r.mask_us), 1),
            "mask_us_p99": round(sorted(r.mask_us)[int(0.99 * (len(r.mask_us) - 1))], 1),
            "accept_us_mean": round(statistics.fmean(r.accept_us), 1),
            "tokens": len(r.mask_us), "accepted": f"{r.accepted}/{len(work.sequences)}",
            "rejected_gold": r.rejected[:3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/clover-tiny",
                    help="model directory whose tokenizer and vocabulary to use")
    ap.add_argument("--n", type=int, default=100, help="test-split examples")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.model)
    config = ModelConfig.load(Path(args.model) / "config.json")
    vocab, eos = config.vocab_size, config.eos_id
    real_V = torch.zeros(vocab, dtype=torch.bool)
    real_V[:len(tok)] = True
    real_V[eos] = False
    results = []
    for work in workloads(tok, args.n):
        row = {"workload": work.name, "sequences": len(work.sequences)}
        llg = run_llguidance(tok, vocab, eos, work)
        xg = run_xgrammar(tok, vocab, eos, work)
        row["llguidance"] = summary(llg, work)
        row["xgrammar"] = summary(xg, work) if xg else None
        agree = None if xg is None else mask_agreement(llg, xg, real_V)
        row["mask_agreement"] = None if agree is None else round(agree, 4)
        row["disagreements"] = [] if xg is None else disagreements(llg, xg, real_V, tok)
        results.append(row)

    table = Table(title=f"grammar engines, {args.model} tokenizer ({len(tok)} tokens), "
                        f"{platform.machine()}, {args.threads} thread(s)")
    for col in ("workload", "engine", "set-up s", "compile s", "mask us (mean / p99)",
                "accept us", "gold accepted", "masks agree"):
        table.add_column(col)
    for row in results:
        for name in ("llguidance", "xgrammar"):
            s = row[name]
            if s is None:
                table.add_row(row["workload"], name, "not installed", "", "", "", "", "")
                continue
            table.add_row(row["workload"], name, f"{s['setup_s']:.3f}",
                          " ".join(f"{v:.3f}" for v in s["compile_s"].values()),
                          f"{s['mask_us_mean']:.1f} / {s['mask_us_p99']:.1f}",
                          f"{s['accept_us_mean']:.1f}", s["accepted"],
                          "" if name == "llguidance" or row["mask_agreement"] is None
                          else f"{100 * row['mask_agreement']:.1f}%")
    Console(width=140).print(table)
    print(json.dumps({"bench": "grammar_backends", "model": args.model, "n": args.n,
                      "machine": platform.machine(), "threads": args.threads,
                      "torch": torch.__version__, "results": results}))


if __name__ == "__main__":
    main()
