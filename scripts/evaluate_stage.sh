#!/bin/bash
# A finished training stage against the shipped model it would replace (maintainers' tool; run
# from the repository root). Usage:
#   bash scripts/evaluate_stage.sh RUN SHIPPED TAG [BF16_BAR]
# e.g. `bash scripts/evaluate_stage.sh runs/smol-dl12 models/clover-smol dl12 0.441`.
# Waits for any `clover train --recipe` to end, then applies the shipping rule each stage has used
# (fixed before the stage ran): the stage's validation zone F1 (40 messages, seed 0, threshold tau
# 0.9, first turn; an AR model ignores tau) must beat the shipped model's in the same precision.
# On a CPU with AVX-512 BF16 or AMX both run in bf16 and BF16_BAR is the shipped model's recorded
# bf16 figure, if given (else it is measured); elsewhere both run in fp32 and the shipped model's
# figure is measured here. The paired bootstrap of the two (`clover score --against`) is printed
# beside the rule, not part of it. A stage that passes then gets the README rows: test (40),
# held-out (20), real-dev (73), test at tau 1.0 and 0.7 for a diffusion model, test turn 2.
# Outputs: runs/eval/TAG-*.json(l) and runs/eval/shipped-val-DTYPE.*; `ship-ready` at the end.
set -u
RUN=$1; SHIPPED=$2; TAG=$3; BF16_BAR=${4:-}
while pgrep -f "clover train --recipe" > /dev/null; do sleep 60; done
[ -f "$RUN/training.json" ] || { echo "$RUN: not finished (no training.json)"; exit 1; }
if grep -q -m1 'avx512_bf16\|amx_bf16' /proc/cpuinfo; then DT=bfloat16; else DT=float32; fi
mkdir -p runs/eval
ev() { # MODEL OUT SPLIT N [TURNS] [TAU]
  [ -s "runs/eval/$2.jsonl" ] && return 0  # done before: reuse
  OMP_NUM_THREADS=2 .venv/bin/clover eval airspace --model "$1" --split "$3" --n "$4" \
    --max-turns "${5:-1}" --dtype "$DT" --batch-size 16 --max-tokens 768 --policy threshold \
    --tau "${6:-0.9}" --out "runs/eval/$2.jsonl" > "runs/eval/$2.json" 2> "runs/eval/$2.log"
}
f1() { tail -1 "runs/eval/$1.json" | python3 -c "import json,sys; print(json.load(sys.stdin)['zone_f1'])"; }
SHIP_TAG=shipped-$(basename "$SHIPPED")-val-$DT
if [ "$DT" = bfloat16 ] && [ -n "$BF16_BAR" ]; then BAR=$BF16_BAR; else
  ev "$SHIPPED" "$SHIP_TAG" validation 40; BAR=$(f1 "$SHIP_TAG"); fi
ev "$RUN" "$TAG-val-$DT" validation 40
F=$(f1 "$TAG-val-$DT")
echo "$TAG validation zone F1 $F against $BAR ($SHIPPED, $DT)"
if [ -s "runs/eval/$SHIP_TAG.jsonl" ]; then
  OMP_NUM_THREADS=1 .venv/bin/clover score airspace "runs/eval/$TAG-val-$DT.jsonl" \
    --split validation --n 40 --against "runs/eval/$SHIP_TAG.jsonl" 2>/dev/null | grep -A4 "^A "
fi
python3 -c "import sys; sys.exit(0 if $F > $BAR else 1)" || { echo "not shipped"; exit 0; }
ev "$RUN" "$TAG-test-$DT" test 40
ev "$RUN" "$TAG-heldout-$DT" heldout 20
ev "$RUN" "$TAG-realdev-$DT" real-dev 73
if grep -q '"attention": "block"' "$RUN/config.json"; then
  ev "$RUN" "$TAG-test-t10-$DT" test 40 1 1.0
  ev "$RUN" "$TAG-test-t07-$DT" test 40 1 0.7
fi
ev "$RUN" "$TAG-test-turn2-$DT" test 40 2
echo ship-ready
