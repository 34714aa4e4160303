#!/usr/bin/env bash
# Fertility supervision for fertility_nat (Gu et al. 2018): word-align the source/target subwords of a data-bin
# with eflomal (forward links, target -> source) and write DATA_BIN/{train,valid,test}.fert.SRC (train from the
# distilled DATA_BIN/train.kd.TGT when it exists, so run run_scripts/distill.sh first). eflomal is GPLv3 and
# optional: run_scripts/setup_env.sh installs it by default (NAT_SETUP_EXTRAS=eflomal).
#   bash run_scripts/fertility.sh DATA_BIN [options of nat_plugins.cli.fertility]
# e.g. --max-fertility 50 (the model's L), --aligner links --links-dir DIR (your own Pharaoh links, or those
#      --save-links DIR kept: eflomal is not deterministic, the saved links reproduce its fertilities),
#      --aligner monotone (uniform spread: a fallback without an aligner, not an alignment)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DATA_BIN=${1:?usage: fertility.sh DATA_BIN [options of nat_plugins.cli.fertility]}
shift
exec python -m nat_plugins.cli.fertility "$DATA_BIN" "$@"
