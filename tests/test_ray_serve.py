"""Ray Serve replicas: `clover serve --replicas 2` answers through the same OpenAI routes as the
single-process server, spreads requests over both replicas, and answers the same text.

One Ray cluster (2 CPUs, small object store, no dashboard) on loopback for the whole module; it
is shut down at the end and the test checks that it was.
"""

import asyncio
import collections
import contextlib
import socket

import pytest

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

import openai  # noqa: E402
import torch  # noqa: E402

from clover.server import ServerConfig  # noqa: E402
from clover.server.testing import build_tiny_model_dir  # noqa: E402

PROMPTS = ["The quick brown fox", "Drone no-fly zone: radius", "Hello! How can I",
           "The weather in Paris", "Call get_weather with"]
NUM_REQUESTS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(model_dir) -> ServerConfig:
    return ServerConfig(model=str(model_dir), device="cpu", max_batch=8, default_max_tokens=12,
                        torch_threads=1, port=_free_port())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-ray")


@pytest.fixture(scope="module")
def ray_url(model_dir):
    import ray

    from clover.server import ray_serve

    ray_config = ray_serve.RayConfig(replicas=2, num_cpus=2, cpus_per_replica=1,
                                     object_store_mb=100)
    try:
        yield ray_serve.start(_config(model_dir), ray_config)
    finally:
        ray_serve.stop()
        assert not ray.is_initialized()


@pytest.fixture(scope="module")
def single_answers(model_dir):
    """The single-process server's temperature-0 answers to PROMPTS (chat and completions)."""
    from test_server import serving

    from clover.server import CloverServer

    before = torch.get_num_threads()
    server = CloverServer.load(_config(model_dir))
    try:
        with serving(server) as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            return asyncio.run(_ask_all(client, PROMPTS))
    finally:
        torch.set_num_threads(before)


async def _ask(client, prompt: str, kind: str, stream: bool) -> tuple[str, str]:
    """One request; (its answer text, the replica that answered or '' for the single server)."""
    if kind == "chat":
        messages = [{"role": "user", "content": prompt}]
        call = client.chat.completions.with_raw_response.create
        raw = await call(model="tiny-ray", messages=messages, temperature=0, stream=stream)
    else:
        call = client.completions.with_raw_response.create
        raw = await call(model="tiny-ray", prompt=prompt, temperature=0, stream=stream)
    replica = raw.headers.get("x-clover-replica", "")
    body = raw.parse()
    if not stream:
        choice = body.choices[0]
        return (choice.message.content if kind == "chat" else choice.text) or "", replica
    text = []
    async for chunk in body:
        for c in chunk.choices:
            text.append((c.delta.content if kind == "chat" else c.text) or "")
    return "".join(text), replica


async def _ask_all(client, prompts: list[str]) -> dict:
    jobs = [(p, kind) for p in prompts for kind in ("chat", "completion")]
    got = await asyncio.gather(*[_ask(client, p, kind, False) for p, kind in jobs])
    return {job: text for job, (text, _) in zip(jobs, got, strict=True)}


@pytest.mark.slow
def test_two_replicas_answer_fifty_concurrent_requests(ray_url, single_answers):
    """50 concurrent openai-client requests (chat and completions, a fifth streamed): all
    answered, both replicas served some, and every temperature-0 answer equals the single-process
    server's for the same prompt."""
    async def run():
        client = openai.AsyncOpenAI(base_url=ray_url + "/v1", api_key="unused", max_retries=0,
                                    timeout=120)
        jobs = [(PROMPTS[i % len(PROMPTS)], ("chat", "completion")[i % 2], i % 5 == 0)
                for i in range(NUM_REQUESTS)]
        return jobs, await asyncio.gather(*[_ask(client, *job) for job in jobs])

    jobs, answers = asyncio.run(run())
    per_replica = collections.Counter(replica for _, replica in answers)
    assert sum(per_replica.values()) == NUM_REQUESTS and "" not in per_replica
    assert len(per_replica) == 2 and min(per_replica.values()) >= 1, per_replica
    for (prompt, kind, stream), (text, _) in zip(jobs, answers, strict=True):
        assert text == single_answers[(prompt, kind)], (prompt, kind, stream)
    assert any(single_answers.values())  # the model does say something


@pytest.mark.slow
def test_replicas_keep_the_servers_errors(ray_url):
    """A bad request gets the single-process server's OpenAI error object and status."""
    client = openai.OpenAI(base_url=ray_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e, contextlib.closing(client):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"
