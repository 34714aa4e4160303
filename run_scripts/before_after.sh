#!/usr/bin/env bash
# Before/after speed of a code change, measured back to back on one machine with the same trained models (the
# tables of docs/results.md "Speed work"): the code at git revision BASE ("before") and this checkout ("after") each
# 1. decode the test set with the teacher (beam 4, greedy) and the plugin rows below (nat-benchmark: batch-1
#    latency, median and p90; every row's speed-up is over the teacher's greedy search of the same benchmark run,
#    DESIGN.md §7), and
# 2. time every training recipe on the same batches (run_scripts/train_speed.sh: updates/s and the ratio to the AR
#    recipe of the same run).
# Needs a finished quickstart's work directory (its checkpoints, data-bin, raw test references).
#   [PRESET=cpu-long] bash run_scripts/before_after.sh BASE [WORK] [LATENCY_SENTENCES] [UPDATES]
# (defaults: work/multi30k-$PRESET, 110 sentences of which 10 warm-up, 20 timed updates; UPDATES 0: decoding
# only). Both sides run in this checkout's Python environment with PYTHONPATH pointing at their own nat_plugins.
# Rows: the teacher's greedy search under --task translation_nat, every blockwise, SAT, RecoverSAT and speculative
# checkpoint of WORK, the NAT (argmax, NPD) and Encoder-NAD-AD. Writes OUT=WORK/before-after:
# before_after.md (both tables, and whether each row's hypotheses are identical before and after), the two
# benchmark directories and the two speed.jsonl files.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BASE=${1:?usage: bash run_scripts/before_after.sh BASE [WORK] [LATENCY_SENTENCES] [UPDATES]}
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

SYSTEMS=(--system "AR teacher, greedy, translation_nat=$TEACHER::--beam 1")  # fairseq's greedy under the plugin's task
row() {  # row NAME CHECKPOINT_DIR GENERATE_ARGS: a benchmark row whose checkpoint exists in WORK
  [ -e "$CKPT/$2/$STUDENT_CHECKPOINT" ] && SYSTEMS+=(--system "$1=$CKPT/$2/$STUDENT_CHECKPOINT::$3")
  return 0
}
for dir in "$CKPT"/blockwise-*-frozen "$CKPT"/blockwise-*-finetuned; do
  [ -d "$dir" ] || continue
  name=$(basename "$dir")
  row "Blockwise ${name#blockwise-}, exact" "$name" "--beam 1 --block-accept exact$DRAFT_ARGS"
done
for dir in "$CKPT"/spec-drafter-*; do
  [ -d "$dir" ] && row "Speculative k=${dir##*-}, exact" "$(basename "$dir")" "--beam 1 --speculative-teacher $TEACHER$DRAFT_ARGS"
done
for dir in "$CKPT"/sat-*; do [ -d "$dir" ] && row "SAT K=${dir##*-}, greedy" "$(basename "$dir")" "--beam 1"; done
for dir in "$CKPT"/recover-sat-*; do [ -d "$dir" ] && row "RecoverSAT K=${dir##*-}" "$(basename "$dir")" "--beam 1"; done
row "NAT, argmax fertility" fertility-nat "--beam 1 --fertility-decoding argmax"
row "NAT, NPD S=10" fertility-nat "--beam 1 --fertility-decoding npd --npd-samples 10 --npd-teacher $TEACHER"
row "Encoder-NAD-AD, beam 4" nad-ad "--beam 4"

for side in before after; do
  src=$ROOT
  [ "$side" = before ] && src=$OUT/before-src
  log "$side: benchmark (${#SYSTEMS[@]} option words of plugin rows, $LATENCY_SENTENCES latency sentences)"
  # run from the side's own tree: Python puts the working directory before PYTHONPATH and the installed package
  (cd "$src" && PYTHONPATH=$src python -m nat_plugins.cli.benchmark "$WORK/data-bin" --teacher "$TEACHER" --cpu \
    --reference "$WORK/raw/test.de" --out-dir "$OUT/bench-$side" --user-dir "$src/nat_plugins" \
    --latency-sentences "$LATENCY_SENTENCES" --warmup 10 --batch-size 64 \
    --generate-args "--max-len-a 1.2 --max-len-b 10" --title "$side" "${SYSTEMS[@]}") > "$OUT/bench-$side.log" 2>&1
  [ "$UPDATES" = 0 ] && continue
  log "$side: training speed ($UPDATES timed updates per recipe)"
  (cd "$src" && PYTHONPATH=$src bash run_scripts/train_speed.sh "$WORK" "$UPDATES") > "$OUT/train-speed-$side.log" 2>&1
  mv "$WORK/train_speed/speed.jsonl" "$OUT/speed-$side.jsonl"
done

python - "$OUT" "$(git -C "$ROOT" log --oneline -1 "$BASE")" "$(git -C "$ROOT" log --oneline -1 HEAD)" \
  > "$OUT/before_after.md" <<'PY'
import json, os, sys
out, before_rev, after_rev = sys.argv[1:]
bench = {side: json.load(open(os.path.join(out, f"bench-{side}", "results.json"))) for side in ("before", "after")}
rows = {side: {row["name"]: row for row in bench[side]["rows"]} for side in bench}
def hyps(side, row):
    return open(os.path.join(out, f"bench-{side}", row["hyp_file"]), encoding="utf-8").read()
print(f"before: {before_rev}  \nafter: {after_rev} (working tree)\n")
print("Decoding, batch 1 (median ms per sentence; x = speed-up over the teacher's greedy search in the same run)\n")
print("| row | before ms | before x greedy | after ms | after x greedy | after/before time | same hypotheses |")
print("|---|---:|---:|---:|---:|---:|---|")
for name, after in rows["after"].items():
    before = rows["before"].get(name)
    if before is None:
        continue
    ratio = after["latency_ms_median"] / before["latency_ms_median"]
    def speedup(row):
        value = row.get("latency_speedup_vs_ar_greedy")
        return "-" if value is None else f"{value:.2f}"
    same = "yes" if hyps("before", before) == hyps("after", after) else "**no**"
    print(f"| {name} | {before['latency_ms_median']:.1f} | {speedup(before)} | {after['latency_ms_median']:.1f} | "
          f"{speedup(after)} | {ratio:.2f} | {same} |")
if not os.path.exists(os.path.join(out, "speed-after.jsonl")):  # UPDATES=0: decoding only
    sys.exit()
speed = {side: [json.loads(line) for line in open(os.path.join(out, f"speed-{side}.jsonl"))] for side in bench}
reference = {"nad-ad": "ar-baseline"}
print("\nTraining (updates/s; x = ratio to the AR recipe on the same batches in the same run)\n")
print("| recipe | before upd/s | before x AR | after upd/s | after x AR |")
print("|---|---:|---:|---:|---:|")
by_label = {side: {row["label"]: row["updates_per_s"] for row in speed[side]} for side in speed}
for label, after in by_label["after"].items():
    before = by_label["before"].get(label)
    base = reference.get(label, "teacher-on-distilled")
    if before is None:
        continue
    print(f"| {label} | {before:.3f} | {before / by_label['before'][base]:.2f} | {after:.3f} | "
          f"{after / by_label['after'][base]:.2f} |")
PY
cat "$OUT/before_after.md"
