"""Seconds of each batched pass over the test set of speculative decoding rows, rows taking turns pass by pass: what
the first pass costs beyond the later ones (the static step's traces are made there) and what drafting adds at a
batch size.

    python dev/batch_passes.py WORK CKPT[@N] [CKPT[@N] ...] [--passes 3] [--batch-size 64] [--trace-first-calls]

WORK: a finished quickstart run (its ``data-bin`` and ``ckpt/teacher/checkpoint_best.pt``, the verifier). Each CKPT
is a ``spec_drafter`` checkpoint decoded with exact verification at the CPU's defaults; ``@N`` sets
``--max-drafting-sentences N`` (``@0``: the teacher's greedy steps only). Batches are the test set in fairseq's
length order, ``--batch-size`` sentences each; the length limit is the benchmark's (1.2·|x| + 10).
``--trace-first-calls``: trace every width of the static step at its first call (as before
:data:`~nat_plugins.engine.static_cache.EAGER_CALLS_BEFORE_TRACING`). Prints each row's pass times and its sentences
per second in its fastest pass.
"""

import argparse
import os
import time
from argparse import Namespace

import torch
from fairseq import checkpoint_utils

import nat_plugins  # noqa: F401  (registers the task and models)
from nat_plugins.engine import static_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", help="a finished quickstart run")
    parser.add_argument("rows", nargs="+", help="spec_drafter checkpoints, each optionally @N (drafting limit)")
    parser.add_argument("--passes", type=int, default=3, help="passes over the test set per row")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--trace-first-calls", action="store_true", help="trace every width at its first call")
    args = parser.parse_args()
    if args.trace_first_calls:
        static_cache.EAGER_CALLS_BEFORE_TRACING = 0
    rows = [(row, *row.partition("@")[::2]) for row in args.rows]
    work = os.path.abspath(args.work)
    os.chdir(work)  # the quickstart's checkpoints name their teacher relative to WORK
    generators = []
    for name, path, limit in rows:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [os.path.abspath(os.path.join(work, path))], arg_overrides={"data": "data-bin"}
        )
        task.cfg.spec_drafter_teacher = "ckpt/teacher/checkpoint_best.pt"
        if limit:
            task.cfg.max_drafting_sentences = int(limit)
        model = models[0].eval()
        generators.append((name, model, task.build_generator([model], Namespace(beam=1, max_len_a=1.2, max_len_b=10))))
    task.load_dataset("test")
    dataset = task.dataset("test")
    order = dataset.ordered_indices().tolist()
    batches = [
        dataset.collater([dataset[i] for i in order[start : start + args.batch_size]])
        for start in range(0, len(order), args.batch_size)
    ]
    seconds = {name: [] for name, _, _ in generators}
    with torch.no_grad():
        for _ in range(args.passes):
            for name, model, generator in generators:
                started = time.perf_counter()
                for batch in batches:
                    generator.generate([model], batch)
                seconds[name].append(time.perf_counter() - started)
    flag = " --trace-first-calls" if args.trace_first_calls else ""
    command = f"python dev/batch_passes.py {args.work} {' '.join(args.rows)} --passes {args.passes}"
    print(f"`{command} --batch-size {args.batch_size}{flag}` ({len(dataset)} sentences)\n")
    print("| row | seconds per pass | sentences / s (fastest pass) |\n|---|---|---:|")
    for name, times in seconds.items():
        print(f"| {name} | {', '.join(f'{t:.2f}' for t in times)} | {len(dataset) / min(times):.1f} |")


if __name__ == "__main__":
    main()
