#!/usr/bin/env bash
# Issue 64's check on a GPU machine (dev/gpu_check.py: does cuDNN's attention, which plans per shape, make the
# plugin's decoders and training slower; every row x batch size x NAT_ATTENTION_BACKENDS setting in its own process;
# ~5 minutes on an H200 after the install). The first call installs (../shared/gpu/README.md: wheels in .gpu_wheels,
# Multi30k in .data/multi30k), starts the check in the background (setsid: it outlives the call) and polls; a later
# call on the same machine only polls. Every call leaves in OUT what exists so far (the check rewrites its report
# after every job): gpu_check.md, gpu_check.json, gpu_check.log (the run's log) and gpu_check-logs.tar.gz (every
# job's log, the install's log).
#   bash dev/gpu_check.sh OUT [SECONDS]   # exit 0: finished; 3: still running after SECONDS (call again); 1: failed
# GPU_CHECK_ARGS: more options of dev/gpu_check.py (e.g. "--sentences 20 --budget-seconds 400"); GPU_CHECK_ON_CPU=1
# rehearses it on the CPU (no install, --cpu) with $PYTHON (default python3). WORK (default work/gpu-check) may lie
# outside the checkout (WORK=/tmp/natgpu/gpu-check), where a later call's copy of the tree cannot touch the run.
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUT [SECONDS]}; LIMIT=${2:-540}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export MULTI30K_DIR=${MULTI30K_DIR:-$ROOT/.data/multi30k} WORK=${WORK:-$ROOT/work/gpu-check}
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
LOG=$WORK.log; INSTALL_LOG=$WORK.install.log; REPORT=$WORK/report
mkdir -p "$OUT" "$WORK"
if [ ! -f "$LOG" ]; then  # the first call
  if [ -z "${GPU_CHECK_ON_CPU:-}" ]; then
    bash "$ROOT/.gpu_wheels/install.sh" "$ROOT/.gpu_wheels" > "$INSTALL_LOG" 2>&1 || {
      tail -n 30 "$INSTALL_LOG"; cp "$INSTALL_LOG" "$OUT/"; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$INSTALL_LOG" 2>&1
    echo "cores: $(nproc)" >> "$INSTALL_LOG"
    tail -n 4 "$INSTALL_LOG"
  fi
  read -r -a EXTRA <<< "${GPU_CHECK_ARGS:-}"
  [ -n "${GPU_CHECK_ON_CPU:-}" ] && EXTRA=(--cpu "${EXTRA[@]}")
  rm -f "$WORK/gpu_check.pid"
  (cd "$ROOT" && setsid nohup "$PYTHON" dev/gpu_check.py "$WORK" "$REPORT" "${EXTRA[@]}" > "$LOG" 2>&1 < /dev/null &)
  for _ in $(seq 1 60); do [ -f "$WORK/gpu_check.pid" ] && break; sleep 1; done
fi
running() { [ -f "$WORK/gpu_check.pid" ] && kill -0 "$(cat "$WORK/gpu_check.pid")" 2> /dev/null; }
collect() {  # what the run has so far, into OUT
  local f
  for f in "$REPORT/gpu_check.md" "$REPORT/gpu_check.json"; do [ -f "$f" ] && cp "$f" "$OUT/"; done
  cp "$LOG" "$OUT/gpu_check.log" 2> /dev/null
  (cd "$(dirname "$WORK")" && tar -czf "$OUT/gpu_check-logs.tar.gz.tmp" --ignore-failed-read \
    "$(basename "$WORK")/logs" $(ls "$(basename "$INSTALL_LOG")" 2> /dev/null) 2> /dev/null &&
    mv "$OUT/gpu_check-logs.tar.gz.tmp" "$OUT/gpu_check-logs.tar.gz")
}
CALL_END=$(( $(date +%s) + LIMIT ))
while running && [ "$(date +%s)" -lt "$CALL_END" ]; do collect; sleep 5; done
collect
STATE=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["state"])' "$REPORT/gpu_check.json" 2> /dev/null)
tail -n 5 "$LOG" 2> /dev/null
sed -n '/^## Verdict/,/^## Training/p' "$REPORT/gpu_check.md" 2> /dev/null | head -n 60
echo "gpu_check.sh: ${STATE:-no report} ($(ls "$OUT" | tr '\n' ' '))"
case $STATE in
  finished) exit 0 ;;
  running) running && exit 3; echo "gpu_check.sh: the check stopped without finishing (see gpu_check.log)"; exit 1 ;;
  *) exit 1 ;;
esac
