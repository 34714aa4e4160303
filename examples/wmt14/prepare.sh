#!/usr/bin/env bash
# WMT14 en-de from the archives you downloaded to binarized data: train = Europarl v7 + Common Crawl + News
# Commentary (cleaned as fairseq's examples/translation/prepare-wmt14en2de.sh cleans it), valid = newstest2013,
# test = newstest2014 (3,003 sentences), segmented by a joint sentencepiece BPE model of 40k subwords learnt on a
# sample of 2M training sentences.
#   bash examples/wmt14/prepare.sh WMT14_DIR OUT_DIR [options of nat_plugins.cli.prepare_data]
# WMT14_DIR: where training-parallel-europarl-v7.tgz, training-parallel-commoncrawl.tgz,
# training-parallel-nc-v9.tgz, dev.tgz and test-full.tgz were extracted. OUT_DIR gets raw/, spm.model, spm/ and
# data-bin/ (en -> de).
set -euo pipefail
usage="usage: prepare.sh WMT14_DIR OUT_DIR [options]"
RELEASE=${1:?$usage}; OUT=${2:?$usage}
shift 2
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/prepare_data.sh" "$OUT" --corpus wmt14 --raw-dir "$RELEASE" \
  -s en -t de --vocab-size 40000 --spm-sample 2000000 --workers "${WORKERS:-8}" "$@"
