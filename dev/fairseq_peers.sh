#!/usr/bin/env bash
# fairseq's own NAT and CMLM given the plugin NAT's whole training budget. The plugin's NAT starts from the AR
# teacher's weights and fine-tunes for its own updates; fairseq's models cannot start from an AR checkpoint, so the
# quickstart's rows (examples/multi30k/fairseq_nat.sh at the NAT's updates) train them from scratch on a fraction of
# that budget. Here each trains from scratch for the teacher's updates + the plugin NAT's updates (read from their
# checkpoints: 1,500 + 480 in PRESET=cpu-long), with the teacher's from-scratch schedule (the recipe's learning
# rate 2e-3, the teacher's warm-up, linear decay), on the same distilled targets; then one nat-benchmark run decodes
# them beside the plugin NAT's rows and the quickstart's fairseq rows (rows interleaved, batch 1 and 64) and the
# wall time of every training step is printed.
#   [PRESET=cpu|cpu-long] bash dev/fairseq_peers.sh [WORK] [OUT]
# (defaults: work/multi30k-$PRESET, WORK/fairseq-peers). Trains into WORK/ckpt/fairseq-{nat,cmlm}-full-budget (kept
# when already there); writes OUT/results.md and OUT/training_time.tsv.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../run_scripts/common.sh"
WORK=$(cd "${1:-$ROOT/work/multi30k-$PRESET}" && pwd)
OUT=${2:-$WORK/fairseq-peers}
cd "$WORK"
TEACHER=ckpt/teacher/checkpoint_best.pt
NAT=ckpt/fertility-nat/$STUDENT_CHECKPOINT
for f in "$TEACHER" "$NAT"; do
  [ -f "$f" ] || { echo "fairseq_peers.sh: no $WORK/$f: run PRESET=$PRESET bash run_scripts/quickstart.sh first" >&2
    exit 1; }
done
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
TIMES=$OUT/training_time.tsv
# the run's own steps first: what the plugin NAT and the quickstart's fairseq rows took
[ -f "$TIMES" ] || grep -E "^(teacher|fertility|fertility-nat|fairseq-nat|fairseq-cmlm)	" logs/steps.tsv > "$TIMES" \
  || true
ROWS=()
for model in nat cmlm; do
  name=fairseq-$model-full-budget
  if [ ! -f "ckpt/$name/checkpoint_last.pt" ]; then
    log "training $name (log: $WORK/logs/$name.log)"
    started=$(date +%s)
    bash "$ROOT/examples/multi30k/fairseq_nat.sh" data-bin "ckpt/$name" "$model" --max-update "$BUDGET" \
      --total-num-update "$BUDGET" --warmup-updates "$WARMUP" > "logs/$name.log" 2>&1 \
      || { tail -n 30 "logs/$name.log" >&2; exit 1; }
    printf '%s\t%s\n' "$name" "$(( $(date +%s) - started ))" >> "$TIMES"
  fi
  decoding="--task translation_lev --iter-decode-max-iter $([ "$model" = nat ] && echo 0 || echo 9)"
  ROWS+=(--system "fairseq ${model^^}, $BUDGET updates from scratch=ckpt/$name/checkpoint_last.pt::$decoding")
done
# the plugin NAT's rows and the quickstart's fairseq rows, as the run's benchmark decodes them
mapfile -t CATALOGUE < <(for system in fertility-nat fairseq; do
  python -m nat_plugins.recipes rows --preset "$PRESET" --work . --data-bin data-bin --teacher "$TEACHER" \
    --checkpoint-name "$STUDENT_CHECKPOINT" --only "$system" --existing
done)
log "decoding (training times: $TIMES)"
nat-benchmark data-bin --teacher "$TEACHER" --reference raw/test.de --out-dir "$OUT" --work-dir . --cpu \
  --threads 2 --no-plots --generate-args "--max-len-a 1.2 --max-len-b 10" --latency-sentences 110 --warmup 10 \
  --batch-sizes 1,64 "${CATALOGUE[@]}" "${ROWS[@]}" > "$OUT.log" 2>&1 || { tail -n 30 "$OUT.log" >&2; exit 1; }
cat "$TIMES"
log "$OUT/results.md"
