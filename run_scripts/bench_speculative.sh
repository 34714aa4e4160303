#!/usr/bin/env bash
# Speculative decoding measured alone on a finished quickstart's work directory (the teacher and its distilled data):
# trains the drafter if it has none (the quickstart's step), then benchmarks the teacher (fairseq beam 4 and greedy;
# CPU presets: CTranslate2 too) against exact and relaxed speculative decoding, with the quickstart's rows and
# benchmark options (nat_recipes/catalogue.py). Run it on an idle machine: the table's latencies are its point.
#   [PRESET=cpu|cpu-long|gpu] [LATENCY_SENTENCES=N] bash run_scripts/bench_speculative.sh [WORK] [K]
# (defaults: work/multi30k-$PRESET; K as the quickstart's: 3 on the CPU presets, 8 with PRESET=gpu)
# Writes WORK/bench-speculative-K/results.{md,json} and hyp.*.txt; `diff` hyp.speculative-k-K-exact.txt with
# hyp.ar-teacher-greedy.txt is empty when the output is the teacher's; the tokens / step column is the mean accepted
# tokens per teacher call.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WORK=${1:-$ROOT/work/multi30k-$PRESET}
DATA_BIN=$WORK/data-bin
TEACHER=$WORK/ckpt/teacher/checkpoint_best.pt
[ -f "$TEACHER" ] || { echo "bench_speculative.sh: $TEACHER is missing: run bash run_scripts/quickstart.sh first" >&2; exit 1; }
RECIPES=(--preset "$PRESET" --work "$WORK" --data-bin "$DATA_BIN" --teacher "$TEACHER"
  --checkpoint-name "$STUDENT_CHECKPOINT" --only spec-drafter ${2:+--values "$2"})
PLAN=$(python -m nat_recipes.catalogue steps "${RECIPES[@]}")  # the drafter's training: JOB STEP SCRIPT ARGS...
ROWS=$(python -m nat_recipes.catalogue rows "${RECIPES[@]}")
OPTIONS=$(python -m nat_recipes.catalogue options --preset "$PRESET" \
  ${LATENCY_SENTENCES:+--latency-sentences "$LATENCY_SENTENCES"})
IFS=$'\t' read -r -a STEP <<< "$PLAN"
K=${STEP[1]#spec-drafter-}
if [ ! -f "$WORK/ckpt/${STEP[1]}/$STUDENT_CHECKPOINT" ]; then
  log "training the drafter (k=$K) into $WORK/ckpt/${STEP[1]}"
  bash "$ROOT/${STEP[2]}" "${STEP[@]:3}"
fi
mapfile -t SYSTEMS <<< "$ROWS"
mapfile -t BENCH_ARGS <<< "$OPTIONS"
exec python -m nat_plugins.bench.benchmark "$DATA_BIN" --teacher "$TEACHER" --reference "$WORK/raw/test.de" \
  --out-dir "$WORK/bench-speculative-$K" --work-dir "$WORK" --title "Speculative decoding, k=$K (PRESET=$PRESET)" \
  "${BENCH_ARGS[@]}" "${SYSTEMS[@]}"
