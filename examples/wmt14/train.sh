#!/usr/bin/env bash
# WMT14 en-de: the teacher and every system at the Transformer base size (transformer_wmt_en_de: 6 layers, 512-d,
# 8 heads, FFN 2048), fp16, ~32k target tokens an update (4096 tokens x UPDATE_FREQ, default 8, x GPUs: with 8 GPUs
# set UPDATE_FREQ=1). Commands and the papers' numbers: examples/wmt14/README.md.
#   bash examples/wmt14/train.sh teacher DATA_BIN SAVE_DIR [fairseq-train args]
#   bash examples/wmt14/train.sh sat|recover_sat DATA_BIN TEACHER_CKPT SAVE_DIR K [fairseq-train args]
#   bash examples/wmt14/train.sh blockwise DATA_BIN INIT_CKPT SAVE_DIR K frozen|finetuned [fairseq-train args]
#   bash examples/wmt14/train.sh fertility_nat|nad_ad|ar_baseline DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
set -euo pipefail
SUFFIX=wmt_en_de
UPDATE_FREQ=${UPDATE_FREQ:-8}
# the Transformer base schedule (Vaswani et al. 2017: 100k updates, warm-up 4000) at fairseq's learning rate
TEACHER_ARGS=(--max-tokens 4096 --update-freq "$UPDATE_FREQ" --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000
  --dropout 0.1 --max-update "${TEACHER_UPDATES:-100000}" --validate-interval-updates 5000 --save-interval-updates 5000)
# every student 100k updates (blockwise's heads: the paper's 100k on top of the base model)
STUDENT_UPDATES=${STUDENT_UPDATES:-100000}
STUDENT_DROPOUT=0.1
STUDENT_ARGS=(--max-tokens 4096 --update-freq "$UPDATE_FREQ" --warmup-updates 4000 --validate-interval-updates 5000
  --save-interval-updates 5000)
source "$(dirname "${BASH_SOURCE[0]}")/../benchmark_recipe.sh"
