"""The airspace recipe end to end on the `tiny` preset: tokenizer, SFT data, training, model dir."""

import argparse
import json

import pytest

from clover import checkpoint
from clover.tasks.airspace import recipes
from clover.tasks.airspace.train_cli import parse_overrides, register


@pytest.fixture
def smoke_recipe(monkeypatch):
    recipe = recipes.Recipe(name="smoke", preset="tiny", steps=2, batch_size=2, num_val=2,
                            num_eval=0, tokenizer_examples=200, warmup_steps=0)
    monkeypatch.setitem(recipes.RECIPES, "smoke", recipe)
    return recipe


def test_sft_prompt_and_response_split_the_rendered_chat():
    """Prompt ends with the assistant marker; the response is the tool calls and ends in EOS."""
    from clover.tasks.airspace import generate_examples

    tok = recipes.build_tokenizer(512, 200, seed=0)
    examples = generate_examples("train", 4, seed=0)
    for ex, sft in zip(examples, recipes.airspace_sft(tok, examples), strict=True):
        prompt = tok.decode(sft.ids[:sft.prompt_len])
        response = tok.decode(sft.ids[sft.prompt_len:])
        assert prompt.endswith("<|assistant|>") and ex.text in prompt
        assert response.endswith("<|eos|>") and response.count("<|eos|>") == 1
        if ex.calls:
            assert response.startswith("<tool_call>")


def test_copy_task_answers_with_a_run_of_the_prompt_and_shares_the_task_prefix():
    """The repeat task's answer is the message's own tokens (so copying can solve it) and its prompt
    starts like the task's (so the shared system-prompt prefix is not broken by mixing)."""
    from clover.tasks.airspace import generate_examples

    tok = recipes.build_tokenizer(512, 200, seed=0)
    examples = generate_examples("train", 4, seed=0)
    sft = recipes.airspace_sft(tok, examples)
    for ex, task, copy in zip(examples, sft, recipes.copy_task(tok, examples, max_tokens=16),
                              strict=True):
        prompt, answer = list(copy.ids[:copy.prompt_len]), list(copy.ids[copy.prompt_len:])
        assert answer[-1] == tok.eos_token_id and 1 < len(answer) <= 17
        body = answer[:-1]
        assert any(prompt[i:i + len(body)] == body for i in range(len(prompt)))
        assert tok.decode(body) == tok.decode(tok.encode(ex.text)[:16])
        text, task_text = tok.decode(prompt), tok.decode(task.ids[:task.prompt_len])
        system_end = text.index("<|user|>")
        assert text[:system_end] == task_text[:system_end]
        assert recipes.COPY_INSTRUCTION in text


def test_prompt_loss_makes_the_prompt_a_target_and_keeps_the_tokens():
    """--prompt-loss: the same ids, every token a target (the collator still starts a causal
    model's targets at position 1); the default keeps the prompt out of the loss."""
    from clover.tasks.airspace import generate_examples
    from clover.train.data import Collator

    tok = recipes.build_tokenizer(512, 200, seed=0)
    sft = recipes.airspace_sft(tok, generate_examples("train", 3, seed=0))
    full = [recipes.with_prompt_loss(ex) for ex in sft]
    assert [ex.ids for ex in full] == [ex.ids for ex in sft]
    collate = Collator(pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, first_target=1)
    sft_batch, full_batch = collate(sft, [0, 1, 2]), collate(full, [0, 1, 2])
    assert full_batch.num_targets == sum(len(ex.ids) - 1 for ex in sft)
    assert sft_batch.num_targets == sum(len(ex.ids) - ex.prompt_len for ex in sft)
    assert full_batch.target_BL[:, 0].sum() == 0


@pytest.mark.parametrize(("field", "value", "flag"), [("copy_mix", 1.5, "--copy-mix"),
                                                     ("prompt_format", "terse", "--prompt-format"),
                                                     ("stop_after", 2, "--stop-after"),
                                                     ("ar_mix", -1.0, "--ar-mix"),
                                                     ("complementary", True,
                                                      "--complementary-masks"),
                                                     ("suffix_masks", 0.5, "--suffix-masks"),
                                                     ("eval_every", -1, "--eval-every"),
                                                     ("ack_share", 0.5, "--ack-share"),
                                                     ("own_token", True, "--own-token"),
                                                     ("mask_init", "random", "--mask-init")])
def test_bad_recipe_option_names_the_flag(smoke_recipe, tmp_path, field, value, flag):
    with pytest.raises(ValueError, match=flag):
        recipes.run_recipe(recipes.RunArgs(recipe="smoke", out=str(tmp_path / "m"),
                                           work_dir=str(tmp_path / "w"), device="cpu",
                                           attention="causal", **{field: value}))


@pytest.mark.parametrize(("items", "message"), [
    (["num_experts"], "expected KEY=VALUE"),
    (["colour=1"], "not a model config field"),
    (["attention=causal"], "not a model config field"),  # --attention owns it
    (["num_dense_layers=9"], "num_dense_layers must be in"),
])
def test_bad_config_override_names_the_flag(items, message):
    with pytest.raises(ValueError, match=message) as e:
        recipes.recipe_config(recipes.RECIPES["airspace-tiny"], "causal",
                              overrides=parse_overrides(items))
    assert "--set" in str(e.value)


