#!/usr/bin/env bash
# The main job of the README, on Multi30k en->de: set-up, data, AR teacher, sequence-level distillation,
# every plugin system that exists so far, and the benchmark table (teacher beam 4 + greedy in the same run).
#   bash run_scripts/quickstart.sh                # PRESET=cpu: 2-layer models, one configuration per system (~26 min on 2 cores)
#   PRESET=cpu-long bash run_scripts/quickstart.sh  # the quality run on the CPU: converged teacher and students (~100 min)
#   PRESET=gpu bash run_scripts/quickstart.sh     # the full-size recipe on one GPU
# WORK (default work/multi30k-$PRESET) keeps every output; each finished step leaves a .done marker, so a
# re-run (or a run after an interruption) skips what is done and fairseq-train resumes from checkpoint_last.pt;
# each step's output is also kept in WORK/logs/STEP.log.
# Smaller smoke runs (the pipeline test uses them): MAX_LINES=N (first N lines of each split), VOCAB_SIZE,
# TEACHER_UPDATES, STUDENT_UPDATES, DISTILL_BEAM, LATENCY_SENTENCES.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/run_scripts/setup_env.sh"
source "$ROOT/run_scripts/common.sh"
WORK=${WORK:-$ROOT/work/multi30k-$PRESET}
DATA_BIN=$WORK/data-bin
mkdir -p "$WORK"
START=$(date +%s)
if [ "$PRESET" = cpu ]; then
  log "PRESET=cpu: the whole pipeline on the CPU: a 2-layer 256-d teacher and one configuration of every system"
  log "(~26 min on 2 cores). Small models, so BLEU is far below the papers'; PRESET=gpu runs the full-size recipe."
  BENCH_ARGS=(--cpu --latency-sentences "${LATENCY_SENTENCES:-30}" --warmup 10 --batch-size 64)
elif [ "$PRESET" = cpu-long ]; then
  log "PRESET=cpu-long: the quality run on the CPU: the 2-layer 256-d teacher trained to convergence, every system"
  log "trained 4x longer than PRESET=cpu, fairseq's own NAT and CMLM for comparison (~100 min on 2 cores)."
  BENCH_ARGS=(--cpu --latency-sentences "${LATENCY_SENTENCES:-110}" --warmup 10 --batch-size 64)
else
  BENCH_ARGS=(--batch-size 128)
fi
# one length limit for every row (Multi30k targets are ~1.1x the source): an undertrained model that never
# emits EOS stops there instead of at fairseq's default 200 tokens
BENCH_ARGS+=(--generate-args "--max-len-a 1.2 --max-len-b 10")
# the teacher decoded by CTranslate2 too: the production baseline a fast decoder has to beat (DESIGN.md §7)
BENCH_ARGS+=(--ctranslate2)

mkdir -p "$WORK/logs"
step() {  # step NAME COMMAND...: run once; a marker file records success; the output also goes to WORK/logs/NAME.log
  local name=$1 started
  shift
  if [ -f "$WORK/.$name.done" ]; then log "$name: done before (remove $WORK/.$name.done to redo)"; return; fi
  started=$(date +%s)
  log "$name ... (log: $WORK/logs/$name.log)"
  "$@" 2>&1 | tee "$WORK/logs/$name.log"
  touch "$WORK/.$name.done"
  log "$name done in $(( $(date +%s) - started )) s"
}

PREP_ARGS=(--vocab-size "${VOCAB_SIZE:-8000}")
[ -n "${MAX_LINES:-}" ] && PREP_ARGS+=(--max-lines "$MAX_LINES")

step data bash "$ROOT/run_scripts/prepare_data.sh" "$WORK" "${PREP_ARGS[@]}"
step teacher bash "$ROOT/run_scripts/train_teacher.sh" "$DATA_BIN" "$WORK/ckpt/teacher" --no-progress-bar
TEACHER=$WORK/ckpt/teacher/checkpoint_best.pt
step distill bash "$ROOT/run_scripts/distill.sh" "$DATA_BIN" "$TEACHER"
# a teacher that stutters teaches its students to stutter (DESIGN.md §10): the log and the report say how much it does
KD_TARGETS=$(find "$DATA_BIN" -maxdepth 1 -name 'train.kd.*.txt' | head -n 1)
KD_REPEATS=$(python - "$KD_TARGETS" <<'PY'
import sys
from nat_plugins.cli.rep_mis import repeated_ratio
with open(sys.argv[1], encoding="utf-8") as f:
    print(f"{repeated_ratio(f.read().splitlines(), window=1):.2f}%")
PY
)
log "distilled targets $KD_TARGETS: $KD_REPEATS of the subwords repeat the one before"
BENCH_ARGS+=(--distilled-targets "$KD_TARGETS")

EXAMPLES=$ROOT/examples/multi30k
CKPT=$WORK/ckpt
SYSTEMS=()
add_row() {  # add_row NAME CHECKPOINT_DIR GENERATE_ARGS: one benchmark row
  SYSTEMS+=(--system "$1=$2/$STUDENT_CHECKPOINT::$3")
}

# The CPU preset trains one headline configuration of every system, long enough to learn (~26 min in all); the
# GPU preset every configuration of the papers' tables.
if [ "$PRESET" = gpu ]; then
  BLOCK_SIZES="2 4 8"; SAT_KS="2 4 6"; RECOVER_SAT_KS="2 4 6"; NPD_SAMPLES="10 100"
