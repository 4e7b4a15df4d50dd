"""`clover generate` / `clover chat`: flags map to SamplingParams, output matches the library,
--show-steps replays the same decode step by step, and user mistakes exit 2 naming the flag."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from clover.bench.quant import cli_dtype
from clover.checkpoint import save
from clover.cli import build_parser, main
from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.engine.cli import print_reply
from clover.engine.flags import sampling_params
from clover.engine.llm import with_tool_calls
from clover.engine.request import RequestOutput, RequestStats
from clover.model import build_model
from clover.tokenizer import format_tool_call, train_tokenizer

STEP_LINE = re.compile(r"^step (\d+): \+(\d+) tokens \| (req-\d+) \[(\w+)\] (.*)$")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    texts = [f"the quick brown fox {i} jumps over the lazy dog number {i}" for i in range(200)]
    path = tmp_path_factory.mktemp("gen") / "tiny-model"
    save(build_model(get_preset("tiny"), seed=0), train_tokenizer(texts, vocab_size=512), path)
    return str(path)


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_every_sampling_field_has_a_flag_and_defaults_round_trip():
    """Flags are generated from SamplingParams: no flags -> the default params; each maps 1:1."""
    parse = lambda *a: build_parser().parse_args(["generate", "--model", "tiny", *a])
    assert sampling_params(parse()) == SamplingParams()
    args = parse("--top-p", "0.5", "--stop", "a", "b", "--ignore-eos", "--steps-per-block", "3",
                 "--stop-token-ids", "7", "--seed", "4")
    assert sampling_params(args) == SamplingParams(top_p=0.5, stop=["a", "b"], ignore_eos=True,
                                                   steps_per_block=3, stop_token_ids=[7], seed=4)
    help_text = build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    for f in dataclasses.fields(SamplingParams):
        assert "--" + f.name.replace("_", "-") in help_text


def test_text_prompts_print_what_the_library_generates(capsys, model_dir, tmp_path):
    """--prompt and --prompt-file (blank lines skipped) give the LLM.generate text, in order."""
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("the lazy dog\n\n")
    rc, out, _ = _run(capsys, "generate", "--model", model_dir, "--prompt", "the quick",
                      "--prompt-file", str(prompt_file), "--max-tokens", "8", "--device", "cpu")
    assert rc == 0
    expected = LLM(model_dir, device="cpu", dtype=cli_dtype("auto", "cpu")).generate(
        ["the quick", "the lazy dog"], SamplingParams(max_tokens=8))
    assert out == "".join(f"--- {i} ---\n{o.text}\n" for i, o in enumerate(expected))


def test_json_prints_one_object_per_prompt(capsys, model_dir):
    """--json: one parseable line per prompt, with ids, finish reason and request stats."""
    rc, out, _ = _run(capsys, "generate", "--model", model_dir, "--prompt", "a", "--prompt", "b c",
                      "--max-tokens", "6", "--json", "--chat")
    lines = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [o["index"] for o in lines] == [0, 1]
    for obj in lines:
        assert len(obj["token_ids"]) <= 6 and obj["finish_reason"] in ("stop", "length")
        assert obj["stats"]["forwards"] >= 1 and {"content", "tool_calls", "errors"} <= set(obj)
        assert obj["prompt_tokens"] > 3  # the chat template wrapped the one-token prompt


def test_stats_prints_request_and_engine_tables(capsys, model_dir):
    rc, out, _ = _run(capsys, "generate", "--model", model_dir, "--prompt", "the quick",
                      "--max-tokens", "4", "--stats")
    assert rc == 0
    for label in ("req-0", "forwards", "TPF", "TPS", "first block s", "total s", "model time",
                  "policy time", "other time", "overhead share"):
        assert label in out, label


@pytest.mark.parametrize("policy", ["threshold", "topk"])
def test_show_steps_replays_the_same_decode(capsys, model_dir, policy):
    """Non-tty --show-steps prints one line per engine step, and decodes exactly what plain
    generate decodes at temperature 0; the per-step commits add up to every generated position."""
    common = ["generate", "--model", model_dir, "--prompt", "the quick", "--max-tokens", "10",
              "--policy", policy, "--steps-per-block", "2", "--ignore-eos", "--json"]
    _, plain, _ = _run(capsys, *common)
    rc, shown, err = _run(capsys, *common, "--show-steps")
    plain_obj, shown_obj = json.loads(plain), json.loads(shown)
    steps = [STEP_LINE.match(line) for line in err.splitlines() if line.startswith("step ")]
    assert rc == 0 and all(steps)
    assert [int(m[1]) for m in steps] == list(range(1, shown_obj["stats"]["forwards"] + 1))
    assert sum(int(m[2]) for m in steps) == 10
    assert "░" in steps[0][5] and steps[-1][4] == "length"
    assert shown_obj["text"] == plain_obj["text"]
    assert shown_obj["token_ids"] == plain_obj["token_ids"]


def test_prompt_ids_on_tokenizerless_preset_print_ids(capsys):
    rc, out, _ = _run(capsys, "generate", "--model", "tiny", "--prompt-ids", "5 6 7",
                      "--max-tokens", "8", "--ignore-eos")
    expected = LLM("tiny", dtype=cli_dtype("auto", "auto")).generate(
        [[5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))
    assert rc == 0 and out.split() == [str(t) for t in expected[0].token_ids]


@pytest.mark.parametrize("argv, flag", [
    (["--model", "tiny", "--prompt", "hello"], "--prompt"),
    (["--model", "tiny", "--prompt-ids", "5 6 7", "--tau", "0"], "--tau"),
    (["--model", "tiny", "--prompt-ids", "5 6 7", "--policy", "greedy"], "--policy"),
    (["--model", "tiny", "--prompt-ids", "5 x"], "--prompt-ids"),
    (["--model", "tiny", "--prompt-ids", "5 6 7", "--chat"], "--chat"),
    (["--model", "no-such-model", "--prompt-ids", "5"], "--model"),
])
def test_user_mistakes_exit_2_with_one_line_naming_the_flag(capsys, argv, flag):
    rc, _, err = _run(capsys, "generate", *argv)
    errors = [line for line in err.splitlines() if line.startswith("clover generate: error:")]
    assert rc == 2 and len(errors) == 1 and flag in errors[0]
    assert "SamplingParams." not in err


def _feed(monkeypatch, lines):
    """Make input() return `lines` one by one, then raise EOFError; record how many were read."""
    it, read = iter(lines), []

    def fake_input(prompt=""):
        line = next(it, None)
        if line is None:
            raise EOFError
        read.append(line)
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    return read


def test_chat_keeps_history_resets_and_exits(capsys, monkeypatch, model_dir):
    """Each turn sees the earlier turns; /reset drops them (the system turn stays); /exit quits."""
    seen = []
    real_chat = LLM.chat
    monkeypatch.setattr(LLM, "chat", lambda self, m, *a, **k: seen.append(m) or
                        real_chat(self, m, *a, **k))
    read = _feed(monkeypatch, ["hi", "the quick", "/reset", "again", "/exit", "never read"])
    rc, out, _ = _run(capsys, "chat", "--model", model_dir, "--system", "be brief",
                      "--max-tokens", "4")
    assert rc == 0 and read == ["hi", "the quick", "/reset", "again", "/exit"]
    assert [len(m) for m in seen] == [2, 4, 2]  # system + user; + assistant + user; reset
    assert seen[1][2]["role"] == "assistant" and seen[2][-1]["content"] == "again"
    assert out.count("assistant>") == 3 and "(history cleared)" in out


def test_chat_quits_on_eof(capsys, monkeypatch, model_dir):
    _feed(monkeypatch, ["hello"])
    rc, out, _ = _run(capsys, "chat", "--model", model_dir, "--max-tokens", "4")
    assert rc == 0 and out.count("assistant>") == 1


def test_chat_shows_tool_calls_and_errors_without_running_them(capsys):
    text = "Checking. " + format_tool_call("get_weather", {"city": "Oslo"}) + "<tool_call>{oops"
    out = RequestOutput("r", [1], [], text, "stop", RequestStats())
    with_tool_calls(out)
    print_reply(out)
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "assistant> Checking."
    assert shown[1] == 'tool call> get_weather({"city": "Oslo"})  [not executed]'
    assert shown[2].startswith("error> tool call: missing </tool_call>")
    assert out.finish_reason == "tool_calls"


def test_chat_rejects_bad_tools_file(capsys, model_dir, tmp_path):
    bad = tmp_path / "tools.json"
    bad.write_text("{not json")
    rc, _, err = _run(capsys, "chat", "--model", model_dir, "--tools", str(bad))
    assert rc == 2 and "--tools" in err


def test_console_script_end_to_end(model_dir):
    """`python -m clover.cli generate` works in a fresh process (no state from these tests)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "clover.cli", "generate", "--model", model_dir, "--prompt",
           "the quick", "--max-tokens", "4", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["request_id"] == "req-0"


