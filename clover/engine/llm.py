"""The engine loop and the `LLM` facade (vLLM-style `generate` and `chat`).

`Engine.step` is the whole decoding algorithm: schedule, run the model, propose, let the policy
choose commits, update. `LLM` loads a model (preset, directory or module), tokenizes, adds
requests, steps until they finish and returns `RequestOutput`s in input order, with stats.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clover.config import PRESETS, get_preset
from clover.engine.params import SamplingParams
from clover.engine.policies import POLICIES, Proposal
from clover.engine.request import Request, RequestOutput
from clover.engine.runner import ModelRunner, RunOutput
from clover.engine.sampler import RowSampling, propose
from clover.engine.scheduler import ScheduledBatch, Scheduler
from clover.model import CloverModel, build_model


@dataclass
class EngineStats:
    """Totals over the engine's life (reset with `reset`): where the wall time went."""

    steps: int = 0
    forwards: int = 0
    generated_tokens: int = 0
    tokens_processed: int = 0
    model_s: float = 0.0
    policy_s: float = 0.0  # sampler + policy
    grammar_s: float = 0.0  # constraint masks and frontier checks
    other_s: float = 0.0  # scheduling, tensor building, bookkeeping
    unique_experts_sum: float = 0.0
    rows_sum: int = 0

    def as_dict(self) -> dict[str, Any]:
        wall = self.model_s + self.policy_s + self.grammar_s + self.other_s
        return {"steps": self.steps, "forwards": self.forwards,
                "generated_tokens": self.generated_tokens,
                "tpf": round(self.generated_tokens / max(self.forwards, 1), 4),
                "tokens_processed_per_forward": round(self.tokens_processed
                                                      / max(self.forwards, 1), 2),
                "mean_batch_rows": round(self.rows_sum / max(self.steps, 1), 2),
                "model_s": round(self.model_s, 4), "policy_s": round(self.policy_s, 4),
                "grammar_s": round(self.grammar_s, 4), "other_s": round(self.other_s, 4),
                "overhead_share": round((wall - self.model_s) / wall, 4) if wall else 0.0,
                "unique_experts_per_forward": round(self.unique_experts_sum
                                                    / max(self.forwards, 1), 2),
                "peak_memory_bytes": peak_memory()}


