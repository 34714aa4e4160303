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
# two worker processes (NAT_TEST_WORKERS; 0: this process alone), each a test file at a time (a file's fixtures are
# built once); each test runs torch on one thread (tests/conftest.py), so two use both cores of a 2-core machine.
# The 20 slowest tests are listed at the end: the suite must stay under ~20 min on 2 cores.
exec "$PYTHON" -m pytest -ra --durations=20 -n "${NAT_TEST_WORKERS:-2}" --dist loadfile "$@"