else
  # (NPD S=100 decodes 100 candidates per sentence: ~10 min of the batched pass on 2 cores)
  BLOCK_SIZES="4"; SAT_KS="2"; RECOVER_SAT_KS="2"; NPD_SAMPLES="10"
  if [ "$PRESET" = cpu-long ]; then SAT_KS="2 4"; fi
fi

# Blockwise parallel decoding (Stern et al. 2018): heads trained on the frozen teacher, then everything fine-tuned
for K in $BLOCK_SIZES; do
  step "blockwise-$K-frozen" bash "$EXAMPLES/blockwise.sh" "$DATA_BIN" "$TEACHER" "$CKPT/blockwise-$K-frozen" "$K" frozen
  add_row "Blockwise k=$K frozen, exact" "$CKPT/blockwise-$K-frozen" "--beam 1 --block-accept exact"
  step "blockwise-$K-finetuned" bash "$EXAMPLES/blockwise.sh" "$DATA_BIN" "$CKPT/blockwise-$K-frozen/$STUDENT_CHECKPOINT" \
    "$CKPT/blockwise-$K-finetuned" "$K" finetuned
  add_row "Blockwise k=$K fine-tuned, exact" "$CKPT/blockwise-$K-finetuned" "--beam 1 --block-accept exact"
done

# Semi-Autoregressive Transformer (Wang et al. 2018) on distilled data, greedy and beam 4
for K in $SAT_KS; do
  step "sat-$K" bash "$EXAMPLES/sat.sh" "$DATA_BIN" "$TEACHER" "$CKPT/sat-$K" "$K"
  add_row "SAT K=$K, greedy" "$CKPT/sat-$K" "--beam 1"
  add_row "SAT K=$K, beam 4" "$CKPT/sat-$K" "--beam 4"
done

# RecoverSAT (Ran et al. 2020): K segments in parallel
for K in $RECOVER_SAT_KS; do
  step "recover-sat-$K" bash "$EXAMPLES/recover_sat.sh" "$DATA_BIN" "$TEACHER" "$CKPT/recover-sat-$K" "$K"
  add_row "RecoverSAT K=$K" "$CKPT/recover-sat-$K" "--beam 1"
done

# NAT with fertility (Gu et al. 2018): eflomal fertilities on the distilled targets, one decoder pass; argmax,
# average and noisy parallel decoding (S fertility samples rescored by the teacher in one pass)
step fertility bash "$ROOT/run_scripts/fertility.sh" "$DATA_BIN"
step fertility-nat bash "$EXAMPLES/fertility_nat.sh" "$DATA_BIN" "$TEACHER" "$CKPT/fertility-nat"
add_row "NAT, argmax fertility" "$CKPT/fertility-nat" "--beam 1 --fertility-decoding argmax"
add_row "NAT, average fertility" "$CKPT/fertility-nat" "--beam 1 --fertility-decoding average"
for S in $NPD_SAMPLES; do
  add_row "NAT, NPD S=$S" "$CKPT/fertility-nat" "--beam 1 --fertility-decoding npd --npd-samples $S --npd-teacher $TEACHER"
done

# Encoder-NAD-AD (Zhou et al. 2020): the AR decoder also attends to a NAD run once per sentence; compared with the
# teacher trained for the same number of updates (same optimiser settings, real targets)
step nad-ad bash "$EXAMPLES/nad_ad.sh" "$DATA_BIN" "$TEACHER" "$CKPT/nad-ad"
step ar-baseline bash "$EXAMPLES/ar_baseline.sh" "$DATA_BIN" "$TEACHER" "$CKPT/ar-baseline"
add_row "Encoder-NAD-AD, beam 4" "$CKPT/nad-ad" "--beam 4"
add_row "AR teacher + same updates, beam 4" "$CKPT/ar-baseline" "--beam 4"
BENCH_ARGS+=(--paired-test "AR teacher + same updates, beam 4::Encoder-NAD-AD, beam 4")  # significance of the gain

# fairseq's own NAT and CMLM (Mask-Predict, 10 iterations) at the NAT's number of updates, from scratch
if [ "$PRESET" != cpu ]; then
  for MODEL in nat cmlm; do
    step "fairseq-$MODEL" bash "$EXAMPLES/fairseq_nat.sh" "$DATA_BIN" "$CKPT/fairseq-$MODEL" "$MODEL"
  done
  add_row "fairseq NAT (nonautoregressive_transformer)" "$CKPT/fairseq-nat" "--task translation_lev --iter-decode-max-iter 0"
  add_row "fairseq CMLM, 10 iterations" "$CKPT/fairseq-cmlm" "--task translation_lev --iter-decode-max-iter 9"
fi

# the benchmark re-runs whenever its rows or options change
BENCH_KEY=$(echo "$PRESET ${BENCH_ARGS[*]} ${SYSTEMS[*]}" | sha1sum | cut -c1-8)
step "benchmark-$BENCH_KEY" bash "$ROOT/run_scripts/benchmark.sh" "$DATA_BIN" --teacher "$TEACHER" \
  --reference "$WORK/raw/test.de" --out-dir "$WORK/bench" --title "Multi30k en-de test2016 (PRESET=$PRESET)" \
  "${BENCH_ARGS[@]}" "${SYSTEMS[@]}"

log "finished in $(( $(date +%s) - START )) s; outputs in $WORK (table: $WORK/bench/results.md, plots: $WORK/bench/pareto.png, $WORK/bench/by_length.png)"
echo
cat "$WORK/bench/results.md"
