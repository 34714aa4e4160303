#!/usr/bin/env bash
# The main job of the README, on Multi30k en->de: set-up, data, AR teacher, sequence-level distillation,
# every plugin system that exists so far, and the benchmark table (teacher beam 4 + greedy in the same run).
#   bash run_scripts/quickstart.sh                # PRESET=cpu: 2-layer models, one configuration per system (~60-65 min on 2 cores)
#   PRESET=cpu-long bash run_scripts/quickstart.sh  # the quality run on the CPU: converged teacher and students (~3 h 45 min)
#   PRESET=gpu bash run_scripts/quickstart.sh     # transformer_iwslt_de_en-sized, fp16, ~13 min on one GPU
# Bring your own teacher: a fairseq translation Transformer you trained, and the data-bin it was trained on (any size,
# shared embeddings or not, pre- or post-norm; sentencepiece, fastBPE or no BPE):
#   TEACHER=path/checkpoint.pt DATA_BIN=path/data-bin bash run_scripts/quickstart.sh
# distils it, trains the lossless systems on it (SYSTEMS=spec-drafter,blockwise by default; any of the catalogue's
# students, comma-separated: sat, recover-sat, fertility-nat; not nad-ad, which the paper trains from scratch beside an
# AR twin trained the same way, not from a teacher) and benchmarks them against it on the data-bin's
# test split (REFERENCE=raw test targets, a line per test sentence, else the split's targets as text;
# POST_PROCESS=sentencepiece|subword_nmt|none, else read off the dictionary). WORK defaults to
# work/own-teacher-$PRESET-<the checkpoint's sha1, 8 digits>, and a WORK that holds another teacher's or data-bin's
# students (its teacher.txt), or finished steps without a teacher.txt, is refused; DATA_BIN is only read. Every input
# is checked before the first step.
# WORK (default work/multi30k-$PRESET) keeps every output; each finished step leaves a .done marker, so a
# re-run (or a run after an interruption) skips what is done and fairseq-train resumes from checkpoint_last.pt;
# each step's output goes to WORK/logs/STEP.log; the terminal gets a line per step, the last lines of a failed
# step, and the report.
# Smaller smoke runs (the pipeline test uses them): MAX_LINES=N (first N lines of each split), VOCAB_SIZE,
# TEACHER_UPDATES, STUDENT_UPDATES, DISTILL_BEAM, LATENCY_SENTENCES.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/run_scripts/setup_env.sh"
source "$ROOT/run_scripts/common.sh"
if [ -n "${TEACHER:-}" ]; then  # bring your own teacher (above)
  [ -n "${DATA_BIN:-}" ] || { log "TEACHER=$TEACHER needs DATA_BIN=the data-bin it was trained on" >&2; exit 2; }
  # (-m: a path that does not exist is named by the checks below, not by realpath)
  TEACHER=$(realpath -m "$TEACHER")
  OWN_DATA_BIN=$(realpath -m "$DATA_BIN")
  REFERENCE=${REFERENCE:+$(realpath -m "$REFERENCE")}
  # checks the teacher (a clear error for what it cannot take) and gives every student its shape (common.sh)
  TEACHER_SHAPE=$(python -m nat_plugins.cli.own_teacher shape "$TEACHER" "$OWN_DATA_BIN") || exit 2
  export TEACHER_SHAPE
  # every other input before the first step: DATA_BIN's splits and dictionaries, a REFERENCE's lines
  python -m nat_plugins.cli.own_teacher check "$OWN_DATA_BIN" ${REFERENCE:+--reference "$REFERENCE"} || exit 2
  POST_PROCESS=${POST_PROCESS:-$(python -m nat_plugins.cli.own_teacher post-process "$OWN_DATA_BIN")}
  # one work folder per teacher: finished steps are skipped, so another teacher must not find this one's students
  TEACHER_SUM=$(sha1sum "$TEACHER" | cut -d' ' -f1)
  WORK=${WORK:-$ROOT/work/own-teacher-$PRESET-${TEACHER_SUM:0:8}}
  REFERENCE=${REFERENCE:-$WORK/reference.test.txt}
  ONLY=(--only "${SYSTEMS:-spec-drafter,blockwise}")
  if [[ ",${SYSTEMS:-}," == *",nad-ad,"* ]]; then
    log "SYSTEMS=$SYSTEMS: Encoder-NAD-AD is compared with an AR twin trained by the same recipe from random weights" \
      "(the paper's protocol), which a run on your own teacher cannot know. Train the pair yourself" \
      "(examples/multi30k/nad_ad.sh with your teacher's training options, or NAD_AD_INIT=teacher nad_ad.sh with" \
      "ar_baseline.sh), or leave nad-ad out of SYSTEMS." >&2
    exit 2
  fi
  REPORT_ARGS=("${ONLY[@]}" --command "TEACHER=$TEACHER DATA_BIN=$OWN_DATA_BIN ${SYSTEMS:+SYSTEMS=$SYSTEMS }PRESET=$PRESET bash run_scripts/quickstart.sh")
  TITLE="$(basename "$OWN_DATA_BIN") test, own teacher $(basename "$(dirname "$TEACHER")")/$(basename "$TEACHER") (PRESET=$PRESET)"
