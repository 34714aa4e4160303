import os
import shutil
from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.data import Dictionary

import nat_plugins  # noqa: F401  (registers the plugin before fairseq parses anything)
from nat_plugins.cli import distill
from nat_plugins.engine import step_graphs
from nat_plugins.engine.config import STATE
from nat_plugins.engine.static_cache import StaticCache
from nat_plugins.tasks.translation_nat import TranslationNATConfig, TranslationNATTask

from .utils import (
    MULTI30K_DIR,
    SYNTHETIC_TEACHER_ARGS,
    SYNTHETIC_TEACHER_UPDATES,
    TINY_TEACHER_ARGS,
    TINY_TEACHER_UPDATES,
    USER_DIR,
    binarize,
    log_file,
    train_model,
    write_dummy_parallel,
    write_synthetic_parallel,
)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end pipeline runs (minutes); deselect with -m 'not slow'")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped here with the reason)")
    pin_xdist_worker_to_its_cores()


def pin_xdist_worker_to_its_cores():
    """Under pytest-xdist, worker i of n runs on every n-th core from the i-th, and so do the programs its tests start
    (fairseq-train, the quickstart, the benchmark: they inherit the affinity and size their thread pools to it).
    Unpinned, a subprocess spins one OpenMP thread per core of the machine beside the other worker's tests: on 2 cores
    fairseq-train ran 2-4x slower than alone and the suite spent a third of its CPU time waiting."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if worker is not None and 2 <= count <= len(cores):
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) :: count])


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models run fastest on one intra-op thread (two spinning threads on a busy 2-core machine: 10-30x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_torch_load_escape_hatch(monkeypatch):
    """Checkpoint loading must work without TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (the plugin fixes it)."""
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)


@pytest.fixture(scope="module")
def toy_task():
    """A translation_nat task over a 24-word dictionary (w0..w23), shared by source and target, no data."""
    dictionary = Dictionary()
    for i in range(24):
        dictionary.add_symbol(f"w{i}")
    return TranslationNATTask(TranslationNATConfig(), dictionary, dictionary)


@pytest.fixture(scope="session")
def dummy_raw(tmp_path_factory):
    return write_dummy_parallel(str(tmp_path_factory.mktemp("raw")))


@pytest.fixture(scope="session")
def dummy_data_bin(dummy_raw, tmp_path_factory):
    return binarize(dummy_raw, str(tmp_path_factory.mktemp("data-bin")))


@pytest.fixture(scope="module")
def fert_data_bin(dummy_data_bin, dummy_raw, tmp_path_factory):
    """A copy of the dummy data-bin with fertility files: the toy target maps s_i -> t_i word for word, so the
    gold fertilities are all 1 (written directly; the eflomal path is tested separately); one copy per test module."""
    path = str(tmp_path_factory.mktemp("fert-bin") / "bin")
    shutil.copytree(dummy_data_bin, path)
    for split in ("train", "valid", "test"):
        with (
            open(os.path.join(path, f"{split}.fert.src"), "w") as out,
            open(os.path.join(dummy_raw, f"{split}.src")) as src,
        ):
            for line in src:
                out.write(" ".join("1" for _ in line.split()) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_teacher(dummy_data_bin, tmp_path_factory):
    """A tiny AR Transformer trained under translation_nat with --eval-bleu checkpoint selection (~48 BLEU); its
    training log is ``train.log`` next to the checkpoints."""
    save_dir = str(tmp_path_factory.mktemp("teacher"))
    with log_file(os.path.join(save_dir, "train.log")):
        train_model(dummy_data_bin, save_dir, TINY_TEACHER_ARGS, max_update=TINY_TEACHER_UPDATES)
    return os.path.join(save_dir, "checkpoint_best.pt")


@pytest.fixture(scope="module")
def teacher(dummy_data_bin, tiny_teacher):
    """The tiny teacher loaded in eval mode, with its task (test split loaded): ``(model, task)``."""
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [tiny_teacher], arg_overrides={"data": dummy_data_bin}
    )
    task.load_dataset("test")
    return models[0].eval(), task


@pytest.fixture(scope="module")
def sat_task(dummy_data_bin):
    """translation_nat over the dummy data, its test split loaded."""
    args = options.parse_args_and_arch(
        options.get_training_parser(), [dummy_data_bin, "--task", "translation_nat", "--arch", "transformer"]
    )
    task = tasks.setup_task(args)
    task.load_dataset("test")
    return task


@pytest.fixture
def graphs_on_the_cpu(monkeypatch):
    """The CUDA path of the static step on the CPU (tests/test_step_graphs.py), every call shape captured at its
    first call; returns the counts of the static step's calls and graph replays so far."""
    counts = Namespace(calls=0, replays=0)
    run_banked = StaticCache.run_banked

    def counted(cache, inputs):
        counts.calls += 1
        return run_banked(cache, inputs)

    def capture(run):
        run()  # the warm-up, as on CUDA
        output = run()

        def replay():
            counts.replays += 1
            output.copy_(run())

        return replay, output

    monkeypatch.setattr(StaticCache, "run_banked", counted)
    monkeypatch.setattr(step_graphs, "graphs_wanted", lambda reference: not torch.is_grad_enabled())
    monkeypatch.setattr(step_graphs, "capture", capture)
    monkeypatch.setattr(step_graphs, "EAGER_CALLS_BEFORE_CAPTURE", 0)
    monkeypatch.setattr(STATE, "capture_failures", {})
    STATE.banks.clear()
    yield counts
    STATE.banks.clear()


@pytest.fixture(scope="session")
def multi30k_dir():
    if not os.path.exists(os.path.join(MULTI30K_DIR, "train.en")):
        pytest.skip(f"Multi30k raw data not found at {MULTI30K_DIR} (set MULTI30K_DIR)")
    return MULTI30K_DIR


# ----- the learning tests' synthetic task (tests/utils.py: synthetic_translation) ----------------------------------
@pytest.fixture(scope="session")
def synthetic_data_bin(tmp_path_factory):
    """Binarized synthetic task with the gold fertilities next to it (``{split}.fert.src``)."""
    raw = write_synthetic_parallel(str(tmp_path_factory.mktemp("synthetic-raw")))
    data_bin = binarize(raw, str(tmp_path_factory.mktemp("synthetic-data-bin")))
    for split in ("train", "valid", "test"):
        shutil.copy(os.path.join(raw, f"{split}.fert.src"), data_bin)
    return data_bin


@pytest.fixture(scope="session")
def synthetic_teacher(synthetic_data_bin, tmp_path_factory):
    """The AR teacher of the learning tests (2 x 64-d), trained until it translates the synthetic task almost
    perfectly, and the data-bin with its greedy distillation of the training set (``train.kd.tgt``, for the
    students that train on distilled targets). Returns ``(checkpoint, data_bin)``."""
    save_dir = str(tmp_path_factory.mktemp("synthetic-teacher"))
    checkpoint = train_model(synthetic_data_bin, save_dir, SYNTHETIC_TEACHER_ARGS, max_update=SYNTHETIC_TEACHER_UPDATES)
    distill.cli_main(
        [
            synthetic_data_bin,
            "--path",
            checkpoint,
            "--user-dir",
            USER_DIR,
            "--cpu",
            "--beam",
            "1",
            "--batch-size",
            "256",
            "--gen-subset",
            "train",
            "--no-progress-bar",
        ]
    )
    return checkpoint, synthetic_data_bin
