"""The engine loop and the `LLM` facade (vLLM-style `generate` and `chat`).

`Engine.step` is the whole decoding algorithm: schedule, run the model, propose, let the policy
choose commits, update. `LLM` loads a model (preset, directory or module), tokenizes, adds
requests, steps until they finish and returns `RequestOutput`s in input order, with stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clover.config import PRESETS, get_preset
from clover.engine.logprobs import output_logprobs, record_logprobs, wants_logprobs
from clover.engine.params import SamplingParams
from clover.engine.policies import ENTROPY_POLICIES, POLICIES, UNIFORM_POLICIES, Proposal
from clover.engine.prefix_cache import PrefixCache
from clover.engine.request import CompletionOutput, Request, RequestOutput
from clover.engine.runner import ModelRunner, RunOutput
from clover.engine.sampler import RowSampling, propose, propose_uniform, schedule_temperature
from clover.engine.scheduler import CanvasStep, ScheduledBatch, Scheduler
from clover.engine.stats import EngineStats, StepClock
from clover.model import CloverModel, build_model


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
                 max_batch_size: int = 32, max_model_len: int | None = None,
                 prefix_cache_mb: float = 256.0, compile: bool = False) -> None:
        self.model = model.eval()
        self.config = model.config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or self.config.max_seq_len
        # the cache starts small and grows (keeping its contents) as requests need more slots
        self.runner = ModelRunner(model, max_batch_size, min(self.max_model_len, 256), compile)
        # keys and values of prompt heads that earlier requests computed (0 MB: off)
        self.prefix_cache = PrefixCache(self.config, prefix_cache_mb)
        self.uniform = self.config.canvas == "uniform"  # DiffusionGemma-style canvases
        self.scheduler = Scheduler(self.config, max_batch_size, self._stop_check, self._verify,
                                   self._load_prefix, self._draw_canvas)
        self.stats = EngineStats()
        self.policies = {name: cls() for name, cls in POLICIES.items()}
        self.clock = StepClock(torch.cuda.synchronize if self.runner.device.type == "cuda"
                               else None)
        self._next_id = 0

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, constraint: Any = None) -> Request:
        """Queue a request. `constraint`: one already built for `params.structured` (the
        server compiles grammars off this thread); None builds it here when needed."""
        if request_id is None:
            request_id, self._next_id = f"req-{self._next_id}", self._next_id + 1
        need = len(prompt_ids) + params.max_tokens
        if need > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the context length "
                             f"{self.max_model_len}")
        params = self._canvas_params(params)
        canvas = self.config.block_size if self.config.attention == "canvas" else 0
        self.runner.ensure_capacity(need + canvas)  # a last canvas is whole, even past max_tokens
        r = Request(request_id, list(prompt_ids), params, self.config.mask_id,
                    uniform=self.uniform)
        if params.seed is not None and params.temperature > 0:
            r.generator = torch.Generator().manual_seed(params.seed)
        if constraint is not None:
            r.constraint = constraint
        elif params.structured is not None:
            r.constraint = self._constraint(params.structured, len(prompt_ids))
        self.scheduler.add(r)
        return r

    def _canvas_params(self, params: SamplingParams) -> SamplingParams:
        """A uniform-canvas model decodes with `entropy_bound` (any other policy is replaced);
        a mask-canvas model cannot; grammars and log-probabilities need committed tokens."""
        if not self.uniform:
            if params.policy in UNIFORM_POLICIES:
                raise ValueError(f"policy {params.policy!r} needs a uniform-canvas model "
                                 "(DiffusionGemma); this one masks")
            return params
        if params.structured is not None or params.logprobs is not None:
            raise ValueError("structured output and logprobs are not supported on a "
                             "uniform-canvas model (DiffusionGemma)")
        return params if params.policy in UNIFORM_POLICIES else params.replace(
            policy=UNIFORM_POLICIES[0])

    def _draw_canvas(self, r: Request, n: int) -> list[int]:
        """n tokens drawn uniformly from the vocabulary (the request's generator if seeded)."""
        return torch.randint(0, self.config.vocab_size, (n,), generator=r.generator).tolist()

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
        """A finished request as the caller sees it: ids up to the first stop id (or up to the
        token that completes a stop string, which also sets the generated-token count), text,
        stats and, when asked for, the log-probabilities of those ids."""
        ids = r.output_ids(self.stop_ids(r.params))
        text = r.text
        if text is None:
            tok = self.tokenizer
            text = tok.decode(ids, skip_special_tokens=False) if tok is not None else ""
        else:  # cut at a stop string: positions decoded past it are not part of the answer
            ids = self._through_stop_string(ids, len(text))
            r.stats.generated_tokens = len(ids)
        logprobs = output_logprobs(r, len(ids)) if r.params.logprobs is not None else None
        return RequestOutput(r.request_id, r.prompt, ids, text, r.finish_reason or "abort",
                             r.stats, logprobs=logprobs)

    def _through_stop_string(self, ids: list[int], kept_chars: int) -> list[int]:
        """The shortest head of `ids` whose text runs past the `kept_chars` kept before the
        stop string: the tokens up to the one where the stop string starts."""
        for k in range(len(ids) + 1):
            if len(self.tokenizer.decode(ids[:k], skip_special_tokens=False)) > kept_chars:
                return ids[:k]
        return ids

    # ---- the loop -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One denoising step for every running request; returns the ones that finished.

        DESIGN.md's five lines; each `lap` files the time since the previous one under a part of
        the stats, and `_record` collects the step's stats in one place.
        """
        self.clock.start()
        batch = self.scheduler.schedule()
        if not batch.rows:
            return []
        self.clock.lap("other_s")
        run = self.runner.run(batch)
        self._store_prefixes(batch)
        self.clock.lap("model_s", sync=True)
        if any(p.request.constraint is not None for p in batch.rows):
            self._mask_logits(run, batch)
            self.clock.lap("grammar_s")  # none without a grammar: exactly 0 unconstrained
        proposal = self._propose(run, batch)
        commit_BM = self._select(proposal, batch)
        if wants_logprobs(batch):
            record_logprobs(run.logits_NV, run.row_N, run.col_N, proposal.tokens_BM, commit_BM,
                            batch)
        tokens = _by_row(proposal.tokens_BM.tolist(), batch)
        commits = _by_row(commit_BM.tolist(), batch)
        canvas = self._canvas_steps(proposal, batch, tokens, commits) if self.uniform else None
        self.clock.lap("policy_s")
        done = self.scheduler.update(batch, tokens, commits, run.unique_experts, canvas)
        self.runner.release([r.row for r in done])
        self._record(batch, run, done)
        return done

    def _load_prefix(self, r: Request) -> None:
        """A newly admitted request starts with the longest cached head of its prompt."""
        r.cache_len = self.prefix_cache.load(r.prompt, self.runner.cache, r.row)

    def _store_prefixes(self, batch: ScheduledBatch) -> None:
        """After a request's first forward its prompt is in the exact cache: keep its chunks."""
        for p in batch.rows:
            r = p.request
            if not r.prefix_stored and p.commit_len is not None:
                self.prefix_cache.store(r.prompt, self.runner.cache, r.row, p.commit_len)
                r.prefix_stored = True

    def _mask_logits(self, run: RunOutput, batch: ScheduledBatch) -> None:
        """Let each constrained row forbid what its grammar rejects at the frontier."""
        start = 0
        for p in batch.rows:
            n = len(p.logits_at)
            if p.request.constraint is not None:
                logits_MV = run.logits_NV[start:start + n]
                p.request.constraint.mask_logits(p.request, p.masked, logits_MV)
            start += n

    def _propose(self, run: RunOutput, batch: ScheduledBatch) -> Proposal:
        """The sampler's proposals laid out [B, M] by row, with each row's policy knobs."""
        if self.uniform:
            return self._propose_uniform(run, batch)
        params = [p.request.params for p in batch.rows]
        rows = [RowSampling(q.temperature, q.top_p, q.top_k, p.request.generator)
                for q, p in zip(params, batch.rows, strict=True)]
        entropy = any(q.policy in ENTROPY_POLICIES for q in params)
        tokens_N, conf_N, ent_N = propose(run.logits_NV, run.row_of, rows, self.config.mask_id,
                                          entropy)
        return self._proposal(run, batch, tokens_N, conf_N, ent_N)

    def _propose_uniform(self, run: RunOutput, batch: ScheduledBatch) -> Proposal:
        """Uniform canvases: a draw for every position at the step's scheduled temperature; the
        argmax rides along as the confidence slot's companion (`argmax_BM`), and the processed
        logits become each row's self-conditioning input for its next step."""
        temps = [schedule_temperature(p.request.params.temperature,
                                      p.request.params.min_temperature,
                                      p.request.params.steps_per_block, p.request.steps_in_block)
                 for p in batch.rows]
        sampled_N, argmax_N, ent_N, processed_NV = propose_uniform(
            run.logits_NV, run.row_of, temps, [p.request.generator for p in batch.rows])
        self.runner.set_soft(batch, processed_NV)
        proposal = self._proposal(run, batch, sampled_N, torch.ones_like(ent_N), ent_N)
        proposal.argmax_BM = run.by_row(argmax_N, 0)
        return proposal

    def _canvas_steps(self, proposal: Proposal, batch: ScheduledBatch, tokens: list[list[int]],
                      accepts: list[list[bool]]) -> list[CanvasStep]:
        """Each row's next draft: accepted draws kept, every other position redrawn uniformly
        (in row order, after the step's sampling, as transformers draws them)."""
        argmax = _by_row(proposal.argmax_BM.tolist(), batch)
        ent_B = (proposal.entropy_BM * proposal.masked_BM).sum(-1) / proposal.masked_BM.sum(-1)
        steps = []
        for i, p in enumerate(batch.rows):
            noise = self._draw_canvas(p.request, len(tokens[i]))
            draft = [t if a else n for t, a, n in zip(tokens[i], accepts[i], noise, strict=True)]
            steps.append(CanvasStep(draft, argmax[i], float(ent_B[i])))
        return steps

    def _proposal(self, run: RunOutput, batch: ScheduledBatch, tokens_N, conf_N,
                  ent_N) -> Proposal:
        params = [p.request.params for p in batch.rows]
        steps_left = [max(q.steps_per_block - p.request.steps_in_block, 1)
                      for q, p in zip(params, batch.rows, strict=True)]
        per_row = self.runner.per_row
        left = Proposal.left_masked([q.policy for q in params], [p.masked for p in batch.rows],
                                    run.masked_BM.shape[1])
        return Proposal(run.by_row(tokens_N, 0), run.by_row(conf_N, 0.0), run.by_row(ent_N, 0.0),
                        run.masked_BM, per_row([q.tau for q in params], torch.float32),
                        per_row([q.gamma for q in params], torch.float32),
                        per_row(steps_left, torch.long),
                        left_masked_BM=None if left is None else per_row(left, torch.bool))

    def _select(self, p: Proposal, batch: ScheduledBatch) -> torch.Tensor:
        """Each row's commits, chosen by the policy the row's request asked for."""
        names = [r.request.params.policy for r in batch.rows]
        if len(set(names)) == 1:
            return self.policies[names[0]].select(p)
        commit_BM = torch.zeros_like(p.masked_BM)
        for name in set(names):
            rows = [i for i, n in enumerate(names) if n == name]
            commit_BM[rows] = self.policies[name].select(p.take(rows))
        return commit_BM

    def _verify(self, r: Request) -> None:
        """The scheduler's grammar check of a row's commits, timed as grammar work."""
        self.clock.lap("other_s")
        r.constraint.after_commit(r)
        self.clock.lap("grammar_s")

    def _record(self, batch: ScheduledBatch, run: RunOutput, done: list[Request]) -> None:
        self.clock.lap("other_s")
        self.stats.add_step(rows=len(batch.rows),
                            tokens_processed=sum(len(p.tokens) for p in batch.rows),
                            unique_experts=run.unique_experts,
                            generated_tokens=sum(r.stats.generated_tokens for r in done),
                            laps=self.clock.laps)

    def _stop_check(self, r: Request) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(r.seq[len(r.prompt):], skip_special_tokens=False)
        hits = [text.find(s) for s in r.params.stop if s in text]
        return text[:min(hits)] if hits else None


def with_tool_calls(out: RequestOutput) -> None:
    """Fill a chat output's content / tool_calls / errors from its text; a stop that ends on
    tool calls becomes finish reason `tool_calls`."""
    from clover.tokenizer import parse_tool_calls

    parsed = parse_tool_calls(out.text)
    out.tool_calls, out.content, out.errors = parsed.tool_calls, parsed.content, parsed.errors
    if parsed.tool_calls and out.finish_reason == "stop":
        out.finish_reason = "tool_calls"
        if getattr(out, "outputs", None):
            out.outputs[0].finish_reason = "tool_calls"


def _nth(params: SamplingParams, i: int) -> SamplingParams:
    """The params of the i-th of n sequences: the seed moves on by i so samples differ."""
    if i == 0 or params.seed is None:
        return params
    return params.replace(seed=(params.seed + i) % 2**64)


def _dict_prompt(prompt: dict) -> str | list[int]:
    """vLLM's TextPrompt / TokensPrompt dicts -> text or ids."""
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError('a dict prompt needs "prompt" or "prompt_token_ids"')


def _by_row(rows_BM: list[list], batch: ScheduledBatch) -> list[list]:
    """[B, M] as lists, each row cut to its own masked positions."""
    return [row[:len(p.masked)] for row, p in zip(rows_BM, batch.rows, strict=True)]


@dataclass
class LLM:
    """Load a model and decode with it: `LLM("models/clover-smol").generate(["..."], params)`."""

    model: str | Path | CloverModel
    tokenizer: Any | None = None
    device: str = "auto"
    dtype: str | torch.dtype = "auto"
    max_batch_size: int = 32
    max_model_len: int | None = None
    prefix_cache_mb: float = 256.0  # keys and values of shared prompt heads, reused (0: off)
    compile: bool = False  # cached forwards as one compiled graph (clover/model/compiled.py)
    draft: Any = None  # a drafter adapter dir (or a loaded RoutedPair): self-speculative, greedy
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        device = resolve_device(self.device)
        int8 = self.dtype == "int8"  # torchao weight-only int8, computing in bf16 or fp32
        dtype = _int8_activation_dtype(device) if int8 else resolve_dtype(self.dtype, device)
        if self.draft is not None:  # the AR model checks the drafter's tokens
            from clover.engine.spec_engine import load_spec_engine
            self.engine = load_spec_engine(self, device, dtype, int8)  # sets model, tokenizer
            return
        if isinstance(self.model, torch.nn.Module):  # CloverModel, or a DiffusionGemmaModel
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
                             max_model_len=self.max_model_len, prefix_cache_mb=self.prefix_cache_mb,
                             compile=self.compile)

    @property
    def config(self):
        return self.engine.config

    def generate(self, prompts: str | list[str] | list[int] | list[list[int]] | list[dict],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Decode every prompt (text, token ids, or vLLM's {"prompt": ...} /
        {"prompt_token_ids": ...} dicts) as one batch; outputs in input order. `sampling_params`
        (vLLM's name; `params` is the same) is one for all prompts or one per prompt. With
        n > 1, a prompt's n sequences run as n rows of the batch (seeded ones with seed,
        seed + 1, ...) and come back in `outputs`."""
        ids = self._prompt_ids(prompts)
        chosen = sampling_params if sampling_params is not None else params
        if not isinstance(chosen, list):
            chosen = [chosen or SamplingParams()] * len(ids)
        if len(chosen) != len(ids):
            raise ValueError(f"got {len(chosen)} SamplingParams for {len(ids)} prompts")
        requests = [[self.engine.add_request(p, _nth(q, i)) for i in range(q.n)]
                    for p, q in zip(ids, chosen, strict=True)]
        while self.engine.has_unfinished():
            self.engine.step()
        texts = prompts if isinstance(prompts, list) else [prompts]
        return [self._grouped(rows, texts[i] if i < len(texts) else None)
                for i, rows in enumerate(requests)]

    def _grouped(self, rows: list[Request], prompt: Any) -> RequestOutput:
        outs = [self.output(r) for r in rows]
        first = outs[0]
        first.outputs = [CompletionOutput(i, o.text, o.token_ids, o.finish_reason, o.logprobs)
                         for i, o in enumerate(outs)]
        first.prompt = prompt if isinstance(prompt, str) else (
            prompt.get("prompt") if isinstance(prompt, dict) else None)
        return first

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """Render conversations with the chat template, decode, parse tool calls."""
        from clover.tokenizer import render_chat

        self._need_tokenizer()
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [render_chat(self.tokenizer, c, tools=tools) for c in convs]
        outputs = self.generate([self.tokenizer.encode(p) for p in prompts], params)
        for out in outputs:
            with_tool_calls(out)
        return outputs

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids, or load a model "
                             "directory that includes tokenizer.json")

    def _prompt_ids(self, prompts) -> list[list[int]]:
        if isinstance(prompts, str | dict) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts is empty")
        if isinstance(prompts[0], dict):
            prompts = [_dict_prompt(p) for p in prompts]
        if any(isinstance(p, str) for p in prompts):
            self._need_tokenizer()
        return [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]

    def output(self, r: Request) -> RequestOutput:
        """The caller's view of a finished request."""
        return self.engine.output(r)
