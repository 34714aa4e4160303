#!/usr/bin/env bash
# How many sentences of a batch may still be decoding for drafts to pay off: the exact rows of a finished quickstart
# (speculative k=3 and fine-tuned blockwise k=4, --int8-drafts) at every --max-drafting-sentences of LIMITS, timed by
# nat-benchmark at every batch size of BATCH_SIZES, round-robin with the teacher's rows (the benchmark's protocol).
# --max-drafting-sentences 0 is the teacher's greedy search in the plugin's decoder loop, no drafts.
#   bash dev/drafting_limit.sh [WORK] [OUT]
# (defaults: work/multi30k-cpu, WORK/drafting-limit). LIMITS (default "100000 16 8 4 2 1 0"), BATCH_SIZES (default
# 1,2,4,8,16,32,64; --batch-size BATCH_SIZE, default 64, is always timed) and LATENCY_SENTENCES (default 110, 10 of
# them warm-up) override. Writes OUT/results.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../run_scripts/common.sh"
WORK=$(cd "${1:-$ROOT/work/multi30k-cpu}" && pwd)
OUT=${2:-$WORK/drafting-limit}
TEACHER=ckpt/teacher/checkpoint_best.pt
# the quickstart's exact rows (their checkpoints and arguments from the catalogue), at every limit
mapfile -t ROWS < <(python - "$TEACHER" ${LIMITS:-100000 16 8 4 2 1 0} <<'PY'
import dataclasses
import sys

from nat_recipes import catalogue

run = catalogue.Run(".", "data-bin", sys.argv[1], "checkpoint_last.pt")
for limit in sys.argv[2:]:
    for row in catalogue.rows("cpu", ["spec-drafter", "blockwise"]):
        if row.name in ("Speculative k=3, exact", "Blockwise k=4 fine-tuned, exact"):
            spec = row.spec(run, catalogue.PRESETS["cpu"])
            limited = dataclasses.replace(
                spec, name=f"{row.name}, limit {limit}", args=spec.args + ["--max-drafting-sentences", limit]
            )
            print("--system")
            print(limited.option())
PY
)
cd "$WORK"
# the quickstart's benchmark sets OMP_WAIT_POLICY=ACTIVE (with --ctranslate2); so does this run
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE} nat-benchmark data-bin --teacher "$TEACHER" --reference raw/test.de \
  --out-dir "$OUT" --work-dir . --cpu --threads 2 --no-plots --generate-args "--max-len-a 1.2 --max-len-b 10" \
  --latency-sentences "${LATENCY_SENTENCES:-110}" --warmup 10 --batch-sizes "${BATCH_SIZES:-1,2,4,8,16,32,64}" \
  --batch-size "${BATCH_SIZE:-64}" "${ROWS[@]}"
log "$OUT/results.md"
