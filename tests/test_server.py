"""The OpenAI-compatible server, end to end: a real uvicorn server on a loopback port, driven by
the official `openai` client and by raw HTTP (httpx) for every class of bad input.

The model is the random `tiny` preset with a trained 512-token tokenizer; `ScriptedModel` rigs
its output layer where a test needs an exact answer (a tool call), so the real engine, parser and
response builder produce it.
"""

import contextlib
import copy
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
import torch

from clover.server.testing import (
    TINY_MODEL,
    build_tiny_model_dir,
    load_tiny_server,
    serving,
)
from clover.tasks.airspace.contract import strict_tools
from clover.tasks.airspace.tools import format_call
from clover.tokenizer import render_chat

MODEL = TINY_MODEL
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HELLO = [{"role": "user", "content": "Hello! How can I help you today?"}]
ERROR_KEYS = {"message", "type", "param", "code"}


_load = load_tiny_server


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model is fastest on one thread, and the engine thread shares 2 cores with HTTP."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


@contextlib.contextmanager
def scripted(srv, messages, answer, tools=None, prefix=""):
    """Make the model answer `answer` (then EOS) to `messages`."""
    tok = srv.tokenizer
    prompt = tok.encode(render_chat(tok, messages, tools=tools) + prefix)
    ids = tok.encode(answer) + [tok.eos_token_id]
    model = srv.engine.model
    model.script = {len(prompt) + k: t for k, t in enumerate(ids)}
    try:
        yield
    finally:
        model.script = {}


def _sse_events(response) -> list[dict]:
    lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


# ---- the happy paths, with the official client ---------------------------------------------------
def test_models_lists_the_served_model(client):
    """GET /v1/models through the client: one model, named after the directory."""
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_completion_has_the_openai_shape(client):
    """A plain chat completion parses in the client with ids, usage and a finish reason."""
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    assert r.system_fingerprint and r.created > 0
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_diffusion_knobs_pass_through_extra_body(client):
    """policy / tau / steps_per_block ride in extra_body; a bad value is a 400 naming it."""
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                       extra_body={"policy": "topk", "steps_per_block": 2})
    assert r.model_extra["clover"]["forwards"] <= 8
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, extra_body={"tau": 2.0})
    assert e.value.body["param"] == "tau"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_concatenates_to_the_non_streamed_answer(client, kind):
    """At temperature 0 the streamed deltas join to exactly the non-streamed text, the last chunk
    carries the finish reason, and include_usage adds the same usage."""
    common = {"model": MODEL, "max_tokens": 24, "temperature": 0}
    if kind == "completion":
        create, common = client.completions.create, common | {"prompt": "The quick brown"}
        text_of = lambda r: r.choices[0].text
        delta_of = lambda c: c.choices[0].text
    else:
        create, common = client.chat.completions.create, common | {"messages": HELLO}
        text_of = lambda r: r.choices[0].message.content
        delta_of = lambda c: c.choices[0].delta.content
    full = create(**common)
    chunks = list(create(**common, stream=True, stream_options={"include_usage": True}))
    pieces = [delta_of(c) or "" for c in chunks if c.choices]
    assert "".join(pieces) == text_of(full)
    assert len([p for p in pieces if p]) >= 2, "text should arrive in several steps"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage


def test_provisional_draft_is_streamed_apart_from_content(http, client):
    """stream_options.provisional adds `clover_provisional` drafts; delta.content stays settled
    text only, so it still joins to the non-streamed answer."""
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 24, "tau": 0.999}
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24,
                                          extra_body={"tau": 0.999}).choices[0].message.content
    with http.stream("POST", "/v1/chat/completions", json=body | {
            "stream": True, "stream_options": {"provisional": True}}) as r:
        events = _sse_events(r)
    drafts = [e["clover_provisional"] for e in events if "clover_provisional" in e]
    assert drafts and all(set(d) == {"offset", "token_ids", "text"} for d in drafts)
    assert any(None in d["token_ids"] for d in drafts), "a draft shows still-masked positions"
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert content == full


