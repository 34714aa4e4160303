#!/usr/bin/env bash
# Training speed of every recipe, measured in one run on the same batches: each recipe of examples/multi30k (and the
# teacher's) runs with FAIRSEQ_TRAIN set to nat_plugins.cli.train_speed, which takes the recipe's exact
# fairseq-train options and times UPDATES updates (after 3 untimed ones) of fairseq's Trainer; nothing is saved.
# Needs a finished quickstart's work directory (distilled targets, fertilities, teacher, frozen blockwise heads).
#   [PRESET=cpu|gpu] bash run_scripts/train_speed.sh [WORK] [UPDATES] [OUT]   (defaults: work/multi30k-$PRESET, 20,
#   WORK/train_speed)
# Writes OUT/speed.jsonl and prints a table: updates/s and the ratio to the AR teacher's recipe on the
# distilled targets (the students' batches).
# Before/after a change: run it here and, for the old commit, in a worktree with this venv and the old package first
# on the path (fairseq refuses a --user-dir of another checkout than the imported one):
#   git worktree add /tmp/nat-before OLD_COMMIT
#   PYTHONPATH=/tmp/nat-before NAT_VENV=$PWD/.venv bash /tmp/nat-before/run_scripts/train_speed.sh $PWD/WORK 20
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WORK=${1:-$ROOT/work/multi30k-$PRESET}
UPDATES=${2:-20}
DATA_BIN=$WORK/data-bin
TEACHER=$WORK/ckpt/teacher/checkpoint_best.pt
FROZEN=$WORK/ckpt/blockwise-4-frozen/$STUDENT_CHECKPOINT
for needed in "$TEACHER" "$FROZEN" "$DATA_BIN"/train.kd.*.idx "$DATA_BIN"/train.fert.*; do
  [ -e "$needed" ] || { echo "train_speed.sh: $needed is missing: run bash run_scripts/quickstart.sh first" >&2; exit 1; }
done
OUT=${3:-$WORK/train_speed}
mkdir -p "$OUT"
RESULTS=$OUT/speed.jsonl
rm -f "$RESULTS"
EXAMPLES=$ROOT/examples/multi30k
SCRATCH=$OUT/unused-save-dir

timed() {  # timed LABEL RECIPE ARGS...: the recipe, its training command replaced by the timing tool
  local label=$1
  shift
  log "$label"
  FAIRSEQ_TRAIN="python -m nat_plugins.cli.train_speed --label $label --updates $UPDATES --output $RESULTS --" "$@"
}

timed teacher-on-distilled bash "$ROOT/run_scripts/train_teacher.sh" "$DATA_BIN" "$SCRATCH" --use-distilled target
timed sat-2 bash "$EXAMPLES/sat.sh" "$DATA_BIN" "$TEACHER" "$SCRATCH" 2
timed recover-sat-2 bash "$EXAMPLES/recover_sat.sh" "$DATA_BIN" "$TEACHER" "$SCRATCH" 2
timed blockwise-4-frozen bash "$EXAMPLES/blockwise.sh" "$DATA_BIN" "$TEACHER" "$SCRATCH" 4 frozen
timed blockwise-4-finetuned bash "$EXAMPLES/blockwise.sh" "$DATA_BIN" "$FROZEN" "$SCRATCH" 4 finetuned
timed fertility-nat bash "$EXAMPLES/fertility_nat.sh" "$DATA_BIN" "$TEACHER" "$SCRATCH"
timed ar-baseline bash "$EXAMPLES/ar_baseline.sh" "$DATA_BIN" "$TEACHER" "$SCRATCH"
timed nad-ad bash "$EXAMPLES/nad_ad.sh" "$DATA_BIN" "$TEACHER" "$SCRATCH"

python - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
reference = {"nad-ad": "ar-baseline"}  # Encoder-NAD-AD batches by the real targets, as its AR baseline does
speed = {row["label"]: row["updates_per_s"] for row in rows}
print(f"\n{rows[0]['updates']} timed updates per recipe on {rows[0]['device']} ({rows[0]['threads']} threads)\n")
print("| recipe | updates/s | target tokens/s | × the AR recipe on the same batches |")
print("|---|---:|---:|---:|")
for row in rows:
    base = reference.get(row["label"], "teacher-on-distilled")
    print(f"| {row['label']} | {row['updates_per_s']:.3f} | {row['target_tokens_per_s']:.0f} | "
          f"{row['updates_per_s'] / speed[base]:.2f} ({base}) |")
PY
