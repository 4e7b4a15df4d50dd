"""How far a block-diffusion model's confidence can be trusted to commit several tokens at once.

(An AR model is probed too, at d = 0 only: its teacher-forced next-token accuracy, the figure to
hold a dLLM's d = 0 row against.)

Teacher-forced, on gold replies: for every reply block and every frontier k (the block's first k
tokens known, the rest masked, every earlier block clean: the states left-to-right decoding
meets), one forward gives each masked position its greedy proposal and confidence (the top
probability). From them:

- accuracy by distance d from the frontier: d = 0 is the next token, read as an AR model reads
  it (what the model knows); d >= 1 are the positions a parallel commit adds;
- reliability of the d >= 1 proposals by confidence bin: how often a proposal at confidence c is
  right (a calibrated model is right about c of the time);
- the prefix policy (`clover.engine.policies.PrefixPolicy`) replayed at each tau: from the block's
  first target, commit the frontier and each next position while its confidence >= tau, then
  move the frontier past them. Its tokens per forward and the share of wrong commits are what the
  policy would do if every earlier commit had been right (the gold prefix stands in for the
  model's own, so errors do not compound): a ceiling on quality at that TPF, from 8 forwards
  per batch instead of a decode per tau.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from clover.train.data import Collator, TokenExample, chunks
from clover.train.objectives import Noise, PrefixMemo, masked_predictions

BINS = (0.0, 0.5, 0.7, 0.9, 0.95, 0.99, 1.0)


@dataclass
class Probe:
    """One record per (example, block, frontier, masked target at or after the frontier)."""
    example: list[int] = field(default_factory=list)
    block: list[int] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)  # k: the block's first k positions known
    dist: list[int] = field(default_factory=list)  # the target's offset in the block minus k
    conf: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)

    def add(self, example: int, block: int, frontier: int, dist: int, conf: float,
            correct: bool) -> None:
        for column, value in zip((self.example, self.block, self.frontier, self.dist, self.conf,
                                  self.correct), (example, block, frontier, dist, conf, correct),
                                 strict=True):
            column.append(value)


@torch.no_grad()
def probe(model: torch.nn.Module, examples: Sequence[TokenExample], collator: Collator,
          batch_size: int = 4) -> Probe:
    """Every (block, frontier) state of every example's reply, one forward per frontier and
    batch. A frontier is a target position (a block whose reply starts at offset o is probed
    from k = o: with fewer known tokens the state is the same)."""
    config = model.config
    if config.attention not in ("block", "causal"):
        raise ValueError(f"calibration probes block-diffusion and AR models; this one is "
                         f"{config.attention!r}")
    out = Probe()
    device = next(model.parameters()).device
    if config.attention == "causal":
        _probe_causal(model, examples, collator, batch_size, device, out)
        return out
    bs, memo = config.block_size, PrefixMemo()  # the shared system prompt runs once
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))  # little padding
    for k in range(bs):
        for idx in chunks(order, batch_size):
            chunk = [examples[i] for i in idx]
            batch = collator(chunk, range(len(chunk))).to(device)  # seeds: no noise drawn
            masked = batch.target_BL & (batch.pos_BL % bs >= k)
            if not masked.any():
                continue
            noise = Noise(torch.where(masked, config.mask_id, batch.ids_BL), masked,
                          torch.ones_like(batch.ids_BL, dtype=torch.float32))
            logits, row, pos, gold = masked_predictions(model, config, batch, noise, memo)
            conf, pred = logits.float().softmax(-1).max(-1)
            block = pos // bs
            keep = batch.target_BL[row, block * bs + k]  # the frontier itself is a target
            for r, b, p, c, ok in zip(row[keep].tolist(), block[keep].tolist(),
                                      pos[keep].tolist(), conf[keep].tolist(),
                                      (pred == gold)[keep].tolist(), strict=True):
                out.add(idx[r], b, k, p % bs - k, c, ok)
    return out


def _probe_causal(model, examples, collator, batch_size, device, out: Probe) -> None:
    """An AR model: every target is a frontier of its own, read at d = 0 from the clean prefix."""
    for first, chunk in enumerate(chunks(examples, batch_size)):
        batch = collator(chunk, range(len(chunk))).to(device)
        row, pos = batch.target_BL.nonzero(as_tuple=True)
        prev = torch.zeros_like(batch.target_BL)
        prev[row, pos - 1] = True
        logits = model(batch.ids_BL, batch.pos_BL, valid_BL=batch.valid_BL,
                       logits_mask_BL=prev).logits  # row-major: the order of (row, pos)
        conf, pred = logits.float().softmax(-1).max(-1)
        for r, p, c, ok in zip(row.tolist(), pos.tolist(), conf.tolist(),
                               (pred == batch.ids_BL[row, pos]).tolist(), strict=True):
            out.add(first * batch_size + r, p, 0, 0, c, ok)


def by_distance(p: Probe) -> list[dict]:
    """Accuracy and mean confidence of the proposals at each distance from the frontier."""
    groups = defaultdict(list)
    for d, c, ok in zip(p.dist, p.conf, p.correct, strict=True):
        groups[d].append((c, ok))
    return [{"dist": d, "n": len(g), "accuracy": sum(ok for _, ok in g) / len(g),
             "mean_conf": sum(c for c, _ in g) / len(g)} for d, g in sorted(groups.items())]


def reliability(p: Probe, bins: Sequence[float] = BINS) -> list[dict]:
    """The d >= 1 proposals by confidence bin [lo, hi) (the last bin holds 1.0): how many, and
    the share that are right, beside the bin's mean confidence."""
    rows = []
    for i, (lo, hi) in enumerate(zip(bins, bins[1:], strict=False)):
        last = i == len(bins) - 2
        g = [(c, ok) for d, c, ok in zip(p.dist, p.conf, p.correct, strict=True)
             if d >= 1 and lo <= c and (c < hi or (last and c <= hi))]
        rows.append({"bin": f"[{lo}, {hi}{']' if last else ')'}", "n": len(g),
                     "accuracy": sum(ok for _, ok in g) / len(g) if g else None,
                     "mean_conf": sum(c for c, _ in g) / len(g) if g else None})
    return rows


