#!/usr/bin/env bash
# Encoder-NAD-AD (Zhou, Zhang & Zong 2020) on Multi30k: the AR Transformer's decoder layers also attend to the
# top states of a non-autoregressive decoder run once per sentence; the AD learns the real targets, the NAD the
# distilled ones (--use-distilled side), loss = L_AD + lambda * L_NAD (+ 0.1 * NAD length loss). Initialised from
# the AR teacher (encoder, embeddings, AD self/encoder attention, FFN, norms; the NAD layers' shared sublayers;
# the NAD-AD attention output at zero, so the AD starts as the teacher). The same-budget AR baseline (the teacher trained for the same number of updates with the same
# optimiser settings on the real targets) is examples/multi30k/ar_baseline.sh.
#   [PRESET=cpu|gpu] bash examples/multi30k/nad_ad.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
# Needs DATA_BIN/train.kd.TGT.{bin,idx} (run_scripts/distill.sh); when validation is on, the validation set is
# distilled here too (valid.kd.TGT: the NAD's validation loss is measured against it). Options: --nad-layers N,
# --nad-weight LAMBDA, --nad-input-copy fertility (needs {train,valid}.fert.SRC on the distilled targets).
# NAD_AD_INIT=scratch: the paper's protocol instead, both decoders and the encoder trained jointly from random weights
# with the teacher's own recipe (run_scripts/train_teacher.sh's updates, schedule, batches, seed; teacher_args in
# run_scripts/common.sh); TEACHER_CKPT then only distils the validation set if needed. Its AR twin is
# run_scripts/train_teacher.sh with the same --seed (dev/nad_ad_seeds.sh PROTOCOL=scratch trains and compares both).
# Decode (AD beam search, the NAD once per sentence; --print-nad-draft prints the NAD's own argmax output):
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_*.pt \
#     --beam 4 --max-len-a 1.2 --max-len-b 10 --print-nad-draft
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: nad_ad.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}
shift 3
case ${NAD_AD_INIT:-teacher} in
  teacher)
    student_args nad-ad  # the same budget as ar_baseline.sh (nat_recipes/catalogue.py)
    TRAINING=("${STUDENT_ARGS[@]}" --init-from-ar "$TEACHER") ;;
  scratch) teacher_args "$@"; TRAINING=("${TEACHER_ARGS[@]}") ;;
  *) echo "nad_ad.sh: NAD_AD_INIT must be 'teacher' or 'scratch' (got '$NAD_AD_INIT')" >&2; exit 2 ;;
esac
distilled_target_lang "$DATA_BIN"
if [[ " ${TRAINING[*]} $* " != *" --disable-validation "* ]] && [ ! -f "$DATA_BIN/valid.kd.$TGT.idx" ]; then
  log "distilling the validation set into $DATA_BIN/valid.kd.$TGT (the NAD's validation loss needs it)"
  bash "$ROOT/run_scripts/distill.sh" "$DATA_BIN" "$TEACHER" --gen-subset valid
fi
arch_args nad_ad_transformer
# on a GPU the NAD runs once per batch: its 4 length groups (the CPU's choice: fewer padded positions) quadruple its
# kernel launches, which is where a launch-bound GPU spends its time (an H200 trained it at 2.2x an AR student's time
# per update with 4 groups)
[ "$PRESET" = gpu ] && [ -z "${GPU_PRESET_ON_CPU:-}" ] && ARCH_ARGS+=(--nad-length-buckets 1)
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${TRAINING[@]}" --use-distilled side \
  --criterion nad_ad_loss --label-smoothing 0.1 --nad-weight 1.0 --length-loss-weight 0.1 \
  --eval-bleu-args '{"beam": 4, "max_len_a": 1.2, "max_len_b": 10}' --save-dir "$SAVE_DIR" "$@"
