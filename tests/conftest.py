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


# ---- the OpenAI-compatible server over a tiny model (test_server*, module-scoped) --------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from clover.server.testing import TINY_MODEL, build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("models") / TINY_MODEL)


@pytest.fixture(scope="module")
def srv(model_dir):
    """A running server (max batch 4, 16 tokens by default); `srv.url` is its address."""
    from clover.server.testing import load_tiny_server, serving

    server = load_tiny_server(model_dir, max_batch=4, default_max_tokens=16)
    with serving(server) as url:
        server.url = url
        yield server


@pytest.fixture
def client(srv):
    import openai

    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def tiny_block_model():
    return build_model(get_preset("tiny"), seed=0).eval()


@pytest.fixture
def tiny_causal_model():
    return build_model(get_preset("tiny", attention="causal", block_size=1), seed=0).eval()
