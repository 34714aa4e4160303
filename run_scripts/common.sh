# Sourced by the run_scripts: repository root, the venv, and the size preset.
#   PRESET=cpu (default): small models and few updates, a smoke run of the whole pipeline on a laptop/CI CPU.
#   PRESET=gpu: the full-size recipe (transformer_iwslt_de_en-sized, fp16), meant for one GPU.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=${PRESET:-cpu}
case $PRESET in cpu|gpu) ;; *) echo "PRESET must be 'cpu' or 'gpu' (got '$PRESET')" >&2; exit 2 ;; esac
# shellcheck disable=SC1091
source "${NAT_VENV:-$ROOT/.venv}/bin/activate"
# fairseq's CLIs import the plugin from this directory (--user-dir), wherever the script is run from
USER_DIR=$ROOT/nat_plugins
if [ "$PRESET" = gpu ]; then
  DEVICE_ARGS=(--fp16)
else
  DEVICE_ARGS=(--cpu)
fi
log() { echo "[$(basename "$0") $(date +%H:%M:%S)] $*"; }
