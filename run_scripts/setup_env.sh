#!/usr/bin/env bash
# Idempotent set-up of ./.venv (git-ignored) for nat-plugins. Every version comes from pyproject.toml: its
# [tool.nat-plugins.setup-env] table names what pip cannot install from package metadata alone, in this order:
#   torch (an already installed torch is kept) -> build prerequisites -> fairseq (--no-build-isolation --no-deps:
#   its metadata asks for torchaudio, which would pull another torch) -> fairseq's runtime dependencies
#   -> this package (editable) with its dependencies and the extras the table lists (fastBPE, CTranslate2,
#   ONNX Runtime, pytest).
# A second run only checks a stamp and returns in seconds. Set NAT_VENV to use another location,
# NAT_SETUP_EXTRAS: more extras of pyproject.toml, space-separated, default "eflomal" (the GPLv3 word aligner the
# fertility pipeline run_scripts/fertility.sh calls as a separate library); NAT_SETUP_EXTRAS=none installs none.
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
want=$(cat "$ROOT/run_scripts/setup_env.sh" "$ROOT/pyproject.toml" "$ROOT/setup.py" | sha1sum | cut -c1-16)-$EXTRAS

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import fairseq, nat_plugins" 2>/dev/null; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

log() { echo "[setup $(date +%H:%M:%S)] $*"; }
# setting KEY: pyproject.toml's value at the dotted KEY, one requirement (or, for a table, one key) a line
setting() {
  "$PY" - "$ROOT/pyproject.toml" "$1" <<'PYTHON'
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit("run_scripts/setup_env.sh reads pyproject.toml with tomllib (Python >= 3.11) or tomli: "
                 "`pip install tomli` for this Python, or set PYTHON to a Python >= 3.11")
path, key = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    value = tomllib.load(f)
for part in key.split("."):
    value = value[part]
print("\n".join([value] if isinstance(value, str) else value))
PYTHON
}
KNOWN_EXTRAS=$(setting project.optional-dependencies | tr '\n' ' ')
for extra in $EXTRAS; do
  case " $KNOWN_EXTRAS " in
    *" $extra "*) ;;
    *) echo "[setup] unknown extra '$extra' in NAT_SETUP_EXTRAS (pyproject.toml has: ${KNOWN_EXTRAS}or none)" >&2; exit 2 ;;
  esac
done
ALL_EXTRAS=$(setting tool.nat-plugins.setup-env.extras)
ALL_EXTRAS=$(printf '%s\n' $ALL_EXTRAS $EXTRAS | paste -sd, -)
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
# pip's own output (resolver notes, warnings about the machine's index settings) goes to a log, not the terminal
SETUP_LOG=$VENV/setup.log
quietly() {  # quietly COMMAND...: its output appended to SETUP_LOG; on failure its last lines, then exit
  if ! "$@" >> "$SETUP_LOG" 2>&1; then
    tail -n 30 "$SETUP_LOG" >&2
    log "failed: $* (the last lines of $SETUP_LOG are above)" >&2
    exit 1
  fi
}
log "pip's output: $SETUP_LOG"

if ! "$VPY" -c "import torch" 2>/dev/null; then
  TORCH=$(setting tool.nat-plugins.setup-env.torch)
  log "installing $TORCH"
  quietly "${PIP[@]}" "$TORCH"
fi
TORCH_VERSION=$("$VPY" -c "import torch; print(torch.__version__)" 2>> "$SETUP_LOG")
# every later install is constrained to the torch that is there, so nothing can replace it
CONSTRAINTS="$VENV/torch-constraint.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
PIP+=(-c "$CONSTRAINTS")
log "torch $TORCH_VERSION"

log "build prerequisites"
BUILD=$(setting tool.nat-plugins.setup-env.build)
mapfile -t BUILD <<< "$BUILD"
quietly "${PIP[@]}" "${BUILD[@]}"

if ! "$VPY" -c "import fairseq" 2>/dev/null; then
  FAIRSEQ=$(setting tool.nat-plugins.setup-env.fairseq)
  log "building $FAIRSEQ (about 4 minutes the first time; pip caches the wheel)"
  quietly "${PIP[@]}" --no-build-isolation --no-deps "$FAIRSEQ"
fi

log "fairseq's runtime dependencies (without torchaudio)"
FAIRSEQ_RUNTIME=$(setting tool.nat-plugins.setup-env.fairseq-runtime)
mapfile -t FAIRSEQ_RUNTIME <<< "$FAIRSEQ_RUNTIME"
quietly "${PIP[@]}" "${FAIRSEQ_RUNTIME[@]}"

# --no-build-isolation: fastBPE's C++ extension builds only with the Cython installed above
log "installing nat_plugins (editable) with its dependencies and extras [$ALL_EXTRAS]"
quietly "${PIP[@]}" --no-build-isolation -e "$ROOT[$ALL_EXTRAS]"

"$VPY" -c "import fairseq, torch, nat_plugins; print('[setup] fairseq', fairseq.__version__, '| torch', torch.__version__, '| nat_plugins', nat_plugins.__version__)" 2>> "$SETUP_LOG"
echo "$want" > "$STAMP"
log "done in $(( $(date +%s) - start )) s"
