"""FSDP2 training on CPU with gloo: 2 processes train exactly like 1 on the same global batch,
a sharded checkpoint written by 2 processes resumes in 1, and the exported model directory loads
and decodes. One spawn of 2 processes serves every test here (module fixture)."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from clover.checkpoint import load_model
from clover.config import get_preset
from clover.engine.llm import LLM
from clover.engine.params import SamplingParams
from clover.model import build_model
from clover.train import TrainConfig, Trainer, sft_example

STEPS, STOP = 4, 2


def _examples(n: int, seed: int = 0) -> list:
    """Copy-reversed toy task behind a shared 9-token system prefix (the two-call shared-prefix
    path of the objective runs under FSDP too)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = torch.randint(20, 60, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g)
        out.append(sft_example([5, 6, 7, 8, 9, 10, 11, 12, 13, 3, *p.tolist(), 4],
                               [*p.tolist()[::-1], 1]))
    return out


def _model(seed: int = 0):
    """tiny with two MoE layers (sigmoid routers: expert-bias buffers travel in checkpoints)."""
    return build_model(get_preset("tiny", router="sigmoid", num_layers=3), seed=seed)


def _config(parallel: str, **kw) -> TrainConfig:
    base = dict(steps=STEPS, batch_size=8, lr=3e-3, warmup_steps=1, device="cpu", progress=False,
                log_every=1, parallel=parallel)
    return TrainConfig(**{**base, **kw})


def _param_sum(model) -> float:
    return sum(float(p.detach().double().sum()) for p in model.parameters())


def _worker(rank: int, world: int, port: int, root: str) -> None:
    from clover.tokenizer import load_tokenizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    data, val = _examples(64), _examples(5, seed=9)  # 5: the ranks hold 3 and 2 val examples
    Trainer(_model(), data, _config("fsdp", work_dir=f"{root}/work", stop_after=STOP)).fit()
    trainer = Trainer(_model(), data, _config("fsdp"), val_data=val,
                      tokenizer=load_tokenizer(f"{root}/tok"),
                      evaluate=lambda model, step: {"param_sum": _param_sum(model)})
    summary = trainer.fit()
    trainer.export(f"{root}/export")
    result = {"losses": trainer.state.losses, "summary": summary,
              "sharded": type(trainer.model).__name__}
    Path(root, f"{rank}.json").write_text(json.dumps(result))
    trainer.close()
    os._exit(0)  # no interpreter finalization: torch's gloo teardown there has aborted done ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """Run the 2-process FSDP2 jobs once; return their directory."""
    import torch.multiprocessing as mp

    from clover.server.testing import SAMPLE_TEXTS
    from clover.tokenizer import save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("fsdp")
    save_tokenizer(train_tokenizer(SAMPLE_TEXTS * 20, vocab_size=512), root / "tok")
    mp.start_processes(_worker, args=(2, _free_port(), str(root)), nprocs=2, join=True,
                       start_method="spawn")
    return root


@pytest.fixture(scope="module")
def single_run():
    """The same global batch in one process as 2 micro-batches. One FSDP process has nothing to
    shard and trains the plain model, with the prompt prefix recomputed per row as under FSDP."""
    trainer = Trainer(_model(), _examples(64), _config("fsdp", micro_batch_size=4),
                      val_data=_examples(5, seed=9))
    return trainer, trainer.fit()


@pytest.mark.slow
def test_fsdp_two_processes_match_one(fsdp_run, single_run):
    """Same losses, validation loss and final weights (fp32 tolerance) as 1 process: FSDP2's
    reduce-scatter mean plus the loop's world scaling is the global-batch gradient."""
    single, summary = single_run
    for rank in range(2):
        got = json.loads((fsdp_run / f"{rank}.json").read_text())
        assert got["sharded"].startswith("FSDP")  # the model really was sharded
        assert got["losses"] == pytest.approx(single.state.losses, abs=1e-5)
        assert got["summary"]["val_loss"] == pytest.approx(summary["val_loss"], abs=1e-5)
    main = json.loads((fsdp_run / "0.json").read_text())
    assert main["summary"]["param_sum"] == pytest.approx(_param_sum(single.model), rel=1e-5)


@pytest.mark.slow
def test_sharded_checkpoint_from_two_processes_resumes_in_one(fsdp_run, single_run):
    """The checkpoint 2 processes wrote at step 2 (torch.distributed.checkpoint shards) loads in
    1 process; the next losses are the uninterrupted run's."""
    single, _ = single_run
    ckpt = fsdp_run / "work" / "checkpoint"
    assert (ckpt / "sharded" / ".metadata").is_file()
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2  # one shard file per rank
    resumed = Trainer(_model(seed=1), _examples(64),  # only the checkpoint can make it right
                      _config("fsdp", work_dir=str(fsdp_run / "work"), resume=True))
    assert resumed.state.step == STOP
    resumed.fit()
    assert resumed.state.losses[STOP:] == pytest.approx(single.state.losses[STOP:], abs=1e-5)
    assert resumed.state.losses[:STOP] == pytest.approx(single.state.losses[:STOP], abs=1e-5)


@pytest.mark.slow
def test_exported_model_loads_and_decodes(fsdp_run, single_run):
    """The export is a full safetensors model directory: it loads with the tokenizer, holds the
    trained weights, and decodes what the single-process model decodes (seeded sampling: four
    steps of training make greedy decoding answer EOS at once, which would prove little)."""
    single, _ = single_run
    exported = load_model(fsdp_run / "export")
    for (name, a), b in zip(single.model.state_dict().items(),
                            exported.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0, msg=name)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=8)
    prompt = "The weather in Paris"
    got = LLM(str(fsdp_run / "export"), device="cpu").generate([prompt], params)[0]
    want = LLM(single.model, got_tokenizer(fsdp_run), device="cpu").generate([prompt], params)[0]
    assert got.token_ids and got.token_ids == want.token_ids, got.finish_reason


def got_tokenizer(root: Path):
    from clover.tokenizer import load_tokenizer

    return load_tokenizer(root / "export")
