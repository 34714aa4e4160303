#!/usr/bin/env bash
# Semi-Autoregressive Transformer (Wang et al. 2018) on Multi30k: K tokens per decoder call, trained on the
# distilled targets and initialised from the AR teacher (encoder, embeddings and decoder: same sizes), with two
# options beyond the paper against the stutter of a group's positions ("Zwei Zwei Männer Männer"):
# --group-slot-embedding and --group-repeat-bias (nat_plugins/systems/sat/model.py, docs/design-notes.md).
# The paper's model: pass --no-slot-options as the first fairseq-train argument.
#   [PRESET=cpu|gpu] bash examples/multi30k/sat.sh DATA_BIN TEACHER_CKPT SAVE_DIR K [fairseq-train args]
# --init-from-ar-scope paper warm-starts only what the paper initialises (encoder, embeddings, output projection).
# Decode with group decoding (greedy: --beam 1; beam search: --beam 4):
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_*.pt \
#     --beam 4 --print-step
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: sat.sh DATA_BIN TEACHER_CKPT SAVE_DIR K [--no-slot-options] [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}; K=${4:?$usage}
shift 4
SLOT_ARGS=(--group-slot-embedding --group-repeat-bias)
if [ "${1:-}" = --no-slot-options ]; then SLOT_ARGS=(); shift; fi
arch_args sat_transformer
student_args sat  # updates, learning rate, warm-up: nat_recipes/catalogue.py
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" --group-size "$K" "${SLOT_ARGS[@]}" --init-from-ar "$TEACHER" --use-distilled target \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --eval-bleu-args '{"beam": 4}' \
  --save-dir "$SAVE_DIR" "$@"