def replay_prefix(p: Probe, tau: float) -> dict:
    """The prefix policy at `tau` on the teacher-forced states (see the module text)."""
    states = defaultdict(list)  # (example, block, frontier) -> [(dist, conf, correct)]
    for e, b, k, d, c, ok in zip(p.example, p.block, p.frontier, p.dist, p.conf, p.correct,
                                 strict=True):
        states[e, b, k].append((d, c, ok))
    starts: dict[tuple[int, int], int] = {}  # (example, block) -> its first frontier
    for e, b, k in states:
        starts[e, b] = min(starts.get((e, b), k), k)
    tokens = forwards = wrong = 0
    wrong_examples = set()
    for (e, b), k in starts.items():
        while (e, b, k) in states:
            row = sorted(states[e, b, k])
            n = 1
            while n < len(row) and row[n][1] >= tau:
                n += 1
            bad = sum(not ok for _, _, ok in row[:n])
            tokens, forwards, wrong = tokens + n, forwards + 1, wrong + bad
            if bad:
                wrong_examples.add(e)
            k += n
    examples = len({e for e, _ in starts})
    return {"tau": tau, "tpf": tokens / max(forwards, 1), "tokens": tokens,
            "forwards": forwards, "wrong_share": wrong / max(tokens, 1),
            "replies_all_right": 1 - len(wrong_examples) / max(examples, 1)}


def calibration_evaluator(examples: Sequence[TokenExample], collator: Collator,
                          taus: Sequence[float] = (1.0, 0.9), batch_size: int = 8):
    """A `Trainer` evaluate hook: probe `examples` and report the next-token accuracy and, per
    tau, the replayed prefix policy's TPF and share of replies with no wrong commit."""

    def evaluate(model: torch.nn.Module, step: int) -> dict:
        start = time.perf_counter()
        # a --bf16 run keeps its frozen weights in bf16 and trains under autocast: so does this
        dtypes = {q.dtype for q in model.parameters() if q.is_floating_point()}
        mixed = torch.bfloat16 in dtypes and len(dtypes) > 1
        device = next(model.parameters()).device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=mixed):
            p = probe(model, examples, collator, batch_size)
        out = {"cal_next_token_acc": round(by_distance(p)[0]["accuracy"], 4)}
        for tau in taus:
            r = replay_prefix(p, tau)
            out[f"cal_tpf_{tau}"] = round(r["tpf"], 3)
            out[f"cal_all_right_{tau}"] = round(r["replies_all_right"], 4)
        out["cal_s"] = round(time.perf_counter() - start, 1)
        return out

    return evaluate


def combine_evaluators(*hooks):
    """One evaluate hook running each given one (None ones skipped) and merging their metrics;
    None when none is given."""
    hooks = [h for h in hooks if h is not None]
    if not hooks:
        return None
    return lambda model, step: {k: v for h in hooks for k, v in h(model, step).items()}
