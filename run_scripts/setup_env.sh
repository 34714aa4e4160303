#!/usr/bin/env bash
# Idempotent set-up of ./.venv (git-ignored) for nat-plugins, in the order DESIGN.md §3 verified:
#   torch (an already installed torch is kept; otherwise torch==2.13.0) -> build prerequisites ->
#   fairseq-fixed==0.12.3.1 (--no-build-isolation --no-deps) -> fairseq's runtime deps (no torchaudio)
#   -> sentencepiece, sacrebleu, matplotlib, pytest, tensorboardX (fairseq logs a hint at import without it),
#   subword-nmt + fastBPE (the alternative subword model), ctranslate2 (the benchmark's production baseline)
#   -> this package (editable).
# A second run only checks a stamp and returns in seconds. Set NAT_VENV to use another location,
# NAT_SETUP_EXTRAS: optional extras, default "eflomal" (the GPLv3 word aligner the fertility pipeline
# run_scripts/fertility.sh calls as an external tool); NAT_SETUP_EXTRAS=none installs no extra.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${NAT_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
EXTRAS=${NAT_SETUP_EXTRAS-eflomal}
if [ "$EXTRAS" = none ]; then EXTRAS=; fi
if [ "$VENV" = system ]; then  # NAT_VENV=system: use the python3 on the PATH as it is (run_scripts/common.sh)
  python3 -c "import fairseq, nat_plugins" || {
    echo "[setup] NAT_VENV=system: python3 must already import fairseq and nat_plugins (pip install -e . there)" >&2
    exit 1; }
  echo "[setup] NAT_VENV=system: using $(command -v python3)"
  exit 0
fi
STAMP=$VENV/.nat_plugins_setup
want=$(cat "$ROOT/run_scripts/setup_env.sh" "$ROOT/setup.py" | sha1sum | cut -c1-16)-$EXTRAS

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import fairseq, nat_plugins" 2>/dev/null; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

log() { echo "[setup $(date +%H:%M:%S)] $*"; }
start=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    # keep the torch this Python already has (e.g. a CUDA build): let the venv see it
    log "creating $VENV on top of $PY's site-packages (keeps its torch $("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    log "creating $VENV"
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q --disable-pip-version-check)

if ! "$VPY" -c "import torch" 2>/dev/null; then
  log "installing torch==2.13.0"
  "${PIP[@]}" torch==2.13.0
fi
TORCH_VERSION=$("$VPY" -c "import torch; print(torch.__version__)")
# every later install is constrained to the torch that is there, so nothing can replace it
CONSTRAINTS="$VENV/torch-constraint.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
PIP+=(-c "$CONSTRAINTS")
log "torch $TORCH_VERSION"

log "build prerequisites"
"${PIP[@]}" "setuptools<81" wheel cython numpy

if ! "$VPY" -c "import fairseq" 2>/dev/null; then
  log "building fairseq-fixed==0.12.3.1 (about 4 minutes the first time; pip caches the wheel)"
  "${PIP[@]}" --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
fi

log "fairseq's runtime dependencies (without torchaudio) and the project's tools"
"${PIP[@]}" cffi hydra-core==1.3.2 omegaconf==2.3.0 regex sacrebleu==2.6.* tqdm bitarray scikit-learn packaging \
  tensorboardX sentencepiece matplotlib pytest subword-nmt==0.3.8 ctranslate2==4.8.5
log "fastBPE (alternative subword model; its C++ extension needs Cython and --no-build-isolation)"
"${PIP[@]}" --no-build-isolation fastbpe==0.1.0

for extra in $EXTRAS; do
  case $extra in
    eflomal) log "optional: eflomal (GPLv3, called as an external aligner)"; "${PIP[@]}" eflomal==2.0.0 ;;
    *) echo "[setup] unknown extra '$extra' in NAT_SETUP_EXTRAS (known: eflomal, or none)" >&2; exit 2 ;;
  esac
done

log "installing nat_plugins (editable)"
"${PIP[@]}" --no-build-isolation --no-deps -e "$ROOT"

"$VPY" -c "import fairseq, torch, nat_plugins; print('[setup] fairseq', fairseq.__version__, '| torch', torch.__version__, '| nat_plugins', nat_plugins.__version__)"
echo "$want" > "$STAMP"
log "done in $(( $(date +%s) - start )) s"
