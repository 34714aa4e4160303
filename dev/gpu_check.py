"""Issue 64 on the device at hand: does ``F.scaled_dot_product_attention``'s cuDNN backend (per-shape execution plans,
cached per process) make the plugin's decoders slower than fairseq's greedy search, and does it slow training?

    python dev/gpu_check.py WORK OUT [--cpu] [--sentences 10] [--batch-sizes 1,64] [--batches 2] [--length 20] ...

Steps, each a job in its own process (``--launch spawn``: a fresh interpreter, started while the job before runs,
which imports and then waits for its job before touching the device; ``--launch fork``: a fork of this process,
which imported torch and fairseq but never ran an op: the CPU rehearsal's fast way). A step whose output exists in
WORK is skipped, and a job whose result is in WORK/results is not run again (a run cut off resumes):

1. data: WORK/data-bin from the raw files in ``--raw-dir`` (default: $MULTI30K_DIR), the first ``--max-lines``
   lines of each split, through the repository's own preparation (``nat_plugins.cli.prepare_data``);
2. teacher: WORK/ckpt/teacher/checkpoint_last.pt, fairseq-train of ``--arch-args`` (GPU: transformer_iwslt_de_en,
   fp16) through ``--task translation_nat`` for at most ``--teacher-seconds`` (``--stop-time-hours``);
3. students, untrained (the check times decoder calls, not quality), built by the task from the teacher's checkpoint
   as the recipes initialise them (``--init-from-ar``) and saved in WORK/ckpt/gpu-check/: blockwise k=4
   (``--identity-first-head --freeze-base``), a speculative drafter k=8 (``--freeze-encoder --read-teacher-states``)
   and a fertility NAT;
4. decoding: every row (:data:`ROWS`) at every batch size, with ``NAT_ATTENTION_BACKENDS`` at the package's default
   (no cuDNN) and ``=torch`` (PyTorch's own choice), each configuration in its own process: its first pass over the
   sentences (cold: every shape met for the first time in the process), then the same sentences again (warm), then a
   profiled warm pass over the first ``--profile-sentences`` (one batch above batch 1) under torch.profiler. Every
   output is forced to ``--length`` tokens (``--min-len N --max-len-a 0 --max-len-b N``), so every row runs the same
   number of steps (the NAT's length is its fertilities', capped there). Per configuration: the attention backends in
   force (``describe()``; the SDPA flags seen inside ``task.inference_step``), ms per decoder call cold and warm
   (decode time over the decoder calls that ``measure.DecoderPassCounter`` counted: at batch B one call decodes B
   sentences), the attention operators the profiled pass ran (none where CUDA graphs replay the step), the static
   step's failed CUDA graph captures; for the default backends the profiler's top operators by self CUDA time (self
   CPU time on the CPU);
5. training: ``--train-updates`` updates of the teacher's architecture through ``--task translation_nat`` (which applies
   the choice in ``train_step``) with each backend setting, timed per update after ``--train-warmup`` of them.

Order: the decoding at the first batch size, the training, the decoding at the others; a job that would start after
``--budget-seconds`` is skipped (the report names it), and a job's limit (``--job-timeout``) is cut to what is left
of the budget (a job killed at its limit keeps the passes it finished). OUT/gpu_check.md and OUT/gpu_check.json are
rewritten (atomically) after every job, with the device, the versions and a verdict computed from the numbers.
"""

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, List, Optional

DEV_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DEV_DIR)
USER_DIR = os.path.join(ROOT, "nat_plugins")
BACKEND_SETTINGS = {"default": None, "torch": "torch"}  # NAT_ATTENTION_BACKENDS: None = unset, the package's default
CHILD_FLAG = "--child"
# nat_plugins.engine.config.ATTENTION_BACKENDS_ENV (not imported here: spawn mode imports no torch)
NAME_ENV = "NAT_ATTENTION_BACKENDS"
TABLE_ROWS = 12
TINY_ARCH = (
    "--arch transformer --share-all-embeddings --encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 "
    "--decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
    "--decoder-attention-heads 2"
)
GPU_ARCH = "--arch transformer_iwslt_de_en --share-all-embeddings"
TRAIN_OPTIONS = (
    "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --optimizer adam --adam-betas (0.9,0.98) "
    "--lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 --dropout 0.3 --weight-decay 0.0001 --seed 1 "
    "--num-workers 0 --disable-validation --no-epoch-checkpoints --log-format simple --log-interval 50 "
    "--no-progress-bar"
)


@dataclass(frozen=True)
class Row:
    """A decoding configuration's row: its key, display name, checkpoint (a key of :func:`checkpoints`), its
    fairseq-generate arguments (``{teacher}`` is the teacher's path), environment and way of decoding."""

    key: str
    name: str
    checkpoint: str
    args: tuple
    env: Dict[str, str] = field(default_factory=dict)
    incremental: bool = False  # the plugin's greedy loop on fairseq's incremental cache (dev/call_profile.py's way)


