"""`clover bench`: the grid, flag errors, int8 coverage of the MoE experts, and a whole (tiny)
sweep through the command line. Tiny random models: no timing or quality is asserted."""

import contextlib
import io
import json
import re

import pytest
import torch

import clover.bench.machine as machine
from clover.bench import harness
from clover.bench.config import BenchConfig, Point, grid, make_config, run_order
from clover.bench.harness import with_block_size
from clover.bench.probe import ForwardProbe
from clover.bench.quant import cli_dtype, load_at, split_experts, weight_report
from clover.checkpoint import save
from clover.cli import main
from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.model import build_model
from clover.tasks.airspace import SYSTEM_PROMPT, assistant_text, generate_examples
from clover.tokenizer import train_tokenizer


def _model_dirs(root, max_seq_len: int) -> tuple[str, str]:
    train = generate_examples("train", 120, seed=1)
    texts = [e.text for e in train] + [assistant_text(e.calls) for e in train] + [SYSTEM_PROMPT]
    tok = train_tokenizer(texts, vocab_size=640)
    size = {"vocab_size": 640, "max_seq_len": max_seq_len}
    dllm = build_model(get_preset("tiny", block_size=8, **size), seed=0)
    ar = build_model(get_preset("tiny", attention="causal", block_size=1, **size), seed=0)
    return str(save(dllm, tok, root / "dllm")), str(save(ar, tok, root / "ar"))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A tiny block-diffusion model and its causal twin, saved with one small tokenizer. Their
    max_seq_len is shorter than the airspace chat prompts: the sweep must still decode them."""
    return _model_dirs(tmp_path_factory.mktemp("bench-models"), 512)


def test_grid_puts_each_ar_point_beside_its_diffusion_points():
    """One group per (precision, batch); AR first; the dLLM gets policy x knob x block."""
    cfg = BenchConfig(policies=("threshold", "prefix", "topk"), taus=(0.7, 0.9), steps=(4,),
                      block_sizes=(0, 4), batch_sizes=(1, 8), precisions=("fp32", "int8"))
    groups = grid(cfg, model_block=8, with_ar=True)
    assert len(groups) == 4
    for group in groups:
        assert group[0].role == "ar" and all(p.role == "dllm" for p in group[1:])
        assert len({(p.precision, p.batch_size) for p in group}) == 1
        assert len(group) == 1 + 5 * 2  # (2 + 2 taus + 1 steps) x blocks {8, 4}
    assert {p.block_size for p in groups[0][1:]} == {8, 4}
    prefix = [p for p in groups[0] if p.policy == "prefix"]
    assert {p.value for p in prefix} == {0.7, 0.9}
    assert prefix[0].params(cfg, False).tau == prefix[0].value
    order = run_order(groups[:1], repeats=2)
    assert [p for _, p in order[:11]] == groups[0] and [p for _, p in order[11:]] == groups[0][::-1]


def test_point_params_carry_the_policy_knob():
    cfg = BenchConfig(max_tokens=40)
    topk = Point("dllm", "fp32", 1, "topk", "steps_per_block", 8.0, 32).params(cfg, False)
    assert topk.policy == "topk" and topk.steps_per_block == 8 and topk.max_tokens == 40
    ar = Point("ar", "fp32", 1).params(cfg, False)
    assert ar.temperature == 0.0 and ar.max_tokens == 40


@pytest.mark.parametrize("changes, flag", [
    ({"taus": (1.5,)}, "--taus"), ({"precisions": ("int4",)}, "--precisions"),
    ({"batch_sizes": (0,)}, "--batch-sizes"), ({"policies": ("greedy",)}, "--policies"),
    ({"policies": ("entropy",), "gammas": ()}, "--gammas"), ({"repeats": 0}, "--repeats"),
    ({"policies": ("prefix",), "taus": ()}, "--taus"),
])
def test_bad_settings_name_the_flag(changes, flag):
    with pytest.raises(ValueError, match=flag):
        BenchConfig(**changes)


def test_quick_defaults_yield_to_explicit_flags():
    cfg = make_config(quick=True, n=5, taus=None, precisions=("fp32", "int8"))
    assert cfg.n == 5 and cfg.taus == (0.7, 0.9) and cfg.precisions == ("fp32", "int8")


def _cpu_flags(monkeypatch, *present):
    monkeypatch.setattr(machine, "cpu_features", lambda: {"flags": list(present)})


@pytest.mark.parametrize("flags, native", [(("avx2", "avx512f", "avx512_bf16"), "bf16"),
                                           (("avx2", "amx_bf16"), "bf16"),
                                           (("avx2", "avx512f"), "fp32")])
def test_command_line_precision_auto_is_bf16_only_where_the_cpu_runs_it_natively(
        monkeypatch, flags, native):
    """auto -> bf16 on a CPU with AVX-512 BF16 or AMX (the cost table's fastest), fp32 on one
    without (bf16 is emulated there), in `clover generate / chat / serve / demo` (`cli_dtype`)
    and `clover bench`'s default precisions; an explicit choice is kept as given."""
    _cpu_flags(monkeypatch, *flags)
    assert cli_dtype("auto", "cpu") == {"bf16": "bfloat16", "fp32": "float32"}[native]
    assert cli_dtype("float32", "cpu") == "float32" and cli_dtype("int8", "cpu") == "int8"
    assert make_config(device="cpu").precisions == (native, "int8")
    assert make_config(quick=True, device="cpu").precisions == (native, "int8")
    assert make_config(device="cpu", precisions=("fp32",)).precisions == ("fp32",)


@pytest.mark.parametrize("flags, warned", [(("avx2",), True), (("avx2", "avx512_bf16"), False),
                                           (("avx2", "amx_bf16"), False)])
def test_bf16_asked_for_on_a_cpu_that_emulates_it_is_warned_about(monkeypatch, capsys, flags,
                                                                    warned):
    """An explicit `--dtype bfloat16` and `clover train --bf16` run as asked, with a warning on
    stderr where the CPU emulates bf16 (several times slower than float32 there), none where it
    runs it natively; auto and float32 never warn."""
    import clover.tasks.airspace.train_cli as train_cli

    _cpu_flags(monkeypatch, *flags)
    assert cli_dtype("bfloat16", "cpu") == "bfloat16"
    assert ("warning: --dtype bfloat16" in capsys.readouterr().err) is warned
    cli_dtype("auto", "cpu"), cli_dtype("float32", "cpu")
    assert capsys.readouterr().err == ""
    runs = []
    monkeypatch.setattr(train_cli, "run_recipe", lambda args: runs.append(args.bf16) or {})
    for extra in (["--bf16"], []):
        assert main(["train", "--recipe", "airspace-smol", "--device", "cpu", *extra]) == 0
        assert ("warning: --bf16" in capsys.readouterr().err) is (warned and bool(extra))
    assert runs == [True, False]


def test_serve_takes_the_native_precision_for_auto(monkeypatch, tmp_path):
    """`clover serve --dtype auto` hands the server cli_dtype's choice; an explicit one as given."""
    from clover.server.app import CloverServer

    seen = []

    def load(config):
        seen.append(config.dtype)
        raise ValueError("stop here")

    monkeypatch.setattr(CloverServer, "load", staticmethod(load))
    _cpu_flags(monkeypatch, "avx2", "amx_bf16")
    assert main(["serve", "--model", str(tmp_path), "--device", "cpu"]) == 2
    assert main(["serve", "--model", str(tmp_path), "--device", "cpu", "--dtype", "float32"]) == 2
    _cpu_flags(monkeypatch, "avx2")
    assert main(["serve", "--model", str(tmp_path), "--device", "cpu"]) == 2
    assert seen == ["bfloat16", "float32", "float32"]


def test_missing_model_directory_is_one_line_naming_it(tmp_path, capsys):
    """The shipped models may not be there yet: say which directory is missing, then stop."""
    missing = tmp_path / "clover-tiny"
    assert main(["bench", "airspace", "--quick", "--model", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and "--model" in err


def test_bad_list_flag_is_rejected_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--taus", "0.5,high"])
    assert "--taus" in capsys.readouterr().err


def test_linear_experts_compute_what_stacked_experts_do():
    """Splitting the grouped expert weights into nn.Linears (so int8 can reach them) is exact."""
    model = build_model(get_preset("tiny"), seed=0).eval()
    ids = torch.randint(3, 512, (2, 12))
    with torch.no_grad():
        before = model(ids).logits
        after = split_experts(model)(ids).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


def test_int8_reaches_the_experts_and_still_decodes(model_dirs):
    """Most parameters of an MoE live in the experts: int8 must cover them, not just attention."""
    pytest.importorskip("torchao")
    fp32, tok = load_at(model_dirs[0], "fp32", torch.device("cpu"))
    int8, _ = load_at(model_dirs[0], "int8", torch.device("cpu"))
    full, quant = weight_report(fp32), weight_report(int8)
    experts = sum(p.numel() for n, p in fp32.named_parameters() if ".experts." in n)
    assert quant.quantized_params >= experts > 0
    assert quant.total_params == full.total_params and quant.weights_bytes < full.weights_bytes
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    out = LLM(int8, tokenizer=tok, device="cpu", dtype="float32").generate(["NOTAM"], params)
    assert len(out[0].token_ids) == 16


def test_block_size_view_shares_weights_and_leaves_the_model_alone():
    model = build_model(get_preset("tiny", block_size=8), seed=0)
    view = with_block_size(model, 4)
    assert view.config.block_size == 4 and model.config.block_size == 8
    assert view.embed.weight is model.embed.weight
    assert with_block_size(model, 8) is model


def test_forward_probe_counts_what_the_engine_counts(model_dirs):
    """The probe's token count per forward must agree with the engine's own stats."""
    llm = LLM(model_dirs[0], device="cpu", max_batch_size=2)
    probe = ForwardProbe(llm.engine)
    llm.generate(["first prompt", "a second, longer prompt"],
                 SamplingParams(max_tokens=12, ignore_eos=True))
    stats = llm.engine.stats
    assert probe.count.forwards == stats.forwards
    assert probe.count.tokens == stats.tokens_processed
    assert probe.count.logits >= stats.forwards and probe.count.peak_rss_bytes > 0


def test_predicted_ratio_prices_the_engines_block_layout(model_dirs, monkeypatch):
    """x AR predicted = AR's tokens / the point's x TPF / AR's TPF x t(1) / c, c = (TPF / b)
    t(2b + 1) + (1 - TPF / b) t(b + 1) for a shifted model (a block's first step re-feeds the
    block just completed): forwards timed
    once per (precision, batch, block) on the dLLM's weights, after the prompt; no AR mate, no
    figure."""
    timed = []

    def fake(model, batch, lengths, context, repeats):
        timed.append((model.config.block_size, batch, lengths, context))
        one, block, start = lengths
        return {one: [10.0, 12.0, 11.0], block: [30.0, 33.0, 31.0], start: [50.0, 40.0, 41.0]}

    monkeypatch.setattr(harness, "time_forwards", fake)
    cfg = BenchConfig(model=model_dirs[0], ar_model=model_dirs[1], policies=("threshold",),
                      taus=(0.7, 0.9), block_sizes=(0, 4), batch_sizes=(2,), precisions=("fp32",))
    groups = grid(cfg, model_block=8, with_ar=True)
    points = [{"key": p.key, "role": p.role, "tpf": 1.0 if p.role == "ar" else 2.0,
               "generated_tokens": 300 if p.role == "ar" else 400} for g in groups for p in g]
    models = harness.Models({"dllm": model_dirs[0], "ar": model_dirs[1]}, torch.device("cpu"))
    shift = int(models.get("dllm", "fp32").model.config.shift_logits)
    harness._add_predicted(points, groups, models, context=100)
    dllm = [p for p in points if p["role"] == "dllm"]
    per_forward = {b: 2.0 / b * 41 + (1 - 2.0 / b) * 31 for b in (8, 4)}
    assert [p["predicted_speedup_vs_ar"] for p in dllm] == [
        pytest.approx(300 / 400 * 2.0 * 11 / per_forward[b]) for b in (8, 4, 8, 4)]
    assert sorted(t[2] for t in timed) == [(1, 4 + shift, 8 + shift), (1, 8 + shift, 16 + shift)]
    assert {t[1] for t in timed} == {2} and {t[3] for t in timed} == {100}
    assert "predicted_speedup_vs_ar" not in points[0]  # the AR point itself
    alone = [{"key": p.key, "role": p.role, "tpf": 3.0, "generated_tokens": 9} for p in grid(
        cfg, model_block=8, with_ar=False)[0]]
    harness._add_predicted(alone, grid(cfg, model_block=8, with_ar=False), models, context=100)
    assert not any("predicted_speedup_vs_ar" in p for p in alone)


@pytest.fixture(scope="module")
def bench_run(model_dirs, tmp_path_factory):
    """`clover bench` end to end on two points (dLLM tau=0.9 and its AR twin), 2 messages."""
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("bench-out")
    argv = ["bench", "airspace", "--model", model_dirs[0], "--ar-model", model_dirs[1],
            "--n", "2", "--policies", "threshold", "--taus", "0.9", "--block-sizes", "0",
            "--batch-sizes", "2", "--precisions", "fp32", "--repeats", "1",
            "--max-tokens", "8", "--max-turns", "1", "--out", str(out), "--no-progress"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    return code, out, stdout.getvalue()


def test_sweep_prints_a_table_then_one_json_line(bench_run):
    code, out, stdout = bench_run
    assert code == 0
    lines = stdout.strip().splitlines()
    assert "point" in stdout.split(lines[-1])[0] and "TPF" in stdout
    assert json.loads(lines[-1])["points"] == json.loads((out / "results.json").read_text())[
        "points"]
    result = json.loads((out / "results.json").read_text())
    assert [p["role"] for p in result["points"]] == ["ar", "dllm"]
    for p in result["points"]:
        for key in ("zone_f1", "exact_message_accuracy", "tps", "tpf", "forwards",
                    "full_task_s", "first_usable_s", "peak_memory_bytes", "model_s",
                    "policy_s", "grammar_s", "other_s", "peak_fraction", "spread"):
            assert key in p, key
        assert p["graphs_compiled_in_run"] == 0  # eager: nothing compiles
        assert p["zone_f1_ci95"][0] - 1e-4 <= p["zone_f1"] <= p["zone_f1_ci95"][1] + 1e-4
    assert result["points"][1]["speedup_vs_ar"] > 0
    assert "x AR predicted" in stdout
    assert set(result["matmul_peak_flops_per_s"]) == {"torch.float32"}
    assert result["weights"]["dllm fp32"]["quantized_fraction"] == 0.0
    assert result["hardware"]["device"] == "cpu"


def test_grammar_sweep_decodes_every_point_under_the_strict_contract(tmp_path):
    """--grammar: each turn is constrained by the task's strict tool contract (grammar time on
    every point, none without it) and the report says so. The models' context holds the chat
    prompt with its tool schemas."""
    model_dirs = _model_dirs(tmp_path, 4096)

    def sweep(name: str, *flags: str) -> dict:
        argv = ["bench", "airspace", "--model", model_dirs[0], "--ar-model", model_dirs[1],
                "--n", "2", "--policies", "threshold", "--taus", "0.9", "--block-sizes", "0",
                "--batch-sizes", "2", "--precisions", "fp32", "--repeats", "1",
                "--max-tokens", "8", "--max-turns", "1", "--out", str(tmp_path / name),
                "--no-progress", "--no-plots", *flags]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv) == 0
        return json.loads((tmp_path / name / "results.json").read_text())

    free, strict = sweep("free"), sweep("strict", "--grammar", "--split", "real-dev")
    assert strict["settings"]["grammar"] is True and free["settings"]["grammar"] is False
    assert all(p["grammar_s"] > 0 and p["generated_tokens"] > 0 for p in strict["points"])
    assert all(p["grammar_s"] == 0 and p["generated_tokens"] > 0 for p in free["points"])
    assert "grammar on" in (tmp_path / "strict" / "report.md").read_text()


def test_sweep_writes_plots_and_a_report_that_embeds_them(bench_run):
    _, out, _ = bench_run
    report = (out / "report.md").read_text()
    for name in ("quality_vs_tpf", "quality_vs_time", "tps_vs_batch", "first_usable",
                 "time_split"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name}.png)" in report


def test_copy_probe_marker_batches_hide_the_source_after_its_marker():
    """The marker probe must be solvable by content: the copy target follows the one MARK in the
    filler, and the filler holds look-alike digits when asked."""
    import argparse

    probe = _load_script("copy_probe")
    args = argparse.Namespace(mode="marker", batch=8, digits=5, filler=40, digit_share=0.5)
    tokens = probe._tokens(None, 2048)
    ids = probe._batch(args, tokens, args.digit_share)
    assert ids.shape == (8, 40 + 2 + 5)
    for row in ids.tolist():
        filler, target = row[:40], row[-5:]
        assert row[40:42] == [30, 31] and filler.count(31) == 1
        at = filler.index(31)
        assert filler[at + 1:at + 6] == target
        assert sum(10 <= t < 20 for t in filler) > 5 + 5  # look-alikes beyond the source
    plain = probe._batch(args, tokens, 0.0)  # the --ramp starts with no look-alikes
    assert all(sum(10 <= t < 20 for t in row[:40]) == 5 for row in plain.tolist())


def test_copy_probe_on_a_real_tokenizer_saves_a_model_train_can_start_from(
        model_dirs, tmp_path, monkeypatch):
    """--tokenizer makes the probe copy the tokenizer's own digit tokens among its ordinary
    tokens, and --save writes a model directory that loads with that tokenizer (the first phase
    of a copy curriculum before `clover train --init-from`)."""
    import sys

    from clover.checkpoint import load_model
    from clover.tokenizer import load_tokenizer

    probe = _load_script("copy_probe")
    tok = load_tokenizer(model_dirs[1])
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    tokens = probe._tokens(model_dirs[1], 640)
    assert sorted(tokens["digits"].tolist()) == sorted(digits)
    assert not set(tokens["filler"].tolist()) & (set(digits) | set(tok.all_special_ids))
    out = tmp_path / "probe-model"
    monkeypatch.setattr(sys, "argv", [
        "copy_probe.py", "--preset", "tiny", "--set", "vocab_size=640", "--mode", "marker",
        "--filler", "12", "--digits", "3", "--digit-share", "0.3", "--batch", "4", "--steps", "2",
        "--token-conv", "2", "--tokenizer", model_dirs[1], "--save", str(out)])
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        probe.main()
    assert json.loads(printed.getvalue().splitlines()[-1])["tokenizer"] == model_dirs[1]
    model = load_model(out)
    assert model.config.token_conv == 2 and model.config.attention == "causal"
    assert load_tokenizer(out).get_vocab() == tok.get_vocab()
    assert json.loads((out / "training.json").read_text())["steps"] == 2
    monkeypatch.setattr(sys, "argv", ["copy_probe.py", "--save", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="--save needs --tokenizer"):
        probe.main()


def _load_script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copy_check_scores_a_causal_model_and_refuses_a_block_model(tmp_path):
    """Teacher-forced accuracies are shares in [0, 1] over the real answer tokens; a block model
    (whose forward sees the answer) is refused by name instead of reporting a fake accuracy."""
    copy_check = _load_script("copy_check")
    train = generate_examples("train", 200, seed=1)
    texts = [e.text for e in train] + [assistant_text(e.calls) for e in train] + [SYSTEM_PROMPT]
    tok = train_tokenizer(texts, vocab_size=512)
    for attention, block in (("causal", 1), ("block", 4)):
        config = get_preset("tiny", attention=attention, block_size=block, max_seq_len=4096)
        save(build_model(config, seed=0), tok, tmp_path / attention)
    result = copy_check.check(str(tmp_path / "causal"), n=3)
    assert 0.0 <= result["digit_acc"] <= 1.0 and 0.0 <= result["copy_acc"] <= 1.0
    assert result["digit_tokens"] > 0 and 0 in result["copy_acc_by_position"]
    with pytest.raises(SystemExit, match="block attention"):
        copy_check.check(str(tmp_path / "block"), n=1)


def test_grammar_bench_extraction_is_always_valid_under_its_schema():
    """The `extract` task's reader: gold zones read back as valid, a zone the scorer cannot read
    makes the output invalid; and the task runs end to end under its schema."""
    import jsonschema

    bench = _load_script("grammar_bench")
    validator = jsonschema.Draft202012Validator(bench.extraction_schema())
    examples = [e for e in generate_examples("test", 40, 0) if e.zones][:3]
    gold = json.dumps({"zones": [c["arguments"] for c in examples[0].calls]})
    calls, ok = bench.read_extraction(gold, validator)
    assert ok and len(calls) == len(examples[0].zones)
    assert bench.read_extraction('{"zones": [{"zone_id": "A"}]}', validator) == ([], False)
    llm, _ = bench.load_llm(None, "cpu")
    params = SamplingParams(max_tokens=160, tau=0.5,
                            structured={"json_schema": bench.extraction_schema()})
    result = bench.run(llm, examples, params, task="extract")
    assert result["tokens"] > 0 and result["grammar_s"] > 0
    # random weights rarely close the object within max_tokens; every one that does is valid
    assert result["validity"] * len(examples) >= result["finished_stop"]


def _fake_llama_bench(path, tok_s: float):
    """A stand-in for llama.cpp's llama-bench: its JSON output (-o json) for a tg32 run."""
    runs = [{"n_prompt": 0, "n_gen": 32, "avg_ts": tok_s, "build_commit": "fake",
             "model_type": "llama 135M Q4_1"}]
    path.write_text(f"#!/bin/sh\necho '{json.dumps(runs)}'\n")
    path.chmod(0o755)
    return str(path)


def test_llama_cpp_rate_sits_beside_each_points_task_rate(bench_run, tmp_path):
    """--llama-bench: llama.cpp's decode rate, parsed from its own JSON, and each point's TPS
    over it, in the document and under the table; a path that is not llama-bench is a clear
    error naming the flag."""
    from clover.bench.harness import add_llama_cpp, check_inputs
    from clover.bench.machine import llama_bench
    from clover.bench.report import render_table

    _, out, _ = bench_run
    doc = json.loads((out / "results.json").read_text())
    llama = llama_bench(_fake_llama_bench(tmp_path / "llama-bench", 250.0), tmp_path / "m.gguf",
                        2)
    assert llama["llama_cpp_tok_s"] == 250.0 and llama["gguf"] == "m.gguf"
    add_llama_cpp(doc, llama)
    for p in doc["points"]:
        assert p["tps_vs_llama_cpp"] == pytest.approx(p["tps"] / 250.0)
    assert "llama.cpp (llama-bench tg32" in render_table(doc)
    (tmp_path / "silent").write_text("#!/bin/sh\necho '[]'\n")
    (tmp_path / "silent").chmod(0o755)
    with pytest.raises(ValueError, match="--llama-bench"):
        llama_bench(str(tmp_path / "silent"), tmp_path / "m.gguf", 2)
    with pytest.raises(ValueError, match="--llama-bench"):
        check_inputs(BenchConfig(model=doc["models"]["dllm"]["path"],
                                 llama_bench=str(tmp_path / "m.gguf")))


def test_summarise_takes_medians_and_keeps_the_first_repeats_interval():
    """Over repeats a figure is the median; an interval (a list) is the first repeat's, since
    greedy answers repeat (checked by `same_output_every_repeat`): no median of lists."""
    rows = [{"zone_f1": 0.5, "zone_f1_ci95": [0.3, 0.7], "full_task_s": s, "generated_tokens": 9}
            for s in (2.0, 4.0)]
    out = harness.summarise(Point("ar", "fp32", 1), rows, peak_flops=0.0)
    assert out["full_task_s"] == 3.0 and out["spread"]["full_task_s"] == [2.0, 4.0]
    assert out["zone_f1_ci95"] == [0.3, 0.7] and out["same_output_every_repeat"]


def test_a_drafter_adds_a_self_speculative_point_with_the_twins_answers(tmp_path, capsys):
    """--draft: per (precision, batch) a third point, the AR twin checking the drafter's tokens,
    run beside AR's: the same answers (greedy, the twin's), its own forwards counted by the probe
    (clean and mask rows: more than one token a forward), its acceptance rate (AR: none), a ratio
    against AR and a line in the report. Tiny dense models (the pair routes plain linears); the
    drafter shares the twin's weights (same seed)."""
    from clover.checkpoint import load

    ar_dir, dllm_dir = _model_dirs(tmp_path, 4096)[1], _model_dirs(tmp_path / "d", 4096)[0]
    _, tok = load(ar_dir)
    dense = dict(qk_norm=False, num_experts=0, num_dense_layers=0, max_seq_len=4096,
                 vocab_size=640)
    ar = str(save(build_model(get_preset("tiny", attention="causal", block_size=1, **dense),
                              seed=0), tok, tmp_path / "ar-dense"))
    draft = str(save(build_model(get_preset("tiny", shift_logits=True, **dense), seed=0), tok,
                     tmp_path / "draft"))
    argv = ["bench", "airspace", "--model", dllm_dir, "--ar-model", ar, "--draft", draft,
            "--n", "2", "--policies", "threshold", "--taus", "0.9", "--block-sizes", "0",
            "--batch-sizes", "1,2", "--precisions", "fp32", "--repeats", "1", "--max-tokens",
            "12", "--max-turns", "1", "--out", str(tmp_path / "out"), "--no-progress"]
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        assert main(argv) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    points = result["points"]
    assert [p["role"] for p in points] == ["ar", "spec", "dllm"] * 2
    for ar_p, spec in zip(points[0::3], points[1::3], strict=True):
        assert spec["setting"] == "AR + drafter" and spec["batch_size"] == ar_p["batch_size"]
        assert spec["generated_tokens"] == ar_p["generated_tokens"] > 0
        assert spec["zone_f1"] == ar_p["zone_f1"]
        assert spec["tokens_per_forward"] > 1 and spec["flops"] > 0
        assert spec["speedup_vs_ar"] > 0 and "predicted_speedup_vs_ar" not in spec
        assert 0 <= spec["acceptance_rate"] <= 1 and ar_p["acceptance_rate"] is None
    assert result["models"]["spec"]["path"] == draft
    assert "AR + drafter" in stdout.getvalue()
    assert "AR + drafter (TPF" in (tmp_path / "out" / "report.md").read_text()
    for extra, match in ((["--no-ar"], "--draft needs --ar-model"),
                         (["--grammar"], "--draft self-speculative decoding has no grammar")):
        assert main(argv[:-3] + extra + ["--no-plots"]) == 2
        assert match in capsys.readouterr().err
    assert main([a if a != draft else ar for a in argv]) == 2
    assert re.search("--draft .*not a block-diffusion model", capsys.readouterr().err)
