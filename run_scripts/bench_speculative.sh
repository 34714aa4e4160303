#!/usr/bin/env bash
# Speculative decoding measured alone on a finished quickstart's work directory (the teacher and its distilled data):
# trains the drafter if SAVE_DIR has none (examples/multi30k/spec_drafter.sh, the quickstart's step), then benchmarks
# the teacher (fairseq beam 4 and greedy; CPU presets: CTranslate2 too) against exact and relaxed speculative decoding
# with the quickstart's settings. Run it on an idle machine: the table's latencies are its point.
#   [PRESET=cpu|cpu-long|gpu] bash run_scripts/bench_speculative.sh [WORK] [K]
# (defaults: work/multi30k-$PRESET; K as the quickstart's: 3 on the CPU presets, 8 with PRESET=gpu)
# Writes WORK/bench-speculative-K/results.{md,json} and hyp.*.txt; `diff` hyp.speculative-k-K-exact.txt with
# hyp.ar-teacher-greedy.txt is empty when the output is the teacher's; the tokens / step column is the mean accepted
# tokens per teacher call.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WORK=${1:-$ROOT/work/multi30k-$PRESET}
if [ "$PRESET" = gpu ]; then K=${2:-8}; else K=${2:-3}; fi
DATA_BIN=$WORK/data-bin
TEACHER=$WORK/ckpt/teacher/checkpoint_best.pt
DRAFTER=$WORK/ckpt/spec-drafter-$K
[ -f "$TEACHER" ] || { echo "bench_speculative.sh: $TEACHER is missing: run bash run_scripts/quickstart.sh first" >&2; exit 1; }
if [ ! -f "$DRAFTER/$STUDENT_CHECKPOINT" ]; then
  log "training the drafter (k=$K) into $DRAFTER"
  bash "$ROOT/examples/multi30k/spec_drafter.sh" "$DATA_BIN" "$TEACHER" "$DRAFTER" "$K"
fi
if [ "$PRESET" = gpu ]; then
  ARGS=(--batch-size 128 --latency-sentences "${LATENCY_SENTENCES:-300}" --warmup 20)
else
  ARGS=(--cpu --batch-size 64 --latency-sentences "${LATENCY_SENTENCES:-110}" --warmup 10 --ctranslate2)
fi
exec python -m nat_plugins.cli.benchmark "$DATA_BIN" --teacher "$TEACHER" --reference "$WORK/raw/test.de" \
  --out-dir "$WORK/bench-speculative-$K" --title "Speculative decoding, k=$K (PRESET=$PRESET)" "${ARGS[@]}" \
  --generate-args "--max-len-a 1.2 --max-len-b 10" \
  --system "Speculative k=$K, exact=$DRAFTER/$STUDENT_CHECKPOINT::--beam 1 --speculative-teacher $TEACHER" \
  --system "Speculative k=$K, relaxed=$DRAFTER/$STUDENT_CHECKPOINT::--beam 1 --speculative-teacher $TEACHER --speculative-verify relaxed --speculative-beta 3 --speculative-tau 1"
