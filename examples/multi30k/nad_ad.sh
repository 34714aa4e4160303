#!/usr/bin/env bash
# Encoder-NAD-AD (Zhou, Zhang & Zong 2020) on Multi30k: the AR Transformer's decoder layers also attend to the
# top states of a non-autoregressive decoder run once per sentence; the AD learns the real targets, the NAD the
# distilled ones (--use-distilled side), loss = L_AD + lambda * L_NAD (+ 0.1 * NAD length loss).
#   [PRESET=cpu|cpu-long|gpu] [NAD_AD_INIT=scratch|teacher] bash examples/multi30k/nad_ad.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
# NAD_AD_INIT=scratch (the default; the paper's protocol and the quickstart's): both decoders and the encoder trained
# jointly from random weights with the teacher's own recipe (run_scripts/train_teacher.sh's updates, schedule,
# batches, validation, checkpoint selection, seed; teacher_args in run_scripts/common.sh), so that the teacher trained
# with the same --seed is its AR twin; TEACHER_CKPT only distils the validation set when it is missing.
# NAD_AD_INIT=teacher: fine-tuned from the AR teacher for a student's budget (--init-from-ar: encoder, embeddings,
# AD self/encoder attention, FFN, norms; the NAD layers' shared sublayers; the NAD-AD attention output at zero, so the
# AD starts as the teacher), against examples/multi30k/ar_baseline.sh (the teacher trained as many more updates).
# Over 3 seeds it gained nothing (docs/design-notes.md), so no preset trains it; dev/nad_ad_seeds.sh compares either.
# Needs DATA_BIN/train.kd.TGT.{bin,idx} (run_scripts/distill.sh); when validation is on, the validation set is
# distilled here too (valid.kd.TGT: the NAD's validation loss is measured against it). Options: --nad-layers N,
# --nad-weight LAMBDA, --nad-input-copy fertility (needs {train,valid}.fert.SRC on the distilled targets).
# Decode (AD beam search, the NAD once per sentence; --print-nad-draft prints the NAD's own argmax output):
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_best.pt \
#     --beam 4 --max-len-a 1.2 --max-len-b 10 --print-nad-draft
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: nad_ad.sh DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}
shift 3
case ${NAD_AD_INIT:-scratch} in
  scratch) teacher_args "$@"; TRAINING=("${TEACHER_ARGS[@]}") ;;
  teacher)
    student_args nad-ad  # the same budget as ar_baseline.sh (nat_recipes/catalogue.py)
    TRAINING=("${STUDENT_ARGS[@]}" --init-from-ar "$TEACHER") ;;
  *) echo "nad_ad.sh: NAD_AD_INIT must be 'scratch' or 'teacher' (got '$NAD_AD_INIT')" >&2; exit 2 ;;
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
