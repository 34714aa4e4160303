#!/usr/bin/env bash
# The fertility NAT exported to ONNX for ONNX Runtime on the CPU (nat-export-onnx): SAVE_DIR/float32 and SAVE_DIR/int8
# (int8 weights), each two graphs and a manifest.json naming the checkpoint, and a link to the checkpoint beside them
# (the quickstart's "NAT, argmax fertility (ONNX Runtime[ int8])" rows decode it with --onnx-model SAVE_DIR/...).
#   bash examples/multi30k/fertility_nat_onnx.sh CHECKPOINT SAVE_DIR
# Decode (the checkpoint loaded by fairseq as usual, its pass run by ONNX Runtime; argmax or average fertilities):
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path CHECKPOINT --cpu --beam 1 \
#     --fertility-decoding argmax --onnx-model SAVE_DIR/float32
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: fertility_nat_onnx.sh CHECKPOINT SAVE_DIR"
CHECKPOINT=${1:?$usage}; SAVE_DIR=${2:?$usage}
mkdir -p "$SAVE_DIR"
python -m nat_plugins.cli.export_onnx "$CHECKPOINT" "$SAVE_DIR/float32"
python -m nat_plugins.cli.export_onnx "$CHECKPOINT" "$SAVE_DIR/int8" --int8
ln -sfn "$(realpath --relative-to="$SAVE_DIR" "$CHECKPOINT")" "$SAVE_DIR/$(basename "$CHECKPOINT")"
log "exported $CHECKPOINT to $SAVE_DIR/float32 and $SAVE_DIR/int8 (decode with --onnx-model DIR)"
