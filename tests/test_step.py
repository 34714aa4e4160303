"""run_scripts/step.sh, the main job's steps: a step's latest progress line (fairseq-train's updates, distillation's
sentences, the benchmark's pass and row) reaches the terminal now and then, also from a job whose own output is
discarded (the GPU preset trains its students side by side so); a finished step is skipped when run again."""

import os
import subprocess
import time

from .utils import REPO_ROOT

BENCHMARK_LINE = (
    "2026-12-04 23:00:00 | INFO | nat_plugins.bench.benchmark | benchmark progress: batch 64, round 1 of 3: "
    "NAT, argmax fertility (5 of 40 of the pass done, ~70 s left in it)"
)


def run_steps(work, progress_seconds: int, commands: str) -> subprocess.CompletedProcess:
    """``commands`` run in bash after sourcing run_scripts/step.sh as the main job does (WORK=``work``, a ``log``
    that prints ``[quickstart] ...``, progress every ``progress_seconds``), its output captured."""
    script = f"""
set -euo pipefail
log() {{ echo "[quickstart] $*"; }}
WORK={work}
mkdir -p "$WORK/logs" && touch "$WORK/logs/steps.tsv"
PROGRESS_SECONDS={progress_seconds}
source {REPO_ROOT}/run_scripts/step.sh
{commands}
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_a_steps_progress_reaches_the_terminal_from_a_discarded_background_job(tmp_path):
    run = run_steps(
        tmp_path,
        1,
        f"""benchmark() {{ echo '{BENCHMARK_LINE}'; sleep 3; }}
( step benchmark-1 benchmark > /dev/null 2>&1 ) &
wait
step benchmark-1 benchmark""",
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    expected = (
        "[quickstart] benchmark-1: batch 64, round 1 of 3: NAT, argmax fertility (5 of 40 of the pass done, ~70 s"
    )
    assert any(line.startswith(expected) for line in lines), run.stdout
    assert not any("benchmark-1 ... (follow it" in line for line in lines)  # the job's own output: discarded
    assert lines[-1] == f"[quickstart] benchmark-1: done before (remove {tmp_path}/.benchmark-1.done to redo)"
    assert os.path.isfile(tmp_path / ".benchmark-1.done")


def test_a_failed_step_returns_at_once_to_a_caller_reading_its_output(tmp_path):
    """The progress reporter's sleep holds no output open (the terminal's descriptor included): a caller that captures
    the main job's output gets the failure at once, not after PROGRESS_SECONDS."""
    started = time.monotonic()
    run = run_steps(tmp_path, 60, 'step broken bash -c "sleep 1; exit 3"')
    assert run.returncode == 1 and "broken failed after" in run.stderr
    assert time.monotonic() - started < 20
