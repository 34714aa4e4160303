# Sourced by the dev scripts that add measurements to a finished quickstart run (dev/nad_ad_seeds.sh,
# dev/fairseq_peers.sh, dev/variant.sh): run_scripts/common.sh, then
#   run_dir WORK SCRIPT FILE...   cd into the run's work folder WORK; exit, saying what to run, when it lacks a FILE
#   train_once NAME RECIPE ARGS   bash examples/multi30k/RECIPE ARGS (RECIPE with a "/": relative to the
#                                 repository) which save into ckpt/NAME, unless
#                                 ckpt/NAME/$STUDENT_CHECKPOINT exists and its training was not interrupted (an
#                                 interrupted one resumes); output in logs/NAME.log, its tail on failure;
#                                 with TRAINING_TIMES set, "NAME<TAB>seconds" is appended to that file
#   run_benchmark OUT ARGS        nat-benchmark on the run's test split on the CPU with the quickstart's length limit,
#                                 no plots, output in OUT.log (its tail on failure); ARGS: rows and timing options
# shellcheck source=../run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_scripts/common.sh"
TEACHER=ckpt/teacher/checkpoint_best.pt

run_dir() {
  local work=$1 script=$2 file
  shift 2
  cd "$work"
  for file in "$@"; do
    [ -f "$file" ] || { echo "$script: no $work/$file: run PRESET=$PRESET bash run_scripts/quickstart.sh first" >&2
      exit 1; }
  done
}

train_once() {
  local name=$1 recipe=$ROOT/examples/multi30k/$2 started
  [[ $2 == */* ]] && recipe=$ROOT/$2
  shift 2
  [ -f "ckpt/$name/$STUDENT_CHECKPOINT" ] && [ ! -f "ckpt/$name/.unfinished" ] && return
  log "training $name (log: $PWD/logs/$name.log)"
  started=$(date +%s)
  mkdir -p "ckpt/$name" && touch "ckpt/$name/.unfinished"
  bash "$recipe" "$@" > "logs/$name.log" 2>&1 || { tail -n 30 "logs/$name.log" >&2; exit 1; }
  rm "ckpt/$name/.unfinished"
  [ -z "${TRAINING_TIMES:-}" ] || printf '%s\t%s\n' "$name" "$(( $(date +%s) - started ))" >> "$TRAINING_TIMES"
}

run_benchmark() {
  local out=$1
  shift
  nat-benchmark data-bin --teacher "$TEACHER" --reference raw/test.de --out-dir "$out" --work-dir . --cpu \
    --threads 2 --no-plots --generate-args "--max-len-a 1.2 --max-len-b 10" "$@" > "$out.log" 2>&1 \
    || { tail -n 30 "$out.log" >&2; exit 1; }
}