def test_stop_string_cuts_streamed_and_plain_answers_alike(srv, client):
    """A stop string ends the answer before it, in a stream (which holds back a tail that could
    still become the stop string) exactly as in a plain response."""
    kw = {"model": MODEL, "messages": HELLO, "max_tokens": 40, "stop": ["sunny"]}
    with scripted(srv, HELLO, "It is sunny in Paris, sunny all day."):
        plain = client.chat.completions.create(**kw).choices[0]
        chunks = list(client.chat.completions.create(**kw, stream=True))
    assert plain.message.content == "It is " and plain.finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "It is "
    assert chunks[-1].choices[0].finish_reason == "stop"


# ---- tool calls ---------------------------------------------------------------------------------
def test_tool_call_round_trip(srv, client):
    """The model emits a tool call: the client sees message.tool_calls and finish_reason
    "tool_calls" (streamed and not); the follow-up with role "tool" renders and answers."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    with scripted(srv, HELLO, call, tools=[WEATHER]):
        r = client.chat.completions.create(model=MODEL, messages=HELLO, tools=[WEATHER],
                                           max_tokens=64)
        chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=64,
                                                     tools=[WEATHER], stream=True))
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_")
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    streamed = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert streamed[0].id and streamed[0].function.name == "get_weather"  # id and name first
    assert len(streamed) >= 3, "arguments arrive in pieces as they are committed"
    assert _accumulate_tool_calls(chunks) == [(streamed[0].id, "get_weather",
                                               tc.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    follow = HELLO + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": tc.id, "content": '{"temp_c": 21}'}]
    with scripted(srv, follow, "It is sunny in Paris.", tools=[WEATHER]):
        r2 = client.chat.completions.create(model=MODEL, messages=follow, tools=[WEATHER],
                                            max_tokens=64)
    assert r2.choices[0].message.content == "It is sunny in Paris."
    assert r2.choices[0].finish_reason == "stop" and not r2.choices[0].message.tool_calls


def _accumulate_tool_calls(chunks) -> list[tuple[str, str, str]]:
    """The accumulation pattern of OpenAI's function-calling guide: by index, take id and name
    when they come, concatenate argument pieces."""
    final: dict[int, object] = {}
    for chunk in chunks:
        for tool_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            index = tool_call.index
            if index not in final:
                final[index] = tool_call
            else:
                final[index].function.arguments += tool_call.function.arguments
    return [(c.id, c.function.name, c.function.arguments) for _, c in sorted(final.items())]


def test_streamed_tool_calls_accumulate_to_the_plain_answer(srv, client):
    """Two parallel calls, streamed: the docs' accumulation gives the same names and argument
    strings as the non-streamed answer."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    with scripted(srv, HELLO, call % "Paris" + "\n" + call % "Rome", tools=[WEATHER]):
        kw = {"model": MODEL, "messages": HELLO, "tools": [WEATHER], "max_tokens": 80}
        plain = client.chat.completions.create(**kw).choices[0].message.tool_calls
        chunks = list(client.chat.completions.create(**kw, stream=True))
    got = _accumulate_tool_calls(chunks)
    assert [(n, a) for _, n, a in got] == [(c.function.name, c.function.arguments)
                                           for c in plain]
    assert len(plain) == 2 and all(i.startswith("call_") for i, _, _ in got)


def test_parallel_tool_calls_false_keeps_the_first_call(srv, client):
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    with scripted(srv, HELLO, call % "Paris" + "\n" + call % "Rome", tools=[WEATHER]):
        ask = lambda **kw: client.chat.completions.create(model=MODEL, messages=HELLO,
                                                          tools=[WEATHER], max_tokens=80, **kw)
        both, one = ask(), ask(parallel_tool_calls=False)
    with scripted(srv, HELLO, call % "Paris"):  # tool_choice "none": no tools in the prompt
        none = ask(tool_choice="none")
    assert len(both.choices[0].message.tool_calls) == 2
    (only,) = one.choices[0].message.tool_calls
    assert json.loads(only.function.arguments) == {"city": "Paris"}
    assert not none.choices[0].message.tool_calls  # not parsed: the text stays content
    assert none.choices[0].message.content.startswith("<tool_call>")


