"""`clover serve --model <converted LLaDA2 checkpoint>` answers the openai client with a tool call.

A tiny checkpoint in the published LLaDA2 layout (BailingMoeV2 keys, sharded, with a tokenizer
whose chat template renders tools) is converted with `clover convert`, served by the real CLI in
a subprocess on a loopback port, and asked with `tool_choice="required"`: the tool grammar keeps
the random weights to a valid call, which comes back parsed as OpenAI `tool_calls`.
"""

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from llada2_layout import random_llada2_tensors, tiny_llada2_config

from clover.checkpoint import load_config
from clover.checkpoint.hf_files import write_hf_dir
from clover.server.testing import SAMPLE_TEXTS
from clover.tokenizer import save_tokenizer, train_tokenizer

pytestmark = pytest.mark.slow  # two CLI subprocesses (convert, serve): ~35 s

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}}}}


def llada2_source(path):
    """Tiny LLaDA2 checkpoint (published block size 32) with a 512-token tokenizer."""
    tok = train_tokenizer(SAMPLE_TEXTS * 20, vocab_size=512)
    config = tiny_llada2_config(vocab_size=512, pad_token_id=tok.pad_token_id,
                                eos_token_id=tok.eos_token_id, mask_token_id=tok.mask_token_id,
                                block_size=32)
    tensors = random_llada2_tensors(config)
    tensors["lm_head.weight"] *= 6.0  # confident greedy choices, as in the server tests
    write_hf_dir(path, config, tensors, shards=2)
    save_tokenizer(tok, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "clover.cli", *args], env=env, **kw)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("llada2")
    src, dst = llada2_source(root / "hf"), root / "clover"
    assert run_cli("convert", str(src), str(dst)).wait(900) == 0  # generous: shared CPUs
    port = free_port()
    proc = run_cli("serve", "--model", str(dst), "--port", str(port), "--device", "cpu",
                   "--torch-threads", "1", "--log-level", "warning",
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900  # generous: the machine may be shared
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield url, dst
    finally:
        proc.terminate()
        proc.wait(20)


def test_converted_llada2_keeps_its_block_diffusion_config(served):
    _, dst = served
    cfg = load_config(dst)
    assert (cfg.attention, cfg.block_size, cfg.router, cfg.num_expert_groups) == (
        "block", 32, "sigmoid", 4)


def test_serve_answers_a_required_tool_call(served):
    url, _ = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    r = client.chat.completions.create(
        model="clover", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        max_tokens=160, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
