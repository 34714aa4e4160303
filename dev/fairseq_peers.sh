#!/usr/bin/env bash
# fairseq's own NAT and CMLM given the plugin NAT's whole training budget. The plugin's NAT starts from the AR
# teacher's weights and fine-tunes for its own updates; fairseq's models cannot start from an AR checkpoint, so the
# quickstart's rows (examples/multi30k/fairseq_nat.sh at the NAT's updates) train them from scratch on a fraction of
# that budget. Here each trains from scratch for the teacher's updates + the plugin NAT's updates (read from their
# checkpoints: 1,500 + 480 in PRESET=cpu-long), with the teacher's from-scratch schedule (the recipe's learning
# rates, NAT 2e-3 and CMLM 5e-4, the teacher's warm-up, linear decay), on the same distilled targets; then one
# nat-benchmark run decodes them beside the plugin NAT's rows and the quickstart's fairseq rows (rows interleaved,
# batch 1 and 64) and the wall time of every training step is printed.
#   [PRESET=cpu|cpu-long] bash dev/fairseq_peers.sh [WORK] [OUT]
# (defaults: work/multi30k-$PRESET, WORK/fairseq-peers). Trains into WORK/ckpt/fairseq-{nat,cmlm}-full-budget (kept
# when already there); writes OUT/results.md and OUT/training_time.tsv.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WORK=$(cd "${1:-$ROOT/work/multi30k-$PRESET}" && pwd)
OUT=${2:-$WORK/fairseq-peers}
NAT=ckpt/fertility-nat/$STUDENT_CHECKPOINT
run_dir "$WORK" fairseq_peers.sh "$TEACHER" "$NAT"
read -r TEACHER_UPDATES WARMUP NAT_UPDATES < <(python - "$TEACHER" "$NAT" <<'PY'
import sys
import torch
teacher, nat = (torch.load(path, map_location="cpu", weights_only=False) for path in sys.argv[1:])
updates = [state["optimizer_history"][-1]["num_updates"] for state in (teacher, nat)]
print(updates[0], teacher["cfg"]["lr_scheduler"]["warmup_updates"], updates[1])
PY
)
BUDGET=$(( TEACHER_UPDATES + NAT_UPDATES ))
log "budget: the teacher's $TEACHER_UPDATES updates + the plugin NAT's $NAT_UPDATES = $BUDGET updates (warm-up $WARMUP)"
mkdir -p "$OUT"
TRAINING_TIMES=$OUT/training_time.tsv
# the run's own steps first: what the plugin NAT and the quickstart's fairseq rows took
[ -f "$TRAINING_TIMES" ] || grep -E "^(teacher|fertility|fertility-nat|fairseq-nat|fairseq-cmlm)	" logs/steps.tsv \
  > "$TRAINING_TIMES" || true
ROWS=()
for model in nat cmlm; do
  name=fairseq-$model-full-budget
  train_once "$name" fairseq_nat.sh data-bin "ckpt/$name" "$model" --max-update "$BUDGET" --total-num-update "$BUDGET" \
    --warmup-updates "$WARMUP"
  decoding="--task translation_lev --iter-decode-max-iter $([ "$model" = nat ] && echo 0 || echo 9)"
  ROWS+=(--system "fairseq ${model^^}, $BUDGET updates from scratch=ckpt/$name/$STUDENT_CHECKPOINT::$decoding")
done
# the plugin NAT's rows and the quickstart's fairseq rows, as the run's benchmark decodes them
mapfile -t CATALOGUE < <(for system in fertility-nat fairseq; do
  python -m nat_recipes.catalogue rows --preset "$PRESET" --work . --data-bin data-bin --teacher "$TEACHER" \
    --checkpoint-name "$STUDENT_CHECKPOINT" --only "$system" --existing
done)
log "decoding (training times: $TRAINING_TIMES)"
run_benchmark "$OUT" --latency-sentences 110 --warmup 10 --batch-sizes 1,64 "${CATALOGUE[@]}" "${ROWS[@]}"
cat "$TRAINING_TIMES"
log "$OUT/results.md"
