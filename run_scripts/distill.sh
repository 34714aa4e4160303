#!/usr/bin/env bash
# Sequence-level distillation: the teacher's beam-search translations of the training set (DISTILL_BEAM, default
# 4: beam outputs repeat and drop fewer words than greedy ones, and students learn their mistakes), binarized next to the
# data (DATA_BIN/train.kd.TGT.{txt,bin,idx}) for --use-distilled target|side. Shard with
# --num-shards N --shard-id I --no-merge on N machines, then run once more with --merge-only.
#   [PRESET=cpu|gpu] bash run_scripts/distill.sh DATA_BIN TEACHER_CKPT [extra options of nat_plugins.cli.distill]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DATA_BIN=${1:?usage: distill.sh DATA_BIN TEACHER_CKPT [options]}
TEACHER=${2:?usage: distill.sh DATA_BIN TEACHER_CKPT [options]}
shift 2
# tokens a batch: 32k on the GPU (29k sentences in 40 s on an H200), 8k on the CPU
[ "$PRESET" = gpu ] && [ -z "${GPU_PRESET_ON_CPU:-}" ] && DEFAULT_TOKENS=32000 || DEFAULT_TOKENS=8000
exec python -m nat_plugins.cli.distill "$DATA_BIN" --path "$TEACHER" --user-dir "$USER_DIR" "${DEVICE_ARGS[@]}" \
  --gen-subset train --beam "${DISTILL_BEAM:-4}" --max-tokens "${DISTILL_MAX_TOKENS:-$DEFAULT_TOKENS}" --max-len-a 1.2 --max-len-b 10 "$@"
