"""The training loop: AdamW with warmup + cosine, accumulation, clipping, logging, resume.

`Trainer(model, examples, TrainConfig(...)).fit()` trains any Clover model with the objective of
its attention mode. Promises: the update of a step depends only on (weights, optimizer state,
seed, step), never on how the global batch is split into micro-batches or processes (losses are
normalised by the global target count), nor on `parallel` (DDP or FSDP2, `parallel.py`); a run
stopped after a checkpoint and resumed continues with exactly the losses of an uninterrupted run
(`checkpointing.py`; FSDP2 checkpoints also resume at another world size). Under `torchrun` it
uses torch.distributed (`distributed.py`); rank 0 alone writes files and prints (`progress.py`).
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover import checkpoint
from clover.model import CloverModel
from clover.train import checkpointing
from clover.train.balance import load_fractions, load_stats, update_expert_bias
from clover.train.checkpointing import CHECKPOINT_DIR, TrainState
from clover.train.config import TrainConfig, lr_at, make_optimizer
from clover.train.data import (
    Batch,
    Collator,
    TokenExample,
    chunks,
    noise_seeds,
    shard,
    step_indices,
)
from clover.train.distill import Teacher
from clover.train.distributed import (
    DistEnv,
    all_reduce_sum,
    close_distributed,
    init_distributed,
    resolve_device,
)
from clover.train.draft import Verifier, draft_block
from clover.train.objectives import (
    OBJECTIVES,
    Objective,
    ObjectiveModule,
    PrefixMemo,
    batch_noise,
    first_target,
)
from clover.train.parallel import PARALLEL, frozen_linears_to_bf16, full_model
from clover.train.progress import Display

LOG_FILE = "log.jsonl"

Evaluate = Callable[[CloverModel, int], dict[str, Any]]


def default_collator(model_config, eos_fill: str | None = None) -> Collator:
    """Padding and EOS fill that match how the model decodes (blocks are filled with EOS)."""
    mode = model_config.attention
    fill = eos_fill or {"block": "block", "full": "length", "causal": "none"}[mode]
    return Collator(pad_id=model_config.pad_id, eos_id=model_config.eos_id,
                    block_size=model_config.block_size, eos_fill=fill,
                    pad_multiple=model_config.block_size if mode == "block" else 1,
                    first_target=first_target(model_config))


def _objective(mode: str, share_prefix: bool, prefix_grad: bool = True,
               complementary: bool = False, teacher: Teacher | None = None) -> Objective:
    """The mode's objective; with `share_prefix` off it recomputes the common prompt prefix in
    every row instead of sharing it through a KV cache (same loss and gradients). With
    `prefix_grad` off the shared prefix runs without gradient (a cheaper, truncated gradient),
    once per optimizer step (`PrefixMemo`). `complementary` (block diffusion) adds the second,
    complementary masked view; a `teacher` (block diffusion) the next-token distillation term."""
    objective = OBJECTIVES[mode]
    params = inspect.signature(objective).parameters
    if complementary and "complementary" not in params:
        raise ValueError(f"complementary masks are for block diffusion, not attention {mode!r}")
    if teacher is not None and "teacher" not in params:
        raise ValueError(f"distillation from a teacher is for block diffusion, not attention "
                         f"{mode!r}")
    if "share_prefix" not in params:
        return objective
    kwargs: dict[str, object] = {}
    if not share_prefix:
        kwargs["share_prefix"] = False
    elif not prefix_grad:
        kwargs["prefix_grad"] = False
        kwargs["prefix_memo"] = PrefixMemo()
    if complementary:
        kwargs["complementary"] = True
    if teacher is not None:
        kwargs["teacher"] = teacher
    return functools.partial(objective, **kwargs) if kwargs else objective


@dataclass
class StepResult:
    loss: float
    aux: float
    grad_norm: float
    lr: float
    tokens: int
    counts_LE: torch.Tensor | None
    confident_entropy: float = 0.0  # mean over all targets of the sharpening term
    ar_loss: float | None = None  # mean next-token loss of the AR term (ar_coef > 0)
    distill_kl: float | None = None  # distillation KL summed over its positions / targets


class Trainer:
    def __init__(self, model: CloverModel, train_data: Sequence[TokenExample],
                 config: TrainConfig, *, val_data: Sequence[TokenExample] = (),
                 collator: Collator | None = None, tokenizer: Any | None = None,
                 evaluate: Evaluate | None = None, teacher: nn.Module | None = None,
                 verifier: nn.Module | None = None) -> None:
        if not train_data:
            raise ValueError("no training examples")
        if config.ar_coef and model.config.attention == "causal":
            raise ValueError("ar_coef adds a next-token loss to a diffusion objective; this "
                             "model is causal already")
        if bool(config.distill_coef) != (teacher is not None):
            raise ValueError("distill_coef > 0 and a teacher model go together")
        self.config, self.train_data, self.val_data = config, train_data, val_data
        self.env = DistEnv.from_environ()
        self.device = resolve_device(config.device, self.env)
        init_distributed(self.env, self.device)
        torch.manual_seed(config.seed)
        self.model = model.to(self.device).train()
        self.model_config = model.config
        self.parallel = PARALLEL[config.parallel]()
        self.parallel.shard(self.model, self.env, self.device, config.bf16)
        self.collator = collator or default_collator(model.config)
        # validation scores one masked view (comparable with and without complementary masks)
        self.objective = _objective(model.config.attention, self.parallel.shares_prefix,
                                    config.prefix_grad)
        self.teacher = self._teacher(teacher)
        self.train_objective = _objective(model.config.attention, self.parallel.shares_prefix,
                                          config.prefix_grad, config.complementary, self.teacher)
        if verifier is not None:  # a drafter for self-speculative decoding (clover.train.draft)
            if (model.config.attention != "block" or config.complementary or teacher is not None
                    or config.suffix_masks != 1 or config.ar_coef or config.sharpen_coef):
                raise ValueError("a verifier trains a block model's drafts on suffix masks "
                                 "(suffix_masks 1), with no complementary masks, teacher, AR "
                                 "term or sharpening")
            self.objective = self.train_objective = functools.partial(
                draft_block, verifier=Verifier(verifier.to(self.device)))
        self.tokenizer, self.evaluate = tokenizer, evaluate
        self.optimizer = make_optimizer(self.model, config)
        self.state = TrainState()
        self.work_dir = Path(config.work_dir) if config.work_dir else None
        if config.resume:
            self._resume()
        ar_objective = _objective("causal", self.parallel.shares_prefix, config.prefix_grad)
        self.net = self.parallel.wrap(ObjectiveModule(self.model, self.train_objective,
                                                      config.ar_coef, ar_objective),
                                      self.model, self.env, self.device)

    def _teacher(self, model: nn.Module | None) -> Teacher | None:
        """The distillation teacher on this device, frozen (its linears in bf16 for --bf16)."""
        if model is None:
            return None
        model = model.to(self.device)
        if self.config.bf16:
            frozen_linears_to_bf16(model)
        return Teacher(model)

    @property
    def per_rank(self) -> int:
        if self.config.batch_size % self.env.world:
            raise ValueError(f"batch_size={self.config.batch_size} must be divisible by the "
                             f"number of processes ({self.env.world})")
        return self.config.batch_size // self.env.world

    # ---- one step ----
    def micro_batches(self, step: int) -> list[Batch]:
        """This process's micro-batches of the global batch at `step` (data and noise seeds)."""
        cfg = self.config
        idx = step_indices(step, cfg.batch_size, len(self.train_data), cfg.seed)
        # similar lengths share a micro-batch (less padding); a slot keeps its example and noise,
        # and sorting before sharding gives processes the groups micro-batches would get
        by_length = sorted(range(cfg.batch_size), key=lambda k: len(self.train_data[idx[k]].ids))
        slots = shard(by_length, self.env.rank, self.env.world)
        size = cfg.micro_batch_size or self.per_rank
        return [self.collator([self.train_data[idx[k]] for k in m],
                              noise_seeds(cfg.seed, step, m)).to(self.device)
                for m in chunks(slots, size)]

    def train_step(self) -> StepResult:
        cfg, env = self.config, self.env
        batches = self.micro_batches(self.state.step)
        totals = torch.tensor([sum(b.num_targets for b in batches),
                               sum(b.num_tokens for b in batches)], dtype=torch.float64)
        num_targets, num_tokens = all_reduce_sum(totals, env).tolist()
        lr = lr_at(self.state.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum, aux_sum, ent_sum, ar_sum, kl_sum, counts = self._accumulate(batches,
                                                                               num_targets)
        grad_norm = self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums = all_reduce_sum(torch.tensor([loss_sum, aux_sum, ent_sum, ar_sum, kl_sum],
                                           dtype=torch.float64), env)
        if counts is not None:
            counts = all_reduce_sum(counts, env)
            if cfg.bias_rate:
                update_expert_bias(self.model, counts, cfg.bias_rate)
        return StepResult(float(sums[0]) / num_targets, float(sums[1]) / (env.world * len(batches)),
                          grad_norm, lr, int(num_tokens), counts, float(sums[2]) / num_targets,
                          float(sums[3]) / num_targets if cfg.ar_coef else None,
                          float(sums[4]) / num_targets if cfg.distill_coef else None)

    def _accumulate(self, batches: list[Batch], num_targets: float):
        """Forward + backward every micro-batch; gradients add up to d(global mean loss)."""
        cfg, world = self.config, self.env.world
        loss_sum = aux_sum = ent_sum = ar_sum = kl_sum = 0.0
        counts = None
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            with self.parallel.sync(self.net, self.model, enabled=last):
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                    noise = batch_noise(batch, self.model_config, cfg.noise_eps,
                                        cfg.suffix_masks)
                    out = self.net(batch, noise)
                # DDP and FSDP2 average gradients over processes: scale by world to sum.
                loss = out.loss_sum * (world / num_targets)
                if out.confident_entropy_sum is not None:
                    ent_sum += float(out.confident_entropy_sum.detach())
                    if cfg.sharpen_coef:
                        loss = loss + cfg.sharpen_coef * out.confident_entropy_sum * (
                            world / num_targets)
                if out.ar_sum is not None:
                    ar_sum += float(out.ar_sum.detach())
                    loss = loss + cfg.ar_coef * out.ar_sum * (world / num_targets)
                if out.distill_sum is not None:
                    kl_sum += float(out.distill_sum.detach())
                    loss = loss + cfg.distill_coef * out.distill_sum * (world / num_targets)
                if out.moe is not None:
                    aux = out.moe.aux_loss
                    loss = loss + cfg.aux_coef * aux / len(batches)
                    aux_sum += float(aux.detach())
                    c = out.moe.counts_LE.detach().to("cpu", torch.float64)
                    counts = c if counts is None else counts + c
                loss.backward()
            loss_sum += float(out.loss_sum.detach())
        return loss_sum, aux_sum, ent_sum, ar_sum, kl_sum, counts

    def _clip(self) -> float:
        return self.parallel.clip(self.model, self.config.grad_clip or float("inf"))

    # ---- validation ----
    @torch.no_grad()
    def validate(self) -> float | None:
        """Mean target loss over the validation set, with fixed noise (comparable across steps)."""
        if not self.val_data:
            return None
        cfg, env = self.config, self.env
        sums = torch.zeros(2, dtype=torch.float64)
        for m in self._val_parts():
            batch = self.collator([self.val_data[k] for k in m or [0]],
                                  noise_seeds(cfg.seed, -1, m or [0])).to(self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                out = self.objective(self.model, self.model_config, batch,
                                     batch_noise(batch, self.model_config, cfg.noise_eps))
            if m is not None:
                sums += torch.tensor([float(out.loss_sum), batch.num_targets],
                                     dtype=torch.float64)
        sums = all_reduce_sum(sums, env)
        return float(sums[0] / sums[1].clamp_min(1))

    def _val_parts(self) -> list[list[int] | None]:
        """This process's validation micro-batches. A sharded model gathers its weights with
        every process at each forward, so then all run the same number (None: run, discard)."""
        env = self.env
        size = self.config.micro_batch_size or self.per_rank
        parts: list[list[int] | None] = list(
            chunks(list(range(env.rank, len(self.val_data), env.world)), size))
        if self.parallel.sharded and env.world > 1:
            most = math.ceil(math.ceil(len(self.val_data) / env.world) / size)
            parts += [None] * (most - len(parts))
        return parts

    def run_evaluation(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        val = self.validate()
        if val is not None:
            metrics["val_loss"] = round(val, 5)
        if self.evaluate is None:
            return metrics
        model = self.full_model() if self.parallel.sharded else self.model
        if self.env.is_main:
            model.eval()
            with torch.no_grad():
                metrics.update(self.evaluate(model, self.state.step))
            model.train()
        return metrics

    def full_model(self, device: torch.device | str | None = None) -> CloverModel | None:
        """The whole model, unsharded, on the main process (None elsewhere), on `device` (default:
        the training device). Every process must call it: under FSDP2 it all-gathers the weights
        into CPU memory first."""
        state = self.parallel.full_state(self.model, self.env)
        if state is None:
            return None
        model = self.model if not self.parallel.sharded else full_model(state, self.model)
        return model.to(device or self.device)

    def export(self, path: str | Path, *, extra: dict[str, str] | None = None,
               dtype: torch.dtype | None = None) -> Path | None:
        """Write the trained model as a model directory (full safetensors, tokenizer, extra
        files) from the main process; every process must call it (see `full_model`)."""
        model = self.full_model(device="cpu")
        if model is None:
            return None
        return checkpoint.save(model, self.tokenizer, path, extra=extra, dtype=dtype)

    def close(self) -> None:
        """Leave the process group (every process calls it once training and export are done).

        The DDP wrapper and the optimizer go first, while the interpreter is fully alive: gloo
        work they still hold, released only at interpreter exit after the group is gone, can
        abort the process (SIGABRT, "terminate called without an active exception")."""
        self.net = self.optimizer = None
        gc.collect()
        close_distributed()

    # ---- the run ----
    def fit(self) -> dict[str, Any]:
        """Train to config.steps (or stop_after); checkpoint; return the final metrics."""
        cfg, st = self.config, self.state
        display = Display(cfg.steps, cfg.progress, self.env.is_main, start_step=st.step)
        t0, tokens0, last_eval = time.perf_counter(), st.tokens_seen, {}
        mark = t0  # wall time up to `mark` is already in st.wall_s
        with display:
            while st.step < cfg.steps:
                result = self.train_step()
                st.step += 1
                st.tokens_seen += result.tokens
                st.losses.append(result.loss)
                tok_s = (st.tokens_seen - tokens0) / max(time.perf_counter() - t0, 1e-9)
                display.update(st.step, result.loss, tok_s)
                entry = None
                if st.step % cfg.log_every == 0 or st.step == cfg.steps:
                    entry = self._log_entry(result, tok_s)
                if cfg.eval_every and st.step % cfg.eval_every == 0:
                    last_eval = self.run_evaluation()
                    entry = {**(entry or self._log_entry(result, tok_s)), **last_eval}
                if entry is not None:
                    self._log(entry, display)
                stop = cfg.stop_after is not None and st.step >= cfg.stop_after
                if (cfg.save_every and st.step % cfg.save_every == 0) or stop:
                    self.save(elapsed_since=mark)
                    mark = time.perf_counter()
                if stop:
                    return self.summary(last_eval)
        if not cfg.eval_every or st.step % cfg.eval_every:
            last_eval = self.run_evaluation()
            if last_eval:
                self._log({"step": st.step, **last_eval}, display)
        self.save(elapsed_since=mark)
        return self.summary(last_eval)

    def _log_entry(self, r: StepResult, tok_s: float) -> dict[str, Any]:
        entry = {"step": self.state.step, "loss": round(r.loss, 5), "lr": r.lr,
                 "grad_norm": round(r.grad_norm, 4), "tok_s": round(tok_s, 1),
                 "tokens_seen": self.state.tokens_seen,
                 "confident_entropy": round(r.confident_entropy, 5)}
        if r.ar_loss is not None:
            entry["ar_loss"] = round(r.ar_loss, 5)
        if r.distill_kl is not None:
            entry["distill_kl"] = round(r.distill_kl, 5)
        if r.counts_LE is not None:
            entry.update(aux=round(r.aux, 4), **load_stats(r.counts_LE),
                         moe_load=load_fractions(r.counts_LE))
        return entry

    def _log(self, entry: dict[str, Any], display: Display) -> None:
        self.state.history.append(entry)
        display.log(entry)
        if self.work_dir is not None and self.env.is_main:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            with open(self.work_dir / LOG_FILE, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def summary(self, last_eval: dict[str, Any]) -> dict[str, Any]:
        st = self.state
        tail = st.losses[-10:]
        return {"steps": st.step, "tokens_seen": st.tokens_seen, "wall_s": round(st.wall_s, 1),
                "train_loss": round(sum(tail) / len(tail), 5) if tail else None,
                "tok_s": round(st.tokens_seen / max(st.wall_s, 1e-9), 1), **last_eval}

    # ---- checkpoints ----
    def save(self, elapsed_since: float | None = None) -> Path | None:
        """Write work_dir/checkpoint atomically (format: `checkpointing`, by `parallel`)."""
        if elapsed_since is not None:
            self.state.wall_s += time.perf_counter() - elapsed_since
        if self.work_dir is None:
            return None
        state_json = json.dumps({"train_config": asdict(self.config), **asdict(self.state)},
                                indent=1)
        return checkpointing.write(self.work_dir, self.model, self.optimizer, self.tokenizer,
                                   state_json, self.env, sharded=self.parallel.sharded)

    def _resume(self) -> None:
        path = self.work_dir / CHECKPOINT_DIR
        saved = checkpointing.saved_state(path)
        if saved is None:
            if self.env.is_main:
                print(f"resume: no checkpoint in {path}; starting from step 0")
            return
        self._check_compatible(saved["train_config"], checkpoint.load_config(path))
        checkpointing.read(path, self.model, self.optimizer, self.device,
                           sharded=self.parallel.sharded)
        self.state = TrainState(**{k: saved[k] for k in asdict(TrainState())})
        if self.env.is_main:  # drop log lines written after the checkpoint (the killed tail)
            lines = "".join(json.dumps(e) + "\n" for e in self.state.history)
            (self.work_dir / LOG_FILE).write_text(lines)

    def _check_compatible(self, saved: dict[str, Any], model_config) -> None:
        """Data order and the model must match, or the resumed run is a different run."""
        for name in ("seed", "batch_size"):
            if saved[name] != getattr(self.config, name):
                raise ValueError(f"--resume: checkpoint has {name}={saved[name]}, this run "
                                 f"{getattr(self.config, name)}; use the same value or a new "
                                 "work directory")
        if model_config.to_dict() != self.model_config.to_dict():
            raise ValueError("--resume: the checkpoint's config.json differs from this model's "
                             "config; use a new work directory")
