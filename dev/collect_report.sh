#!/usr/bin/env bash
# Gather a finished run's report into OUT_DIR as a few small files (what a remote machine can send back): the run's
# report.md, the benchmark's markdown, JSON and plots as they are, the hypotheses and the logs as one archive each.
#   bash dev/collect_report.sh WORK OUT_DIR
set -euo pipefail
WORK=${1:?usage: collect_report.sh WORK OUT_DIR}; OUT_DIR=${2:?usage: collect_report.sh WORK OUT_DIR}
[ -f "$WORK/bench/results.md" ] || { echo "collect_report.sh: no $WORK/bench/results.md: the benchmark has not run" >&2; exit 1; }
mkdir -p "$OUT_DIR"
cp "$WORK"/report.md "$WORK"/bench/*.md "$WORK"/bench/*.json "$WORK"/bench/*.png "$OUT_DIR"/
tar -czf "$OUT_DIR/hypotheses.tar.gz" -C "$WORK/bench" $(cd "$WORK/bench" && ls hyp.*.txt)
tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs
ls -la "$OUT_DIR"
