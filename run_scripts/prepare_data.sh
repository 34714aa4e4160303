#!/usr/bin/env bash
# Raw parallel text -> joint sentencepiece (8k) -> fairseq data-bin (joined dictionary).
#   bash run_scripts/prepare_data.sh OUT_DIR [--raw-dir DIR] [-s en -t de] [--vocab-size 8000] ...
# Raw files: --raw-dir DIR with {train,valid,test}.{src,tgt}, else the directory in $MULTI30K_DIR, else the public
# Multi30k task-1 files downloaded into OUT_DIR/download (needs network access). --corpus iwslt14|wmt14 --raw-dir DIR
# reads those releases as downloaded (examples/iwslt14, examples/wmt14).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT=${1:?usage: prepare_data.sh OUT_DIR [options of python -m nat_plugins.cli.prepare_data]}
shift
exec python -m nat_plugins.cli.prepare_data --out-dir "$OUT" "$@"
