"""Where the time of the fertility NAT through ONNX Runtime goes at batch 1 on this CPU: a trained NAT's exported
graphs (``nat-export-onnx``) decode the test split one sentence at a time, as fairseq-generate does
(``task.inference_step`` with ``--onnx-model``), and each sentence's time is split into the encoder graph (embedding,
encoder layers, fertility predictor), the host work between and around the graphs (fertility choice, the copy of the
source inputs, the hypotheses) and the decoder graph (decoder layers, output projection and argmax); inside each graph
ONNX Runtime's own profile (a second pass, profiled) splits the operators' kernel time by the module that made them.

    python dev/onnx_stages.py DATA_BIN CHECKPOINT GRAPHS_DIR [--sentences 300] [--threads 1] [--json OUT]

e.g. ``python dev/onnx_stages.py work/multi30k-cpu/data-bin work/multi30k-cpu/ckpt/fertility-nat/checkpoint_last.pt
work/multi30k-cpu/ckpt/fertility-nat-onnx/int8``. Prints ms per sentence (medians and means) by stage, the CPU and
versions; run it alone on the machine.
"""

import argparse
import collections
import json
import os
import platform
import statistics
import tempfile
import time
from argparse import Namespace

import onnxruntime
import torch
from fairseq import checkpoint_utils, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import nat_plugins  # noqa: F401  (registers the plugin's models and task)
from nat_plugins.engine import cpu_model
from nat_plugins.systems.fertility_nat.onnx_decoding import session

# operator name prefixes of the exported modules -> the stage they belong to (first match)
STAGES = (
    ("/fertility_predictor", "fertility predictor"),
    ("/encoder/layers", "encoder layers"),
    ("/encoder", "encoder embedding"),
    ("/decoder/nad/layers", "decoder layers"),
    ("/decoder/nad", "decoder inputs"),
    ("/decoder", "output projection, argmax"),
)


class Timed:
    """An ONNX Runtime session whose ``run`` calls are timed (seconds of the last call in ``last``)."""

    def __init__(self, inner):
        self.inner, self.last = inner, 0.0

    def run(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.inner.run(*args, **kwargs)
        self.last = time.perf_counter() - start
        return out


def stage_of(name: str, graph: str) -> str:
    return next((stage for prefix, stage in STAGES if name.startswith(prefix)), f"{graph}: other operators")


def profile_split(path: str, graph: str, sentences: int) -> dict:
    """ms per sentence by stage from an ONNX Runtime profile (its "Node" events)."""
    with open(path) as f:
        events = json.load(f)
    totals = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[stage_of(event["name"][: -len("_kernel_time")], graph)] += event["dur"]
    return {stage: micros / 1000 / sentences for stage, micros in totals.most_common()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_bin")
    parser.add_argument("checkpoint")
    parser.add_argument("graphs", help="a directory written by nat-export-onnx (float32 or --int8)")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task_args = Namespace(task="translation_nat", data=args.data_bin, onnx_model=args.graphs)
    task = tasks.setup_task(convert_namespace_to_omegaconf(task_args).task)
    task.load_dataset("test")
    models, _ = checkpoint_utils.load_model_ensemble([args.checkpoint], task=task)
    model = models[0].eval()
    generator = task.build_generator([model], Namespace(beam=1, max_len_a=1.2, max_len_b=10))
    onnx = generator.onnx
    dataset = task.dataset("test")
    count = min(args.sentences, len(dataset) - args.warmup)
    graphs = onnx.manifest["graphs"]
    paths = {graph: os.path.join(args.graphs, graphs[graph]) for graph in ("encoder", "decoder")}
    seconds = collections.defaultdict(list)  # the pass timed as fairseq-generate runs it: no profiling
    for graph, path in paths.items():
        setattr(onnx, graph, Timed(session(path, args.threads)))
    for i in range(args.warmup + count):
        sample = dataset.collater([dataset[i]])
        start = time.perf_counter()
        task.inference_step(generator, [model], sample)
        total = time.perf_counter() - start
        if i >= args.warmup:
            seconds["total"].append(total)
            seconds["encoder graph"].append(onnx.encoder.last)
            seconds["decoder graph"].append(onnx.decoder.last)
            seconds["host (fertilities, copy, hypotheses)"].append(total - onnx.encoder.last - onnx.decoder.last)
    profiles = {}  # then the same sentences again with ONNX Runtime's profiler on (slower: its shares only)
    with tempfile.TemporaryDirectory() as scratch:
        for graph, path in paths.items():
            setattr(onnx, graph, session(path, args.threads, profile_prefix=os.path.join(scratch, graph)))
        for i in range(args.warmup + count):
            task.inference_step(generator, [model], dataset.collater([dataset[i]]))
        for graph in paths:
            profiles[graph] = profile_split(getattr(onnx, graph).end_profiling(), graph, args.warmup + count)
    result = {
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "threads": args.threads,
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "graphs": os.path.abspath(args.graphs),
        "int8": onnx.int8,
        "sentences": count,
        "ms_per_sentence_median": {k: 1000 * statistics.median(v) for k, v in seconds.items()},
        "ms_per_sentence_mean": {k: 1000 * statistics.fmean(v) for k, v in seconds.items()},
        # the operators' kernel time in a second, profiled pass (warm-up sentences included): their split, not the
        # pass's time (the profiler slows every run)
        "operators_ms_per_sentence": profiles,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