def test_config_override_values_are_json_or_text():
    assert parse_overrides(["dim=64", "qk_norm=true", "router=sigmoid"]) == {
        "dim": 64, "qk_norm": True, "router": "sigmoid"}
    config = recipes.recipe_config(recipes.RECIPES["airspace-tiny"], "block", True,
                                   {"num_dense_layers": 4})
    assert config.num_dense_layers == 4 and config.shift_logits and config.attention == "block"


def test_mid_run_evaluations_log_the_calibration_probe(smoke_recipe, tmp_path):
    """--eval-every 1 --calibration-examples 2: every step's log entry holds the probe's
    next-token accuracy and the replayed prefix policy at tau 1.0 (TPF 1) and 0.9."""
    work = tmp_path / "w"
    recipes.run_recipe(recipes.RunArgs(recipe="smoke", out=str(tmp_path / "m"),
                                       work_dir=str(work), device="cpu", attention="block",
                                       eval_examples=0, eval_every=1, calibration_examples=2,
                                       progress=False))
    logged = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    probed = [e for e in logged if "cal_next_token_acc" in e]
    assert [e["step"] for e in probed] == [1, 2]
    for e in probed:
        assert 0 <= e["cal_next_token_acc"] <= 1 and e["cal_tpf_1.0"] == 1.0
        assert e["cal_tpf_0.9"] >= 1.0 and 0 <= e["cal_all_right_0.9"] <= 1


@pytest.mark.slow
def test_recipe_writes_model_directory_and_resumes(smoke_recipe, tmp_path):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out, work = tmp_path / "model", tmp_path / "work"
    argv = ["train", "--recipe", "smoke", "--out", str(out), "--work-dir", str(work),
            "--device", "cpu", "--no-progress", "--eval-examples", "0", "--copy-mix", "0.5",
            "--prompt-format", "message", "--prompt-loss", "--set", "num_dense_layers=2",
            "--set", "ffn_dim=48"]
    # --stop-after: a checkpoint (with the tokenizer) that --init-from can start from, no model
    stopped = parser.parse_args([*argv[:6], str(tmp_path / "w1"), *argv[7:], "--stop-after", "1"])
    assert stopped.func(stopped) == 0 and not out.exists()
    state = json.loads((tmp_path / "w1" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 1
    model, tok = checkpoint.load(tmp_path / "w1" / "checkpoint")
    assert len(tok) == model.config.vocab_size == 512
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    info = json.loads((out / "training.json").read_text())
    assert info["copy_mix"] == 0.5 and info["prompt_format"] == "message"
    assert info["prompt_loss"] is True
    assert info["steps"] == 2 and info["recipe"] == "smoke" and info["tokens_seen"] > 0
    assert "copy_consistency" in info and (out / "README.md").is_file()
    assert "`smoke` recipe" in (out / "README.md").read_text()
    assert "loss on the prompt" in (out / "README.md").read_text()  # --prompt-loss
    model, tok = checkpoint.load(out)
    assert model.config.vocab_size == len(tok) == 512
    assert (model.config.num_dense_layers, model.config.ffn_dim) == (2, 48)  # --set
    assert info["config_overrides"] == {"num_dense_layers": 2, "ffn_dim": 48}
    assert recipes.prompt_format(tok) == "message"  # the model directory keeps its prompt format
    args = parser.parse_args([*argv, "--resume", "--steps", "3"])
    assert args.func(args) == 0
    assert json.loads((out / "training.json").read_text())["steps"] == 3


def test_init_from_ar_model_keeps_weights_and_takes_attention_from_recipe(tmp_path):
    """AR-to-diffusion adaptation: block model = the causal model's weights, block attention."""
    import torch

    from clover.config import get_preset
    from clover.model import build_model

    ar = build_model(get_preset("tiny", attention="causal", block_size=1), seed=3)
    checkpoint.save(ar, None, tmp_path / "ar")
    model = recipes.init_model(get_preset("tiny"), str(tmp_path / "ar"), seed=0)
    assert model.config.attention == "block" and model.config.block_size == 4
    for (name, a), b in zip(ar.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="shapes differ"):
        recipes.init_model(get_preset("tiny", dim=32, num_heads=2, num_kv_heads=1),
                           str(tmp_path / "ar"), seed=0)


@pytest.mark.parametrize(("changes", "flag"), [
    ({"attention": "block", "ack_share": 1.5}, "--ack-share"),
    ({"attention": "causal", "own_token": True}, "--own-token"),  # an AR twin has no masks
    ({"attention": "block", "own_token": True, "shift_logits": True}, "--own-token"),
    ({"attention": "block", "mask_init": "random"}, "--mask-init .*--train-mask-row")])
def test_base_recipe_bad_option_names_the_flag(tmp_path, changes, flag):
    with pytest.raises(ValueError, match=flag):
        recipes.run_recipe(recipes.RunArgs(recipe="airspace-smol", out=str(tmp_path / "m"),
                                           work_dir=str(tmp_path / "w"), device="cpu",
                                           **changes))