else
  WORK=${WORK:-$ROOT/work/multi30k-$PRESET}
  TEACHER=$WORK/ckpt/teacher/checkpoint_best.pt
  unset TEACHER_SHAPE  # the students take the preset's size (common.sh)
  POST_PROCESS=sentencepiece
  REFERENCE=$WORK/raw/test.de
  ONLY=()
  REPORT_ARGS=()
  TITLE="Multi30k en-de test2016 (PRESET=$PRESET)"
fi
DATA_BIN=$WORK/data-bin
mkdir -p "$WORK"
if [ -n "${OWN_DATA_BIN:-}" ]; then  # the folder records whose students it holds, and refuses another teacher's run
  MADE_FOR="teacher sha1 $TEACHER_SUM, data-bin $OWN_DATA_BIN"
  if [ -f "$WORK/teacher.txt" ] && [ "$(cat "$WORK/teacher.txt")" != "$MADE_FOR" ]; then
    log "WORK=$WORK holds the students of another teacher or data-bin ($(cat "$WORK/teacher.txt")); this run's:" \
      "$MADE_FOR. Leave WORK unset (one folder per teacher), give another WORK, or remove $WORK." >&2
    exit 2
  fi
  # finished steps without teacher.txt (a Multi30k WORK, one made before it was written): whose, cannot be proven
  if [ ! -f "$WORK/teacher.txt" ] && compgen -G "$WORK/.*.done" > /dev/null; then
    log "WORK=$WORK has finished steps ($(cd "$WORK" && echo .*.done)) but no teacher.txt saying whose students" \
      "they are (the Multi30k quickstart's WORK, or one made before teacher.txt was written). Leave WORK unset" \
      "(one folder per teacher), give another WORK, or, if they are this teacher's, write '$MADE_FOR' into" \
      "$WORK/teacher.txt." >&2
    exit 2
  fi
  echo "$MADE_FOR" > "$WORK/teacher.txt"
fi
START=$(date +%s)
if [ "$PRESET" = gpu ] && [ -z "${GPU_PRESET_ON_CPU:-}" ] &&
    ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  log "PRESET=gpu needs a CUDA GPU (torch sees none); GPU_PRESET_ON_CPU=1 rehearses it on the CPU" >&2
  exit 2
fi
if [ -n "${OWN_DATA_BIN:-}" ]; then
  log "TEACHER=$TEACHER: its shape for the students: $TEACHER_SHAPE; systems: ${ONLY[1]}; subwords: $POST_PROCESS"
