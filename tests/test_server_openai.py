"""What OpenAI and vLLM users expect of the server, over real HTTP with the official client:
system messages and tools reach the model, `strict` is honoured, `n` choices, `logprobs`,
exact usage, seeded sampling, the default temperature, Prometheus metrics, and the packaging
that makes `.[serve]` a working server.
"""

import ast
import json
import re
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_server import HELLO, MODEL, WEATHER, scripted

from clover.tokenizer import CHAT_TEMPLATE

ROOT = Path(__file__).resolve().parents[1]


# ---- the prompt the model sees ------------------------------------------------------------------
def test_system_message_and_tools_reach_the_model(srv, client, monkeypatch):
    """The chat template renders the system message and each tool's schema into the prompt the
    engine receives (the shipped template used to drop both)."""
    assert srv.planner.tokenizer.chat_template == CHAT_TEMPLATE
    seen = []
    real = srv.engine.add_request
    monkeypatch.setattr(srv.engine, "add_request",
                        lambda ids, *a, **kw: seen.append(ids) or real(ids, *a, **kw))
    system = "You are a terse weather bot."
    client.chat.completions.create(model=MODEL, max_tokens=2, tools=[WEATHER], messages=[
        {"role": "system", "content": system}] + HELLO)
    prompt = srv.tokenizer.decode(seen[0], skip_special_tokens=False)
    assert system in prompt and HELLO[0]["content"] in prompt
    assert '"name": "get_weather"' in prompt and "Current weather in a city" in prompt


# ---- strict -------------------------------------------------------------------------------------
def test_strict_tool_schema_closes_objects(srv, client):
    """A model rigged to add a key the tool does not declare: without strict the key comes
    through; with strict: true the grammar closes the object and the key never appears."""
    if srv.grammar is None:
        pytest.skip("no grammar backend (clover.grammar)")
    extra = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "zz": 1}}</tool_call>'

    def ask(strict: bool) -> dict:
        tool = json.loads(json.dumps(WEATHER))
        tool["function"]["strict"] = strict
        with scripted(srv, HELLO, extra, tools=[tool]):
            r = client.chat.completions.create(model=MODEL, messages=HELLO, tools=[tool],
                                               tool_choice="required", max_tokens=48)
        return json.loads(r.choices[0].message.tool_calls[0].function.arguments)

    assert ask(False) == {"city": "Oslo", "zz": 1}
    strict = ask(True)  # the rigged `", "zz"` cannot follow, so the string runs on a little
    assert set(strict) == {"city"} and strict["city"].startswith("Oslo")


# ---- n, logprobs, usage -------------------------------------------------------------------------
def test_n_choices_plain_and_streamed(client):
    """n rows of the same prompt: n choices (seeded samples differ per choice), usage counts the
    prompt once and every choice's tokens; a stream interleaves chunks of each index."""
    kw = {"model": MODEL, "prompt": "The quick", "max_tokens": 12, "temperature": 2.0,
          "seed": 3, "n": 3}
    r = client.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1
    assert r.usage.prompt_tokens == client.completions.create(
        **(kw | {"n": 1})).usage.prompt_tokens
    scored = client.completions.create(**kw, logprobs=0)  # one logprob per answer token
    assert scored.usage.completion_tokens == sum(
        len(c.logprobs.tokens) + (c.finish_reason == "stop") for c in scored.choices)  # + EOS
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices and
                        c.choices[0].index == i) for i in range(3)}
    assert texts == {c.index: c.text for c in r.choices}
    finished = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1, 2] and chunks[-1].usage == r.usage


def test_chat_logprobs_cover_every_token(client):
    """logprobs: one entry per completion token (its log-probability when committed, <= 0) with
    top_logprobs alternatives; streamed entries join to the same tokens."""
    kw = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 0,
          "logprobs": True, "top_logprobs": 2}
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content)
    assert all(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in content)
    assert "".join(e.token for e in content) == r.choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e.token for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert streamed == [e.token for e in content]


