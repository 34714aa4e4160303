#!/usr/bin/env bash
# The main job of the README, on Multi30k en->de: set-up, data, AR teacher, sequence-level distillation,
# every plugin system that exists so far, and the benchmark table (teacher beam 4 + greedy in the same run).
#   bash run_scripts/quickstart.sh                # PRESET=cpu: 2-layer models, one configuration per system (~30 min on 2 cores)
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
  log "(~30 min on 2 cores). Small models, so BLEU is far below the papers'; PRESET=gpu runs the full-size recipe."
elif [ "$PRESET" = cpu-long ]; then
  log "PRESET=cpu-long: the quality run on the CPU: the 2-layer 256-d teacher trained to convergence, every system"
  log "trained 4x longer than PRESET=cpu, fairseq's own NAT and CMLM for comparison (~100 min on 2 cores)."
fi
if [ "$PRESET" = gpu ]; then
  # batch-1 latency on every test sentence (the first 20 are warm-up), unless LATENCY_SENTENCES says how many
  BENCH_ARGS=(--batch-size 128 --warmup 20 ${LATENCY_SENTENCES:+--latency-sentences "$LATENCY_SENTENCES"})
else
  # batch-1 latency: 100 sentences timed after 10 of warm-up (machine noise is ±15% between runs; ~1 min per 100)
  BENCH_ARGS=(--cpu --latency-sentences "${LATENCY_SENTENCES:-110}" --warmup 10 --batch-size 64)
fi
# one length limit for every row (Multi30k targets are ~1.1x the source): an undertrained model that never
# emits EOS stops there instead of at fairseq's default 200 tokens
BENCH_ARGS+=(--generate-args "--max-len-a 1.2 --max-len-b 10")
# the teacher decoded by CTranslate2 too: the production baseline a fast decoder has to beat (CPU presets: the GPU
# machine's checkout cannot carry a CTranslate2 wheel beside fairseq's)
[ "$PRESET" = gpu ] || BENCH_ARGS+=(--ctranslate2)

