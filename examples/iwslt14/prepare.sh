#!/usr/bin/env bash
# IWSLT14 de-en from the release you downloaded to binarized data, the way fairseq's
# examples/translation/prepare-iwslt14.sh splits it (train/valid from train.tags, valid = every 23rd pair; test =
# dev2010 + TEDX dev2012 + tst2010-2012; lowercased), segmented by a joint sentencepiece BPE model of 10k subwords.
#   bash examples/iwslt14/prepare.sh DE_EN_DIR OUT_DIR [options of nat_plugins.cli.prepare_data]
# DE_EN_DIR: the de-en/ directory extracted from de-en.tgz (the IWSLT 2014 evaluation campaign's TED data).
# OUT_DIR gets raw/ (the text scored against), spm.model, spm/ and data-bin/ (de -> en).
set -euo pipefail
usage="usage: prepare.sh DE_EN_DIR OUT_DIR [options]"
RELEASE=${1:?$usage}; OUT=${2:?$usage}
shift 2
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/prepare_data.sh" "$OUT" --corpus iwslt14 --raw-dir "$RELEASE" \
  -s de -t en --lowercase --vocab-size 10000 "$@"