elif [ "$PRESET" = cpu ]; then
  log "PRESET=cpu: the whole pipeline on the CPU: a 2-layer 256-d teacher and one configuration of every system"
  log "(~60-65 min on 2 cores). Small models, so BLEU is far below the papers'; PRESET=gpu runs iwslt-sized models on one GPU."
elif [ "$PRESET" = cpu-long ]; then
  log "PRESET=cpu-long: the quality run on the CPU: the 2-layer 256-d teacher trained to convergence, every system"
  log "trained 4x longer than PRESET=cpu, fairseq's own NAT and CMLM for comparison (~3 h 45 min on 2 cores: training ~3 h 15 min, then the benchmark)."
fi
# the systems of the preset, their benchmark rows and the benchmark's options: nat_recipes/catalogue.py
RECIPES=(--preset "$PRESET" --work "$WORK" --data-bin "$DATA_BIN" --teacher "$TEACHER"
  --checkpoint-name "$STUDENT_CHECKPOINT" "${ONLY[@]}")
PLAN=$(python -m nat_recipes.catalogue steps "${RECIPES[@]}")  # one training step a line: JOB STEP SCRIPT ARGS...
ROWS=$(python -m nat_recipes.catalogue rows "${RECIPES[@]}")  # --system and --paired-test options, a word a line
OPTIONS=$(python -m nat_recipes.catalogue options --preset "$PRESET" \
  ${LATENCY_SENTENCES:+--latency-sentences "$LATENCY_SENTENCES"})
mapfile -t STEPS <<< "$PLAN"
mapfile -t ROW_ARGS <<< "$ROWS"
mapfile -t BENCH_ARGS <<< "$OPTIONS"
[ -n "${GPU_PRESET_ON_CPU:-}" ] && BENCH_ARGS=("${BENCH_ARGS[@]/#--fp16/--cpu}")  # the GPU preset rehearsed on the CPU

mkdir -p "$WORK/logs" && touch "$WORK/logs/steps.tsv"
source "$ROOT/run_scripts/step.sh"  # step NAME COMMAND...: run once, its output in WORK/logs/NAME.log

PREP_ARGS=(--vocab-size "${VOCAB_SIZE:-8000}")
[ -n "${MAX_LINES:-}" ] && PREP_ARGS+=(--max-lines "$MAX_LINES")

