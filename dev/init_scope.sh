#!/usr/bin/env bash
# Which initialisation each student should default to: the students of a finished quickstart run (--init-from-ar-scope
# all: every teacher parameter whose name and shape fit) against the same recipes trained again with
# --init-from-ar-scope paper (only what each paper initialises from its AR model), one seed each, decoded as their
# benchmark rows are (dev/variant.sh: sacreBLEU, Rep/Mis, decoder calls) with sacreBLEU's paired bootstrap test of the
# two. The recipes and their arguments come from the catalogue (nat_recipes/catalogue.py); the speculative drafter
# prints the teacher's output either way, so what decides it is the tokens it gets accepted per teacher call.
#   [PRESET=cpu|cpu-long] bash dev/init_scope.sh WORK [STEP ...]     (default steps: the three below; not
# Encoder-NAD-AD, which trains from scratch)
# Writes WORK/variants/STEP{,-scope-paper}.{gen,hyp} and prints one line per step.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage="usage: init_scope.sh WORK [STEP ...]"
WORK=$(cd "${1:?$usage}" && pwd)
shift
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(fertility-nat recover-sat-2 spec-drafter-3)
declare -A DECODE=(
  [fertility-nat]="--fertility-decoding argmax"
  [recover-sat-2]="--print-segments"
  [spec-drafter-3]="--spec-drafter-teacher $TEACHER --max-drafting-sentences 100000"
)
run_dir "$WORK" init_scope.sh bench/hyp.ar-teacher-greedy.txt "$TEACHER"
mkdir -p variants
PLAN=$(python -m nat_recipes.catalogue steps --preset "$PRESET" --work . --data-bin data-bin --teacher "$TEACHER" \
  --checkpoint-name "$STUDENT_CHECKPOINT")
SUMMARY=()
for STEP in "${STEPS[@]}"; do
  [ -n "${DECODE[$STEP]+set}" ] || { echo "init_scope.sh: no decoding options for step $STEP" >&2; exit 1; }
  LINE=$(awk -F'\t' -v step="$STEP" '$2 == step' <<< "$PLAN")
  [ -n "$LINE" ] || { echo "init_scope.sh: PRESET=$PRESET trains no step $STEP" >&2; exit 1; }
  IFS=$'\t' read -r -a FIELDS <<< "$LINE"
  RECIPE=$(basename "${FIELDS[2]}")
  ARGS=("${FIELDS[@]:3}")
  ARGS=("${ARGS[@]/#.\/ckpt\/$STEP/SAVE}")  # variant.sh saves into ckpt/NAME
  for NAME in "$STEP" "$STEP-scope-paper"; do
    EXTRA=()
    [ "$NAME" = "$STEP" ] || EXTRA=(--init-from-ar-scope paper)
    bash "$ROOT/dev/variant.sh" . "$NAME" "${DECODE[$STEP]}" "$RECIPE" "${ARGS[@]}" "${EXTRA[@]}" \
      | tee "variants/$NAME.summary"
  done
  PAIRED=$(sacrebleu raw/test.de -i "variants/$STEP.hyp" "variants/$STEP-scope-paper.hyp" --paired-bs 2> /dev/null \
    | python -c 'import json, sys; (a, p) = (s["BLEU"] for s in json.load(sys.stdin))
print("all %.2f, paper %.2f (paired bootstrap p = %.3f)" % (a["score"], p["score"], p["p_value"]))')
  SUMMARY+=("$STEP: $PAIRED")
done
printf '%s\n' "${SUMMARY[@]}"
