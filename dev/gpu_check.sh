#!/usr/bin/env bash
# One call on a GPU machine (../shared/gpu/README.md: wheels in .gpu_wheels, Multi30k in .data/multi30k): install,
# the CUDA-only tests beside the GPU preset's whole pipeline at smoke size (its stage times and whether every step
# runs on CUDA in fp16), then its logs and whatever report it reached into OUT. The quickstart gets SECONDS
# (default 480) in all; a step it did not reach shows in steps.tsv by its absence.
#   bash dev/gpu_check.sh OUT [SECONDS]
# Smoke size (override any): TEACHER_UPDATES=600 STUDENT_UPDATES=300 MAX_LINES=10000 LATENCY_SENTENCES=100.
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUT [SECONDS]}; LIMIT=${2:-480}
mkdir -p "$OUT"
bash .gpu_wheels/install.sh .gpu_wheels > "$OUT/install.log" 2>&1 || { tail -n 30 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/install.log"
nproc >> "$OUT/install.log"
tail -n 6 "$OUT/install.log"
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
# the CUDA-only cases (skipped on the CI machine), on the GPU beside the pipeline's first, CPU-bound steps
( timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_half_precision.py -k cuda \
    > "$OUT/pytest-gpu.log" 2>&1; echo "pytest exit $?" >> "$OUT/pytest-gpu.log" ) &
TESTS=$!
export PRESET=gpu NAT_VENV=system MULTI30K_DIR=$PWD/.data/multi30k WORK=$PWD/work/multi30k-gpu-smoke
export TEACHER_UPDATES=${TEACHER_UPDATES:-600} STUDENT_UPDATES=${STUDENT_UPDATES:-300} MAX_LINES=${MAX_LINES:-10000}
export LATENCY_SENTENCES=${LATENCY_SENTENCES:-100}
started=$(date +%s)
timeout "$LIMIT" bash run_scripts/quickstart.sh > "$OUT/quickstart.log" 2>&1
echo "quickstart exit $? after $(( $(date +%s) - started )) s"
wait "$TESTS"
tail -n 15 "$OUT/pytest-gpu.log"
grep "^\[" "$OUT/quickstart.log" | tail -n 30
cat "$WORK/logs/steps.tsv" 2>/dev/null
cp "$WORK/report.md" "$OUT/" 2>/dev/null
tar -czf "$OUT/work.tar.gz" -C "$WORK" logs $(cd "$WORK" && ls -d bench 2>/dev/null) 2>/dev/null
ls -la "$OUT"
