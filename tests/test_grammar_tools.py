"""Tool calling under a grammar: outputs parse into valid calls of the allowed tools.

The grammar must accept exactly what the chat template and the airspace gold data write (so a
trained model is never pushed off its format), keep `<tool_call>` a special token, and honour
tool_choice: auto, required, none, or one named function.
"""

import json
from pathlib import Path

import jsonschema
import pytest
from test_grammar import EOS, PROMPTS, VOCAB, corpus, ids_of, tiny_llm

from clover.engine import SamplingParams
from clover.grammar import compile_matcher, tool_call_lark
from clover.grammar.tools import special_token_id
from clover.tasks.airspace import NO_ZONE_REPLY, TOOLS, assistant_text, generate_examples
from clover.tasks.airspace.tools import parse_tool_calls as parse_task_calls
from clover.tokenizer import load_tokenizer, parse_tool_calls, train_tokenizer

pytest.importorskip("llguidance")

SMALL_TOOLS = [
    {"type": "function", "function": {"name": "set_zone", "parameters": {
        "type": "object", "properties": {
            "zone_id": {"type": "string", "maxLength": 4},
            "radius": {"type": "integer", "minimum": 1, "maximum": 99},
            "unit": {"enum": ["NM", "KM"]}},
        "required": ["zone_id", "radius"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "clear_zone", "parameters": {
        "type": "object", "properties": {"zone_id": {"type": "string", "maxLength": 4}},
        "required": ["zone_id"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in SMALL_TOOLS}


def accepts(tok, structured, text: str) -> bool:
    m = compile_matcher(structured, tok, VOCAB, EOS)
    ids = ids_of(tok, text)
    return m.accept(ids) == len(ids) and m.is_accepting()


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(corpus(), vocab_size=VOCAB)


@pytest.fixture(scope="module")
def llm(tok):
    return tiny_llm(tok, "block", seed=3)


def test_gold_airspace_outputs_are_accepted(tok):
    """Every gold assistant turn of the airspace task (calls, or the no-zone reply) is in the
    auto grammar, so constraining a trained model never fights its training format."""
    auto = {"tools": TOOLS, "tool_choice": "auto"}
    texts = {assistant_text(e.calls) for e in generate_examples("test", 40)} | {NO_ZONE_REPLY}
    assert len(texts) > 30
    for text in texts:
        assert accepts(tok, auto, text), text
    assert not accepts(tok, {"tools": TOOLS, "tool_choice": "required"}, NO_ZONE_REPLY)
    assert accepts(tok, {"tools": TOOLS, "tool_choice": "none"}, NO_ZONE_REPLY)


def test_tags_are_special_tokens_not_text(tok):
    """`<tool_call>` typed out as characters is neither a call nor allowed inside plain text."""
    auto = {"tools": SMALL_TOOLS, "tool_choice": "auto"}
    call = '<tool_call>{"name": "clear_zone", "arguments": {"zone_id": "A1"}}</tool_call>'
    assert ids_of(tok, "<tool_call>") == [7]
    assert accepts(tok, auto, call) and accepts(tok, auto, "Done.\n" + call)
    m = compile_matcher(auto, tok, VOCAB, EOS)
    as_text = [t for ch in "<tool_call>" for t in ids_of(tok, ch)]
    assert m.accept(as_text) < len(as_text)
    assert not accepts(tok, auto, call.replace('"A1"', "1"))  # arguments follow the schema
    assert not accepts(tok, auto, call.replace("clear_zone", "drop_zone"))  # known names only


@pytest.mark.parametrize("choice, names", [
    ("required", {"set_zone", "clear_zone"}),
    ("auto", {"set_zone", "clear_zone"}),
    ({"type": "function", "function": {"name": "clear_zone"}}, {"clear_zone"}),
])
def test_generated_calls_parse_and_validate(llm, choice, names):
    """Closed calls always parse into calls of allowed tools with schema-valid arguments; a
    stopped output has no errors at all; only a length cut can leave the last call open."""
    structured = {"tools": SMALL_TOOLS, "tool_choice": choice}
    max_tokens = 48 if choice == "auto" else 96  # auto: random weights ramble on in text
    params = [SamplingParams(max_tokens=max_tokens, tau=tau, temperature=temp, seed=s,
                             structured=structured)
              for tau, temp, s in ((0.5, 0.0, 0), (0.9, 1.0, 1), (1.0, 1.0, 2))]
    outs = llm.generate(PROMPTS, params)
    for out in outs:
        parsed = parse_tool_calls(out.text)
        for call in parsed.tool_calls:
            fn = call["function"]
            assert fn["name"] in names
            jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])
        if out.finish_reason == "stop":
            assert not parsed.errors, out.text
            assert parsed.tool_calls or (choice == "auto" and parsed.content)
        else:  # cut by max_tokens: at most the last call is left open
            assert len(parsed.errors) <= 1
            assert all("missing </tool_call>" in e for e in parsed.errors)
    if choice != "auto":  # a random model may ramble on in text, but calls end
        assert any(o.finish_reason == "stop" for o in outs)


def test_tool_choice_none_is_text_only(llm):
    out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=12, structured={
        "tools": SMALL_TOOLS, "tool_choice": "none"}))[0]
    assert "<tool_call>" not in out.text and out.text


def test_chat_with_a_required_call_reports_tool_calls(llm):
    params = SamplingParams(max_tokens=96, tau=0.7, temperature=1.0, seed=4,
                            structured={"tools": SMALL_TOOLS, "tool_choice": "required"})
    out = llm.chat([{"role": "user", "content": "clear zone A1"}], params, tools=SMALL_TOOLS)[0]
    assert out.tool_calls
    if out.finish_reason != "length":
        assert out.finish_reason == "tool_calls" and not out.errors


@pytest.mark.parametrize("tools, choice, message", [
    ([], "auto", "non-empty list"),
    (SMALL_TOOLS, "always", "tool_choice must be one of"),
    (SMALL_TOOLS, {"type": "function", "function": {"name": "nope"}}, "not among the tools"),
    (SMALL_TOOLS, {"type": "function"}, "must name a function"),
    (SMALL_TOOLS + SMALL_TOOLS[:1], "auto", "duplicate function name"),
    ([{"type": "function", "function": {"parameters": {}}}], "auto", "name must be"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}], "auto",
     "Invalid type"),
])
def test_bad_tool_specs_raise_clear_value_errors(tok, tools, choice, message):
    with pytest.raises(ValueError, match=message):
        compile_matcher({"tools": tools, "tool_choice": choice}, tok, VOCAB, EOS)