PLUGIN_GREEDY = ("--task", "translation_nat", "--beam", "1")
ROWS = (
    Row("fairseq", "fairseq greedy (SequenceGenerator)", "teacher", ("--task", "translation", "--beam", "1")),
    Row("plugin-cache", "plugin greedy loop, fairseq's incremental cache", "teacher", PLUGIN_GREEDY, incremental=True),
    Row(
        "plugin-eager",
        "plugin greedy loop, static step (bank eager)",
        "teacher",
        PLUGIN_GREEDY,
        {"NAT_CUDA_GRAPHS": "0"},
    ),
    Row("plugin-graphs", "plugin greedy loop, static step (bank + CUDA graphs)", "teacher", PLUGIN_GREEDY),
    Row(
        "blockwise",
        "blockwise k=4, exact",
        "blockwise",
        ("--task", "translation_nat", "--beam", "1", "--block-accept", "exact"),
    ),
    Row(
        "speculative",
        "speculative k=8, exact",
        "drafter",
        ("--task", "translation_nat", "--beam", "1", "--spec-drafter-teacher", "{teacher}"),
    ),
    Row(
        "nat",
        "NAT, argmax fertility (one pass)",
        "nat",
        ("--task", "translation_nat", "--beam", "1", "--fertility-decoding", "argmax"),
    ),
)
ROW_KEYS = tuple(row.key for row in ROWS)


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", help="work directory: data-bin/, ckpt/ (made where missing), results/, logs/")
    parser.add_argument("out", help="where gpu_check.md and gpu_check.json are written (after every job)")
    parser.add_argument("--cpu", action="store_true", help="on the CPU in fp32 (a rehearsal; default --launch fork)")
    parser.add_argument(
        "--launch",
        choices=("spawn", "fork"),
        default=None,
        help="a fresh interpreter per job (spawn; default on a GPU) or a fork of this process (default with --cpu)",
    )
    parser.add_argument("--sentences", type=int, default=10, help="sentences of a batch-1 pass (default: 10)")
    parser.add_argument("--batch-sizes", default="1,64", help="comma-separated batch sizes (default: 1,64)")
    parser.add_argument("--batches", type=int, default=2, help="batches of a pass above batch 1 (default: 2)")
    parser.add_argument("--length", type=int, default=20, help="every output is forced to this many tokens (20)")
    parser.add_argument(
        "--profile-sentences", type=int, default=4, help="sentences of the profiled batch-1 pass (default: 4)"
    )
    parser.add_argument("--rows", default=",".join(ROW_KEYS), help=f"comma-separated rows (default: all, {ROW_KEYS})")
    parser.add_argument(
        "--backends", default="default,torch", help="NAT_ATTENTION_BACKENDS settings: default and/or torch"
    )
    parser.add_argument("--train-updates", type=int, default=30, help="updates of each training run (default: 30)")
    parser.add_argument("--train-warmup", type=int, default=5, help="updates not timed in a training run (5)")
    parser.add_argument(
        "--train-max-tokens", type=int, default=None, help="tokens per training batch (default: GPU 8192, CPU 1000)"
    )
    parser.add_argument("--raw-dir", default=None, help="raw {train,valid,test}.{SRC,TGT} (default: $MULTI30K_DIR)")
    parser.add_argument("-s", "--source-lang", default="en", help="source language of the raw files (en)")
    parser.add_argument("-t", "--target-lang", default="de", help="target language of the raw files (de)")
    parser.add_argument("--max-lines", type=int, default=5000, help="first N lines of each split (default: 5000)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint sentencepiece vocabulary (8000)")
    parser.add_argument("--teacher", default=None, help="the teacher (default: WORK/ckpt/teacher/checkpoint_last.pt)")
    parser.add_argument(
        "--arch-args",
        default=None,
        help=f"the teacher's (and the training runs') architecture (default: GPU {GPU_ARCH!r}; CPU a tiny one)",
    )
    parser.add_argument("--teacher-seconds", type=float, default=30, help="teacher training time bound (30 s)")
    parser.add_argument(
        "--teacher-updates", type=int, default=None, help="teacher updates at most (default: GPU 5000, CPU 20)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads of every job (default: torch's)")
    parser.add_argument(
        "--budget-seconds", type=float, default=290, help="no job starts after this many seconds (default: 290)"
    )
    parser.add_argument("--job-timeout", type=float, default=60, help="a decoding/training job's limit (60 s)")
    parser.add_argument("--setup-timeout", type=float, default=150, help="the data and student jobs' limit (150 s)")
    return parser


# ----- the jobs, run in a child process ------------------------------------------------------------------------------


def heavy_imports():
    """What every job needs (imported before a spawned child waits for its job, or by this process before forking)."""
    import torch  # noqa: F401
    import torch._inductor  # noqa: F401  (torch.profiler imports it when a profile starts: seconds)
    from fairseq_cli import train  # noqa: F401
    from torch.profiler import profile  # noqa: F401

    import nat_plugins  # noqa: F401
    from nat_plugins.bench import measure  # noqa: F401
    from nat_plugins.cli import prepare_data  # noqa: F401

    sys.path.insert(0, DEV_DIR)
    import call_profile  # noqa: F401  (the plugin's greedy loop on fairseq's incremental cache)


