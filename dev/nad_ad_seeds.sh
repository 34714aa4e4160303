#!/usr/bin/env bash
# Encoder-NAD-AD's gain over its AR twin across training seeds (Zhou et al. 2020 report +0.6 to +1.1 BLEU; one seed
# cannot tell that from noise), on a finished quickstart run's data and teacher. Two protocols (PROTOCOL):
# - scratch (default; the paper's and the quickstart's): both trained jointly from random weights with the teacher's
#   own recipe (examples/multi30k/nad_ad.sh; run_scripts/train_teacher.sh) for SEEDS (default "1 2 3"); seed 1 is
#   the run's teacher and its nad-ad, the others are trained into ckpt/{nad-ad,ar}-scratch-seedN;
# - teacher: both fine-tuned from the teacher for the catalogue's student budget (NAD_AD_INIT=teacher nad_ad.sh and
#   ar_baseline.sh) into ckpt/{nad-ad-teacher,ar-baseline}-seedN.
# NAD_AD_TAG=T NAD_AD_TRAIN_ARGS="..." (either protocol): every NAD-AD seed, seed 1 included, is trained with these
# extra nad_ad.sh options into ckpt/nad-ad-{scratch,teacher}-T-seedN, against the same AR seeds (OUT:
# WORK/nad-ad[-scratch]-seeds-T). A checkpoint already there is kept. All are decoded with beam 4 in one nat-benchmark
# run (BLEU on the whole test set; the timing is short and not the point); dev/seed_gain.py prints each seed's BLEU and paired test, mean ± std
# and the paired bootstrap on the seeds' hypotheses pooled. Training seconds per model: OUT/training_times.tsv.
#   [PRESET=cpu|cpu-long] [PROTOCOL=scratch|teacher] bash dev/nad_ad_seeds.sh [WORK] [OUT]
# (defaults: work/multi30k-$PRESET, WORK/nad-ad-scratch-seeds or WORK/nad-ad-seeds). Writes OUT/seed_gain.md and
# OUT/seed_gain.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PROTOCOL=${PROTOCOL:-scratch}
TAG=${NAD_AD_TAG:+-$NAD_AD_TAG}
read -r -a EXTRA <<< "${NAD_AD_TRAIN_ARGS:-}"
[ -z "${NAD_AD_TRAIN_ARGS:-}" ] || [ -n "$TAG" ] || { echo "nad_ad_seeds.sh: NAD_AD_TRAIN_ARGS needs a NAD_AD_TAG" \
  "naming the checkpoints it makes" >&2; exit 2; }
WORK=$(cd "${1:-$ROOT/work/multi30k-$PRESET}" && pwd)
# the decoding arguments of both rows: the catalogue's Encoder-NAD-AD row's (nat_recipes/catalogue.py)
ARGS=$(python -c 'import shlex; from nat_recipes import catalogue as r
print(shlex.join(map(str, next(row for row in r.rows("cpu", ["nad-ad"]) if row.name == r.NAD_AD_ROW).args)))')
run_dir "$WORK" nad_ad_seeds.sh "$TEACHER"
read -r -a SEEDS <<< "${SEEDS-1 2 3}"
case $PROTOCOL in
  scratch)
    OUT=${2:-$WORK/nad-ad-scratch-seeds$TAG}
    AR_ROW="AR from scratch, beam 4" NAD_AD_ROW="Encoder-NAD-AD from scratch, beam 4"
    DECODED=checkpoint_best.pt  # the checkpoint the teacher's recipe selects, as the quickstart's rows decode
    ar_checkpoint() { [ "$1" = 1 ] && echo ckpt/teacher || echo "ckpt/ar-scratch-seed$1"; }
    # seed 1 without options: the quickstart's own nad-ad (the same command)
    nad_ad_checkpoint() { [ "$1" = 1 ] && [ -z "$TAG" ] && echo ckpt/nad-ad || echo "ckpt/nad-ad-scratch$TAG-seed$1"; }
    train_pair() {
      local save
      save=$(nad_ad_checkpoint "$1")
      train_once "${save#ckpt/}" nad_ad.sh data-bin "$TEACHER" "$save" --seed "$1" --no-progress-bar "${EXTRA[@]}"
      [ "$1" = 1 ] || train_once "ar-scratch-seed$1" run_scripts/train_teacher.sh data-bin "ckpt/ar-scratch-seed$1" \
        --seed "$1" --no-progress-bar
    } ;;
  teacher)
    OUT=${2:-$WORK/nad-ad-seeds$TAG}
    AR_ROW="AR teacher + same updates, beam 4" NAD_AD_ROW="Encoder-NAD-AD from the teacher, beam 4"
    DECODED=$STUDENT_CHECKPOINT
    export NAD_AD_INIT=teacher
    ar_checkpoint() { echo "ckpt/ar-baseline-seed$1"; }
    nad_ad_checkpoint() { echo "ckpt/nad-ad-teacher$TAG-seed$1"; }
    train_pair() {
      train_once "nad-ad-teacher$TAG-seed$1" nad_ad.sh data-bin "$TEACHER" "ckpt/nad-ad-teacher$TAG-seed$1" \
        --seed "$1" "${EXTRA[@]}"
      train_once "ar-baseline-seed$1" ar_baseline.sh data-bin "$TEACHER" "ckpt/ar-baseline-seed$1" --seed "$1"
    } ;;
  *) echo "nad_ad_seeds.sh: PROTOCOL must be 'scratch' or 'teacher' (got '$PROTOCOL')" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
export TRAINING_TIMES=$OUT/training_times.tsv
BASELINES=() SYSTEMS=() ROWS=()
for seed in "${SEEDS[@]}"; do
  train_pair "$seed"
  BASELINES+=("$AR_ROW, seed $seed") SYSTEMS+=("$NAD_AD_ROW, seed $seed")
  ROWS+=(--system "$AR_ROW, seed $seed=$(ar_checkpoint "$seed")/$DECODED::$ARGS"
    --system "$NAD_AD_ROW, seed $seed=$(nad_ad_checkpoint "$seed")/$DECODED::$ARGS")
done
log "decoding ${#SYSTEMS[@]} seeds of each ($ARGS)"
run_benchmark "$OUT" --latency-sentences 20 --warmup 10 --batch-sizes 64 "${ROWS[@]}"
python "$ROOT/dev/seed_gain.py" "$OUT" --reference raw/test.de --baseline "${BASELINES[@]}" --system "${SYSTEMS[@]}" \
  --json "$OUT/seed_gain.json" | tee "$OUT/seed_gain.md"
