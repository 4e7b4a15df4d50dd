"""The decoding engine: parallel denoising with commit policies, exact KV cache, batching, stats."""

from clover.engine.llm import LLM, Engine, EngineStats
from clover.engine.params import SamplingParams
from clover.engine.policies import POLICIES
from clover.engine.request import RequestOutput, RequestStats

__all__ = ["LLM", "POLICIES", "Engine", "EngineStats", "RequestOutput", "RequestStats",
           "SamplingParams"]
