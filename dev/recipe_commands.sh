#!/usr/bin/env bash
# Every student step's fairseq-train command line, for every preset, without training anything (fairseq-train replaced
# by echo, on a throw-away work folder of empty placeholder files): diff two runs of it to show that a change to the
# catalogue (nat_recipes/catalogue.py) or the recipes (examples/multi30k/*.sh, run_scripts/common.sh) keeps the
# commands, byte for byte.
#   bash dev/recipe_commands.sh OUT [REPO]      # REPO: the checkout to read (default: this one)
# Environment that changes the commands (STUDENT_UPDATES, TEACHER_SHAPE, STUDENT_VALIDATE) passes through.
set -euo pipefail
OUT=${1:?usage: dev/recipe_commands.sh OUT [REPO]}
REPO=$(cd "${2:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
source "$REPO/.venv/bin/activate"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
for preset in cpu cpu-long gpu; do
  W=$SCRATCH/$preset B=$SCRATCH/$preset/data-bin
  mkdir -p "$B" "$W/ckpt/teacher"
  for f in dict.en.txt dict.de.txt train.en-de.en.idx train.en-de.de.idx train.en-de.en.bin train.en-de.de.bin \
    valid.en-de.en.idx test.en-de.en.idx train.kd.de.idx train.kd.de.bin train.kd_greedy.de.idx train.fert.en \
    valid.fert.en; do touch "$B/$f"; done  # what the recipes look for before they train (else they would make it)
  touch "$W/ckpt/teacher/checkpoint_best.pt"
  (cd "$REPO" && python -m nat_recipes.catalogue steps --preset "$preset" --work "$W" --data-bin "$B" \
    --teacher "$W/ckpt/teacher/checkpoint_best.pt" --checkpoint-name checkpoint_last.pt) |
  while IFS=$'\t' read -r -a fields; do
    case ${fields[2]} in examples/*) ;; *) continue ;; esac  # fairseq-train recipes only (not the ONNX export)
    grep -q fairseq-train "$REPO/${fields[2]}" || continue
    mkdir -p "$W/ckpt/${fields[1]}" && touch "$W/ckpt/${fields[1]}/checkpoint_last.pt"
    echo "## $preset ${fields[1]}"
    (cd "$REPO" && PRESET=$preset GPU_PRESET_ON_CPU=1 FAIRSEQ_TRAIN=echo bash "${fields[2]}" "${fields[@]:3}" \
      < /dev/null 2>&1 | tail -n 1 | sed "s#$SCRATCH#SCRATCH#g; s#$REPO#REPO#g")
  done
done > "$OUT"
echo "$(grep -c '^## ' "$OUT") commands in $OUT"
