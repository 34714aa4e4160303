#!/usr/bin/env bash
# Before/after speed of a code change, measured back to back on one machine with the same trained models: the code at git revision BASE ("before") and this checkout ("after") each
# 1. decode the test set with the teacher (beam 4, greedy) and the plugin rows below (nat-benchmark: batch-1
#    latency, median and p90; every row's speed-up is over the teacher's greedy search of the same benchmark run),
#    and
# 2. time every training recipe on the same batches (run_scripts/train_speed.sh: updates/s and the ratio to the AR
#    recipe of the same run).
# Needs a finished quickstart's work directory (its checkpoints, data-bin, raw test references).
#   [PRESET=cpu-long] bash dev/before_after.sh BASE [WORK] [LATENCY_SENTENCES] [UPDATES]
# (defaults: work/multi30k-$PRESET, 110 sentences of which 10 warm-up, 20 timed updates; UPDATES 0: decoding
# only). Both sides run in this checkout's Python environment with PYTHONPATH pointing at their own nat_plugins.
# Rows: the teacher's greedy search under --task translation_nat and the quickstart's rows of the preset whose
# checkpoints WORK has (nat_recipes/catalogue.py), with its benchmark options but CTranslate2's. Writes
# OUT=WORK/before-after:
# before_after.md (both tables, and whether each row's hypotheses are identical before and after), the two
# benchmark directories and the two speed.jsonl files.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../run_scripts/common.sh"
BASE=${1:?usage: bash dev/before_after.sh BASE [WORK] [LATENCY_SENTENCES] [UPDATES]}
WORK=$(cd "${2:-$ROOT/work/multi30k-$PRESET}" && pwd)
LATENCY_SENTENCES=${3:-110}
UPDATES=${4:-20}
CKPT=$WORK/ckpt
TEACHER=$CKPT/teacher/checkpoint_best.pt
for needed in "$TEACHER" "$WORK/data-bin" "$WORK/raw/test.de"; do
  [ -e "$needed" ] || { echo "before_after.sh: $needed is missing: run the quickstart (PRESET=$PRESET) first" >&2; exit 1; }
done
OUT=$WORK/before-after
rm -rf "$OUT"
mkdir -p "$OUT/before-src"
git -C "$ROOT" archive "$BASE" | tar -x -C "$OUT/before-src"
log "before: $(git -C "$ROOT" log --oneline -1 "$BASE"); after: this checkout ($(git -C "$ROOT" log --oneline -1 HEAD))"
# the Python environment both sides use: this checkout's (common.sh activated it), unless NAT_VENV says otherwise
export NAT_VENV=${NAT_VENV:-$ROOT/.venv}

ROWS=$(python -m nat_recipes.catalogue rows --preset "$PRESET" --work "$WORK" --data-bin "$WORK/data-bin" \
  --teacher "$TEACHER" --checkpoint-name "$STUDENT_CHECKPOINT" --existing)
OPTIONS=$(python -m nat_recipes.catalogue options --preset "$PRESET" --latency-sentences "$LATENCY_SENTENCES")
SYSTEMS=(--system "AR teacher, greedy, translation_nat=$TEACHER::--beam 1")
[ -z "$ROWS" ] || mapfile -t -O 2 SYSTEMS <<< "$ROWS"
mapfile -t OPTIONS <<< "$OPTIONS"
BENCH_ARGS=()
for word in "${OPTIONS[@]}"; do [ "$word" = --ctranslate2 ] || [ "$word" = --solo ] || BENCH_ARGS+=("$word"); done
for side in before after; do
  src=$ROOT
  [ "$side" = before ] && src=$OUT/before-src
  log "$side: benchmark (${#SYSTEMS[@]} option words of plugin rows, $LATENCY_SENTENCES latency sentences)"
  # run from the side's own tree: Python puts the working directory before PYTHONPATH and the installed package
  (cd "$src" && PYTHONPATH=$src python -m nat_plugins.bench.benchmark "$WORK/data-bin" --teacher "$TEACHER" \
    --reference "$WORK/raw/test.de" --out-dir "$OUT/bench-$side" --user-dir "$src/nat_plugins" --title "$side" \
    "${BENCH_ARGS[@]}" "${SYSTEMS[@]}") > "$OUT/bench-$side.log" 2>&1
  [ "$UPDATES" = 0 ] && continue
  log "$side: training speed ($UPDATES timed updates per recipe)"
  (cd "$src" && PYTHONPATH=$src bash run_scripts/train_speed.sh "$WORK" "$UPDATES") > "$OUT/train-speed-$side.log" 2>&1
  mv "$WORK/train_speed/speed.jsonl" "$OUT/speed-$side.jsonl"
done

python "$ROOT/dev/before_after.py" "$OUT" "$(git -C "$ROOT" log --oneline -1 "$BASE")" \
  "$(git -C "$ROOT" log --oneline -1 HEAD)" > "$OUT/before_after.md"
cat "$OUT/before_after.md"
