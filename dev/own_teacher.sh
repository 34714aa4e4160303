#!/usr/bin/env bash
# Bring your own teacher on real data: a Transformer of a shape the quickstart never makes (3+3 layers, 256-d, pre-norm,
# separate encoder and decoder embeddings, the decoder's shared with its output projection), trained by plain fairseq
# (--task translation, no --user-dir) on a quickstart's Multi30k data-bin, then the README's own-teacher command on it.
#   bash dev/own_teacher.sh QUICKSTART_WORK [OUT]     # e.g. work/multi30k-cpu; OUT default work/own-teacher-demo
# TEACHER_UPDATES (default 500) sizes the teacher; the rest of the environment goes to run_scripts/quickstart.sh
# (PRESET, SYSTEMS, STUDENT_UPDATES, LATENCY_SENTENCES). Re-running skips the teacher once trained.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOURCE=${1:?usage: dev/own_teacher.sh QUICKSTART_WORK [OUT]}
OUT=$(realpath -m "${2:-$ROOT/work/own-teacher-demo}")
DATA_BIN=$(realpath "$SOURCE/data-bin")
[ -f "$DATA_BIN/dict.en.txt" ] || { echo "own_teacher.sh: $DATA_BIN is not a quickstart's Multi30k data-bin" >&2; exit 2; }
source "$ROOT/run_scripts/common.sh"
UPDATES=${TEACHER_UPDATES:-500}
mkdir -p "$OUT/teacher"
if [ ! -f "$OUT/teacher/checkpoint_best.pt" ] || [ ! -f "$OUT/teacher/.done" ]; then
  log "training the teacher: 3+3 layers, 256-d, pre-norm, separate embeddings, $UPDATES updates (log: $OUT/teacher.log)"
  fairseq-train "$DATA_BIN" --task translation --arch transformer --cpu \
    --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 \
    --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4 \
    --encoder-normalize-before --decoder-normalize-before --share-decoder-input-output-embed \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 2e-3 --lr-scheduler polynomial_decay --warmup-updates 60 \
    --total-num-update "$UPDATES" --max-update "$UPDATES" --max-tokens 4096 --dropout 0.1 --weight-decay 0.0001 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --validate-interval 1000 --save-interval 1000 \
    --save-interval-updates "$UPDATES" --keep-interval-updates 1 --no-epoch-checkpoints --seed 1 \
    --save-dir "$OUT/teacher" --log-format simple --log-interval 50 --no-progress-bar > "$OUT/teacher.log" 2>&1
  touch "$OUT/teacher/.done"
fi
TEACHER=$OUT/teacher/checkpoint_best.pt DATA_BIN=$DATA_BIN REFERENCE=$(realpath "$SOURCE/raw/test.de") \
  WORK=$OUT/work bash "$ROOT/run_scripts/quickstart.sh"
