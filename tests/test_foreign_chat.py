"""Foreign tokenizers and chat templates: a Hugging Face directory's tokenizer.json and its own
chat template (tokenizer_config.json) survive `clover convert` and load through
`clover.tokenizer.load_tokenizer`; a ChatML template without tools gets the ChatML-with-tools one;
system messages and tools reach the model, through `LLM.chat` and through `clover serve` with the
official openai client, and tool calls parse back.

The model is a tiny random Qwen2 (hidden 64) over SmolLM2-135M-Instruct's real tokenizer (taken
from the converted base, `make setup`); the server test records the token ids the model is run on,
so "the model sees the system message and the tools" is checked on the model's own input.
"""

from __future__ import annotations

import json
import shutil

import openai
import pytest
import torch
import transformers

from clover.checkpoint.base import require_base
from clover.checkpoint.convert import CHATML_TOOLS_TEMPLATE, convert
from clover.checkpoint.keymap import CheckpointError
from clover.server import CloverServer, ServerConfig
from clover.server.testing import ScriptedModel, serving
from clover.tokenizer import format_tool_call, load_tokenizer, parse_tool_calls, render_chat

CHATML_PLAIN = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# A Hermes-style template of the kind Qwen2.5 ships (written here): tools in the system turn.
HERMES = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0].content if messages[0].role == 'system' "
    "else 'You are helpful.' }}\n\n# Tools\n<tools>\n{%- for t in tools %}\n{{ t | tojson }}"
    "{%- endfor %}\n</tools>\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if not (tools and loop.first and m.role == 'system') %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
SYSTEM = "You draw no-fly zones for the Zurich tower."
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
MESSAGES = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Weather in Zurich?"}]


@pytest.fixture(scope="module")
def smol_tokenizer_dir():
    try:
        return require_base()
    except CheckpointError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smol_tokenizer(smol_tokenizer_dir):
    return load_tokenizer(smol_tokenizer_dir)


def hf_dir_with_template(root, tokenizer_dir, template: str, vocab: int = 49152):
    """A tiny random Qwen2 over SmolLM2's tokenizer (49152 tokens), saved the way the Hub ships
    models; `vocab` > 49152 pads the embedding as Qwen's checkpoints do."""
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=96, tie_word_embeddings=True,
                                      eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(root)
    shutil.copy(tokenizer_dir / "tokenizer.json", root / "tokenizer.json")
    tok_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**tok_config,
                                                            "chat_template": template}))
    return root


@pytest.fixture(scope="module")
def converted_chatml(tmp_path_factory, smol_tokenizer_dir):
    root = tmp_path_factory.mktemp("foreign")
    src = hf_dir_with_template(root / "hf", smol_tokenizer_dir, CHATML_PLAIN)
    return convert(src, root / "clover")


def test_foreign_tokenizer_and_own_tools_template_are_kept(tmp_path, smol_tokenizer_dir,
                                                          smol_tokenizer):
    """tokenizer.json loads unchanged; a template that renders tools is the model's own choice
    and is kept verbatim; system message and tools reach the prompt through it."""
    src = hf_dir_with_template(tmp_path / "hf", smol_tokenizer_dir, HERMES)
    tok = load_tokenizer(convert(src, tmp_path / "clover"))
    original = smol_tokenizer
    assert len(original) == 49152
    text = "Restricted area R-123: SFC-FL100, 0600-1800 UTC."
    assert tok.encode(text) == original.encode(text)
    assert tok.chat_template == HERMES
    prompt = render_chat(tok, MESSAGES, tools=[WEATHER])
    assert prompt.startswith(f"<|im_start|>system\n{SYSTEM}\n\n# Tools\n<tools>")
    assert '"name": "get_weather"' in prompt and prompt.count(SYSTEM) == 1


