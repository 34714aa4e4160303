#!/usr/bin/env bash
# fairseq's own non-autoregressive models, for comparison with the plugin's systems at the same number of updates:
# the vanilla NAT (nonautoregressive_transformer, --noise full_mask) or the Mask-Predict CMLM (cmlm_transformer,
# --noise random_mask), trained with fairseq's translation_lev task and nat_loss on the distilled targets, from
# scratch (fairseq has no option to start them from an AR checkpoint, unlike the plugin's students).
#   [PRESET=cpu|cpu-long|gpu] bash examples/multi30k/fairseq_nat.sh DATA_BIN SAVE_DIR nat|cmlm [fairseq-train args]
# translation_lev reads the training pair by its usual file names, so the distilled targets are linked into
# DATA_BIN/kd-pair (train.SRC-TGT.TGT -> train.kd.TGT). Decode with fairseq's IterativeRefinementGenerator:
#   fairseq-generate DATA_BIN --task translation_lev --path SAVE_DIR/checkpoint_last.pt --iter-decode-max-iter 0  # NAT
#   fairseq-generate DATA_BIN --task translation_lev --path SAVE_DIR/checkpoint_last.pt --iter-decode-max-iter 9  # CMLM
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: fairseq_nat.sh DATA_BIN SAVE_DIR nat|cmlm [fairseq-train args]"
DATA_BIN=${1:?$usage}; SAVE_DIR=${2:?$usage}; MODEL=${3:?$usage}
shift 3
case $MODEL in
  nat) BASE_ARCH=nonautoregressive_transformer; MODEL_ARGS=(--noise full_mask --src-embedding-copy) ;;
  cmlm) BASE_ARCH=cmlm_transformer; MODEL_ARGS=(--noise random_mask) ;;
  *) echo "fairseq_nat.sh: MODEL must be 'nat' or 'cmlm' (got '$MODEL'); $usage" >&2; exit 2 ;;
esac
distilled_target_lang "$DATA_BIN"
PAIR=$(basename "$(find "$DATA_BIN" -maxdepth 1 -name "train.*-*.$TGT.idx" | head -n 1)" ".$TGT.idx")  # train.SRC-TGT
KD_BIN=$DATA_BIN/kd-pair
mkdir -p "$KD_BIN"
for f in "$DATA_BIN"/dict.*.txt "$DATA_BIN"/valid.* "$DATA_BIN"/test.* "$DATA_BIN/$PAIR".*; do
  ln -sfn "$(realpath "$f")" "$KD_BIN/$(basename "$f")"
done
for ext in bin idx; do ln -sfn "$(realpath "$DATA_BIN/train.kd.$TGT.$ext")" "$KD_BIN/$PAIR.$TGT.$ext"; done
if [ "$PRESET" = gpu ] && [ -z "${TEACHER_SHAPE:-}" ]; then
  # transformer_iwslt_de_en's sizes (fairseq registers no *_iwslt_de_en NAT architecture)
  ARCH_ARGS=(--arch "$BASE_ARCH" --encoder-layers 6 --decoder-layers 6 --encoder-embed-dim 512 --decoder-embed-dim 512
    --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4
    --share-all-embeddings)
else
  arch_args "$BASE_ARCH"
fi
student_args "fairseq-$MODEL"
exec "${FAIRSEQ_TRAIN[@]}" "$KD_BIN" --task translation_lev "${DEVICE_ARGS[@]}" "${ARCH_ARGS[@]}" "${STUDENT_ARGS[@]}" \
  "${MODEL_ARGS[@]}" --criterion nat_loss --label-smoothing 0.1 --length-loss-factor 0.1 --pred-length-offset \
  --apply-bert-init --save-dir "$SAVE_DIR" "$@"