def test_version_flag_prints_the_package_version(capsys):
    """`clover --version` answers with clover.__version__ (the version pyproject.toml reads)."""
    import clover

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"clover {clover.__version__}"


def test_draft_prints_the_ar_models_greedy_text_and_refuses_what_it_cannot_do(capsys, tmp_path):
    """--draft DIR: the AR --model checks a drafter's tokens (self-speculative): the text is the
    AR model's own greedy text, in fewer forwards. Tiny dense models (the pair routes plain
    linears); the drafter is a shifted block model with the AR model's seed, so drafts pass."""
    texts = [f"the quick brown fox {i} jumps over the lazy dog number {i}" for i in range(200)]
    tok = train_tokenizer(texts, vocab_size=512)
    dense = dict(qk_norm=False, num_experts=0, num_dense_layers=0)
    ar = str(save(build_model(get_preset("tiny", attention="causal", block_size=1, **dense),
                              seed=0), tok, tmp_path / "ar"))
    draft = str(save(build_model(get_preset("tiny", shift_logits=True, **dense), seed=0), tok,
                     tmp_path / "draft"))
    flags = ["--prompt", "the quick brown", "--max-tokens", "24", "--ignore-eos",
             "--device", "cpu", "--dtype", "float32", "--json"]
    rc, out, _ = _run(capsys, "generate", "--model", ar, *flags)
    alone = json.loads(out)
    rc2, out, _ = _run(capsys, "generate", "--model", ar, "--draft", draft, *flags)
    paired = json.loads(out)
    assert rc == rc2 == 0 and paired["token_ids"] == alone["token_ids"]
    assert len(paired["token_ids"]) == 24 and paired["stats"]["forwards"] < 24
    stats = paired["stats"]  # each accepted draft saved a forward (the prefill wrote token 1)
    assert stats["draft_tokens"] >= stats["accepted_tokens"] == 24 - stats["forwards"]
    assert "draft_tokens" not in alone["stats"]
    for argv, why in ((["--draft", str(tmp_path / "none")], "is not a model directory"),
                      (["--draft", draft, "--show-steps"], "drop --show-steps"),
                      (["--draft", draft, "--compile"], "not supported with --compile")):
        rc, _, err = _run(capsys, "generate", "--model", ar, *argv, *flags)
        assert rc == 2 and "--draft" in err and why in err
    rc, _, err = _run(capsys, "generate", "--model", "tiny", "--draft", draft, *flags)
    assert rc == 2 and "--model to be the AR model's directory" in err
