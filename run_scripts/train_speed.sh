#!/usr/bin/env bash
# Training speed of every recipe of the preset, measured in one run on the same batches: each fairseq-train step of
# the quickstart (nat_recipes/catalogue.py) and the teacher's recipe on the distilled targets runs with FAIRSEQ_TRAIN set
# to nat_recipes.train_speed, which takes the recipe's exact fairseq-train options and times UPDATES updates
# (after 3 untimed ones) of fairseq's Trainer; nothing is saved.
# Needs a finished quickstart's work directory (distilled targets, fertilities, teacher, frozen blockwise heads).
#   [PRESET=cpu|cpu-long|gpu] bash run_scripts/train_speed.sh [WORK] [UPDATES] [OUT]   (defaults:
#   work/multi30k-$PRESET, 20, WORK/train_speed)
# Writes OUT/speed.jsonl and prints a table: updates/s and the ratio to the recipe trained on the same batches (the AR
# teacher's recipe on the distilled targets; for Encoder-NAD-AD, its AR baseline on the real targets).
# Before/after a change: dev/before_after.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WORK=${1:-$ROOT/work/multi30k-$PRESET}
UPDATES=${2:-20}
DATA_BIN=$WORK/data-bin
TEACHER=$WORK/ckpt/teacher/checkpoint_best.pt
for needed in "$TEACHER" "$DATA_BIN"/train.kd.*.idx "$DATA_BIN"/train.fert.*; do
  [ -e "$needed" ] || { echo "train_speed.sh: $needed is missing: run bash run_scripts/quickstart.sh first" >&2; exit 1; }
done
OUT=${3:-$WORK/train_speed}
mkdir -p "$OUT"
RESULTS=$OUT/speed.jsonl
rm -f "$RESULTS"
# one step a line: STEP, the step it is compared with, SCRIPT, ARGS... (every step saves into one scratch directory)
PLAN=$(python -m nat_recipes.catalogue speed-steps --preset "$PRESET" --work "$WORK" --data-bin "$DATA_BIN" \
  --teacher "$TEACHER" --checkpoint-name "$STUDENT_CHECKPOINT" --save-dir "$OUT/unused-save-dir")
mapfile -t STEPS <<< "$PLAN"
for line in "${STEPS[@]}"; do
  IFS=$'\t' read -r -a fields <<< "$line"
  log "${fields[0]}"
  FAIRSEQ_TRAIN="python -m nat_recipes.train_speed --label ${fields[0]} --compared-with ${fields[1]} \
    --updates $UPDATES --output $RESULTS --" bash "$ROOT/${fields[2]}" "${fields[@]:3}"
done
echo
python -m nat_recipes.train_speed --table "$RESULTS"