def peak_memory() -> int:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def resolve_device(device: str) -> torch.device:
    """auto, cpu, cuda or cuda:N -> a torch.device; a clear error when CUDA is absent."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"--device must be auto, cpu or cuda (got {device!r})")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here; use --device cpu")
    return torch.device(device)


def _int8_activation_dtype(device: torch.device) -> torch.dtype:
    from clover.bench.quant import activation_dtype, require_torchao

    require_torchao("--dtype")
    return activation_dtype("int8", device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in names:
        raise ValueError(f"--dtype must be auto, int8 or one of {sorted(names)} (got {dtype!r})")
    return names[dtype]


class Engine:
    def __init__(self, model: CloverModel, tokenizer: Any | None = None, *,
                 max_batch_size: int = 32, max_model_len: int | None = None) -> None:
        self.model = model.eval()
        self.config = model.config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or self.config.max_seq_len
        # the cache starts small and grows (keeping its contents) as requests need more slots
        self.runner = ModelRunner(model, max_batch_size, min(self.max_model_len, 256))
        self.scheduler = Scheduler(self.config, max_batch_size, self._stop_check)
        self.stats = EngineStats()
        self.policies = {name: cls() for name, cls in POLICIES.items()}
        self._sync = self.runner.device.type == "cuda"
        self._next_id = 0

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    request_id: str | None = None) -> Request:
        if request_id is None:
            request_id, self._next_id = f"req-{self._next_id}", self._next_id + 1
        need = len(prompt_ids) + params.max_tokens
        if need > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the context length "
                             f"{self.max_model_len}")
        self.runner.ensure_capacity(need)
        r = Request(request_id, list(prompt_ids), params, self.config.mask_id)
        if params.seed is not None and params.temperature > 0:
            r.generator = torch.Generator().manual_seed(params.seed)
        if params.structured is not None:
            r.constraint = self._constraint(params.structured, len(prompt_ids))
        self.scheduler.add(r)
        return r

    def _constraint(self, structured: dict, prompt_len: int):
        if self.tokenizer is None:
            raise ValueError("structured output needs a tokenizer (load a model directory)")
        from clover.grammar import build_constraint  # the grammar backend, loaded on demand

        return build_constraint(structured, self.tokenizer, self.config, prompt_len)

    def abort(self, request_id: str) -> Request | None:
        r = self.scheduler.abort(request_id)
        if r is not None and r.row >= 0:
            self.runner.release([r.row])
        return r

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stop_ids(self, params: SamplingParams) -> set[int]:
        """Token ids that end a request: EOS plus the request's stop_token_ids."""
        return self.scheduler.stop_ids | set(params.stop_token_ids)

    def output(self, r: Request) -> RequestOutput:
        """A finished request as the caller sees it: ids up to the first stop id, text, stats."""
        ids = r.output_ids(self.stop_ids(r.params))
        text = r.text
        if text is None:
            tok = self.tokenizer
            text = tok.decode(ids, skip_special_tokens=False) if tok is not None else ""
        return RequestOutput(r.request_id, r.prompt, ids, text, r.finish_reason or "abort",
                             r.stats)

    # ---- the loop -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One denoising step for every running request; returns the ones that finished."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.rows:
            return []
        t1 = time.perf_counter()
        run = self.runner.run(batch)
        if self._sync:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        self._apply_constraints(run, batch)
        mask_s = time.perf_counter() - t2
        proposal = self._propose(run, batch)
        commit_BM = self._select(proposal, batch)
        tokens, commits = proposal.tokens_BM.tolist(), commit_BM.tolist()
        t3 = time.perf_counter()
        done = self.scheduler.update(batch, _trim(tokens, batch), _trim(commits, batch),
                                     run.unique_experts)
        self.runner.release([r.row for r in done])
        check_s, self.scheduler.constraint_s = self.scheduler.constraint_s, 0.0
        self._account(batch, run, done, sched_s=t1 - t0, model_s=t2 - t1,
                      policy_s=t3 - t2 - mask_s, update_s=time.perf_counter() - t3 - check_s,
                      grammar_s=mask_s + check_s)
        return done

    def _apply_constraints(self, run: RunOutput, batch: ScheduledBatch) -> None:
        """Let each constrained row forbid what its grammar rejects at the frontier."""
        start = 0
        for p in batch.rows:
            n = len(p.logits_at)
            if p.request.constraint is not None:
                logits_MV = run.logits_NV[start:start + n]
                p.request.constraint.mask_logits(p.request, p.masked, logits_MV)
            start += n

    def _propose(self, run: RunOutput, batch: ScheduledBatch) -> Proposal:
        rows = [RowSampling(p.request.params.temperature, p.request.params.top_p,
                            p.request.params.top_k, p.request.generator) for p in batch.rows]
        tokens_N, conf_N, ent_N = propose(run.logits_NV, run.row_of, rows, self.config.mask_id)
        B, M = len(batch.rows), max(len(p.masked) for p in batch.rows)
        index = (run.row_N, run.col_N)
        pad = lambda x, fill: torch.full((B, M), fill, dtype=x.dtype,
                                         device=x.device).index_put_(index, x)
        params = [p.request.params for p in batch.rows]
        as_t = lambda xs, dt: torch.tensor(xs, dtype=dt, device=tokens_N.device)
        steps_left = [max(q.steps_per_block - p.request.steps_in_block, 1)
                      for q, p in zip(params, batch.rows, strict=True)]
        return Proposal(pad(tokens_N, 0), pad(conf_N, 0.0), pad(ent_N, 0.0),
                        pad(torch.ones_like(tokens_N, dtype=torch.bool), False),
                        as_t([q.tau for q in params], torch.float32),
                        as_t([q.gamma for q in params], torch.float32),
                        as_t(steps_left, torch.long))

    def _select(self, p: Proposal, batch: ScheduledBatch) -> torch.Tensor:
        names = [r.request.params.policy for r in batch.rows]
        if len(set(names)) == 1:
            return self.policies[names[0]].select(p)
        commit_BM = torch.zeros_like(p.masked_BM)
        for name in set(names):
            rows = torch.tensor([i for i, n in enumerate(names) if n == name])
            sub = Proposal(*(getattr(p, f)[rows] for f in p.__dataclass_fields__))
            commit_BM[rows] = self.policies[name].select(sub)
        return commit_BM

    def _account(self, batch, run, done, sched_s, model_s, policy_s, update_s,
                 grammar_s) -> None:
        s = self.stats
        s.steps += 1
        s.forwards += 1
        s.rows_sum += len(batch.rows)
        s.tokens_processed += sum(len(p.tokens) for p in batch.rows)
        s.model_s += model_s
        s.policy_s += policy_s
        s.other_s += sched_s + update_s
        s.grammar_s += grammar_s
        s.unique_experts_sum += run.unique_experts
        s.generated_tokens += sum(r.stats.generated_tokens for r in done)

    def _stop_check(self, r: Request) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(r.seq[len(r.prompt):], skip_special_tokens=False)
        hits = [text.find(s) for s in r.params.stop if s in text]
        return text[:min(hits)] if hits else None


