"""Shared fixtures: tiny models built in-process, never downloaded."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from clover.config import get_preset  # noqa: E402
from clover.model import build_model  # noqa: E402

# One thread: the tiny models gain nothing from a second, and when the cores are busy (other
# processes, a training run) two OpenMP threads wait on each other: the engine-vs-reference test
# took 40 s instead of 1 s with two threads on this loaded 2-core machine.
torch.set_num_threads(1)


@pytest.fixture(params=["block", "causal", "full"])
def any_mode_config(request):
    block_size = 1 if request.param == "causal" else 4
    return get_preset("tiny", attention=request.param, block_size=block_size)


@pytest.fixture
def tiny_block_model():
    return build_model(get_preset("tiny"), seed=0).eval()


@pytest.fixture
def tiny_causal_model():
    return build_model(get_preset("tiny", attention="causal", block_size=1), seed=0).eval()
