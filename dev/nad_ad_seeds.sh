#!/usr/bin/env bash
# Encoder-NAD-AD's gain over its AR twin across training seeds (Zhou et al. 2020 report +0.6 to +1.1 BLEU; one seed
# cannot tell that from noise), on a finished quickstart run's data and teacher. Two protocols (PROTOCOL):
# - teacher (default): both start from the teacher and train the catalogue's student budget (examples/multi30k/
#   nad_ad.sh and ar_baseline.sh); the run's nad-ad and ar-baseline are seed 1, the other SEEDS (default "2 3") are
#   trained into ckpt/{nad-ad,ar-baseline}-seedN;
# - scratch (the paper's): both are trained jointly from random weights with the teacher's own recipe
#   (NAD_AD_INIT=scratch examples/multi30k/nad_ad.sh; run_scripts/train_teacher.sh) for SEEDS (default "1 2 3") into
#   ckpt/{nad-ad,ar}-scratch-seedN; seed 1's AR twin is the run's teacher (that command with --seed 1).
# NAD_AD_TAG=T NAD_AD_TRAIN_ARGS="..." (either protocol): every NAD-AD seed, seed 1 included, is trained with these
# extra nad_ad.sh options into ckpt/nad-ad[-scratch]-T-seedN, against the same AR seeds (OUT: WORK/nad-ad[-scratch]-
# seeds-T). A checkpoint already there is kept. All are decoded with beam 4 in one nat-benchmark run (BLEU on the whole test
# set; the timing is short and not the point); dev/seed_gain.py prints each seed's BLEU and paired test, mean ± std
# and the paired bootstrap on the seeds' hypotheses pooled. Training seconds per model: OUT/training_times.tsv.
#   [PRESET=cpu|cpu-long] [PROTOCOL=teacher|scratch] bash dev/nad_ad_seeds.sh [WORK] [OUT]
# (defaults: work/multi30k-$PRESET, WORK/nad-ad-seeds or WORK/nad-ad-scratch-seeds). Writes OUT/seed_gain.md and
# OUT/seed_gain.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PROTOCOL=${PROTOCOL:-teacher}
TAG=${NAD_AD_TAG:+-$NAD_AD_TAG}
read -r -a EXTRA <<< "${NAD_AD_TRAIN_ARGS:-}"
[ -z "${NAD_AD_TRAIN_ARGS:-}" ] || [ -n "$TAG" ] || { echo "nad_ad_seeds.sh: NAD_AD_TRAIN_ARGS needs a NAD_AD_TAG" \
  "naming the checkpoints it makes" >&2; exit 2; }
WORK=$(cd "${1:-$ROOT/work/multi30k-$PRESET}" && pwd)
# the two rows' names and decoding arguments: the catalogue's (nat_recipes/catalogue.py)
mapfile -t CATALOGUE < <(python -c 'import shlex; from nat_recipes import catalogue as r
rows = {row.name: row for row in r.rows("cpu", ["nad-ad"])}
for name in (r.AR_SAME_UPDATES_ROW, r.NAD_AD_ROW): print(name); print(shlex.join(map(str, rows[name].args)))')
AR_ROW=${CATALOGUE[0]} AR_ARGS=${CATALOGUE[1]} NAD_AD_ROW=${CATALOGUE[2]} NAD_AD_ARGS=${CATALOGUE[3]}
case $PROTOCOL in
  teacher)
    OUT=${2:-$WORK/nad-ad-seeds$TAG}
    run_dir "$WORK" nad_ad_seeds.sh "ckpt/nad-ad/$STUDENT_CHECKPOINT" "ckpt/ar-baseline/$STUDENT_CHECKPOINT"
    SEEDS=(1 ${SEEDS-2 3})
    ar_checkpoint() { [ "$1" = 1 ] && echo ckpt/ar-baseline || echo "ckpt/ar-baseline-seed$1"; }
    nad_ad_checkpoint() { [ "$1" = 1 ] && [ -z "$TAG" ] && echo ckpt/nad-ad || echo "ckpt/nad-ad$TAG-seed$1"; }
    train_pair() {
      [ "$1" = 1 ] && [ -z "$TAG" ] || train_once "nad-ad$TAG-seed$1" nad_ad.sh data-bin "$TEACHER" \
        "ckpt/nad-ad$TAG-seed$1" --seed "$1" "${EXTRA[@]}"
      [ "$1" = 1 ] || train_once "ar-baseline-seed$1" ar_baseline.sh data-bin "$TEACHER" "ckpt/ar-baseline-seed$1" \
        --seed "$1"
    } ;;
  scratch)
    OUT=${2:-$WORK/nad-ad-scratch-seeds$TAG}
    run_dir "$WORK" nad_ad_seeds.sh "$TEACHER" ckpt/teacher/checkpoint_last.pt
    read -r -a SEEDS <<< "${SEEDS-1 2 3}"
    AR_ROW="AR from scratch, beam 4" NAD_AD_ROW="Encoder-NAD-AD from scratch, beam 4"
    export NAD_AD_INIT=scratch
    ar_checkpoint() { [ "$1" = 1 ] && echo ckpt/teacher || echo "ckpt/ar-scratch-seed$1"; }
    nad_ad_checkpoint() { echo "ckpt/nad-ad-scratch$TAG-seed$1"; }
    train_pair() {
      train_once "nad-ad-scratch$TAG-seed$1" nad_ad.sh data-bin "$TEACHER" \
        "ckpt/nad-ad-scratch$TAG-seed$1" --seed "$1" --no-progress-bar "${EXTRA[@]}"
      [ "$1" = 1 ] || train_once "ar-scratch-seed$1" run_scripts/train_teacher.sh data-bin "ckpt/ar-scratch-seed$1" \
        --seed "$1" --no-progress-bar
    } ;;
  *) echo "nad_ad_seeds.sh: PROTOCOL must be 'teacher' or 'scratch' (got '$PROTOCOL')" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
export TRAINING_TIMES=$OUT/training_times.tsv
BASELINES=() SYSTEMS=() ROWS=()
for seed in "${SEEDS[@]}"; do
  train_pair "$seed"
  BASELINES+=("$AR_ROW, seed $seed") SYSTEMS+=("$NAD_AD_ROW, seed $seed")
  ROWS+=(--system "$AR_ROW, seed $seed=$(ar_checkpoint "$seed")/$STUDENT_CHECKPOINT::$AR_ARGS"
    --system "$NAD_AD_ROW, seed $seed=$(nad_ad_checkpoint "$seed")/$STUDENT_CHECKPOINT::$NAD_AD_ARGS")
done
log "decoding ${#SYSTEMS[@]} seeds of each ($NAD_AD_ARGS)"
run_benchmark "$OUT" --latency-sentences 20 --warmup 10 --batch-sizes 64 "${ROWS[@]}"
python "$ROOT/dev/seed_gain.py" "$OUT" --reference raw/test.de --baseline "${BASELINES[@]}" --system "${SYSTEMS[@]}" \
  --json "$OUT/seed_gain.json" | tee "$OUT/seed_gain.md"