def test_named_tool_choice_with_grammar(srv, client):
    """With the grammar backend, tool_choice and response_format constrain decoding; an answer
    the grammar allows comes back parsed."""
    if srv.grammar is None:
        pytest.skip("no grammar backend (clover.grammar)")
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    with scripted(srv, HELLO, call, tools=[WEATHER]):
        r = client.chat.completions.create(
            model=MODEL, messages=HELLO, tools=[WEATHER], max_tokens=48,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (tc,) = r.choices[0].message.tool_calls
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {
        "city": "Oslo"}
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    with scripted(srv, HELLO, '{"city": "Oslo"}'):
        r = client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=32, response_format={
                "type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    assert json.loads(r.choices[0].message.content) == {"city": "Oslo"}


NOTAM = ("A1234/25 NOTAMN\nA) EGLL B) 2502140400 C) 2502141030\nE) UAS OPS WI 1214.3N "
         "12212.1E RADIUS 10NM.\nF) SFC G) 300M AGL")


@pytest.fixture(scope="module")
def long_ctx(tmp_path_factory):
    """A server whose tiny model takes 16,384 tokens: the strict airspace schemas (patterns for
    every coordinate layout and calendar date) fill ~13,000 of them."""
    path = build_tiny_model_dir(tmp_path_factory.mktemp("models") / MODEL, max_seq_len=16384)
    server = _load(path, max_batch=1, default_max_tokens=16)
    with serving(server) as url:
        server.url = url
        yield server


@pytest.mark.slow
def test_strict_airspace_tools_hold_over_the_server(long_ctx):
    """The task's strict contract needs no server flag: a client sends `strict_tools()` as its
    tools, and a call the server returns validates against them (a circle and a polygon). The
    place-name branch of `centre` (every airport code, ~37k prompt tokens) is left out so the
    tiny model's context holds the prompt."""
    srv = long_ctx
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    if srv.grammar is None:
        pytest.skip("no grammar backend (clover.grammar)")
    tools = copy.deepcopy(strict_tools())
    for branch in tools[0]["function"]["parameters"]["anyOf"]:
        if "centre" in branch["properties"]:
            branch["properties"]["centre"] = branch["properties"]["centre"]["anyOf"][0]
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    messages = [{"role": "user", "content": NOTAM}]
    circle = {"zone_id": "A1234/25", "centre": "1214.3N 12212.1E",
              "radius": {"value": 10, "unit": "NM"}, "upper": {"value": 300, "unit": "M",
                                                               "ref": "AGL"},
              "start": "2502140400", "end": "2502141030"}
    polygon = {"zone_id": "A1234/25", "polygon": ["1214N12212E", "1215N12213E", "1213N12214E"],
               "start": "2502140400", "end": "2502141030"}
    for good in (circle, polygon):
        call = format_call({"name": "set_no_fly_zone", "arguments": good})
        with scripted(srv, messages, call, tools=tools):
            r = client.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                               tool_choice="required", max_tokens=200)
        (tc,) = r.choices[0].message.tool_calls
        args = json.loads(tc.function.arguments)
        jsonschema.Draft202012Validator(schema[tc.function.name]).validate(args)
        assert (tc.function.name, args) == ("set_no_fly_zone", good)


def test_named_tool_choice_without_grammar_forces_the_call(srv, client, monkeypatch):
    """Without a grammar backend a named tool_choice starts the answer with the call's opening;
    the model only writes the arguments."""
    monkeypatch.setattr(srv, "grammar", None)
    prefix = '<tool_call>{"name": "get_weather", "arguments": '
    with scripted(srv, HELLO, '{"city": "Oslo"}}</tool_call>', tools=[WEATHER], prefix=prefix):
        r = client.chat.completions.create(
            model=MODEL, messages=HELLO, tools=[WEATHER], max_tokens=32,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (tc,) = r.choices[0].message.tool_calls
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {
        "city": "Oslo"}


# ---- batching, isolation, cancellation -----------------------------------------------------------
def test_concurrent_requests_match_their_solo_answers(client):
    """Continuous batching (8 requests, 4 rows, so some queue) never changes a temperature-0
    answer."""
    prompts = [f"The quick brown fox {i}" * (1 + i % 3) for i in range(8)]
    ask = lambda p: client.completions.create(model=MODEL, prompt=p, max_tokens=12,
                                              temperature=0).choices[0].text
    solo = [ask(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ask, prompts)) == solo


class _ExplodingConstraint:
    def frontier(self, request):
        return len(request.seq)

    def mask_logits(self, request, masked, logits):
        pass

    def after_commit(self, request):
        raise RuntimeError("boom")


def test_generation_error_fails_only_its_request(srv, client, monkeypatch):
    """A grammar that raises mid-generation fails its own request (500, code grammar_error);
    the request batched beside it finishes normally and the server keeps serving."""
    monkeypatch.setattr(srv.grammar, "build", lambda *a: _ExplodingConstraint())
    solo = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=16)
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(client.chat.completions.create, model=MODEL, messages=HELLO,
                          response_format={"type": "json_object"})
        good = pool.submit(client.completions.create, model=MODEL, prompt="Hello there",
                           max_tokens=16)
        with pytest.raises(openai.InternalServerError) as e:
            bad.result()
        assert good.result().choices[0].text == solo.choices[0].text
    assert e.value.body["code"] == "grammar_error"
    assert srv.worker.alive


def test_failed_step_fails_its_batch_and_the_loop_lives_on(srv, client, monkeypatch):
    """A forward that raises fails the requests of that step (500, generation_error), frees
    their rows, and the next request is served."""
    real = srv.engine.runner.run
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated device error")
        return real(batch)

    monkeypatch.setattr(srv.engine.runner, "run", flaky)
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt="Hello there", max_tokens=8)
    assert e.value.body["code"] == "generation_error"
    assert srv.worker.alive and srv.worker.load()["running"] == 0
    assert client.completions.create(model=MODEL, prompt="Hello", max_tokens=8).choices[0]