mkdir -p "$WORK/logs"
step() {  # step NAME COMMAND...: run once; a marker file records success; the output also goes to WORK/logs/NAME.log
  local name=$1 started
  shift
  if [ -f "$WORK/.$name.done" ]; then log "$name: done before (remove $WORK/.$name.done to redo)"; return; fi
  started=$(date +%s)
  log "$name ... (log: $WORK/logs/$name.log)"
  "$@" 2>&1 | tee "$WORK/logs/$name.log"
  touch "$WORK/.$name.done"
  printf '%s\t%s\n' "$name" "$(( $(date +%s) - started ))" >> "$WORK/logs/steps.tsv"  # for the report
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

# The CPU presets train one headline configuration of every system (PRESET=cpu-long adds SAT K=4); the GPU preset
# the configurations its targets are about (docs/results.md), the students STUDENT_JOBS at a time: one of these
# models leaves most of an H100 idle, so its 27-minute plan (examples/multi30k/README.md) trains them side by side.
if [ "$PRESET" = gpu ]; then
  BLOCK_SIZES="8"; SAT_KS="2 6"; RECOVER_SAT_KS="2 6"; NPD_SAMPLES="10 100"; DRAFT_SIZES="8"; STUDENT_JOBS=${STUDENT_JOBS:-11}
else
  # (NPD S=100 decodes 100 candidates per sentence: ~10 min of the batched pass on 2 cores)
  BLOCK_SIZES="4"; SAT_KS="2"; RECOVER_SAT_KS="2"; NPD_SAMPLES="10"; DRAFT_SIZES="3"; STUDENT_JOBS=${STUDENT_JOBS:-1}
  if [ "$PRESET" = cpu-long ]; then SAT_KS="2 4"; fi
fi
STUDENT_STEPS=()
students() {  # students NAME... -- COMMAND...: steps that need only the teacher and the distilled data, in the
  # background when STUDENT_JOBS > 1 (each on 16/STUDENT_JOBS CPU threads, output in its log only)
  local names=()
  while [ "$1" != -- ]; do names+=("$1"); shift; done
  shift
  STUDENT_STEPS+=("${names[@]}")
  if [ "$STUDENT_JOBS" -le 1 ]; then "$@"; return; fi
  while [ "$(jobs -rp | wc -l)" -ge "$STUDENT_JOBS" ]; do wait -n || true; done
  ( export OMP_NUM_THREADS=$(( ($(nproc) + STUDENT_JOBS - 1) / STUDENT_JOBS )); "$@" > /dev/null 2>&1 ) &
}
blockwise_chain() {  # Blockwise parallel decoding (Stern et al. 2018): heads on the frozen teacher, then all fine-tuned
  step "blockwise-$1-frozen" bash "$EXAMPLES/blockwise.sh" "$DATA_BIN" "$TEACHER" "$CKPT/blockwise-$1-frozen" "$1" frozen
  step "blockwise-$1-finetuned" bash "$EXAMPLES/blockwise.sh" "$DATA_BIN" \
    "$CKPT/blockwise-$1-frozen/$STUDENT_CHECKPOINT" "$CKPT/blockwise-$1-finetuned" "$1" finetuned
}
fertility_chain() {  # NAT with fertility (Gu et al. 2018): eflomal fertilities on the distilled targets, then the NAT
  # eflomal is not deterministic: its links are kept (fertility.sh DATA_BIN --aligner links --links-dir WORK/links)
  step fertility bash "$ROOT/run_scripts/fertility.sh" "$DATA_BIN" --save-links "$WORK/links"
  step fertility-nat bash "$EXAMPLES/fertility_nat.sh" "$DATA_BIN" "$TEACHER" "$CKPT/fertility-nat"
}

for K in $BLOCK_SIZES; do
  students "blockwise-$K-frozen" "blockwise-$K-finetuned" -- blockwise_chain "$K"
  add_row "Blockwise k=$K frozen, exact" "$CKPT/blockwise-$K-frozen" "--beam 1 --block-accept exact$DRAFT_ARGS"
  add_row "Blockwise k=$K fine-tuned, exact" "$CKPT/blockwise-$K-finetuned" "--beam 1 --block-accept exact$DRAFT_ARGS"
done

# Speculative decoding (Xia et al. 2023): a shallow non-autoregressive drafter proposes K tokens, the teacher verifies
# them in one call; exact verification prints the teacher's greedy output, relaxed (top-3 within 1 nat) accepts more
for K in $DRAFT_SIZES; do
  students "spec-drafter-$K" -- step "spec-drafter-$K" bash "$EXAMPLES/spec_drafter.sh" "$DATA_BIN" "$TEACHER" "$CKPT/spec-drafter-$K" "$K"
  add_row "Speculative k=$K, exact" "$CKPT/spec-drafter-$K" "--beam 1 --speculative-teacher $TEACHER$DRAFT_ARGS"
  add_row "Speculative k=$K, relaxed" "$CKPT/spec-drafter-$K" \
    "--beam 1 --speculative-teacher $TEACHER --speculative-verify relaxed --speculative-beta 3 --speculative-tau 1"
done

# Semi-Autoregressive Transformer (Wang et al. 2018) on distilled data, greedy and beam 4
for K in $SAT_KS; do
  students "sat-$K" -- step "sat-$K" bash "$EXAMPLES/sat.sh" "$DATA_BIN" "$TEACHER" "$CKPT/sat-$K" "$K"
  add_row "SAT K=$K, greedy" "$CKPT/sat-$K" "--beam 1"
  add_row "SAT K=$K, beam 4" "$CKPT/sat-$K" "--beam 4"
done

# RecoverSAT (Ran et al. 2020): K segments in parallel
for K in $RECOVER_SAT_KS; do
  students "recover-sat-$K" -- step "recover-sat-$K" bash "$EXAMPLES/recover_sat.sh" "$DATA_BIN" "$TEACHER" "$CKPT/recover-sat-$K" "$K"
  add_row "RecoverSAT K=$K" "$CKPT/recover-sat-$K" "--beam 1"
done

# the NAT decoded with argmax, average and noisy parallel decoding (S fertility samples rescored by the teacher)
students fertility fertility-nat -- fertility_chain
add_row "NAT, argmax fertility" "$CKPT/fertility-nat" "--beam 1 --fertility-decoding argmax"
add_row "NAT, average fertility" "$CKPT/fertility-nat" "--beam 1 --fertility-decoding average"
for S in $NPD_SAMPLES; do
  add_row "NAT, NPD S=$S" "$CKPT/fertility-nat" "--beam 1 --fertility-decoding npd --npd-samples $S --npd-teacher $TEACHER"
done

# Encoder-NAD-AD (Zhou et al. 2020): the AR decoder also attends to a NAD run once per sentence; compared with the
# teacher trained for the same number of updates (same optimiser settings, real targets)
students nad-ad -- step nad-ad bash "$EXAMPLES/nad_ad.sh" "$DATA_BIN" "$TEACHER" "$CKPT/nad-ad"
students ar-baseline -- step ar-baseline bash "$EXAMPLES/ar_baseline.sh" "$DATA_BIN" "$TEACHER" "$CKPT/ar-baseline"
add_row "Encoder-NAD-AD, beam 4" "$CKPT/nad-ad" "--beam 4"
add_row "AR teacher + same updates, beam 4" "$CKPT/ar-baseline" "--beam 4"
BENCH_ARGS+=(--paired-test "AR teacher + same updates, beam 4::Encoder-NAD-AD, beam 4")  # significance of the gain

# fairseq's own NAT and CMLM (Mask-Predict, 10 iterations) at the NAT's number of updates, from scratch
if [ "$PRESET" != cpu ]; then
  for MODEL in nat cmlm; do
    students "fairseq-$MODEL" -- step "fairseq-$MODEL" bash "$EXAMPLES/fairseq_nat.sh" "$DATA_BIN" "$CKPT/fairseq-$MODEL" "$MODEL"
  done
  add_row "fairseq NAT (nonautoregressive_transformer)" "$CKPT/fairseq-nat" "--task translation_lev --iter-decode-max-iter 0"
  add_row "fairseq CMLM, 10 iterations" "$CKPT/fairseq-cmlm" "--task translation_lev --iter-decode-max-iter 9"
fi

if [ "$STUDENT_JOBS" -gt 1 ]; then
  log "training ${#STUDENT_STEPS[@]} steps, $STUDENT_JOBS at a time (progress: ls $WORK/.*.done; logs: $WORK/logs)"
  wait
  for name in "${STUDENT_STEPS[@]}"; do
    [ -f "$WORK/.$name.done" ] || { log "step $name failed: see $WORK/logs/$name.log" >&2; exit 1; }
  done
fi

# the benchmark re-runs whenever its rows or options change
BENCH_KEY=$(echo "$PRESET ${BENCH_ARGS[*]} ${SYSTEMS[*]}" | sha1sum | cut -c1-8)
step "benchmark-$BENCH_KEY" bash "$ROOT/run_scripts/benchmark.sh" "$DATA_BIN" --teacher "$TEACHER" \
  --reference "$WORK/raw/test.de" --out-dir "$WORK/bench" --title "Multi30k en-de test2016 (PRESET=$PRESET)" \
  "${BENCH_ARGS[@]}" "${SYSTEMS[@]}"

# the report: targets, the teacher's validation curve, step times, the benchmark's tables; the quality runs
# (cpu-long, gpu) also regenerate their section of docs/results.md
REPORT_ARGS=()
[ "$PRESET" = cpu ] || REPORT_ARGS=(--docs "$ROOT/docs/results.md")
python -m nat_plugins.cli.report "$WORK" --preset "$PRESET" "${REPORT_ARGS[@]}" > /dev/null
log "finished in $(( $(date +%s) - START )) s; outputs in $WORK (report: $WORK/report.md, benchmark tables and plots: $WORK/bench)"
echo
cat "$WORK/report.md"
