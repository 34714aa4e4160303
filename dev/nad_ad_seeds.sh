#!/usr/bin/env bash
# Encoder-NAD-AD's gain over its same-updates AR baseline across training seeds (Zhou et al. 2020 report +0.6 to
# +1.1 BLEU; one seed cannot tell that from noise): a finished quickstart run's nad-ad and ar-baseline are seed 1;
# this trains the same two recipes with the other SEEDS (default "2 3") into WORK/ckpt/{nad-ad,ar-baseline}-seedN
# (a checkpoint already there is kept), decodes all of them with beam 4 in one nat-benchmark run (BLEU on the whole
# test set; the timing is short and not the point) and prints each seed's BLEU, mean ± std and the paired bootstrap
# on the seeds' hypotheses pooled (dev/seed_gain.py).
#   [PRESET=cpu|cpu-long] bash dev/nad_ad_seeds.sh [WORK] [OUT]
# (defaults: work/multi30k-$PRESET, WORK/nad-ad-seeds; SEEDS="" decodes seed 1 only). Writes OUT/seed_gain.md and
# OUT/seed_gain.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WORK=$(cd "${1:-$ROOT/work/multi30k-$PRESET}" && pwd)
OUT=${2:-$WORK/nad-ad-seeds}
run_dir "$WORK" nad_ad_seeds.sh "ckpt/nad-ad/$STUDENT_CHECKPOINT" "ckpt/ar-baseline/$STUDENT_CHECKPOINT"
# the two rows' names and decoding arguments: the catalogue's (nat_recipes/catalogue.py)
mapfile -t CATALOGUE < <(python -c 'import shlex; from nat_recipes import catalogue as r
rows = {row.name: row for row in r.rows("cpu", ["nad-ad"])}
for name in (r.AR_SAME_UPDATES_ROW, r.NAD_AD_ROW): print(name); print(shlex.join(map(str, rows[name].args)))')
AR_ROW=${CATALOGUE[0]} AR_ARGS=${CATALOGUE[1]} NAD_AD_ROW=${CATALOGUE[2]} NAD_AD_ARGS=${CATALOGUE[3]}
BASELINES=("$AR_ROW, seed 1") SYSTEMS=("$NAD_AD_ROW, seed 1")
ROWS=(--system "${BASELINES[0]}=ckpt/ar-baseline/$STUDENT_CHECKPOINT::$AR_ARGS"
  --system "${SYSTEMS[0]}=ckpt/nad-ad/$STUDENT_CHECKPOINT::$NAD_AD_ARGS")
for seed in ${SEEDS-2 3}; do
  for recipe in nad_ad ar_baseline; do
    name=${recipe//_/-}-seed$seed
    train_once "$name" "$recipe.sh" data-bin "$TEACHER" "ckpt/$name" --seed "$seed"
  done
  BASELINES+=("$AR_ROW, seed $seed") SYSTEMS+=("$NAD_AD_ROW, seed $seed")
  ROWS+=(--system "$AR_ROW, seed $seed=ckpt/ar-baseline-seed$seed/$STUDENT_CHECKPOINT::$AR_ARGS"
    --system "$NAD_AD_ROW, seed $seed=ckpt/nad-ad-seed$seed/$STUDENT_CHECKPOINT::$NAD_AD_ARGS")
done
log "decoding ${#SYSTEMS[@]} seeds of each ($NAD_AD_ARGS)"
run_benchmark "$OUT" --latency-sentences 20 --warmup 10 --batch-sizes 64 "${ROWS[@]}"
python "$ROOT/dev/seed_gain.py" "$OUT" --reference raw/test.de --baseline "${BASELINES[@]}" --system "${SYSTEMS[@]}" \
  --json "$OUT/seed_gain.json" | tee "$OUT/seed_gain.md"