def test_lark_names_the_tags_by_id_or_text():
    lark = tool_call_lark(SMALL_TOOLS, "required", open_token=7, close_token=8)
    assert "<[7]>" in lark and "<[8]>" in lark
    assert '"<tool_call>"' in tool_call_lark(SMALL_TOOLS, "required")


def test_parallel_tool_calls_false_allows_one_call_at_most(tok):
    call = '<tool_call>{"name": "clear_zone", "arguments": {"zone_id": "A1"}}</tool_call>'
    one = {"tools": SMALL_TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    assert accepts(tok, one, call)
    assert not accepts(tok, one, call + "\n" + call)
    assert accepts(tok, {**one, "parallel_tool_calls": True}, call + "\n" + call)
    with pytest.raises(ValueError, match="parallel_tool_calls"):
        compile_matcher({**one, "parallel_tool_calls": "no"}, tok, VOCAB, EOS)
    with pytest.raises(ValueError, match="only goes with"):
        compile_matcher({"regex": "a", "parallel_tool_calls": False}, tok, VOCAB, EOS)


def test_tags_as_text_inside_a_string_parse_as_the_grammar_allowed():
    """SmolLM2's tokenizer has no special tokens for the tags, so the grammar matches them as text
    and a JSON string may hold their characters (a model under `--grammar` wrote one into a free
    `schedule` field). Both parsers read the call the grammar allowed, the string intact, instead
    of cutting the call at the tag inside it."""
    smol = load_tokenizer(Path(__file__).parents[1] / "models" / "clover-smol")
    assert special_token_id(smol, "</tool_call>") is None
    example = next(e for e in generate_examples("test", 40)
                   if e.calls and e.calls[0]["name"] == "set_no_fly_zone")
    value = '0900</tool_call> <tool_call>{"'
    call = {**example.calls[0], "arguments": {**example.calls[0]["arguments"], "schedule": value}}
    text = assistant_text([call, example.calls[0]])
    m = compile_matcher({"tools": TOOLS, "tool_choice": "auto"}, smol, len(smol),
                        smol.convert_tokens_to_ids("<|im_end|>"))
    ids = smol.encode(text, add_special_tokens=False)
    assert m.accept(ids) == len(ids) and m.is_accepting()
    parsed = parse_tool_calls(text)
    assert not parsed.errors and parsed.content == ""
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        call["arguments"], example.calls[0]["arguments"]]
    task = parse_task_calls(text)
    assert task.num_invalid == 0 and task.calls == [call, example.calls[0]]
