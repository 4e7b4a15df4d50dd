"""The table of scripts/ablate_adaptation.sh (maintainers' tool; run from the repository root):
per variant, its training time and final validation loss, the calibration probe (next-token
accuracy; replies all right and the prefix policy's TPF at tau 1.0 / 0.9), and the decoded
validation eval (zone F1, validity, exact messages, TPF)."""

import json
import re
from pathlib import Path

SCRIPT = Path("scripts/ablate_adaptation.sh")
COLUMNS = ("variant", "flags", "train s", "val loss", "next-token", "all right tau 1.0",
           "probe TPF tau 0.9", "all right tau 0.9", "val zone F1", "validity", "exact", "TPF")


def fmt(d: dict, key: str, spec: str = ".3f") -> str:
    return "-" if d.get(key) is None else format(d[key], spec)


def main() -> None:
    text = SCRIPT.read_text()
    base = re.search(r'^BASE="(.*)"$', text, re.M).group(1)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for name, flags in re.findall(r'^  "(\w+)\|(.*)"$', text, re.M):
        flags = flags.replace("$BASE", base)
        record = Path(f"runs/abl-{name}/training.json")
        if not record.exists():
            print(f"| {name} | `{flags}` | (not run) |" + " |" * (len(COLUMNS) - 3))
            continue
        m = json.loads(record.read_text())["final_metrics"]
        e = Path(f"runs/eval/abl-{name}-val.json")
        lines = e.read_text().strip().splitlines() if e.exists() else []
        ev = json.loads(lines[-1]) if lines else {}  # not yet evaluated: "-"
        cells = [name, f"`{flags}`", fmt(m, "wall_s", ".0f"), fmt(m, "val_loss", ".4f"),
                 fmt(m, "cal_next_token_acc", ".4f"), fmt(m, "cal_all_right_1.0"),
                 fmt(m, "cal_tpf_0.9", ".2f"), fmt(m, "cal_all_right_0.9"), fmt(ev, "zone_f1"),
                 fmt(ev, "tool_call_validity"), fmt(ev, "exact_message_accuracy"),
                 fmt(ev, "tpf", ".2f")]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
