"""dev/gpu_check.sh (issue 64's GPU check) rehearsed on the CPU: GPU_CHECK_ON_CPU=1, the toy corpus, a tiny teacher.

The whole check runs as on the GPU machine (data preparation, a time-bounded teacher, the untrained students, every
row x batch size x NAT_ATTENTION_BACKENDS setting in its own process, the training runs, the report), with forked job
processes (the CPU rehearsal's default); the spawned job processes the GPU run uses are checked on one row."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from .utils import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "dev", "gpu_check.sh")
ROWS = ("fairseq", "plugin-cache", "plugin-eager", "plugin-graphs", "blockwise", "speculative", "nat")
FORCED_LENGTH_ROWS = ROWS[:-1]  # every row but the NAT emits exactly --length tokens and EOS
BATCH_SIZES = (1, 4)
BACKENDS = ("default", "torch")
LENGTH = 4
TRAIN_UPDATES = 4
CHECK_ARGS = [
    "-s",
    "src",
    "-t",
    "tgt",
    "--vocab-size",
    "30",  # the toy corpus has few characters
    "--max-lines",
    "0",
    "--sentences",
    "2",
    "--batch-sizes",
    ",".join(map(str, BATCH_SIZES)),
    "--batches",
    "1",
    "--length",
    str(LENGTH),
    "--profile-sentences",
    "1",
    "--teacher-updates",
    "10",
    "--train-updates",
    str(TRAIN_UPDATES),
    "--train-warmup",
    "2",
    "--threads",
    "1",
    "--budget-seconds",
    "1200",
    "--job-timeout",
    "300",
]


def run_script(out, work, raw_dir):
    env = dict(
        os.environ,
        GPU_CHECK_ON_CPU="1",
        PYTHON=sys.executable,
        WORK=str(work),
        MULTI30K_DIR=raw_dir,
        GPU_CHECK_ARGS=" ".join(CHECK_ARGS),
    )
    return subprocess.run(["bash", SCRIPT, str(out), "900"], env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def rehearsal(dummy_raw, tmp_path_factory):
    """The check's first call (it runs to the end within the call) and its report."""
    root = tmp_path_factory.mktemp("gpu-check")
    work, out = root / "work", root / "out"
    done = run_script(out, work, dummy_raw)
    log = (root / "work.log").read_text() if (root / "work.log").exists() else "(no log)"
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:] + log[-4000:]
    return work, out, json.loads((out / "gpu_check.json").read_text()), done.stdout


def test_every_configuration_is_measured(rehearsal):
    work, out, report, stdout = rehearsal
    assert report["state"] == "finished" and not report["skipped"], report["skipped"]
    assert {"gpu_check.md", "gpu_check.json", "gpu_check.log", "gpu_check-logs.tar.gz"} <= set(os.listdir(out))
    for step in ("data", "teacher", "students"):  # made by the run, not found
        assert "error" not in report["steps"][step] and not report["steps"][step].get("existing"), step
    assert report["env"]["device"].startswith("CPU") and report["env"]["torch"]
    markdown = (out / "gpu_check.md").read_text()
    for row in ROWS:
        for size in BATCH_SIZES:
            for backends in BACKENDS:
                key = f"decode/{row}/b{size}/{backends}"
                result = report["decode"][key]
                assert "error" not in result, (key, result["error"])
                cold, warm = result["cold"], result["warm"]
                assert cold["ms_per_call"] > 0 and warm["ms_per_call"] > 0 and result["profiled"]["ms"] > 0, key
                assert cold["calls"] > 0 and warm["calls"] == cold["calls"], key
                assert cold["units"] == (2 if size == 1 else 1), key
                if row in FORCED_LENGTH_ROWS:  # --min-len N --max-len-a 0 --max-len-b N: N tokens and EOS
                    assert cold["tokens_per_sentence"] == LENGTH + 1, key
                    assert cold["calls_per_unit"] >= 2, key  # the NAT's one pass aside, several calls a sentence
                else:
                    assert cold["calls_per_unit"] == 1 and 1 <= cold["tokens_per_sentence"] <= LENGTH + 1, key
                # the package's default never lets SDPA pick cuDNN's kernel while decoding; "torch" leaves it on
                assert result["cudnn_sdpa_in_decode"] is (backends == "torch"), key
                assert any("scaled_dot_product" in op for op in result["attention_ops"]), key
                assert (result["profile_table"] is not None) is (backends == "default"), key
                assert any(
                    line.startswith(f"| {result_name(row)}") and f"| {size} | {backends} |" in line
                    for line in markdown.splitlines()
                ), key
    for backends in BACKENDS:
        train = report["train"][f"train/{backends}"]
        assert "error" not in train, train["error"]
        assert train["updates"] >= TRAIN_UPDATES and train["warm_updates_per_second"] > 0
        assert train["cudnn_sdpa_in_train_step"] is (backends == "torch")
    assert report["verdict"] and "## Verdict" in markdown and "## Profiles" in markdown
    assert "gpu_check.sh: finished" in stdout


def result_name(row):
    return {
        "fairseq": "fairseq greedy",
        "plugin-cache": "plugin greedy loop, fairseq's incremental cache",
        "plugin-eager": "plugin greedy loop, static step (bank eager)",
        "plugin-graphs": "plugin greedy loop, static step (bank + CUDA graphs)",
        "blockwise": "blockwise k=4",
        "speculative": "speculative k=8",
        "nat": "NAT, argmax fertility",
    }[row]


def test_a_later_call_only_collects(rehearsal, dummy_raw, tmp_path):
    """A second call on the same machine starts nothing: it returns the finished run's report."""
    work, out, report, _ = rehearsal
    log = (work.parent / "work.log").read_text()
    done = run_script(tmp_path / "out", work, dummy_raw)
    assert done.returncode == 0, done.stdout[-3000:]
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["decode"] == report["decode"]
    assert (work.parent / "work.log").read_text() == log


def test_spawned_job_processes(rehearsal, tmp_path):
    """--launch spawn (the GPU's way): a fresh interpreter per job, the next one started while a job runs."""
    work, _, _, _ = rehearsal
    copy = tmp_path / "work"
    copy.mkdir()
    shutil.copytree(work / "data-bin", copy / "data-bin")
    shutil.copytree(work / "ckpt", copy / "ckpt")
    args = ["--cpu", "--launch", "spawn", "--rows", "plugin-graphs", "--backends", "default", "--batch-sizes", "1"]
    args += ["--sentences", "2", "--length", str(LENGTH), "--profile-sentences", "1", "--train-updates", "0"]
    done = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "dev", "gpu_check.py"), str(copy), str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["state"] == "finished" and report["launch"] == "spawn"
    assert report["steps"]["students"]["existing"]
    result = report["decode"]["decode/plugin-graphs/b1/default"]
    assert "error" not in result and result["cold"]["ms_per_call"] > 0
    assert result["cold"]["tokens_per_sentence"] == LENGTH + 1
    spawned = (copy / "logs" / "spawned.log").read_text() if (copy / "logs" / "spawned.log").exists() else ""
    assert "Traceback" not in spawned, spawned[-3000:]
