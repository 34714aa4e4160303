#!/usr/bin/env bash
# Decode a test set with the AR teacher (fairseq's SequenceGenerator, beam and greedy) and plugin systems;
# writes results.md/.json, hyp files, pareto.png (BLEU % of the teacher vs speedup) and by_length.png. All arguments go to
# `python -m nat_plugins.bench.benchmark` (see --help), e.g.
#   bash run_scripts/benchmark.sh DATA_BIN --teacher ckpt/ar.pt --reference raw/test.de --out-dir bench \
#     --system 'SAT K=2, greedy=ckpt/sat2.pt::--beam 1'
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
exec python -m nat_plugins.bench.benchmark "$@"
