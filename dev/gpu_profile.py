"""Where a row's batch-1 time goes on the device at hand: the question the first GPU run left (docs/results.md, GPU
section: the plugin's decoders ran slower than fairseq's there, and identical code took 10x longer in the row warmed up
first).

Every row (the benchmark's teacher rows, the greedy teacher through the plugin's loop, and each ``--system``, with the
benchmark's own syntax) decodes the same N test sentences at batch 1 twice, cold then warm (the same shapes again),
a third time without the static step's CUDA graphs (``NAT_CUDA_GRAPHS=0``: the same buffers run eagerly; a row off
the static step decodes as before), then a profiled pass over N new sentences: a row whose warm pass is much faster
than its cold one pays for shapes it has not seen (kernel selection, allocation, plans), not for its arithmetic.
Prints ms per sentence per pass, the SDPA backends torch enables, and each row's 12 costliest operators
(torch.profiler, self CPU time) of the profiled pass; writes the same to OUT/gpu_profile.txt.

    python dev/gpu_profile.py WORK OUT [--sentences 20] [--system 'NAME=CKPT::ARGS' ...] [--cpu]
e.g. after dev/gpu_table.sh: python dev/gpu_profile.py /tmp/natgpu/multi30k-gpu $OUT \\
    --system 'NAT, argmax fertility=/tmp/natgpu/multi30k-gpu/ckpt/fertility-nat/checkpoint_last.pt::--beam 1'
"""

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from nat_plugins.bench import benchmark
from nat_plugins.bench.measure import FairseqRunner, generation_cfg
from nat_plugins.bench.rows import TEACHER_BEAM
from nat_plugins.engine.config import CUDA_GRAPHS_ENV, STATE


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", help="a quickstart's work directory (data-bin, ckpt/teacher, raw/test.de)")
    parser.add_argument("out", help="where gpu_profile.txt goes")
    parser.add_argument("--sentences", type=int, default=20, help="sentences a pass (default: 20)")
    parser.add_argument("--system", action="append", default=[], help="a row, as the benchmark's --system")
    parser.add_argument("--cpu", action="store_true", help="on the CPU in fp32 (a rehearsal)")
    args = parser.parse_args()
    use_cuda = torch.cuda.is_available() and not args.cpu
    argv = [
        os.path.join(args.work, "data-bin"),
        "--teacher",
        os.path.join(args.work, "ckpt", "teacher", "checkpoint_best.pt"),
        "--reference",
        os.path.join(args.work, "raw", "test.de"),
        "--out-dir",
        args.out,
        "--batch-size",
        "1",
        "--generate-args",
        "--max-len-a 1.2 --max-len-b 10",
        *(["--cpu"] if not use_cuda else ["--fp16"]),
        *[word for system in args.system for word in ("--system", system)],
    ]
    bench_args = benchmark.get_parser().parse_args(argv)
    specs = [spec for spec in benchmark.row_specs(bench_args) if spec.role != TEACHER_BEAM]
    with open(bench_args.reference, encoding="utf-8") as f:
        num_sentences = sum(1 for _ in f)
    runners = [FairseqRunner(spec, generation_cfg(bench_args, spec, use_cuda), 1, num_sentences) for spec in specs]
    n = args.sentences
    lines = [
        f"device: {torch.cuda.get_device_name() if use_cuda else 'CPU'}; torch {torch.__version__}; "
        f"{'fp16' if use_cuda else 'fp32'}; {n} sentences a pass",
    ]
    if use_cuda:
        backends = torch.backends.cuda
        lines.append(
            f"SDPA backends enabled: flash {backends.flash_sdp_enabled()}, memory-efficient "
            f"{backends.mem_efficient_sdp_enabled()}, cuDNN {backends.cudnn_sdp_enabled()}, math "
            f"{backends.math_sdp_enabled()}"
        )

    def ms_per_sentence(runner, ids):
        start = time.perf_counter()
        for i in ids:
            runner.decode(runner.inputs([i]))
        return 1000 * (time.perf_counter() - start) / len(ids)

    lines.append(
        "| row | cold ms / sentence | warm (same sentences) | warm, no CUDA graphs | new sentences, profiled |"
    )
    lines.append("|---|---:|---:|---:|---:|")
    tables = []
    for runner in runners:
        cold = ms_per_sentence(runner, range(n))
        warm = ms_per_sentence(runner, range(n))
        os.environ[CUDA_GRAPHS_ENV] = "0"
        without_graphs = ms_per_sentence(runner, range(n))
        del os.environ[CUDA_GRAPHS_ENV]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
        with profile(activities=activities) as profiled:
            new = ms_per_sentence(runner, range(n, 2 * n))
        lines.append(f"| {runner.spec.name} | {cold:.1f} | {warm:.1f} | {without_graphs:.1f} | {new:.1f} |")
        table = profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        tables += ["", f"## {runner.spec.name}", table]
        write(args.out, "\n".join(lines + tables) + "\n")  # a row at a time: a run cut off keeps what it measured
    if STATE.capture_failures:
        lines.append(f"CUDA graph captures that failed (those call shapes ran eagerly): {STATE.capture_failures}")
        write(args.out, "\n".join(lines + tables) + "\n")
    print("\n".join(lines + tables))


def write(out: str, text: str):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_profile.txt.tmp"), "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(os.path.join(out, "gpu_profile.txt.tmp"), os.path.join(out, "gpu_profile.txt"))


if __name__ == "__main__":
    main()