def test_client_disconnect_mid_stream_frees_the_row(srv, client):
    """Closing a stream aborts its request: the row is freed and the server keeps serving."""
    srv.engine.model.delay_s = 0.01
    try:
        before = srv.metrics.aborted
        stream = client.completions.create(model=MODEL, prompt="The quick", max_tokens=200,
                                           stream=True, extra_body={"tau": 1.0})
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        deadline = time.monotonic() + 10
        while srv.worker.load()["running"] and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        srv.engine.model.delay_s = 0.0
    assert srv.worker.load() == {"queued": 0, "running": 0, "tokens_in_flight": 0}
    assert srv.metrics.aborted == before + 1
    assert sorted(srv.engine.scheduler.free_rows) == list(range(4))
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=4).choices[0]


def test_client_gone_before_a_plain_answer_aborts_it(srv, http):
    """A non-streamed request whose client gives up is aborted too (the server watches the
    connection while it waits)."""
    srv.engine.model.delay_s = 0.01
    try:
        before = srv.metrics.aborted
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", timeout=0.3, json={
                "model": MODEL, "prompt": "The quick", "max_tokens": 200, "tau": 1.0})
        deadline = time.monotonic() + 10
        while srv.metrics.aborted == before and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        srv.engine.model.delay_s = 0.0
    assert srv.metrics.aborted == before + 1 and srv.worker.load()["running"] == 0


def test_health_and_metrics(http):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    text = http.get("/metrics").text
    for name in ("clover_http_requests_total", "clover_generation_tokens_total",
                 "clover_tokens_per_second", "clover_tokens_per_forward", "clover_queue_depth",
                 "clover_batch_size", "clover_request_latency_seconds_bucket",
                 "clover_time_to_first_block_seconds_count"):
        assert f"\n{name}" in text, name


# ---- bad input: a 4xx OpenAI error object, never a 500 -------------------------------------------
def _chat(**kw):
    return json.dumps({"model": MODEL, "messages": HELLO} | kw)


