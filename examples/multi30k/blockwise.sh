#!/usr/bin/env bash
# Blockwise parallel decoding (Stern et al. 2018) on Multi30k: k heads on top of the AR teacher.
#   [PRESET=cpu|gpu] bash examples/multi30k/blockwise.sh DATA_BIN TEACHER_CKPT SAVE_DIR K MODE [fairseq-train args]
# MODE frozen:    the teacher stays as it is (--freeze-base) and head 1 is the teacher (--identity-first-head);
#                 heads 2..k learn from the real targets. Exact acceptance then outputs the teacher's greedy
#                 translation, only faster.
# MODE distilled: every parameter is fine-tuned on the distilled targets (--use-distilled target); head 1 still
#                 bypasses the new layer, so it starts as the teacher.
# The paper samples one head per batch (--head-sampling random). Decode with
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_*.pt \
#     --beam 1 --block-accept exact [--min-block-size M | --block-accept topk:M]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: blockwise.sh DATA_BIN TEACHER_CKPT SAVE_DIR K frozen|distilled [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}; K=${4:?$usage}; MODE=${5:?$usage}
shift 5
case $MODE in
  frozen) MODE_ARGS=(--freeze-base) ;;
  distilled) MODE_ARGS=(--use-distilled target) ;;
  *) echo "MODE must be 'frozen' or 'distilled' (got '$MODE'); $usage" >&2; exit 2 ;;
esac
arch_args blockwise_transformer
exec fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" --block-size "$K" --identity-first-head "${MODE_ARGS[@]}" \
  --init-from-ar "$TEACHER" --criterion blockwise_loss --head-sampling random --label-smoothing 0.1 \
  --eval-bleu-args '{"beam": 1}' --save-dir "$SAVE_DIR" "$@"
