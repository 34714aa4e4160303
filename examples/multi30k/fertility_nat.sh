#!/usr/bin/env bash
# NAT with fertility (Gu et al. 2018) on Multi30k: fertilities from eflomal word alignments of the distilled
# training targets (made here when DATA_BIN/{train,valid}.fert.SRC are missing), a fertility_nat model
# initialised from the AR teacher (encoder, embeddings and the decoder sublayers the NAD shares with it), trained on
# the distilled targets with translation NLL + fertility NLL (fertility_nat_loss). With RKL_UPDATES=N (default 0)
# it is then fine-tuned N more updates with the paper's eq. 11 (examples/multi30k/fertility_nat_rkl.sh: reverse KL to
# the teacher + REINFORCE over sampled fertilities, λ = 0.25) into SAVE_DIR/rkl.
#   [PRESET=cpu|gpu] [RKL_UPDATES=N] bash examples/multi30k/fertility_nat.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
# Decode (argmax | average | npd; --beam 1, see examples/multi30k/README.md):
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_*.pt \
#     --beam 1 --fertility-decoding npd --npd-samples 10 --npd-teacher TEACHER_CKPT --print-step
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: fertility_nat.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}
shift 3
RKL_UPDATES=${RKL_UPDATES:-0}
if ! ls "$DATA_BIN"/train.fert.* "$DATA_BIN"/valid.fert.* >/dev/null 2>&1; then
  log "no fertility files in $DATA_BIN: aligning with eflomal (run_scripts/fertility.sh)"
  bash "$ROOT/run_scripts/fertility.sh" "$DATA_BIN"
fi
arch_args fertility_nat
student_args fertility-nat  # updates, learning rate, warm-up: nat_recipes/catalogue.py
"${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" --init-from-ar "$TEACHER" --use-distilled target \
  --criterion fertility_nat_loss --label-smoothing 0.1 --max-fertility 50 \
  --eval-bleu-args '{"beam": 1}' --save-dir "$SAVE_DIR" "$@"
if [ "$RKL_UPDATES" -gt 0 ]; then
  log "fine-tuning $RKL_UPDATES updates with nat_rkl_finetune into $SAVE_DIR/rkl"
  STUDENT_UPDATES=$RKL_UPDATES bash "$ROOT/examples/multi30k/fertility_nat_rkl.sh" "$DATA_BIN" "$TEACHER" \
    "$SAVE_DIR/rkl" "$SAVE_DIR/$STUDENT_CHECKPOINT" "$@"
fi
