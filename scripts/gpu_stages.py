"""Train the airspace-smol pair on one GPU inside a fixed time budget (maintainers' tool).

    PYTHONUNBUFFERED=1 python scripts/gpu_stages.py --budget 480 --twin models/clover-smol-ar \
        --work /tmp/gw [--pack OUT]

Three `clover train --recipe airspace-smol --device cuda` stages, in this order:
  A  the AR twin continued from `--twin` (seed 11);
  D  the block-diffusion model adapted from A (the clover-smol stage-4/5 recipe: blocks of 8,
     shifted prediction, complementary masks, trained mask row, sharpen 0.1; seed 12; with
     `--distill W`, also distilling A's next-token distribution, `--distill-from A`);
  B  the AR twin continued from A on D's examples (same seed, steps and batch), so the twin has
     exactly the diffusion model's task examples (the issue's budget rule).
Their step counts come from two short probe runs (6 AR steps, 5 diffusion steps, discarded):
the steady seconds per step of each, the fixed cost of a run (load, data, warm-up, save), and
`--share-a` of the time left going to A. Every command run is printed and written to
WORK/record.json; with `--pack OUT` each finished model directory (plus its log.jsonl) is also
written as OUT/NAME.tgz.NN parts of 15 MiB, for transports with a per-file size cap.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

from clover.cli import main as clover

T0 = time.time()


def log(*parts) -> None:
    print(f"[{time.time() - T0:7.1f}s]", *parts, flush=True)


def commands(a: argparse.Namespace) -> tuple[list[str], list[str]]:
    common = ["train", "--recipe", "airspace-smol", "--batch-size", str(a.batch_size),
              "--micro-batch-size", str(a.batch_size), "--bf16", "--no-progress", "--device",
              a.device, "--no-prefix-grad", "--save-every", "100000", "--lr", str(a.lr)]
    ar = common + ["--attention", "causal"]
    dl = common + ["--attention", "block", "--block-size", "8", "--shift-logits", "--sharpen",
                   "0.1", "--complementary-masks", "--train-mask-row"]
    return ar, dl


def run(name: str, argv: list[str], work: Path, record: list) -> float:
    start = time.time()
    log(name, "clover " + " ".join(argv))
    rc = clover(argv)
    wall = time.time() - start
    log(name, f"rc={rc} wall={wall:.1f}s")
    record.append({"name": name, "command": "clover " + " ".join(argv), "rc": rc,
                   "wall_s": round(wall, 1)})
    (work / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    if rc != 0:
        raise SystemExit(f"{name}: clover train exited {rc}")
    return wall


def seconds_per_step(work_dir: Path) -> float:
    """Steady seconds per step from a run's log.jsonl (elapsed = tokens / cumulative tok/s),
    between its second and last logged step (the first holds the warm-up)."""
    rows = [json.loads(x) for x in (work_dir / "log.jsonl").read_text().splitlines()]
    elapsed = [(r["step"], r["tokens_seen"] / r["tok_s"]) for r in rows
               if r.get("tok_s") and "tokens_seen" in r]
    (s0, e0), (s1, e1) = elapsed[1], elapsed[-1]
    return (e1 - e0) / (s1 - s0)


def pack(name: str, model_dir: Path, work_dir: Path, out: Path) -> None:
    shutil.copy(work_dir / "log.jsonl", model_dir / "train_log.jsonl")
    shutil.copy(work_dir.parent / "record.json", model_dir / "stages_record.json")
    tgz = work_dir.parent / f"{name}.tgz"
    subprocess.run(["tar", "czf", str(tgz), "-C", str(model_dir.parent), model_dir.name],
                   check=True)
    subprocess.run(["split", "-b", "15M", "-d", str(tgz), str(out / f"{name}.tgz.")], check=True)
    log("packed", name, tgz.stat().st_size, "bytes")


def plan(a: argparse.Namespace, ar: list[str], dl: list[str], record: list) -> tuple[int, int]:
    """(steps of A, steps of D = steps of B) that fit the budget, from two probe runs."""
    w = a.work
    w_ar = run("probe-ar", ar + ["--init-adapter", a.twin, "--steps", "6", "--seed", "98",
                                 "--out", str(w / "pa"), "--work-dir", str(w / "pa-w")], w, record)
    s_ar = seconds_per_step(w / "pa-w")
    teach = ["--distill-from", a.twin, "--distill-coef", str(a.distill)] if a.distill else []
    w_dl = run("probe-dl", dl + teach + ["--init-adapter", a.twin, "--steps", "5", "--seed",
                                         "99", "--out", str(w / "pd"), "--work-dir",
                                         str(w / "pd-w")], w, record)
    s_dl = seconds_per_step(w / "pd-w")
    fixed = max(w_ar - 6 * s_ar, w_dl - 5 * s_dl)
    left = a.budget - (time.time() - T0) - 3 * fixed - 25
    data = 0.0025 * a.batch_size  # generating and tokenizing a step's examples, seconds
    steps_a = max(2, int(a.share_a * left / (s_ar + data)))
    steps_d = max(2, int((1 - a.share_a) * left / (s_dl + s_ar + 2 * data)))
    log(f"AR {s_ar:.3f} s/step, diffusion {s_dl:.3f} s/step, fixed {fixed:.1f} s, "
        f"{left:.0f} s left -> A {steps_a} steps, D and B {steps_d} steps")
    return steps_a, steps_d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget", type=float, required=True, help="seconds for everything")
    p.add_argument("--twin", required=True, help="the AR twin's adapter directory to start from")
    p.add_argument("--work", type=Path, required=True, help="stage outputs and work dirs")
    p.add_argument("--pack", type=Path, default=None, help="also write NAME.tgz.NN parts here")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu", "auto"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--share-a", type=float, default=0.3, help="share of the time for stage A")
    p.add_argument("--distill", type=float, default=0.0, metavar="W",
                   help="stage D also learns A's next token (--distill-coef W)")
    p.add_argument("--steps", default=None, metavar="A,D", help="skip the probes (a dry run)")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    record: list = []
    ar, dl = commands(a)
    steps_a, steps_d = (map(int, a.steps.split(",")) if a.steps else plan(a, ar, dl, record))
    w = a.work
    if a.distill:
        dl = dl + ["--distill-from", str(w / "A"), "--distill-coef", str(a.distill)]
    stages = [("A", ar, a.twin, steps_a, 11), ("D", dl, str(w / "A"), steps_d, 12),
              ("B", ar, str(w / "A"), steps_d, 12)]
    for name, argv, init, steps, seed in stages:
        run(name, argv + ["--init-adapter", init, "--steps", str(steps), "--seed", str(seed),
                          "--out", str(w / name), "--work-dir", str(w / f"{name}-w")], w, record)
        if a.pack:
            a.pack.mkdir(parents=True, exist_ok=True)
            pack(name, w / name, w / f"{name}-w", a.pack)
    log("done")


if __name__ == "__main__":
    main()
