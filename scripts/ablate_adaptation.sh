#!/bin/bash
# Issue 30's adaptation decisions, measured (maintainers' tool; run from the repository root):
# the same short block-diffusion adaptation of the shipped AR twin (models/clover-smol-ar) with one
# choice changed at a time. 16 steps x 8 examples (seed 20: examples no shipped stage saw), lr
# 3e-4, bf16, trained mask row, no prefix gradient; each run ends with the teacher-forced
# calibration probe on 16 validation replies and a decoded validation eval (20 messages,
# threshold tau 0.9, first turn, bf16). Outputs: runs/abl-NAME (model), runs/eval/abl-NAME-val.*;
# a finished variant is skipped on a rerun; names as arguments run only those variants
# (`bash scripts/ablate_adaptation.sh b4 mask`). `python scripts/ablation_table.py` prints the table.
# PRECISION=fp32 trains and evaluates in fp32 instead (CPUs without AVX-512 BF16, where bf16 is
# emulated: 7x slower matmuls on an AVX2-only EPYC); its outputs are runs/abl32-NAME and
# runs/eval/abl32-NAME-val.*, a separate set, since the precision changes every figure a little.
set -u
if [ "${PRECISION:-bf16}" = fp32 ]; then
  P=abl32; TRAIN_PREC=""; EVAL_DTYPE=float32
else
  P=abl; TRAIN_PREC="--bf16"; EVAL_DTYPE=bfloat16
fi
BASE="--block-size 8 --sharpen 0.1 --complementary-masks"
variants=(
  "base|$BASE"
  "b16|--block-size 16 --sharpen 0.1 --complementary-masks"
  "own|$BASE --own-token"
  "armix|$BASE --ar-mix 1.0"
  "b4|--block-size 4 --sharpen 0.1 --complementary-masks"
  "nocomp|--block-size 8 --sharpen 0.1"
  "nosharp|--block-size 8 --complementary-masks"
  "mask|$BASE --mask-init random"
)
mkdir -p runs/eval
for v in "${variants[@]}"; do
  name=${v%%|*}; flags=${v#*|}
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  out=runs/$P-$name
  if [ ! -f "$out/training.json" ]; then
    echo "=== $name: $flags ($(date -u +%H:%M))"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=2 .venv/bin/clover train --recipe airspace-smol --attention block \
      --batch-size 8 --micro-batch-size 2 $TRAIN_PREC --no-progress \
      --init-adapter models/clover-smol-ar --steps 16 --seed 20 --lr 3e-4 --train-mask-row \
      --no-prefix-grad --save-every 4 --eval-every 16 --calibration-examples 16 \
      --out "$out" --work-dir "$out-work" --resume $flags || { echo "$name failed"; continue; }
  fi
  tag=$P-$name-val
  [ -f "runs/eval/$tag.json" ] || OMP_NUM_THREADS=2 .venv/bin/clover eval airspace --model "$out" \
    --split validation --n 20 --max-turns 1 --dtype "$EVAL_DTYPE" --batch-size 16 --max-tokens 768 \
    --policy threshold --tau 0.9 --out "runs/eval/$tag.jsonl" > "runs/eval/$tag.json" \
    2> "runs/eval/$tag.log"
done
echo done-ablations
