"""The vLLM-compatible Python surface beside Clover's: `LLM.generate(prompts,
sampling_params=...)` returning objects whose `.outputs[i]` carry text, token ids and finish
reason, with `n` sequences per prompt, while `.stats` and the flat fields stay."""

from clover.engine.llm import LLM
from clover.engine.params import SamplingParams
from clover.server.testing import build_tiny_model_dir


def test_generate_reads_like_vllm(tmp_path):
    llm = LLM(str(build_tiny_model_dir(tmp_path / "m")), device="cpu")
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    (out,) = llm.generate(["The quick brown"], sampling_params=greedy)
    first = out.outputs[0]
    assert out.prompt == "The quick brown" and out.prompt_token_ids
    assert (first.text, first.token_ids, first.finish_reason) == (
        out.text, out.token_ids, out.finish_reason)
    assert first.finish_reason in ("stop", "length") and out.stats.forwards > 0
    assert llm.generate(["The quick brown"], greedy)[0].text == first.text  # positional

    sampled = SamplingParams(max_tokens=8, temperature=2.0, seed=5, n=3, logprobs=1)
    a, b = llm.generate([{"prompt": "The quick"}, {"prompt_token_ids": out.prompt_token_ids}],
                        sampling_params=sampled)
    assert [o.index for o in a.outputs] == [0, 1, 2] and len(b.outputs) == 3
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1, "n seeded samples differ"
    again = llm.generate([{"prompt": "The quick"}], sampling_params=sampled)[0]
    assert [o.text for o in again.outputs] == [o.text for o in a.outputs]
    assert all(len(o.logprobs) == len(o.token_ids) for o in a.outputs)
    assert all(e.logprob <= 0 and len(e.top) <= 1 for o in a.outputs for e in o.logprobs)