def _trim(rows_BM: list[list], batch: ScheduledBatch) -> list[list]:
    return [row[:len(p.masked)] for row, p in zip(rows_BM, batch.rows, strict=True)]


@dataclass
class LLM:
    """Load a model and decode with it: `LLM("models/clover-tiny").generate(["..."], params)`."""

    model: str | Path | CloverModel
    tokenizer: Any | None = None
    device: str = "auto"
    dtype: str | torch.dtype = "auto"
    max_batch_size: int = 32
    max_model_len: int | None = None
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        device = resolve_device(self.device)
        int8 = self.dtype == "int8"  # torchao weight-only int8, computing in bf16 or fp32
        dtype = _int8_activation_dtype(device) if int8 else resolve_dtype(self.dtype, device)
        if isinstance(self.model, CloverModel):
            module = self.model.to(device=device, dtype=dtype)
        elif str(self.model) in PRESETS:
            module = build_model(get_preset(str(self.model)), device=device, dtype=dtype)
        else:
            from clover.checkpoint import load
            module, tok = load(self.model, device=device, dtype=dtype)
            self.tokenizer = self.tokenizer or tok
        if int8:
            from clover.bench.quant import quantize_int8
            quantize_int8(module)
        self.model = module
        self.engine = Engine(module, self.tokenizer, max_batch_size=self.max_batch_size,
                             max_model_len=self.max_model_len)

    @property
    def config(self):
        return self.engine.config

    def generate(self, prompts: str | list[str] | list[int] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Decode every prompt (text or token ids) as one batch; outputs in input order."""
        ids = self._prompt_ids(prompts)
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(ids)
        params_list = params
        if len(params_list) != len(ids):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(ids)} prompts")
        requests = [self.engine.add_request(p, q) for p, q in zip(ids, params_list, strict=True)]
        while self.engine.has_unfinished():
            self.engine.step()
        return [self.output(r) for r in requests]

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """Render conversations with the chat template, decode, parse tool calls."""
        from clover.tokenizer import parse_tool_calls, render_chat

        self._need_tokenizer()
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [render_chat(self.tokenizer, c, tools=tools) for c in convs]
        outputs = self.generate([self.tokenizer.encode(p) for p in prompts], params)
        for out in outputs:
            parsed = parse_tool_calls(out.text)
            out.tool_calls, out.content = parsed.tool_calls, parsed.content
            out.errors = parsed.errors
            if parsed.tool_calls and out.finish_reason == "stop":
                out.finish_reason = "tool_calls"
        return outputs

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids, or load a model "
                             "directory that includes tokenizer.json")

    def _prompt_ids(self, prompts) -> list[list[int]]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts is empty")
        if isinstance(prompts[0], str):
            self._need_tokenizer()
            return [self.tokenizer.encode(p) for p in prompts]
        return [list(p) for p in prompts]

    def output(self, r: Request) -> RequestOutput:
        """The caller's view of a finished request."""
        return self.engine.output(r)
