#!/usr/bin/env bash
# The AR Transformer teacher, trained with plain fairseq (task translation_nat = translation + side files),
# checkpoints selected by validation BLEU (--eval-bleu; PRESET=cpu: by validation loss). Re-running resumes from checkpoint_last.pt.
#   [PRESET=cpu|gpu] bash run_scripts/train_teacher.sh DATA_BIN SAVE_DIR [extra fairseq-train args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DATA_BIN=${1:?usage: train_teacher.sh DATA_BIN SAVE_DIR [fairseq-train args]}
SAVE_DIR=${2:?usage: train_teacher.sh DATA_BIN SAVE_DIR [fairseq-train args]}
shift 2
arch_args transformer
teacher_args "$@"
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${TEACHER_ARGS[@]}" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --save-dir "$SAVE_DIR" "$@"
