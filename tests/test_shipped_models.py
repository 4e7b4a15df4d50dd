"""The shipped models (LoRA adapters over the embedded SmolLM2 base) load and do the task.

For each model under models/, the first few test-split messages that order a zone are decoded
free-running (no grammar; greedy; the diffusion model with its default threshold policy, tau 0.9)
and scored: every call must parse and every zone must match the truth exactly. A broken adapter,
merge, mask row, tokenizer, chat template or engine change fails it. Needs the converted base
(`make setup`).
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("clover-smol", "clover-smol-ar")
MESSAGES = 3
MAX_TOKENS = 256


def decode(name: str):
    from clover.engine import LLM, SamplingParams
    from clover.tasks.airspace import TOOLS, generate_examples
    from clover.tokenizer import render_chat

    llm = LLM(str(ROOT / "models" / name), device="cpu", dtype="float32")
    tok = llm.tokenizer
    examples = [e for e in generate_examples("test", 40, 0) if not e.history and e.zones]
    examples = examples[:MESSAGES]
    prompts = [tok.encode(render_chat(tok, e.messages(tools=True)[:-1], TOOLS)) for e in examples]
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                policy="threshold", tau=0.9))
    return examples, outs


@pytest.mark.parametrize("name", MODELS)
def test_shipped_model_does_the_task(name):
    from clover.tasks.airspace import score

    assert (ROOT / "models" / name / "adapter_config.json").is_file(), f"models/{name} missing"
    examples, outs = decode(name)
    result = score([o.text for o in outs], examples)
    assert result["tool_call_validity"] == 1.0, [o.text for o in outs]
    assert result["zone_f1"] == 1.0, [o.text for o in outs]