BAD_REQUESTS = {
    "malformed json": ("/v1/chat/completions", '{"model": "tiny-chat", "messages": [', 400,
                       None, "invalid_json"),
    "not an object": ("/v1/chat/completions", "[1, 2]", 400, None, "invalid_json"),
    "wrong type": ("/v1/chat/completions", _chat(temperature="hot"), 400, "temperature",
                   "invalid_value"),
    "wrong nested type": ("/v1/chat/completions", _chat(messages=[{"role": "user",
                                                                   "content": 5}]),
                          400, "messages[0].content", "invalid_value"),
    "bad role": ("/v1/chat/completions", _chat(messages=[{"role": "robot", "content": "x"}]),
                 400, "messages[0].role", "invalid_value"),
    "unknown model": ("/v1/chat/completions", _chat(model="gpt-4"), 404, "model",
                      "model_not_found"),
    "missing model": ("/v1/completions", json.dumps({"prompt": "hi"}), 400, "model",
                      "missing_required_parameter"),
    "empty messages": ("/v1/chat/completions", _chat(messages=[]), 400, "messages",
                       "invalid_value"),
    "empty prompt": ("/v1/completions", json.dumps({"model": MODEL, "prompt": ""}), 400,
                     "prompt", None),
    "prompt too long": ("/v1/completions", json.dumps({"model": MODEL, "prompt": "fox " * 900}),
                        400, "prompt", "context_length_exceeded"),
    "absurd max_tokens": ("/v1/chat/completions", _chat(max_tokens=10**12), 400, "max_tokens",
                          "context_length_exceeded"),
    "zero max_tokens": ("/v1/chat/completions", _chat(max_tokens=0), 400, "max_tokens",
                        "invalid_value"),
    "n too large": ("/v1/chat/completions", _chat(n=1000), 400, "n", "invalid_value"),
    "unknown field": ("/v1/chat/completions", _chat(temprature=0.5), 400, "temprature",
                      "unrecognized_argument"),
    "bad token id": ("/v1/completions", json.dumps({"model": MODEL, "prompt": [1, 99999]}),
                     400, "prompt", None),
    "tool schema not an object": (
        "/v1/chat/completions", _chat(tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "string"}}}]),
        400, "tools[0].function.parameters", "invalid_schema"),
    "tool schema invalid": (
        "/v1/chat/completions", _chat(tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]),
        400, "tools[0].function.parameters", "invalid_schema"),
    "tool name invalid": (
        "/v1/chat/completions", _chat(tools=[{"type": "function", "function": {
            "name": "no spaces allowed"}}]), 400, "tools[0].function.name", "invalid_value"),
    "tool_choice unknown tool": (
        "/v1/chat/completions", _chat(tools=[WEATHER], tool_choice={
            "type": "function", "function": {"name": "nope"}}), 400, "tool_choice", None),
    "tool_choice without tools": ("/v1/chat/completions", _chat(tool_choice="required"), 400,
                                  "tool_choice", None),
    "tool message without id": ("/v1/chat/completions", _chat(messages=HELLO + [
        {"role": "tool", "content": "{}"}]), 400, "messages[1].tool_call_id", None),
    "response_format bad type": ("/v1/chat/completions", _chat(response_format={"type": "xml"}),
                                 400, "response_format.type", "invalid_value"),
    "response_format no schema": ("/v1/chat/completions", _chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x"}}), 400,
        "response_format.json_schema", None),
    "stream_options without stream": ("/v1/chat/completions", _chat(stream_options={
        "include_usage": True}), 400, "stream_options", None),
    "too many stops": ("/v1/chat/completions", _chat(stop=list("abcde")), 400, "stop",
                       "invalid_value"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_a_4xx_openai_error(http, srv, case):
    path, body, status, param, code = BAD_REQUESTS[case]
    r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == ERROR_KEYS and error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert srv.worker.alive


ODD_BODIES = [
    b"\xff\xfe\x00garbage", b"", b"null", b'"a string"', b"[" * 100_000 + b"]" * 100_000,
    _chat(max_tokens=10**40).encode(), b'{"model": "tiny-chat", "messages": NaN}',
    _chat(temperature=float("nan")).encode(), _chat(tau=float("inf")).encode(),
    _chat(gamma=float("inf"), max_tokens=2).encode(), _chat(messages="hello").encode(),
    _chat(messages=[{"role": "user", "content": [{"type": "image_url",
                                                  "image_url": {}}]}]).encode(),
    _chat(tools={"a": 1}).encode(), _chat(stop=5).encode(), _chat(seed=1.5).encode(),
    _chat(stream_options=[1], stream=True).encode(), _chat(policy="nope").encode(),
    _chat(stop_token_ids=[-1]).encode(), _chat(block_size=0).encode(),
    _chat(messages=[{"role": "assistant"}]).encode(),
    _chat(messages=[{"role": "user", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]).encode(),
    json.dumps({"model": MODEL, "prompt": [[1, 2], [3]]}).encode(),
    json.dumps({"model": MODEL, "prompt": [-5]}).encode(),
    json.dumps({"model": MODEL, "prompt": "hi", "echo": True}).encode(),
]


@pytest.mark.parametrize("i", range(len(ODD_BODIES)))
def test_odd_bodies_never_500(http, srv, i):
    """Whatever the body, the answer is a 4xx OpenAI error (or a 200), the worker lives on."""
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = http.post(path, content=ODD_BODIES[i], headers={"Content-Type": "application/json"})
        assert r.status_code < 500, r.text
        if r.status_code >= 400:
            assert set(r.json()["error"]) == ERROR_KEYS
    assert srv.worker.alive


def test_response_format_is_not_supported_without_grammar(http, srv, monkeypatch):
    monkeypatch.setattr(srv, "grammar", None)
    r = http.post("/v1/chat/completions", json=json.loads(_chat(
        response_format={"type": "json_object"})))
    assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]


def test_unknown_route_and_method_are_openai_errors(http):
    for r in (http.get("/v1/nope"), http.get("/v1/chat/completions")):
        assert r.status_code in (404, 405) and set(r.json()["error"]) == ERROR_KEYS


# ---- a small, locked-down server: API key, body limit, back-pressure -----------------------------
@pytest.fixture(scope="module")
def small(model_dir):
    server = _load(model_dir, max_batch=1, max_queue=1, api_key="sekret", max_body_bytes=4096)
    with serving(server) as url:
        server.url = url
        yield server


def test_api_key_is_required(small):
    body = json.loads(_chat(max_tokens=2))
    r = httpx.post(small.url + "/v1/chat/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = httpx.get(small.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401
    assert httpx.get(small.url + "/health").status_code == 200  # probes need no key
    ok = openai.OpenAI(base_url=small.url + "/v1", api_key="sekret", max_retries=0)
    assert ok.chat.completions.create(**body).choices[0].message.role == "assistant"


def test_body_size_limit(small):
    body = _chat(messages=[{"role": "user", "content": "x" * 5000}])
    r = httpx.post(small.url + "/v1/chat/completions", content=body,
                   headers={"Authorization": "Bearer sekret"})
    assert r.status_code == 413 and set(r.json()["error"]) == ERROR_KEYS


def test_full_queue_answers_429_with_retry_after(small):
    """One row busy and one request waiting: the next is refused with 429 + Retry-After, and
    both accepted requests still complete."""
    small.engine.model.delay_s = 0.02
    headers = {"Authorization": "Bearer sekret"}
    slow = json.loads(_chat(max_tokens=40, tau=1.0))
    try:
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(httpx.post, small.url + "/v1/chat/completions", json=slow,
                                  headers=headers, timeout=60)
            while small.worker.load()["running"] < 1:
                time.sleep(0.01)
            waiting = pool.submit(httpx.post, small.url + "/v1/chat/completions", json=slow,
                                  headers=headers, timeout=60)
            while small.worker.load()["queued"] < 1:
                time.sleep(0.01)
            refused = httpx.post(small.url + "/v1/chat/completions", json=slow, headers=headers)
            assert refused.status_code == 429 and refused.headers["Retry-After"]
            assert refused.json()["error"]["code"] == "queue_full"
            assert running.result().status_code == waiting.result().status_code == 200
    finally:
        small.engine.model.delay_s = 0.0


# ---- the command line ----------------------------------------------------------------------------
def test_serve_without_the_default_model_is_a_clear_error(capsys, tmp_path, monkeypatch):
    from clover.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "models/clover-smol" in err and "no such model directory" in err
