"""SamplingParams: everything a request says about how to decode it, validated up front.

Field names follow vLLM / the OpenAI API where they exist; the diffusion knobs (policy, tau,
steps per block, gamma, block size, cache mode) sit beside them. Errors name the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

CACHE_MODES = ("none", "prefix", "dual")


@dataclass(kw_only=True)
class SamplingParams:
    n: int = 1  # LLM.generate: outputs per prompt (rows of the same prompt in one batch)
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # keep decoding after EOS (the EOS block is still EOS-filled)
    policy: str = "threshold"
    tau: float = 0.9  # threshold policy: commit every position with confidence >= tau
    steps_per_block: int = 8  # topk policy: denoising steps per block
    gamma: float = 0.5  # entropy / entropy_bound policies: summed-entropy budget per step (nats)
    # Uniform-canvas models (DiffusionGemma; policy entropy_bound): `steps_per_block` is the most
    # denoising steps a block takes; step k of N (k counting down N..1) samples at temperature
    # min_temperature + (temperature - min_temperature) * k / N (None: constant temperature);
    # a block ends early once its argmax canvas has not changed for `stable_steps` steps and its
    # mean entropy is below `stop_entropy`.
    min_temperature: float | None = None
    stable_steps: int = 1
    stop_entropy: float = 0.005
    block_size: int | None = None  # override for `full` models (block/causal use their own)
    cache: str = "dual"  # `full` models: none | prefix | dual
    refresh_every: int = 0  # `full` models: recompute the whole canvas every N steps (0: per block)
    # Structured output, one key: {"json_schema": {...}} | {"json_object": True} | {"regex": "..."}
    # | {"lark": "..."} | {"tools": [...], "tool_choice": "auto"|"required"|{"name": ...}}
    structured: dict | None = None
    # Log-probabilities of the committed tokens (see clover/engine/logprobs.py): None for none,
    # k >= 0 for the chosen token's plus the k most likely at its position.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        from clover.engine.policies import POLICIES

        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            (self.n >= 1, "n", "must be >= 1"),
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (self.seed is None or -2**63 <= self.seed < 2**64, "seed",
             "must be in [-2**63, 2**64)"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]"),
            (self.temperature >= 0, "temperature", "must be >= 0"),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0, "top_k", "must be >= 0"),
            (self.policy in POLICIES, "policy", f"must be one of {sorted(POLICIES)}"),
            (0 < self.tau <= 1, "tau", "must be in (0, 1]"),
            (self.steps_per_block >= 1, "steps_per_block", "must be >= 1"),
            (self.gamma >= 0, "gamma", "must be >= 0"),
            (self.min_temperature is None or 0 <= self.min_temperature < self.temperature,
             "min_temperature", "must be in [0, temperature)"),
            (self.stable_steps >= 0, "stable_steps", "must be >= 0"),
            (self.stop_entropy > 0, "stop_entropy", "must be > 0"),
            (self.block_size is None or self.block_size >= 1, "block_size", "must be >= 1"),
            (self.cache in CACHE_MODES, "cache", f"must be one of {CACHE_MODES}"),
            (self.refresh_every >= 0, "refresh_every", "must be >= 0"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings"),
            (self.structured is None or isinstance(self.structured, dict), "structured",
             "must be a dict such as {'json_schema': {...}}"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {why} (got {getattr(self, name)!r})")

    def replace(self, **changes) -> SamplingParams:
        return dataclasses.replace(self, **changes)
