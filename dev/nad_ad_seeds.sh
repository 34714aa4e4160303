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
source "$(dirname "${BASH_SOURCE[0]}")/../run_scripts/common.sh"
WORK=$(cd "${1:-$ROOT/work/multi30k-$PRESET}" && pwd)
OUT=${2:-$WORK/nad-ad-seeds}
TEACHER=ckpt/teacher/checkpoint_best.pt
cd "$WORK"
for name in nad-ad ar-baseline; do
  [ -f "ckpt/$name/$STUDENT_CHECKPOINT" ] || { echo "nad_ad_seeds.sh: no $WORK/ckpt/$name/$STUDENT_CHECKPOINT:" \
    "run PRESET=$PRESET bash run_scripts/quickstart.sh first" >&2; exit 1; }
done
BASELINES=("AR + same updates, seed 1") SYSTEMS=("Encoder-NAD-AD, seed 1")
ROWS=(--system "${BASELINES[0]}=ckpt/ar-baseline/$STUDENT_CHECKPOINT::--beam 4"
  --system "${SYSTEMS[0]}=ckpt/nad-ad/$STUDENT_CHECKPOINT::--beam 4")
for seed in ${SEEDS-2 3}; do
  for recipe in nad_ad ar_baseline; do
    name=${recipe//_/-}-seed$seed
    if [ ! -f "ckpt/$name/$STUDENT_CHECKPOINT" ]; then
      log "training $name (log: $WORK/logs/$name.log)"
      bash "$ROOT/examples/multi30k/$recipe.sh" data-bin "$TEACHER" "ckpt/$name" --seed "$seed" > "logs/$name.log" 2>&1
    fi
  done
  BASELINES+=("AR + same updates, seed $seed") SYSTEMS+=("Encoder-NAD-AD, seed $seed")
  ROWS+=(--system "AR + same updates, seed $seed=ckpt/ar-baseline-seed$seed/$STUDENT_CHECKPOINT::--beam 4"
    --system "Encoder-NAD-AD, seed $seed=ckpt/nad-ad-seed$seed/$STUDENT_CHECKPOINT::--beam 4")
done
log "decoding ${#SYSTEMS[@]} seeds of each with beam 4"
nat-benchmark data-bin --teacher "$TEACHER" --reference raw/test.de --out-dir "$OUT" --work-dir . --cpu \
  --threads 2 --no-plots --generate-args "--max-len-a 1.2 --max-len-b 10" --latency-sentences 20 --warmup 10 \
  --batch-sizes 64 "${ROWS[@]}" > "$OUT.log" 2>&1 || { tail -n 30 "$OUT.log" >&2; exit 1; }
python "$ROOT/dev/seed_gain.py" "$OUT" --reference raw/test.de --baseline "${BASELINES[@]}" --system "${SYSTEMS[@]}" \
  --json "$OUT/seed_gain.json" | tee "$OUT/seed_gain.md"