def test_usage_stops_at_the_stop_string(srv, client):
    """completion_tokens counts the tokens up to the stop string, not the positions the
    diffusion decoder filled after it in the same block."""
    answer = "It is sunny in Paris, sunny all day."
    tok = srv.tokenizer
    ids = tok.encode(answer)
    kept = next(k for k in range(len(ids) + 1) if len(tok.decode(ids[:k])) > len("It is "))
    with scripted(srv, HELLO, answer):
        r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40,
                                           stop=["sunny"])
    assert r.choices[0].message.content == "It is "
    assert r.usage.completion_tokens == kept < len(ids)


# ---- sampling -----------------------------------------------------------------------------------
def test_seeded_sampling_is_reproducible_and_the_seed_matters(client):
    """The same seed gives the same sample; different seeds give different ones (so a server
    that ignored the seed, drawing from one global generator, would fail both ways)."""
    ask = lambda seed: client.completions.create(model=MODEL, prompt="The quick", max_tokens=16,
                                                 temperature=2.0, seed=seed).choices[0].text
    assert ask(7) == ask(7) == ask(7)
    assert len({ask(s) for s in range(1, 6)}) > 1


def test_default_temperature_follows_openai(model_dir):
    """A request that names no temperature samples at 1.0 as OpenAI and vLLM do; the flag
    --default-temperature changes it."""
    from clover.server import CloverServer, ServerConfig

    body = json.dumps({"model": MODEL, "prompt": "Hi"}).encode()
    for default in (None, 0.0):
        extra = {} if default is None else {"default_temperature": default}
        server = CloverServer.load(ServerConfig(model=str(model_dir), device="cpu", **extra))
        try:
            assert server.planner.plan("completion", body).params.temperature == (
                1.0 if default is None else 0.0)
        finally:
            server.close()


# ---- metrics and packaging ----------------------------------------------------------------------
def test_metrics_are_prometheus_with_a_model_label(srv, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    text = __import__("httpx").get(srv.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("clover_http_requests", "clover_generation_tokens", "clover_tokens_per_second",
                 "clover_queue_depth", "clover_request_latency_seconds",
                 "process_resident_memory_bytes", "clover_grammar_compile_seconds"):
        assert name in families, name
    samples = families["clover_generation_tokens"].samples
    assert samples and all(s.labels["model"] == MODEL for s in samples)
    assert sum(s.value for s in samples if s.name.endswith("_total")) > 0



def test_a_shared_system_prompt_is_served_from_the_prefix_cache(srv, client):
    """Two chats behind the same long system prompt: the second reuses its keys and values,
    answers as a server without the cache does, and /metrics counts the reused tokens."""
    import httpx

    def hits():
        text = httpx.get(srv.url + "/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        return families["clover_prefix_cache_hit_tokens"].samples[0].value

    system = {"role": "system", "content": " ".join(f"rule {i}: be brief." for i in range(20))}
    ask = [system, {"role": "user", "content": "Hello there"}]
    before = hits()
    first = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=6)
    second = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=6)
    assert hits() - before >= 64
    assert second.choices[0].message.content == first.choices[0].message.content

# features with their own extra, imported only when used: Ray Serve replicas (`.[ray]`)
OTHER_EXTRAS = {"ray"}


def _third_party_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in __import__("sys").stdlib_module_names
            and n not in ("clover", "__future__")}


def test_serve_extra_declares_what_the_server_imports():
    """`pip install .[serve]` must give a working server: every third-party module that
    clover/server and clover/grammar import belongs to a core dependency or the serve extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(d) for d in project["dependencies"]
                + project["optional-dependencies"]["serve"]}
    declared |= {_name(r) for d in list(declared) for r in _requires(d)}  # e.g. starlette
    dists = packages_distributions()
    for folder in ("server", "grammar"):
        for module in _third_party_imports(ROOT / "clover" / folder) - OTHER_EXTRAS:
            owners = {_name(d) for d in dists.get(module, [module])}
            assert owners & declared, f"clover/{folder} imports {module}, not in [serve]"


def _name(requirement: str) -> str:
    return re.split(r"[\s;\[<>=!~]", requirement.strip(), maxsplit=1)[0].lower().replace(
        "_", "-")


def _requires(dist: str) -> list[str]:
    """What `dist` itself installs (so fastapi's starlette counts as declared)."""
    try:
        return [r for r in requires(dist) or [] if "extra ==" not in r]
    except PackageNotFoundError:
        return []
