"""The table of scripts/ablate_adaptation.sh (maintainers' tool; run from the repository root):
per variant, its training time and final validation loss, the calibration probe (next-token
accuracy; replies all right and the prefix policy's TPF at tau 1.0 / 0.9), and the decoded
validation eval (zone F1, validity, exact messages, TPF).

Two sets, each compared only within itself: bf16 (runs/abl-NAME) and fp32 (`PRECISION=fp32`,
runs/abl32-NAME, for CPUs without AVX-512 BF16). A variant is read from runs/ when it is there,
else from the record in clover-smol's training.json (`adaptation_ablations`, keys NAME and
"NAME fp32"). `--record "MACHINE"` writes the variants found in runs/ into that record, with
the machine they ran on."""

import argparse
import json
import re
from pathlib import Path

SCRIPT = Path("scripts/ablate_adaptation.sh")
RECORD = Path("models/clover-smol/training.json")
COLUMNS = ("variant", "precision", "flags", "train s", "val loss", "next-token",
           "all right tau 1.0", "probe TPF tau 0.9", "all right tau 0.9",
           "val zone F1", "validity", "exact", "TPF")
# (key, format): training's final metrics, then the decoded eval's summary
KEYS = (("wall_s", ".0f"), ("val_loss", ".4f"), ("cal_next_token_acc", ".4f"),
        ("cal_all_right_1.0", ".3f"), ("cal_tpf_0.9", ".2f"), ("cal_all_right_0.9", ".3f"),
        ("zone_f1", ".3f"), ("tool_call_validity", ".3f"), ("exact_message_accuracy", ".3f"),
        ("tpf", ".2f"))
SETS = (("abl", "bf16", ""), ("abl32", "fp32", " fp32"))  # (runs/ prefix, precision, key suffix)


def variants() -> list[tuple[str, str]]:
    text = SCRIPT.read_text()
    base = re.search(r'^BASE="(.*)"$', text, re.M).group(1)
    return [(name, flags.replace("$BASE", base))
            for name, flags in re.findall(r'^  "(\w+)\|(.*)"$', text, re.M)]


def from_runs(prefix: str, name: str) -> dict | None:
    """The variant's figures from runs/, or None when it has not been trained there."""
    record = Path(f"runs/{prefix}-{name}/training.json")
    if not record.exists():
        return None
    row = dict(json.loads(record.read_text())["final_metrics"])
    e = Path(f"runs/eval/{prefix}-{name}-val.json")
    lines = e.read_text().strip().splitlines() if e.exists() else []
    row.update(json.loads(lines[-1]) if lines else {})  # not yet evaluated: "-"
    return {key: row.get(key) for key, _ in KEYS}


def fmt(d: dict, key: str, spec: str) -> str:
    return "-" if d.get(key) is None else format(d[key], spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", metavar="MACHINE",
                    help="write the variants measured in runs/ into the training.json record")
    args = ap.parse_args()
    doc = json.loads(RECORD.read_text())
    stored = doc.get("adaptation_ablations", {}).get("variants", {})
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for prefix, precision, suffix in SETS:
        for name, flags in variants():
            row = from_runs(prefix, name)
            if row is not None and args.record:
                stored[name + suffix] = {"flags": flags, "precision": precision,
                                         "measured": args.record, **row}
            row = row if row is not None else stored.get(name + suffix)
            if row is None:
                if prefix == "abl":  # the fp32 set lists only what it has
                    print(f"| {name} | {precision} | `{flags}` | (not run) |"
                          + " |" * (len(COLUMNS) - 4))
                continue
            cells = [name, precision, f"`{flags}`"] + [fmt(row, k, spec) for k, spec in KEYS]
            print("| " + " | ".join(cells) + " |")
    if args.record:
        doc.setdefault("adaptation_ablations", {})["variants"] = stored
        RECORD.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
