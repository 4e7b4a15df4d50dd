"""The decoding engine: parallel denoising with commit policies, exact KV cache, batching, stats.

The public names below load on first use (PEP 562), so importing a torch-free part of the
engine, such as `clover.engine.scheduler`, does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clover.engine.llm import LLM, Engine
    from clover.engine.params import SamplingParams
    from clover.engine.policies import POLICIES
    from clover.engine.request import RequestOutput, RequestStats
    from clover.engine.stats import EngineStats

_EXPORTS: dict[str, str] = {
    "LLM": "clover.engine.llm",
    "Engine": "clover.engine.llm",
    "EngineStats": "clover.engine.stats",
    "POLICIES": "clover.engine.policies",
    "RequestOutput": "clover.engine.request",
    "RequestStats": "clover.engine.request",
    "SamplingParams": "clover.engine.params",
}

__all__ = ["LLM", "POLICIES", "Engine", "EngineStats", "RequestOutput", "RequestStats",
           "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'clover.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