def environment(use_cuda: bool) -> dict:
    import fairseq
    import torch

    return {
        "device": torch.cuda.get_device_name() if use_cuda else f"CPU ({cpu_model()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "fairseq": fairseq.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "precision": "fp16" if use_cuda else "fp32",
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def sdpa_flags() -> tuple:
    import torch

    b = torch.backends.cuda
    return (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled())


def flags_text(flags: tuple) -> str:
    return ",".join(name for name, on in zip(("cudnn", "flash", "efficient", "math"), flags) if on) or "none"


def prepare_job(job: dict) -> dict:
    from nat_plugins.cli import prepare_data

    argv = ["--raw-dir", job["raw_dir"], "--out-dir", job["work"], "-s", job["source_lang"], "-t", job["target_lang"]]
    argv += ["--vocab-size", str(job["vocab_size"]), "--workers", "2"]
    argv += ["--max-lines", str(job["max_lines"])] if job["max_lines"] else []
    prepare_data.cli_main(argv)
    return {"data_bin": os.path.join(job["work"], "data-bin")}


def train_job(job: dict) -> dict:
    """fairseq-train in this process (the plugin's task applies the attention choice in train_step), every update's
    start and end recorded (after a CUDA synchronisation), and the SDPA flags inside the task's train_step."""
    import torch
    from fairseq import options
    from fairseq.tasks import FairseqTask
    from fairseq.trainer import Trainer
    from fairseq_cli import train

    from nat_plugins.engine import attention

    use_cuda = not job["cpu"] and torch.cuda.is_available()
    starts, ends, flags = [], [], set()
    train_step, task_step = Trainer.train_step, FairseqTask.train_step

    def timed_train_step(self, *args, **kwargs):
        starts.append(time.perf_counter())
        result = train_step(self, *args, **kwargs)
        if use_cuda:
            torch.cuda.synchronize()
        ends.append(time.perf_counter())
        return result

    def flagged_task_step(self, *args, **kwargs):  # inside TranslationNATTask.train_step's attention_backends()
        flags.add(sdpa_flags())
        return task_step(self, *args, **kwargs)

    Trainer.train_step, FairseqTask.train_step = timed_train_step, flagged_task_step
    args = options.parse_args_and_arch(options.get_training_parser(), job["argv"])
    started = time.perf_counter()
    train.main(args)
    n, warmup = len(ends), job.get("warmup", 0)
    result = {
        "env": environment(use_cuda),
        "backends": attention.describe(),
        "sdpa_flags_in_train_step": sorted(flags_text(f) for f in flags),
        "cudnn_sdpa_in_train_step": any(f[0] for f in flags),
        "updates": n,
        "seconds": time.perf_counter() - started,
        "update_seconds": [e - s for s, e in zip(starts, ends)],
    }
    if n:
        result["first_updates"] = min(warmup, n)
        result["first_updates_seconds"] = ends[min(warmup, n) - 1] - starts[0] if warmup else 0.0
    if n > warmup >= 1:
        result["warm_ms_per_update"] = 1000 * (ends[-1] - ends[warmup - 1]) / (n - warmup)
        result["warm_updates_per_second"] = 1000 / result["warm_ms_per_update"]
    return result


def build_job(job: dict) -> dict:
    """The untrained students, built by the task from the teacher's checkpoint as the recipes initialise them."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from nat_plugins.cli.own_teacher import checked_model_cfg, shape_options

    teacher, data_bin = job["teacher"], job["data_bin"]
    model_cfg = checked_model_cfg(teacher, data_bin)
    shape = shape_options(model_cfg)
    drafter_layers = str(min(2, model_cfg.decoder_layers))
    made = {}
    for key, arch, extra in (
        ("blockwise", "blockwise_transformer", ["--block-size", "4", "--identity-first-head", "--freeze-base"]),
        (
            "drafter",
            "spec_drafter",
            ["--draft-size", "8", "--decoder-layers", drafter_layers, "--freeze-encoder", "--read-teacher-states"]
            + ["--spec-drafter-teacher", teacher],
        ),
        ("nat", "fertility_nat", []),
    ):
        path = job["paths"][key]
        argv = [data_bin, "--user-dir", USER_DIR, "--task", "translation_nat", "--arch", arch, *shape, *extra]
        args = options.parse_args_and_arch(options.get_training_parser(), argv + ["--init-from-ar", teacher])
        task = tasks.setup_task(args)
        torch.manual_seed(1)
        model = task.build_model(args)
        # as fairseq's Trainer.state_dict saves it (a config, not the legacy args every load would convert)
        cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
        history = [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}, "num_updates": 0}]
        state = {"args": None, "cfg": cfg, "model": model.state_dict(), "optimizer_history": history}
        state.update(task_state=task.state_dict(), extra_state={})
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(state, path)
        made[key] = {"path": path, "arch": arch, "options": shlex.join(extra), "parameters": param_count(model)}
    return {"students": made, "shape": shlex.join(shape)}


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def decode_job(job: dict) -> dict:
    """One row at one batch size with one backend setting: cold pass, warm pass, profiled warm pass."""
    import torch
    from call_profile import use_incremental_cache
    from torch.profiler import ProfilerActivity, profile

    from nat_plugins.bench.measure import FairseqRunner, generation_cfg, load_split
    from nat_plugins.bench.rows import RowSpec
    from nat_plugins.cli.own_teacher import detect_post_process
    from nat_plugins.engine import attention
    from nat_plugins.engine.config import STATE

    use_cuda = not job["cpu"] and torch.cuda.is_available()
    started = time.perf_counter()
    options = SimpleNamespace(
        data_bin=job["data_bin"],
        user_dir=USER_DIR,
        gen_subset="test",
        batch_size=job["batch_size"],
        seed=1,
        post_process=detect_post_process(job["data_bin"]),
        source_lang=None,
        target_lang=None,
        fp16=use_cuda,
        generate_args=job["length_args"],
    )
    spec = RowSpec(job["name"], job["checkpoint"], list(job["args"]))
    cfg = generation_cfg(options, spec, use_cuda)
    _task, dataset = load_split(cfg, spec.name)
    runner = FairseqRunner(spec, cfg, 1, len(dataset))
    if job["incremental"]:
        use_incremental_cache(runner.decoder.generation.generator)
    task = runner.decoder.generation.task
    inference_step, flags = task.inference_step, set()

    def flagged_inference_step(*args, **kwargs):  # inside Generation.decode's attention_backends()
        flags.add(sdpa_flags())
        return inference_step(*args, **kwargs)

    task.inference_step = flagged_inference_step
    size, count = job["batch_size"], job["units"]
    if size * count > len(dataset):
        raise SystemExit(f"gpu_check.py: {count} x {size} sentences asked, the test split has {len(dataset)}")
    units = [list(range(k * size, (k + 1) * size)) for k in range(count)]
    result = {
        "env": environment(use_cuda),
        "backends": attention.describe(),
        "load_seconds": time.perf_counter() - started,
    }

    @torch.no_grad()
    def run_pass(pass_units):
        measured = []
        for ids in pass_units:
            sample = runner.inputs(ids)  # collated off the clock, CUDA synchronised, counter reset
            start = time.perf_counter()
            best = runner.decode(sample)  # CUDA synchronised
            seconds = time.perf_counter() - start
            tokens = sum(len(hypo["tokens"]) for hypo in best) / len(best)
            measured.append({"ms": 1000 * seconds, "calls": runner.counter.passes, "tokens": tokens})
        return measured

    def record(name, measured):  # written as it is measured: a job killed at its limit keeps its passes so far
        result[name], result[f"{name}_units"] = summary(measured), measured
        result["sdpa_flags_in_decode"] = sorted(flags_text(f) for f in flags)
        result["cudnn_sdpa_in_decode"] = any(f[0] for f in flags)
        result["capture_failures"] = dict(STATE.capture_failures)
        write_json(job["result"], dict(result, partial=True))

    record("cold", run_pass(units))
    record("warm", run_pass(units))
    with_table = job["backends"] == "default"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda and with_table else [])
    with profile(activities=activities) as profiled:
        profiled_pass = run_pass(units[: job["profile_units"]])
    events = profiled.key_averages()
    result["attention_ops"] = {e.key: e.count for e in events if e.key.startswith("aten::") and "attention" in e.key}
    result["profile_table"] = None
    if with_table:
        for sort_by in ("self_device_time_total", "self_cuda_time_total") if use_cuda else ("self_cpu_time_total",):
            try:
                result["profile_table"] = events.table(sort_by=sort_by, row_limit=TABLE_ROWS, max_name_column_width=60)
                break
            except (AttributeError, KeyError, ValueError, TypeError):
                continue
    result["profile_sort"] = "self CUDA time" if use_cuda else "self CPU time"
    record("profiled", profiled_pass)
    del result["profiled_units"]
    if use_cuda:
        result["max_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def summary(units: List[dict]) -> dict:
    """ms per decoder call over a pass (None where calls are not observable), its first unit and the rest."""
    ms = sum(u["ms"] for u in units)
    counted = all(u["calls"] is not None for u in units)
    calls = sum(u["calls"] for u in units) if counted else None
    rest_calls = sum(u["calls"] for u in units[1:]) if counted else None
    return {
        "units": len(units),
        "ms": ms,
        "calls": calls,
        "ms_per_call": ms / calls if calls else None,
        "calls_per_unit": calls / len(units) if calls else None,
        "tokens_per_sentence": sum(u["tokens"] for u in units) / len(units) if units else None,
        "first_unit_ms": units[0]["ms"] if units else None,
        "ms_per_call_after_first": sum(u["ms"] for u in units[1:]) / rest_calls if rest_calls else None,
    }


JOBS = {"prepare": prepare_job, "train": train_job, "build": build_job, "decode": decode_job}


def run_job(job: dict) -> int:
    """Run ``job`` in this (child) process: its output into its log, its result (or error) into its result file."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    for name, value in job.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    print(f"gpu_check.py job {job['key']} (pid {os.getpid()}, {NAME_ENV}={os.environ.get(NAME_ENV, '(unset)')})")
    status = 0
    try:
        import torch

        if job.get("threads"):
            torch.set_num_threads(job["threads"])
        result = JOBS[job["kind"]](job)
    except BaseException as error:  # noqa: BLE001 - reported in the result, the run goes on
        traceback.print_exc()
        result, status = read_json(job["result"]) or {}, 1  # the numbers measured before the error
        result["error"] = f"{type(error).__name__}: {error}".strip()[:2000]
    result.pop("partial", None)
    write_json(job["result"], result)
    sys.stdout.flush()
    sys.stderr.flush()
    return status


def child_main():
    """A spawned job process: import, then wait for the job (one JSON line on stdin; none: exit)."""
    heavy_imports()
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    return run_job(json.loads(line))


# ----- launching the jobs ------------------------------------------------------------------------------------------


class Launcher:
    """Runs a job in its own process with a time limit: ``spawn`` keeps one fresh interpreter started ahead (it
    imports while the job before it runs, and touches no device until it has its job); ``fork`` forks this process
    (which has imported everything and run nothing)."""

    def __init__(self, mode: str, log_dir: str):
        self.mode, self.log_dir, self.spare, self.spawned = mode, log_dir, None, 0
        if mode == "fork":
            heavy_imports()

    def _spawn(self) -> subprocess.Popen:
        self.spawned += 1
        log = open(os.path.join(self.log_dir, "spawned.log"), "a", encoding="utf-8")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), CHILD_FLAG],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
            start_new_session=True,
            text=True,
        )
        log.close()
        return process

    def run(self, job: dict, timeout: float, spare_wanted: bool = True) -> Optional[int]:
        """The job's exit status (None: killed at ``timeout`` seconds)."""
        if self.mode == "fork":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child
                os.setsid()
                code = 1
                try:
                    code = run_job(job)
                finally:
                    os._exit(code)
            return wait_pid(pid, timeout)
        process, self.spare = self.spare or self._spawn(), None
        if not hand_over(process, job):  # the spare died (its log: spawned.log): once more in a new one
            process.wait()
            process = self._spawn()
            if not hand_over(process, job):
                return process.wait()
        if spare_wanted:
            self.spare = self._spawn()  # imports while this job runs
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait()
            return None

    def close(self):
        if self.spare is not None:
            self.spare.stdin.close()  # no job: it exits
            try:
                self.spare.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self.spare.pid)
            self.spare = None


