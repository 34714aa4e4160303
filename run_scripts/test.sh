#!/usr/bin/env bash
# The test command of the README: set up ./.venv (idempotent), check lint and format (ruff), run the test suite.
# Extra arguments go to pytest, e.g. `bash run_scripts/test.sh -m "not slow"` or `... tests/test_task.py`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/run_scripts/setup_env.sh"
cd "$ROOT"
PYTHON="${NAT_VENV:-$ROOT/.venv}/bin/python"
# lint and format first (configuration: [tool.ruff] in pyproject.toml; `ruff format .` applies the format)
"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
exec "$PYTHON" -m pytest -ra --durations=20 "$@"  # the 20 slowest tests at the end: the suite must stay under ~15 min on 2 cores