own_data() {  # WORK/data-bin: links to OWN_DATA_BIN's dictionaries and splits (distilled and fertility files are
  # written beside them, never through a link into OWN_DATA_BIN); the test targets as text
  local file
  mkdir -p "$DATA_BIN" "$(dirname "$REFERENCE")"
  for file in "$OWN_DATA_BIN"/dict.*.txt "$OWN_DATA_BIN"/*.*-*.*.bin "$OWN_DATA_BIN"/*.*-*.*.idx; do
    [ -e "$file" ] && ln -sf "$file" "$DATA_BIN/"
  done
  if [ ! -f "$REFERENCE" ]; then
    python -m nat_plugins.cli.own_teacher reference "$OWN_DATA_BIN" "$REFERENCE" --post-process "$POST_PROCESS"
  fi
}
if [ -n "${OWN_DATA_BIN:-}" ]; then
  step data own_data
else
  step data bash "$ROOT/run_scripts/prepare_data.sh" "$WORK" "${PREP_ARGS[@]}"
  step teacher bash "$ROOT/run_scripts/train_teacher.sh" "$DATA_BIN" "$(dirname "$TEACHER")" --no-progress-bar
fi
step distill bash "$ROOT/run_scripts/distill.sh" "$DATA_BIN" "$TEACHER"
# a teacher that stutters teaches its students to stutter: the log and the report say how much it does
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

# The students need only the teacher and the distilled data: on a GPU (PRESET=gpu) STUDENT_JOBS train side by side
# (one of these models leaves most of a GPU idle: 11 together train ~5x as many updates per second as one alone on an
# H200, examples/multi30k/README.md), each job's steps in order. Rehearsed on the CPU, 2 at a time: 8 of these models
# training in fp32 in the machine's memory need more than ~40 GB (a RecoverSAT job alone: 7 GB).
if [ "$PRESET" != gpu ]; then STUDENT_JOBS=${STUDENT_JOBS:-1}
elif [ -n "${GPU_PRESET_ON_CPU:-}" ]; then STUDENT_JOBS=${STUDENT_JOBS:-2}
else STUDENT_JOBS=${STUDENT_JOBS:-8}; fi
STUDENT_STEPS=()
run_job() {  # run_job JOB: the steps of JOB (lines of STEPS), in order
  local line fields
  for line in "${STEPS[@]}"; do
    IFS=$'\t' read -r -a fields <<< "$line"
    if [ "${fields[0]}" = "$1" ]; then step "${fields[1]}" bash "$ROOT/${fields[2]}" "${fields[@]:3}"; fi
  done
}
PHASE_STARTED=$(date +%s); PHASE_STEPS_BEFORE=$(wc -l < "$WORK/logs/steps.tsv")  # for the side-by-side phase's line
for JOB in $(cut -f1 <<< "$PLAN" | uniq); do  # in the background when STUDENT_JOBS > 1 (output in its logs only)
  mapfile -t NAMES < <(awk -F'\t' -v job="$JOB" '$1 == job { print $2 }' <<< "$PLAN")
  STUDENT_STEPS+=("${NAMES[@]}")
  if [ "$STUDENT_JOBS" -le 1 ]; then run_job "$JOB"; continue; fi
  while [ "$(jobs -rp | wc -l)" -ge "$STUDENT_JOBS" ]; do wait -n || true; done
  # each on its share of the CPU threads
  ( export OMP_NUM_THREADS=$(( ($(nproc) + STUDENT_JOBS - 1) / STUDENT_JOBS )) STEP_PHASE="side by side"
    run_job "$JOB" > /dev/null 2>&1 ) &
done

if [ "$STUDENT_JOBS" -gt 1 ]; then
  log "training ${#STUDENT_STEPS[@]} steps, $STUDENT_JOBS at a time (progress: ls $WORK/.*.done; logs: $WORK/logs)"
  wait
  if [ "$(wc -l < "$WORK/logs/steps.tsv")" -gt "$PHASE_STEPS_BEFORE" ]; then  # the wall time of what trained now
    printf 'students, %s at a time\t%s\tphase\n' "$STUDENT_JOBS" "$(( $(date +%s) - PHASE_STARTED ))" \
      >> "$WORK/logs/steps.tsv"
  fi
  for name in "${STUDENT_STEPS[@]}"; do
    [ -f "$WORK/.$name.done" ] || { log "step $name failed: see $WORK/logs/$name.log" >&2; exit 1; }
  done
fi

# the benchmark re-runs whenever its rows, options, BLEU reference (path and content) or post-processing change
BENCH_KEY=$(echo "$PRESET ${BENCH_ARGS[*]} ${ROW_ARGS[*]} $POST_PROCESS $(sha1sum "$REFERENCE")" | sha1sum | cut -c1-8)
step "benchmark-$BENCH_KEY" bash "$ROOT/run_scripts/benchmark.sh" "$DATA_BIN" --teacher "$TEACHER" \
  --reference "$REFERENCE" --post-process "$POST_PROCESS" --out-dir "$WORK/bench" --work-dir "$WORK" \
  --title "$TITLE" "${BENCH_ARGS[@]}" "${ROW_ARGS[@]}"

# the report: the preset's targets, the teacher's validation curve, step times, the benchmark's tables
python -m nat_recipes.run_report "$WORK" --preset "$PRESET" "${REPORT_ARGS[@]}" > /dev/null
log "finished in $(( $(date +%s) - START )) s; outputs in $WORK (report: $WORK/report.md, benchmark tables and plots: $WORK/bench)"
echo
cat "$WORK/report.md"
