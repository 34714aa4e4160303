#!/usr/bin/env bash
# The same-budget AR baseline of Encoder-NAD-AD fine-tuned from the teacher (NAD_AD_INIT=teacher nad_ad.sh; the
# paper's own protocol, nad_ad.sh's default, trains it from scratch and its baseline is the teacher): the teacher
# itself, trained for the same number of updates (STUDENT_UPDATES) with the same optimiser settings as the students
# (STUDENT_ARGS: fresh Adam, lr schedule and warm-up) on the real targets.
# It starts from the teacher's weights (--finetune-from-model: ignored once SAVE_DIR has a checkpoint, so re-runs
# resume) and is a plain fairseq Transformer, decoded by fairseq's SequenceGenerator.
#   [PRESET=cpu|gpu] bash examples/multi30k/ar_baseline.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: ar_baseline.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}
shift 3
[ -f "$TEACHER" ] || { echo "ar_baseline.sh: teacher checkpoint $TEACHER does not exist" >&2; exit 1; }
arch_args transformer
student_args ar-baseline  # the same budget as nad_ad.sh (nat_recipes/catalogue.py)
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" --finetune-from-model "$TEACHER" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --eval-bleu-args '{"beam": 4, "max_len_a": 1.2, "max_len_b": 10}' --save-dir "$SAVE_DIR" "$@"
