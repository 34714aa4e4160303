#!/usr/bin/env bash
# Fine-tuning a trained fertility_nat towards its AR teacher (Gu et al. 2018 §4.2, eq. 11; the paper's NAT+FT rows):
# reverse KL to the teacher + REINFORCE over sampled fertilities + the aligner fertilities' term, mixed with the
# distillation loss by λ = 0.25 (nat_rkl_finetune), from NAT_CKPT into SAVE_DIR, on the distilled targets. The sampled
# fertilities' reward is L_RKL per output position (--rkl-reward mean, beyond the paper): summed, as eq. 10 writes it,
# it rewarded shorter outputs (on the quickstart's NAT: 8.4 -> 6.6 words a sentence, BLEU 22.98 -> 19.01; per position
# 8.7 words, BLEU 24.41; docs/results.md).
#   [PRESET=cpu|gpu] bash examples/multi30k/fertility_nat_rkl.sh DATA_BIN TEACHER_CKPT SAVE_DIR NAT_CKPT [fairseq-train args]
# Its updates, learning rate and warm-up are the catalogue's (fertility-nat-rkl); decode as the NAT
# (examples/multi30k/fertility_nat.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: fertility_nat_rkl.sh DATA_BIN TEACHER_CKPT SAVE_DIR NAT_CKPT [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}; NAT_CKPT=${4:?$usage}
shift 4
arch_args fertility_nat
student_args fertility-nat-rkl  # updates, learning rate, warm-up: nat_recipes/catalogue.py
# fairseq's --finetune-from-model: the NAT's weights with a fresh optimizer and schedule on the first launch; a
# re-run resumes from SAVE_DIR's own last checkpoint
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" --use-distilled target --max-fertility 50 \
  --criterion nat_rkl_finetune --teacher-path "$TEACHER" --rkl-weight 0.25 --rkl-reward mean --label-smoothing 0.1 \
  --finetune-from-model "$NAT_CKPT" --eval-bleu-args '{"beam": 1}' --save-dir "$SAVE_DIR" "$@"
