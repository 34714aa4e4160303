#!/usr/bin/env bash
# IWSLT14 de-en: the teacher and every system at the transformer_iwslt_de_en size (6 layers, 512-d, 4 heads,
# FFN 1024) on one GPU, fp16. Commands and the papers' numbers: examples/iwslt14/README.md.
#   bash examples/iwslt14/train.sh teacher DATA_BIN SAVE_DIR [fairseq-train args]
#   bash examples/iwslt14/train.sh sat|recover_sat DATA_BIN TEACHER_CKPT SAVE_DIR K [fairseq-train args]
#   bash examples/iwslt14/train.sh blockwise DATA_BIN INIT_CKPT SAVE_DIR K frozen|finetuned [fairseq-train args]
#   bash examples/iwslt14/train.sh fertility_nat|nad_ad|ar_baseline DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
set -euo pipefail
SUFFIX=iwslt_de_en
# fairseq's IWSLT14 de-en Transformer recipe: 4k tokens a batch, Adam, inverse square root schedule
TEACHER_ARGS=(--max-tokens 4096 --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3
  --max-update "${TEACHER_UPDATES:-50000}" --validate-interval-updates 2000 --save-interval-updates 2000)
STUDENT_UPDATES=${STUDENT_UPDATES:-50000}
STUDENT_DROPOUT=0.3
STUDENT_ARGS=(--max-tokens 4096 --warmup-updates 4000 --validate-interval-updates 2000 --save-interval-updates 2000)
source "$(dirname "${BASH_SOURCE[0]}")/../benchmark_recipe.sh"