def hand_over(process: subprocess.Popen, job: dict) -> bool:
    """Give a spawned process its job (False: it is gone)."""
    try:
        process.stdin.write(json.dumps(job) + "\n")
        process.stdin.close()
        return True
    except (BrokenPipeError, OSError):
        return False


def wait_pid(pid: int, timeout: float) -> Optional[int]:
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            kill_group(pid)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)


def kill_group(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, data) -> None:
    write_text(path, json.dumps(data, indent=1, default=str) + "\n")


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# ----- the run -----------------------------------------------------------------------------------------------------


class Check:
    """The run's state: the jobs' results and what the report says."""

    def __init__(self, args):
        self.args = args
        self.work, self.out = os.path.abspath(args.work), os.path.abspath(args.out)
        self.results_dir, self.log_dir = os.path.join(self.work, "results"), os.path.join(self.work, "logs")
        os.makedirs(self.results_dir, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        self.started = time.monotonic()
        self.mode = args.launch or ("fork" if args.cpu else "spawn")
        self.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        self.rows = [row for key in args.rows.split(",") if key.strip() for row in ROWS if row.key == key.strip()]
        unknown = set(args.rows.split(",")) - set(ROW_KEYS)
        if unknown or not self.rows:
            raise SystemExit(f"gpu_check.py: --rows: unknown {sorted(unknown)}; rows: {', '.join(ROW_KEYS)}")
        self.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        if set(self.backends) - set(BACKEND_SETTINGS) or not self.backends:
            raise SystemExit(f"gpu_check.py: --backends {args.backends!r}: expected default and/or torch")
        self.data_bin = os.path.join(self.work, "data-bin")
        self.teacher = os.path.abspath(args.teacher or os.path.join(self.work, "ckpt", "teacher", "checkpoint_last.pt"))
        students = os.path.join(self.work, "ckpt", "gpu-check")
        self.checkpoints = {
            "teacher": self.teacher,
            "blockwise": os.path.join(students, "blockwise-4.pt"),
            "drafter": os.path.join(students, "spec-drafter-8.pt"),
            "nat": os.path.join(students, "fertility-nat.pt"),
        }
        self.arch_args = args.arch_args or (TINY_ARCH if args.cpu else GPU_ARCH)
        self.length_args = f"--min-len {args.length} --max-len-a 0 --max-len-b {args.length}"
        self.state = {
            "command": "python " + shlex.join(sys.argv),
            "state": "running",
            "launch": self.mode,
            "env": None,
            "steps": {},
            "decode": {},
            "train": {},
            "skipped": [],
            "settings": {
                "sentences_batch_1": args.sentences,
                "batches": args.batches,
                "batch_sizes": self.batch_sizes,
                "length": args.length,
                "length_args": self.length_args,
                "profile_sentences": args.profile_sentences,
                "train_updates": args.train_updates,
                "train_warmup": args.train_warmup,
                "arch_args": self.arch_args,
                "budget_seconds": args.budget_seconds,
            },
        }
        self.launcher = Launcher(self.mode, self.log_dir)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def job(self, key: str, kind: str, timeout: float, essential: bool = False, **fields) -> Optional[dict]:
        """Run (or read back) one job; None where it was skipped for the budget."""
        slug = key.replace("/", "-")
        path = os.path.join(self.results_dir, slug + ".json")
        result = read_json(path)
        if result is not None:
            if "error" not in result and not result.get("partial"):
                if self.state["env"] is None and "env" in result:
                    self.state["env"] = result["env"]
                return result
        left = self.args.budget_seconds - self.elapsed()
        if not essential and left < 5:
            self.state["skipped"].append(f"{key}: the budget of {self.args.budget_seconds:g} s was spent")
            self.write()
            return None
        limit = timeout if essential else min(timeout, left)
        job = dict(fields, key=key, kind=kind, result=path, log=os.path.join(self.log_dir, slug + ".log"))
        job.setdefault("cpu", self.args.cpu)
        job.setdefault("threads", self.args.threads)
        if os.path.exists(path):
            os.remove(path)
        began = time.monotonic()
        print(f"[gpu_check {self.elapsed():6.1f}s] {key} ...", flush=True)
        status = self.launcher.run(job, limit)
        seconds = time.monotonic() - began
        result = read_json(path)
        if status is None:  # the numbers it wrote before it was killed, if any
            result = dict(result or {}, error=f"killed after {limit:.0f} s (the job's limit)")
        elif result is None:
            result = {"error": f"exit status {status}, no result (see {job['log']})"}
        result["job_seconds"] = seconds
        result["log"] = os.path.relpath(job["log"], self.work)
        write_json(path, result)
        note = result.get("error") or "ok"
        print(f"[gpu_check {self.elapsed():6.1f}s] {key}: {note} ({seconds:.1f} s)", flush=True)
        if self.state["env"] is None and "env" in result:
            self.state["env"] = result["env"]
        return result

    def step(self, name: str, result: Optional[dict]):
        self.state["steps"][name] = result
        self.write()
        if result is None or "error" in result:
            self.fail(f"step {name} failed: {result and result.get('error')}")

    def fail(self, why: str):
        self.state["state"] = f"failed: {why}"
        self.write()
        self.launcher.close()
        raise SystemExit(f"gpu_check.py: {why}")

    def setup(self):
        args = self.args
        if not any(name.startswith("test.") and name.endswith(".idx") for name in listdir(self.data_bin)):
            raw_dir = args.raw_dir or os.environ.get("MULTI30K_DIR")
            if not raw_dir:
                self.fail("no data-bin in WORK and no raw files (--raw-dir or MULTI30K_DIR)")
            fields = dict(work=self.work, raw_dir=raw_dir, source_lang=args.source_lang, target_lang=args.target_lang)
            fields.update(max_lines=args.max_lines, vocab_size=args.vocab_size)
            self.step("data", self.job("prepare", "prepare", args.setup_timeout, essential=True, **fields))
        else:
            self.state["steps"]["data"] = {"data_bin": self.data_bin, "existing": True}
        if not os.path.isfile(self.teacher):
            updates = args.teacher_updates or (20 if args.cpu else 5000)
            argv = self.train_argv(
                ["--max-tokens", str(self.max_tokens(teacher=True)), "--max-update", str(updates)],
                [
                    "--stop-time-hours",
                    f"{args.teacher_seconds / 3600:.6f}",
                    "--save-dir",
                    os.path.dirname(self.teacher),
                ],
                ["--save-interval", "1000000", "--save-interval-updates", "0"],
            )
            timeout = args.teacher_seconds + args.setup_timeout
            self.step("teacher", self.job("teacher", "train", timeout, essential=True, argv=argv, warmup=5))
            if not os.path.isfile(self.teacher):
                self.fail(f"the teacher's training left no {self.teacher}")
        else:
            self.state["steps"]["teacher"] = {"checkpoint": self.teacher, "existing": True}
        students = {key: path for key, path in self.checkpoints.items() if key != "teacher"}
        if not all(os.path.isfile(path) for path in students.values()):
            fields = dict(teacher=self.teacher, data_bin=self.data_bin, paths=students)
            self.step("students", self.job("students", "build", args.setup_timeout, essential=True, **fields))
        else:
            self.state["steps"]["students"] = {"existing": True, "paths": students}
        self.write()

    def max_tokens(self, teacher: bool = False) -> int:
        if self.args.train_max_tokens and not teacher:
            return self.args.train_max_tokens
        if self.args.cpu:
            return 1000
        return 16384 if teacher else 8192

    def train_argv(self, *extra: List[str]) -> List[str]:
        device = ["--cpu"] if self.args.cpu else ["--fp16"]
        argv = [self.data_bin, "--user-dir", USER_DIR, "--task", "translation_nat", *shlex.split(self.arch_args)]
        argv += shlex.split(TRAIN_OPTIONS) + device
        for words in extra:
            argv += words
        return argv

    def decode(self, batch_size: int):
        args = self.args
        units = args.sentences if batch_size == 1 else args.batches
        profile_units = max(1, min(units, args.profile_sentences if batch_size == 1 else 1))
        for row in self.rows:
            for backends in self.backends:
                key = f"decode/{row.key}/b{batch_size}/{backends}"
                env = dict(row.env)
                env[NAME_ENV] = BACKEND_SETTINGS[backends]
                fields = dict(
                    row=row.key,
                    name=row.name,
                    checkpoint=self.checkpoints[row.checkpoint],
                    args=[a.format(teacher=self.teacher) for a in row.args],
                    incremental=row.incremental,
                    env=env,
                    backends=backends,
                    batch_size=batch_size,
                    units=units,
                    profile_units=profile_units,
                    data_bin=self.data_bin,
                    length_args=self.length_args,
                )
                result = self.job(key, "decode", args.job_timeout, **fields)
                if result is not None:
                    self.state["decode"][key] = result
                self.write()

    def train(self):
        args = self.args
        for backends in self.backends:
            key = f"train/{backends}"
            argv = self.train_argv(
                ["--max-tokens", str(self.max_tokens()), "--max-update", str(args.train_updates), "--no-save"]
            )
            env = {NAME_ENV: BACKEND_SETTINGS[backends]}
            result = self.job(key, "train", args.job_timeout, argv=argv, env=env, warmup=args.train_warmup)
            if result is not None:
                self.state["train"][key] = result
            self.write()

    def run(self):
        write_text(os.path.join(self.work, "gpu_check.pid"), f"{os.getpid()}\n")  # dev/gpu_check.sh polls it
        self.write()
        self.setup()
        for i, batch_size in enumerate(self.batch_sizes):
            self.decode(batch_size)
            if i == 0 and self.args.train_updates > 0:
                self.train()
        self.launcher.close()
        self.state["state"] = "finished"
        self.state["seconds"] = self.elapsed()
        self.write()

    def write(self):
        self.state["elapsed_seconds"] = self.elapsed()
        self.state["verdict"] = verdict(self.state, self.rows, self.batch_sizes)
        write_json(os.path.join(self.out, "gpu_check.json"), self.state)
        write_text(os.path.join(self.out, "gpu_check.md"), markdown(self.state, self.rows, self.batch_sizes))


def listdir(path: str) -> List[str]:
    return os.listdir(path) if os.path.isdir(path) else []


# ----- the report --------------------------------------------------------------------------------------------------


def number(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def ratio(a, b) -> Optional[float]:
    return a / b if a is not None and b else None


def ok(result: Optional[dict]) -> Optional[dict]:
    return result if result and "error" not in result else None


def decode_result(state: dict, row: str, batch_size: int, backends: str) -> Optional[dict]:
    return ok(state["decode"].get(f"decode/{row}/b{batch_size}/{backends}"))


def warm_cold(result: Optional[dict]):
    if result is None:
        return None, None
    return result["cold"]["ms_per_call"], result["warm"]["ms_per_call"]


def verdict(state: dict, rows: List[Row], batch_sizes: List[int]) -> List[str]:
    """Sentences computed from the numbers (none where they are missing)."""
    lines = []
    if str((state["env"] or {}).get("device", "")).startswith("CPU") and state["decode"]:
        lines.append("no CUDA here: PyTorch's CPU attention has no cuDNN backend, so the two settings differ by noise")
    for size in batch_sizes:
        fairseq_cold, fairseq_warm = warm_cold(decode_result(state, "fairseq", size, "default"))
        for key in ("plugin-graphs", "plugin-eager", "plugin-cache"):
            cold, warm = warm_cold(decode_result(state, key, size, "default"))
            if warm is not None and fairseq_warm is not None:
                lines.append(
                    f"batch {size}, default backends: {key} warm {warm:.2f} ms/call vs fairseq greedy "
                    f"{fairseq_warm:.2f} ({ratio(warm, fairseq_warm):.2f}x); cold {cold:.2f} vs {fairseq_cold:.2f} "
                    f"({ratio(cold, fairseq_cold):.2f}x)"
                )
                break
        pairs = []
        for key in ("fairseq", "plugin-graphs"):
            cells = [
                f"{backends} {number(cold)}/{number(warm)}"
                for backends in BACKEND_SETTINGS
                for cold, warm in [warm_cold(decode_result(state, key, size, backends))]
                if warm is not None
            ]
            if cells:
                pairs.append(f"{key}: " + ", ".join(cells))
        if pairs:
            lines.append(f"batch {size}, ms/call cold/warm: " + "; ".join(pairs))
        parts, slower_cold, slower_warm = [], [], []
        for row in rows:
            default, allowed = (
                decode_result(state, row.key, size, "default"),
                decode_result(state, row.key, size, "torch"),
            )
            if default is None or allowed is None:
                continue
            (d_cold, d_warm), (t_cold, t_warm) = warm_cold(default), warm_cold(allowed)
            if None in (d_cold, d_warm, t_cold, t_warm):
                continue
            parts.append(f"{row.key} {ratio(t_cold, t_warm):.1f}x vs {ratio(d_cold, d_warm):.1f}x")
            if t_cold >= 1.5 * d_cold:
                slower_cold.append(f"{row.key} ({t_cold:.1f} vs {d_cold:.1f} ms/call)")
            if t_warm >= 1.2 * d_warm:
                slower_warm.append(f"{row.key} ({t_warm:.2f} vs {d_warm:.2f} ms/call)")
        if parts:
            lines.append(
                f"batch {size}, cold/warm ms per call with cuDNN allowed (torch) vs without (default): "
                + "; ".join(parts)
            )
            lines.append(
                f"batch {size}, cold pass >= 1.5x slower per call with cuDNN allowed: "
                + (", ".join(slower_cold) if slower_cold else "no row")
                + "; warm pass >= 1.2x slower: "
                + (", ".join(slower_warm) if slower_warm else "no row")
            )
    allowed = [r for k, r in state["decode"].items() if k.endswith("/torch") and ok(r)]
    if allowed:
        flag_on = sum(r["cudnn_sdpa_in_decode"] for r in allowed)
        cudnn_ops = sorted(
            {
                k.split("/")[1]
                for k, r in state["decode"].items()
                if ok(r) and any("cudnn" in op for op in r.get("attention_ops", {}))
            }
        )
        default_on = sum(
            r["cudnn_sdpa_in_decode"] for k, r in state["decode"].items() if k.endswith("/default") and ok(r)
        )
        lines.append(
            f"cuDNN SDPA flag on inside inference_step: {flag_on}/{len(allowed)} torch configurations, {default_on} "
            f"default ones; cuDNN attention operators in the profiled passes of: {', '.join(cudnn_ops) or 'no row'}"
        )
    default, allowed = ok(state["train"].get("train/default")), ok(state["train"].get("train/torch"))
    if default and allowed and default.get("warm_updates_per_second") and allowed.get("warm_updates_per_second"):
        lines.append(
            f"training: {default['warm_updates_per_second']:.2f} updates/s without cuDNN attention (default) vs "
            f"{allowed['warm_updates_per_second']:.2f} with it allowed (torch): "
            f"{ratio(default['warm_updates_per_second'], allowed['warm_updates_per_second']):.2f}x; first "
            f"{default['first_updates']} updates {default['first_updates_seconds']:.2f} s vs "
            f"{allowed['first_updates_seconds']:.2f} s"
        )
    return lines


def markdown(state: dict, rows: List[Row], batch_sizes: List[int]) -> str:
    env, settings = state["env"] or {}, state["settings"]
    lines = [
        "# GPU check (issue 64): attention backends and the cost of a decoder call",
        "",
        f"State: {state['state']}, {state['elapsed_seconds']:.0f} s. `{state['command']}`",
        "",
        f"Device: {env.get('device', '?')}; torch {env.get('torch', '?')}, CUDA {env.get('cuda')}, cuDNN "
        f"{env.get('cudnn')}, fairseq {env.get('fairseq', '?')}, Python {env.get('python', '?')}, "
        f"{env.get('precision', '?')}, {env.get('threads', '?')} threads. Every configuration in its own process "
        f"({state['launch']}). Outputs forced to {settings['length']} tokens (`{settings['length_args']}`); batch 1: "
        f"{settings['sentences_batch_1']} sentences a pass, larger batches: {settings['batches']} batches a pass. "
        "Cold: the first pass over those sentences in the process; warm: the same sentences again. ms/call: decode "
        "time over the decoder calls counted (at batch B one call decodes B sentences).",
        "",
    ]
    steps = []
    for name, result in state["steps"].items():
        if not result:
            continue
        if result.get("existing"):
            steps.append(f"{name}: existing")
        elif "error" in result:
            steps.append(f"{name}: FAILED ({result['error']})")
        else:
            extra = ""
            if name == "teacher":
                extra = f", {result.get('updates')} updates"
                if result.get("warm_updates_per_second"):
                    extra += f" ({result['warm_updates_per_second']:.1f}/s after the first {result['first_updates']})"
            steps.append(f"{name}: {result.get('job_seconds', 0):.0f} s{extra}")
    if steps:
        lines += ["Steps: " + "; ".join(steps) + ".", ""]
    lines += ["## Verdict", ""] + [f"- {line}" for line in state["verdict"] or ["(no numbers yet)"]] + [""]
    lines += [
        "## Decoding",
        "",
        "| row | batch | NAT_ATTENTION_BACKENDS | SDPA flags in decode | attention ops (profiled pass) | load s "
        "| first unit ms | cold ms/call | cold after first | warm ms/call | cold/warm | calls/unit | tokens/sentence "
        "| capture failures |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in batch_sizes:
        for row in rows:
            for backends in BACKEND_SETTINGS:
                key = f"decode/{row.key}/b{size}/{backends}"
                result = state["decode"].get(key)
                if result is None:
                    continue
                cold, warm = result.get("cold") or {}, result.get("warm") or {}
                if "error" in result and not cold:
                    lines.append(f"| {row.name} | {size} | {backends} | FAILED: {result['error'][:300]} |")
                    continue
                name = f"{row.name} (FAILED: {result['error'][:300]})" if "error" in result else row.name
                ops = result.get("attention_ops")
                ops = ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in sorted(ops.items())) if ops else "–"
                failures = ", ".join(f"{k}: {v}" for k, v in result.get("capture_failures", {}).items()) or "0"
                cells = [
                    name,
                    str(size),
                    backends,
                    "; ".join(result.get("sdpa_flags_in_decode", [])),
                    ops,
                    number(result.get("load_seconds"), 1),
                    number(cold.get("first_unit_ms"), 1),
                    number(cold.get("ms_per_call")),
                    number(cold.get("ms_per_call_after_first")),
                    number(warm.get("ms_per_call")),
                    number(ratio(cold.get("ms_per_call"), warm.get("ms_per_call"))),
                    number(cold.get("calls_per_unit"), 1),
                    number(cold.get("tokens_per_sentence"), 1),
                    failures,
                ]
                lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if state["train"]:
        lines += [
            "## Training (fairseq-train through translation_nat, the teacher's architecture)",
            "",
            "| NAT_ATTENTION_BACKENDS | SDPA flags in train_step | updates | first updates s | warm ms/update "
            "| warm updates/s |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for key, result in state["train"].items():
            if "error" in result:
                lines.append(f"| {key.split('/')[1]} | FAILED: {result['error'][:200]} |")
                continue
            cells = [
                key.split("/")[1],
                "; ".join(result["sdpa_flags_in_train_step"]),
                str(result["updates"]),
                f"{number(result.get('first_updates_seconds'))} ({result.get('first_updates')})",
                number(result.get("warm_ms_per_update"), 1),
                number(result.get("warm_updates_per_second")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if state["skipped"]:
        lines += ["Skipped: " + "; ".join(state["skipped"]), ""]
    tables = [(k, r) for k, r in state["decode"].items() if ok(r) and r.get("profile_table")]
    if tables:
        lines += ["## Profiles (default backends, one warm pass)", ""]
        for key, result in tables:
            _, row, size, _ = key.split("/")
            lines += [
                f"### {row}, batch {size[1:]}: {result['profiled']['units']} units, by {result['profile_sort']}",
                "",
                "```",
                result["profile_table"].rstrip(),
                "```",
                "",
            ]
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        sys.exit(child_main())
    args = get_parser().parse_args()
    check = Check(args)
    try:
        check.run()
    except Exception as error:  # a bug of the check itself: said in the report, which keeps what was measured
        check.state["state"] = f"failed: {type(error).__name__}: {error}"
        check.write()
        raise
    finally:
        check.launcher.close()


if __name__ == "__main__":
    main()