def test_chatml_without_tools_gets_hermes_tools_and_calls_round_trip(converted_chatml):
    """A ChatML template that ignores tools is replaced by the ChatML-with-tools one: system
    message and tool schemas render, and an assistant tool call renders as the model must write
    it, which `parse_tool_calls` reads back."""
    tok = load_tokenizer(converted_chatml)
    assert tok.chat_template == CHATML_TOOLS_TEMPLATE
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Zurich"}'}}
    prompt = render_chat(tok, [*MESSAGES, {"role": "assistant", "content": "",
                                           "tool_calls": [call]}], tools=[WEATHER],
                         add_generation_prompt=False)
    assert prompt.startswith(f"<|im_start|>system\n{SYSTEM}\n\n") and "<tools>\n{" in prompt
    written = format_tool_call("get_weather", {"city": "Zurich"})
    assert f"<|im_start|>assistant\n{written}<|im_end|>" in prompt
    parsed = parse_tool_calls(written)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed.tool_calls] == [("get_weather", {"city": "Zurich"})]


class RecordingModel(ScriptedModel):
    """ScriptedModel that also records every token it is run on, by absolute position."""

    def forward(self, ids_BL, pos_BL=None, **kw):
        valid_BL = kw.get("valid_BL")
        valid_BL = torch.ones_like(ids_BL, dtype=torch.bool) if valid_BL is None else valid_BL
        if pos_BL is not None:
            for p, t in zip(pos_BL[valid_BL].tolist(), ids_BL[valid_BL].tolist(), strict=True):
                self.seen[p] = t
        return super().forward(ids_BL, pos_BL, **kw)


def test_serve_shows_system_message_and_tools_to_the_model(converted_chatml):
    """`clover serve` on the converted model, driven by the openai client: the token ids the
    model runs on decode to a prompt holding the system message and the tool schema, and the
    tool call it answers comes back as OpenAI `tool_calls`."""
    server = CloverServer.load(ServerConfig(model=str(converted_chatml), device="cpu",
                                            max_batch=2, default_max_tokens=32))
    model = RecordingModel.wrap(server.engine.model)
    model.seen = {}
    tok = server.tokenizer
    prompt = tok.encode(render_chat(tok, MESSAGES, tools=[WEATHER]))
    answer = tok.encode(format_tool_call("get_weather", {"city": "Zurich"})) + [tok.eos_token_id]
    model.script = {len(prompt) + k: t for k, t in enumerate(answer)}
    with serving(server) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model=converted_chatml.name, messages=MESSAGES,
                                           tools=[WEATHER], max_tokens=32, temperature=0)
    seen = tok.decode([model.seen[p] for p in range(len(prompt))])
    assert seen.startswith(f"<|im_start|>system\n{SYSTEM}\n\n")
    assert '{"type": "function", "function": {"name": "get_weather"' in seen
    assert seen.endswith("<|im_start|>user\nWeather in Zurich?<|im_end|>\n<|im_start|>assistant\n")
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather",
                                                                         {"city": "Zurich"})


def test_padded_vocabulary_reserves_a_padding_row_as_mask_id(tmp_path, smol_tokenizer_dir):
    """An embedding larger than the tokenizer (Qwen pads to a multiple of 128): the engine's
    mask sentinel is the first padding row, so no real token is ever withheld from decoding."""
    from clover.checkpoint import load_config

    src = hf_dir_with_template(tmp_path / "hf", smol_tokenizer_dir, CHATML_PLAIN, vocab=49280)
    config = load_config(convert(src, tmp_path / "clover"))
    assert (config.vocab_size, config.mask_id, config.eos_id) == (49280, 49152, 2)


def test_mask_token_takes_the_first_padding_row(tmp_path, smol_tokenizer_dir):
    """--mask-token on a padded embedding reuses the first padding row (no new row): it holds
    the mean of the real token rows and the tokenizer maps <|mask|> to it."""
    from clover.checkpoint import load

    src = hf_dir_with_template(tmp_path / "hf", smol_tokenizer_dir, CHATML_PLAIN, vocab=49280)
    model, tok = load(convert(src, tmp_path / "clover", mask_token=True))
    assert model.config.vocab_size == 49280
    assert model.config.mask_id == tok.convert_tokens_to_ids("<|mask|>") == 49152
    embed = model.embed.weight.detach()
    torch.testing.assert_close(embed[49152], embed[:49152].mean(0))
