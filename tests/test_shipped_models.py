"""The shipped models (LoRA adapters over the embedded SmolLM2 base) load and decode as recorded.

For each model under models/, a few fixed test-split messages are decoded free-running (greedy;
the diffusion model with the threshold policy, tau 0.9) in the CPU's native precision (bf16 on a
CPU with AVX-512 BF16 or AMX, fp32 elsewhere: emulated bf16 ran these tests 2-3x slower) and
compared with the outputs recorded in that precision (tests/data/shipped_models.json, per model
and dtype): the calls must parse as they did and the tokens must agree with the record (a broken
adapter, merge, mask row, tokenizer, chat template or engine change sends agreement to near zero;
a little slack allows for float differences between CPUs). This checks the shipped artefacts,
not their quality: the measured quality is in each model's README. The drafter
(clover-smol-draft) is checked in its role: self-speculative decoding with the AR twin as
verifier (fp32, drafts to the block's end) must give the twin's recorded output and keep
committing several tokens a forward (a broken drafter falls to one). Needs the converted base
(`make setup`). Regenerate the record after retraining with `python tests/test_shipped_models.py
[NAME ...]` (in this CPU's native precision; the drafter's record is always fp32).
"""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("data") / "shipped_models.json"
MODELS = ("clover-smol", "clover-smol-ar")
DRAFTER, VERIFIER = "clover-smol-draft", "clover-smol-ar"
MESSAGES = 2
MAX_TOKENS = 200


def native_dtype() -> str:
    """bfloat16 where this CPU runs it natively, else float32 (`native_precision`)."""
    import torch

    from clover.bench.quant import native_precision

    return "bfloat16" if native_precision(torch.device("cpu")) == "bf16" else "float32"


def recorded(name: str, dtype: str) -> list[dict]:
    """The record of `name` decoded in `dtype`, or, where none was made in it (a model
    re-recorded on a CPU of the other kind), the other precision's (bf16 and fp32 decodes of
    these models agree token for token so far; the 0.9 agreement leaves room for a flip)."""
    by_dtype = json.loads(RECORD.read_text())[name]
    return by_dtype.get(dtype) or next(iter(by_dtype.values()))


def fixed_prompts(tok) -> tuple[list, list[list[int]]]:
    from clover.tasks.airspace import TOOLS, generate_examples
    from clover.tokenizer import render_chat

    examples = [e for e in generate_examples("test", 40, 0) if not e.history][:MESSAGES]
    return examples, [tok.encode(render_chat(tok, e.messages(tools=True)[:-1], TOOLS))
                      for e in examples]


def decode(name: str, dtype: str) -> list[dict]:
    from clover.engine import LLM, SamplingParams
    from clover.tokenizer import parse_tool_calls

    if name == DRAFTER:
        return decode_speculative()
    llm = LLM(str(ROOT / "models" / name), device="cpu", dtype=dtype)
    tok = llm.tokenizer
    examples, prompts = fixed_prompts(tok)
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                policy="threshold", tau=0.9))
    return [{"id": e.id, "token_ids": o.token_ids, "text": o.text,
             "calls": len(parse_tool_calls(o.text).tool_calls)}
            for e, o in zip(examples, outs, strict=True)]


def decode_speculative() -> list[dict]:
    """The drafter with its verifier: self-speculative greedy decoding (fp32, fused fast paths)."""
    import torch

    from clover.engine.speculative import SelfSpeculative, fuse_pair, load_pair
    from clover.tokenizer import parse_tool_calls

    pair, tok = load_pair(str(ROOT / "models" / VERIFIER), str(ROOT / "models" / DRAFTER),
                          dtype=torch.float32)
    dec = SelfSpeculative(fuse_pair(pair))
    examples, prompts = fixed_prompts(tok)
    rows = []  # decoded together: each row's tokens and forwards are its own (test_speculative)
    for e, res in zip(examples, dec.generate_batch(prompts, MAX_TOKENS, {tok.eos_token_id}),
                      strict=True):
        ids = res.ids[:-1] if res.ids and res.ids[-1] == tok.eos_token_id else res.ids
        text = tok.decode(ids, skip_special_tokens=False)
        rows.append({"id": e.id, "token_ids": ids, "text": text, "forwards": res.forwards,
                     "calls": len(parse_tool_calls(text).tool_calls)})
    return rows


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where two token lists agree (two empty outputs agree fully)."""
    if not a and not b:
        return 1.0
    same = sum(x == y for x, y in zip(a, b, strict=False))
    return same / max(len(a), len(b))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_shipped_model_decodes_as_recorded(name):
    assert (ROOT / "models" / name / "adapter_config.json").is_file(), f"models/{name} missing"
    dtype = native_dtype()
    record = recorded(name, dtype)
    got = decode(name, dtype)
    assert [g["id"] for g in got] == [r["id"] for r in record]
    for g, r in zip(got, record, strict=True):
        assert g["calls"] == r["calls"], (g["text"], r["text"])
        assert agreement(g["token_ids"], r["token_ids"]) >= 0.9, (g["text"], r["text"])


@pytest.mark.slow
def test_shipped_drafter_gives_the_twins_output_in_fewer_forwards():
    assert (ROOT / "models" / DRAFTER / "adapter_config.json").is_file(), f"models/{DRAFTER}"
    record = recorded(DRAFTER, "float32")  # the pair decodes in fp32; the twin's record in the
    twin = recorded(VERIFIER, "float32")  # same precision (its bf16 one is identical here)
    got = decode(DRAFTER, "float32")
    assert [g["id"] for g in got] == [r["id"] for r in record] == [t["id"] for t in twin]
    for g, r, t in zip(got, record, twin, strict=True):
        assert g["calls"] == r["calls"] == t["calls"], (g["text"], t["text"])
        assert agreement(g["token_ids"], r["token_ids"]) >= 0.9, (g["text"], r["text"])
        assert agreement(g["token_ids"], t["token_ids"]) >= 0.9, (g["text"], t["text"])
    tpf = sum(len(g["token_ids"]) for g in got) / sum(g["forwards"] for g in got)
    record_tpf = sum(len(r["token_ids"]) for r in record) / sum(r["forwards"] for r in record)
    assert record_tpf >= 2.0, record_tpf  # what the record says the drafter is for
    assert tpf >= 0.8 * record_tpf, (tpf, record_tpf)


if __name__ == "__main__":
    names = sys.argv[1:] or (*MODELS, DRAFTER)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for name in names:
        dtype = "float32" if name == DRAFTER else native_dtype()
        record[name] = {dtype: decode(name, dtype)}  # a retrained model's other records are stale
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {RECORD}")
