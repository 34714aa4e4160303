#!/usr/bin/env bash
# Blockwise parallel decoding (Stern et al. 2018) on Multi30k: k heads on top of the AR teacher, trained in the
# paper's two stages (§6), both on the teacher's distilled outputs (--use-distilled target): the heads must predict
# what the teacher itself will emit, because exact acceptance compares them with the teacher's greedy choices.
#   [PRESET=cpu|gpu] bash examples/multi30k/blockwise.sh DATA_BIN INIT_CKPT SAVE_DIR K MODE [fairseq-train args]
# MODE frozen:    INIT_CKPT is the AR teacher; the teacher stays as it is (--freeze-base) and head 1 is the teacher
#                 (--identity-first-head): only heads 2..k learn (the mean of their losses, cheap with a frozen
#                 trunk; no dropout, so they learn from the states the teacher has at decoding time). Exact
#                 acceptance then outputs the teacher's greedy translation, only faster.
# MODE finetuned: INIT_CKPT is a frozen-stage checkpoint (SAVE_DIR of MODE frozen); every parameter is fine-tuned at
#                 a low learning rate with head 1's loss in every update and one of heads 2..k drawn per update,
#                 weighted 0.1 (--head-sampling first-plus-random --other-heads-weight 0.1), so the output stays close
#                 to the teacher's while heads 2..k agree with it more often. Two output projections per update
#                 instead of k: 0.69 of the teacher's updates/s where all heads (mean) train at 0.44, for the same
#                 BLEU (docs/design-notes.md). (One random head per update, the paper's recipe, collapses: head 1
#                 decides the output but is trained on 1/k of the updates; nat_plugins/systems/blockwise/loss.py has
#                 the measurements.)
# Decode with
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_*.pt \
#     --beam 1 --block-accept exact [--min-block-size M | --block-accept topk:M] [--int8-drafts (CPU)]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: blockwise.sh DATA_BIN INIT_CKPT SAVE_DIR K frozen|finetuned [fairseq-train args]"
DATA_BIN=${1:?$usage}; INIT=${2:?$usage}; SAVE_DIR=${3:?$usage}; K=${4:?$usage}; MODE=${5:?$usage}
shift 5
[ -f "$INIT" ] || { echo "blockwise.sh: checkpoint $INIT does not exist" >&2; exit 1; }
case $MODE in
  frozen)
    student_args blockwise-frozen  # updates, learning rate, warm-up: nat_recipes/catalogue.py
    MODE_ARGS=(--freeze-base --init-from-ar "$INIT" --head-sampling mean --dropout 0) ;;
  finetuned)
    student_args blockwise-finetuned
    MODE_ARGS=(--finetune-from-model "$INIT" --head-sampling first-plus-random --other-heads-weight 0.1) ;;
  *) echo "MODE must be 'frozen' or 'finetuned' (got '$MODE'); $usage" >&2; exit 2 ;;
esac
arch_args blockwise_transformer
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" --block-size "$K" --identity-first-head --use-distilled target \
  "${MODE_ARGS[@]}" --criterion blockwise_loss --label-smoothing 0.1 \
  --eval-bleu-args '{"beam": 1}' --save-dir "$SAVE_DIR" "$@"
