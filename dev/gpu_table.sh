#!/usr/bin/env bash
# The GPU table (PRESET=gpu, ~13 minutes on one H100/H200) on a machine whose commands may last 10 minutes each and
# send back at most 8 small files. The first call installs (../shared/gpu/README.md: wheels in .gpu_wheels, Multi30k
# in .data/multi30k), starts the CUDA-only tests and the quickstart in the background (setsid: they outlive the call)
# and polls; a later call on the same machine only polls. Every call leaves in OUT what exists so far: report.md,
# results.md and results.json once the run finished, and run.tar.gz (the run's folder without its checkpoints and data:
# logs, report, results, plots, hypotheses; the tests' log): `tar -xzf run.tar.gz && python dev/results_section.py
# multi30k-gpu --preset gpu` puts it into docs/results.md.
#   bash dev/gpu_table.sh OUT [SECONDS]   # exit 0: finished; 3: still running after SECONDS (call again); 1: failed
# Smoke sizes (TEACHER_UPDATES, STUDENT_UPDATES, MAX_LINES, LATENCY_SENTENCES) pass through; GPU_PRESET_ON_CPU=1
# rehearses the whole script on the CPU, with the python3 on the PATH (no install, no CUDA tests). WORK may lie
# outside the checkout (WORK=/tmp/natgpu/multi30k-gpu), where a later call's copy of the tree cannot touch the run.
# The benchmark rewrites bench/progress.json after every timing round: each call returns it. Where the rows' time
# goes on that machine: once the table is done the script runs dev/gpu_profile.py (cold and warm batch-1 passes, one
# without CUDA graphs, a profile per row; PROFILE_SECONDS, default 100) and returns gpu_profile.txt.
# Issue 64's question alone (does cuDNN's attention, which plans per shape, slow the decoders and training): `bash
# dev/gpu_check.sh OUT` after the same install, ~5 minutes with its own small data-bin, 30-s teacher and untrained
# students, every row x batch size x NAT_ATTENTION_BACKENDS setting in a fresh process (dev/gpu_check.py).
# Teacher variants, for measurement only (never distilled): once the data is ready, each "NAME:fairseq-train args" of
# TEACHER_VARIANTS (';'-separated; default on a GPU: "dropout-0.1:--dropout 0.1"; empty: none) trains beside the
# preset's teacher (the GPU is mostly idle at these batch sizes) with the same recipe plus its args, no checkpoints,
# for at most VARIANT_SECONDS (default 240); its validation BLEU every 500 updates is in
# logs/teacher-variant-NAME.log, and every call prints each teacher's curve.
set -uo pipefail
OUT=${1:?usage: gpu_table.sh OUT [SECONDS]}; LIMIT=${2:-540}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PRESET=gpu NAT_VENV=system MULTI30K_DIR=${MULTI30K_DIR:-$ROOT/.data/multi30k} WORK=${WORK:-$ROOT/work/multi30k-gpu}
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONUNBUFFERED=1
LOG=$WORK.log; TESTS_LOG=$WORK.pytest-gpu.log; INSTALL_LOG=$WORK.install.log
mkdir -p "$OUT" "$(dirname "$WORK")"
if [ ! -f "$LOG" ]; then  # the first call
  if [ -z "${GPU_PRESET_ON_CPU:-}" ]; then
    bash "$ROOT/.gpu_wheels/install.sh" "$ROOT/.gpu_wheels" > "$INSTALL_LOG" 2>&1 || { tail -n 30 "$INSTALL_LOG"; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$INSTALL_LOG"
    echo "cores: $(nproc)" >> "$INSTALL_LOG"
    # the peers a GPU run could add: CTranslate2's CUDA rows need CUDA 12's cuBLAS (its wheel links it); onnxruntime
    python3 - >> "$INSTALL_LOG" 2>&1 <<'PY'
import ctypes
for lib in ("libcublas.so.12", "libcublas.so.13"):
    try:
        ctypes.CDLL(lib)
        print(f"peers: {lib} loads")
    except OSError as err:
        print(f"peers: {lib} does not load ({err})")
try:
    import onnxruntime
    print("peers: onnxruntime", onnxruntime.__version__, "providers", onnxruntime.get_available_providers())
except ImportError:
    print("peers: onnxruntime is not installed")
PY
    tail -n 11 "$INSTALL_LOG"
    # the CUDA-only cases (skipped on a machine without CUDA), beside the pipeline's first, mostly CPU-bound steps
    (cd "$ROOT" && setsid nohup nice timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py \
      tests/test_half_precision.py -k cuda > "$TESTS_LOG" 2>&1 < /dev/null &)
  fi
  (cd "$ROOT" && setsid nohup bash run_scripts/quickstart.sh > "$LOG" 2>&1 < /dev/null &)
  DEFAULT_VARIANTS="dropout-0.1:--dropout 0.1"
  [ -n "${GPU_PRESET_ON_CPU:-}" ] && DEFAULT_VARIANTS=""
  if [ -n "${TEACHER_VARIANTS-$DEFAULT_VARIANTS}" ]; then
    (cd "$ROOT" && setsid nohup bash -c '
      while [ ! -f "$WORK/.data.done" ]; do sleep 2; done
      IFS=";" read -r -a variants <<< "$1"
      for variant in "${variants[@]}"; do
        name=${variant%%:*}; read -r -a extra <<< "${variant#*:}"
        timeout "${VARIANT_SECONDS:-240}" bash run_scripts/train_teacher.sh "$WORK/data-bin" \
          "$WORK/teacher-variants/$name" "${extra[@]}" --no-save > "$WORK/logs/teacher-variant-$name.log" 2>&1 &
      done
      wait' _ "${TEACHER_VARIANTS-$DEFAULT_VARIANTS}" > /dev/null 2>&1 < /dev/null &)
  fi
  sleep 2
fi
CALL_END=$(( $(date +%s) + LIMIT ))
bash "$ROOT/dev/wait_for_run.sh" "$LOG" "$WORK" "$LIMIT"
status=$?
# once the table is done, where the rows' time goes (dev/gpu_profile.py; PROFILE_SECONDS, default 100, 0: none): the
# teacher's greedy search by fairseq and by the plugin's loop, the NAT, exact speculative decoding; its file grows a
# row at a time and comes back with every later call
PROFILE=$WORK.profile
if [ "$status" = 0 ] && [ "${PROFILE_SECONDS:-100}" -gt 0 ] && [ ! -d "$PROFILE" ]; then
  mkdir -p "$PROFILE"
  CPU_FLAG=${GPU_PRESET_ON_CPU:+--cpu}
  (cd "$ROOT" && setsid nohup timeout "${PROFILE_SECONDS:-100}" python3 dev/gpu_profile.py "$WORK" "$PROFILE" \
    --sentences "${PROFILE_SENTENCES:-10}" $CPU_FLAG \
    --system "NAT, argmax fertility=$WORK/ckpt/fertility-nat/checkpoint_last.pt::--beam 1 --fertility-decoding argmax" \
    --system "Speculative k=8, exact=$WORK/ckpt/spec-drafter-8/checkpoint_last.pt::--beam 1 --spec-drafter-teacher \
$WORK/ckpt/teacher/checkpoint_best.pt" > "$PROFILE/log.txt" 2>&1 < /dev/null &)
  sleep 2
fi
while [ -d "$PROFILE" ] && pgrep -f dev/gpu_profile.py > /dev/null && [ "$(date +%s)" -lt "$CALL_END" ]; do sleep 5; done
[ -f "$PROFILE/gpu_profile.txt" ] && cp "$PROFILE/gpu_profile.txt" "$OUT/" && head -n 12 "$PROFILE/gpu_profile.txt"
[ -f "$TESTS_LOG" ] && tail -n 3 "$TESTS_LOG"
cat "$WORK/logs/steps.tsv" 2>/dev/null
for f in "$WORK"/logs/teacher.log "$WORK"/logs/teacher-variant-*.log; do  # each teacher's validation BLEU so far
  [ -f "$f" ] && echo "$(basename "$f" .log) (updates: validation BLEU): $(grep "valid on 'valid'" "$f" | \
    sed -E 's/.*\| bleu ([0-9.]+) .*\| num_updates ([0-9]+).*/\2: \1/' | paste -sd ' ')"
done
# what comes back: the benchmark's progress.json (rewritten after every timing round) and, once the run finished,
# the report's three files; one archive of everything else
for f in "$WORK/report.md" "$WORK/bench/results.md" "$WORK/bench/results.json" "$WORK/bench/progress.json"; do [ -f "$f" ] && cp "$f" "$OUT/"; done
(cd "$(dirname "$WORK")" && tar -czf "$OUT/run.tar.gz" --ignore-failed-read "$(basename "$LOG")" \
  $(ls "$(basename "$TESTS_LOG")" "$(basename "$INSTALL_LOG")" 2>/dev/null) "$(basename "$WORK")/logs" \
  $(cd "$WORK" 2>/dev/null && ls -d report.md bench/results.* bench/progress.json bench/*.png bench/hyp.*.txt 2>/dev/null | sed "s|^|$(basename "$WORK")/|"))
ls -la "$OUT"
exit $status
