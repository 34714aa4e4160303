"""What one decoder call costs at batch 1 on the CPU, for several ways of decoding: decoder calls per sentence, ms per
call, aten ops per call and the share of the wall time spent inside aten ops (the rest is Python between them:
dispatch and the generator's bookkeeping). The plugin's greedy loop, SAT, RecoverSAT and the speculative drafter are
shown with their static decoder step (traced, the CPU's default), that step run eagerly (``NAT_TRACED_STEP=0``) and with
fairseq's incremental cache, the path it replaced; the greedy loop also with an int8 copy of the teacher's decoder
(``--int8-decoder``).

    python dev/call_profile.py WORK [--sentences N] [--threads T] [--out FILE.md] [--greedy-only]
        [--rows NAME ...] [--drafter CKPT ...]

WORK is a quickstart work directory: ``data-bin/`` (split ``test``), ``ckpt/teacher/checkpoint_best.pt`` and the
students' ``ckpt/<step>/checkpoint_last.pt`` that exist (a missing one skips its row, with a note); the students' rows
are the quickstart's (:data:`CATALOGUE_ROWS`, with the catalogue's arguments).

Every row is loaded and decoded by the benchmark's own objects (:func:`nat_plugins.bench.measure.generation_cfg`,
:class:`~nat_plugins.bench.measure.FairseqRunner`): fairseq-generate's command line with ``--cpu``, float32 and
``--max-len-a 1.2 --max-len-b 10`` for every row, the sentence collated off the clock, ``task.inference_step`` on
it, under ``torch.no_grad()``. One sentence at a time:

* warm-up: each row on the first 5 test sentences, not counted;
* timed pass: the next N sentences, the rows taking turns on each sentence (interleaved, as the benchmark times its
  rows, so that a slower spell of the machine falls on every row; who goes first alternates). ms / sentence is their
  median; decoder calls / sentence the mean of the benchmark's count
  (:class:`~nat_plugins.bench.measure.DecoderPassCounter`: runs of any decoder layer stack, speculative decoding's
  teacher calls included); ms / call their total time over their total calls (the encoder and the generator's
  per-sentence work spread over the calls, as the benchmark's ``ms_per_decoder_call``);
* profiled pass: the first 10 timed sentences again under ``torch.profiler`` (CPU activity), each
  ``task.inference_step`` in a ``record_function`` range. Counted are the top-level aten ops of those ranges: events
  named ``aten::*`` with no ``aten::*`` event above them (``aten::linear`` counts once, not with its
  ``aten::addmm``). aten ops / call is their number over the pass's decoder calls; % wall in aten ops the sum of
  their CPU time (their inner ops included) over the pass's wall time. The profiler's own cost per op lengthens both,
  so the share is an estimate of the split, not a timing;
* same tokens as fairseq greedy: the timed sentences whose best hypothesis has the first row's token ids, for the
  rows that print the teacher's greedy output (:func:`~nat_plugins.bench.measure.prints_teacher_greedy`, as the
  benchmark's exact check decides); "–" for the others;
* a row that drafts (blockwise, speculative decoding): ms per drafting call (host time of the drafter's calls or of
  blockwise's heads, timed by the benchmark's :class:`~nat_plugins.bench.measure.DraftingTimer`) and the rest of its
  time per verifier call (the teacher's call, the encoder pass, the loop's work). ``--drafter CKPT`` adds a drafter
  decoded as the quickstart's exact speculative row.
"""

import argparse
import logging
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import nat_plugins
from nat_plugins.bench.measure import (
    FairseqRunner,
    batch1_stats,
    generation_cfg,
    load_split,
    prints_teacher_greedy,
)
from nat_plugins.bench.rows import RowSpec, plugin_int8_spec, plugin_layout_spec, teacher_specs
from nat_plugins.engine.block_call import IncrementalCache
from nat_plugins.engine.config import TRACED_STEP_ENV
from nat_plugins.engine.static_cache import StaticCache
from nat_plugins.generators.verify_accept_loop import GreedyLoop

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # nat_recipes/, beside the package
from nat_recipes import catalogue  # noqa: E402

WARMUP = 5
PROFILED = 10
LENGTH_LIMIT = "--max-len-a 1.2 --max-len-b 10"
DECODE_RANGE = "call_profile.decode"
# the quickstart's rows profiled after the teacher's (their arguments: nat_recipes/catalogue.py, PRESET=cpu)
CATALOGUE_ROWS = (
    "Speculative k=3, exact",
    "Blockwise k=4 frozen, exact",
    "NAT, argmax fertility",
    "SAT K=2, greedy",
    "RecoverSAT K=2",
)  # the profiler range around one task.inference_step


@dataclass
class Way:
    """One way of decoding: the benchmark's row specification and, where the row changes the generator the task
    builds, that change."""

    spec: RowSpec
    adapt: Optional[Callable[[object], None]] = None


@dataclass
class Profile:
    """A row's measurements (seconds; ``calls`` None where decoder calls are not observable)."""

    name: str
    seconds: List[float]  # per timed sentence
    calls: Optional[int]  # over the timed pass
    ids: Dict[int, Tuple[int, ...]]  # best hypothesis' token ids of each timed sentence
    aten_ops: int  # top-level aten ops of the profiled pass
    aten_seconds: float
    profiled_seconds: float
    profiled_calls: Optional[int]
    claims_greedy: bool
    # a verify-accept row on the CPU: ms per drafting call and the rest per verifier call over the timed pass, as the
    # benchmark splits them (batch1_stats; None: a row that does not draft)
    drafting_ms_per_call: Optional[float] = None
    verify_ms_per_call: Optional[float] = None


def use_incremental_cache(generator):
    """The plugin's greedy loop with fairseq's ``incremental_state`` instead of the static step."""
    if not isinstance(generator, GreedyLoop):
        raise SystemExit(f"call_profile.py: expected the plugin's GreedyLoop, got {type(generator).__name__}")

    def new_cache(encoder_out, length):
        return IncrementalCache(generator.verifier.decoder)

    generator.new_cache = new_cache


def use_eager_step(generator):
    """The generator with its static decoder step run eagerly, op by op from Python (``NAT_TRACED_STEP=0`` while it
    decodes), instead of the CPU's default trace (nat_plugins/engine/static_cache.py)."""
    generate = generator.generate

    def eager_generate(*args, **kwargs):
        before = os.environ.get(TRACED_STEP_ENV)
        os.environ[TRACED_STEP_ENV] = "0"
        try:
            return generate(*args, **kwargs)
        finally:
            if before is None:
                del os.environ[TRACED_STEP_ENV]
            else:
                os.environ[TRACED_STEP_ENV] = before

    generator.generate = eager_generate


def use_plain_static_loop(generator, scores=False):
    """The floor under the plugin's greedy loop: the same static decoder step on the same weights in the plainest
    loop (one token a step, the output projection, pad masked, EOS held back below --min-len and forced at the length
    limit, an argmax and one host sync on EOS), no scores, no batch bookkeeping. Batch 1 only; its tokens are the
    plugin loop's, up to near-ties. ``scores``: also each token's log-probability (fairseq's positional scores, which
    the plugin's loop returns), a logsumexp over the vocabulary per token."""
    if not isinstance(generator, GreedyLoop):
        raise SystemExit(f"call_profile.py: expected the plugin's GreedyLoop, got {type(generator).__name__}")
    model = generator.verifier
    decoder, eos, pad = model.decoder, generator.eos, generator.pad
    slots = torch.arange(4096).view(-1, 1, 1)  # slot t as a (1, 1) tensor, made once

    def generate(models, sample, **kwargs):
        src_tokens = sample["net_input"]["src_tokens"]
        if src_tokens.size(0) != 1:
            raise SystemExit("call_profile.py: the plain static loop decodes batch 1 only")
        max_len = int(generator.max_lengths(src_tokens.new_full((1,), src_tokens.size(1)), generator.max_positions - 1))
        encoder_out = model.encoder.forward_torchscript(sample["net_input"])
        cache = StaticCache(decoder, encoder_out, max_len + 2)
        token, output, positional_scores = src_tokens.new_full((1, 1), eos), [], []
        for t in range(max_len + 1):
            logits = decoder.output_layer(cache.step(token, slots[t], slots[t]))[:, -1]
            logsumexp = logits.logsumexp(dim=-1, keepdim=True) if scores else None
            logits[:, pad] = -math.inf
            if t < generator.min_len:
                logits[:, eos] = -math.inf
            if t == max_len:
                logits[:, :eos] = logits[:, eos + 1 :] = -math.inf
            best, token = logits.max(dim=-1, keepdim=True)
            output.append(token)
            if scores:
                positional_scores.append(best - logsumexp)
            if token.item() == eos:
                break
        tokens = torch.cat(output, dim=1)[0]
        positional = torch.cat(positional_scores, dim=1)[0] if scores else torch.zeros(len(tokens))
        return [[{"tokens": tokens, "score": 0.0, "positional_scores": positional, "alignment": None}]]

    generator.generate = generate


def use_fairseq_drafter_cache(generator):
    """Speculative decoding's drafter on fairseq's ``incremental_state`` (rolled back after each call) instead of the
    static step's buffers."""
    generator.new_drafter_cache = lambda max_len: {}


def use_fairseq_group_cache(generator):
    """SAT's or RecoverSAT's greedy decoding with fairseq's ``incremental_state`` instead of the static step."""
    generator.model.decoder.new_cache = lambda encoder_out, length: {}


def ways_of(work: str) -> Tuple[List[Way], List[str]]:
    """The rows whose checkpoints are in ``work`` and a note for each one skipped."""
    teacher = os.path.join(work, "ckpt", "teacher", "checkpoint_best.pt")
    if not os.path.isfile(teacher):
        raise SystemExit(f"call_profile.py: no teacher checkpoint {teacher}")
    plugin = plugin_layout_spec(teacher)
    ways = [
        Way(replace(teacher_specs(teacher, 1)[1], name="fairseq greedy (SequenceGenerator)")),
        Way(replace(plugin, name="plugin greedy, static step")),
        Way(replace(plugin, name="plugin greedy, eager static step"), use_eager_step),
        Way(replace(plugin, name="plain loop over the static step (the floor)"), use_plain_static_loop),
        Way(
            replace(plugin, name="the floor + positional scores"),
            lambda generator: use_plain_static_loop(generator, scores=True),
        ),
        Way(replace(plugin, name="plugin greedy, fairseq's incremental cache"), use_incremental_cache),
        Way(replace(plugin_int8_spec(teacher), name="plugin greedy, int8 decoder (--int8-decoder)")),
    ]
    run = catalogue.Run(work, os.path.join(work, "data-bin"), teacher, "checkpoint_last.pt")
    skipped = []
    for row in catalogue.rows("cpu"):
        if row.name not in CATALOGUE_ROWS:
            continue
        spec = row.spec(run, catalogue.PRESETS["cpu"])  # the quickstart's arguments (int8 drafts included)
        if os.path.isfile(spec.checkpoint):
            ways.append(Way(spec))
            if row.step in ("sat-2", "recover-sat-2"):
                ways.append(
                    Way(replace(spec, name=f"{row.name}, fairseq's incremental cache"), use_fairseq_group_cache)
                )
            if row.name == CATALOGUE_ROWS[0]:
                ways.append(
                    Way(replace(spec, name=f"{row.name}, drafter on fairseq's cache"), use_fairseq_drafter_cache)
                )
            if row.step != "fertility-nat":  # the NAT's one pass has no static step
                ways.append(Way(replace(spec, name=f"{row.name}, eager static step"), use_eager_step))
        else:
            skipped.append(f"{row.name}: no {os.path.relpath(spec.checkpoint, work)}")
    return ways, skipped


def benchmark_args(work: str) -> SimpleNamespace:
    """The benchmark options :func:`generation_cfg` reads, as a CPU run at batch 1 with the common length limit."""
    return SimpleNamespace(
        data_bin=os.path.join(work, "data-bin"),
        user_dir=os.path.dirname(os.path.abspath(nat_plugins.__file__)),
        gen_subset="test",
        batch_size=1,
        seed=1,
        post_process="sentencepiece",
        source_lang=None,
        target_lang=None,
        fp16=False,
        generate_args=LENGTH_LIMIT,
    )


def decode_one(runner: FairseqRunner, index: int) -> Tuple[float, Optional[int]]:
    """Decode sentence ``index`` as the benchmark times it: seconds of ``task.inference_step`` and decoder calls."""
    sample = runner.inputs([index])
    with record_function(DECODE_RANGE):
        start = time.perf_counter()
        best = runner.decode(sample)
        seconds = time.perf_counter() - start
    runner.record(sample, best)
    return seconds, runner.outputs[index].passes


def top_level_aten(events) -> list:
    """The ``aten::*`` events inside a :data:`DECODE_RANGE` range with no ``aten::*`` event above them."""
    found = []
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and parent.name != DECODE_RANGE and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is not None and parent.name == DECODE_RANGE:
            found.append(event)
    return found


def total_calls(calls: List[Optional[int]]) -> Optional[int]:
    return None if None in calls else sum(calls)


@torch.no_grad()
def measure(runners: List[FairseqRunner], timed: range) -> List[Profile]:
    """Each row's warm-up; the timed pass over ``timed``, the rows taking turns sentence by sentence (a slower spell
    of the machine falls on all of them); then each row's profiled pass over the first :data:`PROFILED` sentences."""
    for runner in runners:
        for index in range(WARMUP):
            decode_one(runner, index)
    timings = {runner.spec.name: [] for runner in runners}
    for index in timed:
        for runner in runners if index % 2 else runners[::-1]:  # who goes first alternates
            timings[runner.spec.name].append(decode_one(runner, index))
    profiles = []
    for runner in runners:
        seconds, calls = zip(*timings[runner.spec.name])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            profiled = [decode_one(runner, index) for index in timed[:PROFILED]]
        aten = top_level_aten(prof.events())
        split = batch1_stats({index: 1000 * s for index, s in zip(timed, seconds)}, runner.outputs)
        profiles.append(
            Profile(
                name=runner.spec.name,
                seconds=list(seconds),
                calls=total_calls(list(calls)),
                ids={index: runner.outputs[index].ids for index in timed},
                aten_ops=len(aten),
                aten_seconds=sum(event.cpu_time_total for event in aten) / 1e6,
                profiled_seconds=sum(s for s, _ in profiled),
                profiled_calls=total_calls([c for _, c in profiled]),
                claims_greedy=runner is runners[0] or prints_teacher_greedy(runner, runners[0]),
                drafting_ms_per_call=split.drafting_ms_per_call,
                verify_ms_per_call=split.verify_ms_per_call,
            )
        )
        print(f"call_profile.py: {runner.spec.name} profiled", file=sys.stderr)
    return profiles


def same_tokens(row: Profile, greedy: Profile) -> str:
    if row is greedy:
        return "reference"
    if not row.claims_greedy:
        return "–"
    return f"{sum(ids == greedy.ids[index] for index, ids in row.ids.items())}/{len(row.ids)}"


def table_row(row: Profile, greedy: Profile) -> str:
    n = len(row.seconds)
    cells = [row.name, f"{1000 * statistics.median(row.seconds):.2f}"]
    if row.calls:
        cells += [f"{row.calls / n:.1f}", f"{1000 * sum(row.seconds) / row.calls:.3f}"]
    else:
        cells += ["–", "–"]
    cells.append(f"{row.aten_ops / row.profiled_calls:.0f}" if row.profiled_calls else "–")
    cells.append(f"{100 * row.aten_seconds / row.profiled_seconds:.0f}%")
    cells.append(same_tokens(row, greedy))
    if row.drafting_ms_per_call is None:  # a row that does not draft
        cells += ["–", "–"]
    else:  # the drafter's share, the rest per verifier call
        cells += [f"{row.drafting_ms_per_call:.3f}", f"{row.verify_ms_per_call:.3f}"]
    return "| " + " | ".join(cells) + " |"


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")


def report(rows: List[Profile], skipped: List[str], sentences: int, command: str) -> str:
    lines = [
        f"Decoder calls at batch 1: {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"{sentences} sentences after {WARMUP} warm-up, aten ops profiled on the first {min(PROFILED, sentences)}, "
        f"length limit {LENGTH_LIMIT}",
        "",
        f"`{command}`",
        "",
        "| way | ms / sentence (median) | decoder calls / sentence | ms / call | aten ops / call "
        "| % wall in aten ops | same tokens as fairseq greedy | ms / drafting call | ms / verifier call (the rest) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [table_row(row, rows[0]) for row in rows]
    if skipped:
        lines += [""] + [f"Skipped {note}" for note in skipped]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", help="quickstart work directory (data-bin/, ckpt/)")
    parser.add_argument("--sentences", type=int, default=100, help="timed test sentences (default: 100)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--out", default=None, metavar="FILE.md", help="also write the table to FILE.md")
    parser.add_argument(
        "--greedy-only",
        action="store_true",
        help="the teacher's greedy searches only (fairseq's, the plugin's, the floor)",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=None,
        metavar="NAME",
        help="only these rows (their names in the table) after fairseq greedy, the reference",
    )
    parser.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="CKPT",
        help="also a spec_drafter checkpoint, decoded as the quickstart's exact speculative row (repeatable)",
    )
    args = parser.parse_args()
    # force: importing fairseq_cli.generate (measure.py) already configured the root logger at INFO
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING").upper(), stream=sys.stderr, force=True)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    ways, skipped = ways_of(args.work)
    speculative = next((way.spec for way in ways if way.spec.name == CATALOGUE_ROWS[0]), None)
    for path in args.drafter:
        if speculative is None:
            raise SystemExit(f"call_profile.py: --drafter needs the quickstart's {CATALOGUE_ROWS[0]!r} row")
        name = f"{CATALOGUE_ROWS[0]}, drafter {os.path.relpath(path, args.work)}"
        ways.append(Way(replace(speculative, name=name, checkpoint=os.path.abspath(path))))
    if args.greedy_only:
        ways = [way for way in ways if way.spec.checkpoint == ways[0].spec.checkpoint]
    if args.rows:
        unknown = set(args.rows) - {way.spec.name for way in ways}
        if unknown:
            raise SystemExit(f"call_profile.py: --rows: no row named {', '.join(sorted(unknown))}")
        ways = ways[:1] + [way for way in ways[1:] if way.spec.name in args.rows]
    for note in skipped:
        print(f"call_profile.py: skipping {note}", file=sys.stderr)
    options = benchmark_args(args.work)
    cfgs = [generation_cfg(options, way.spec, use_cuda=False) for way in ways]
    _, dataset = load_split(cfgs[0], ways[0].spec.name)
    if not 0 < args.sentences <= len(dataset) - WARMUP:
        raise SystemExit(f"call_profile.py: --sentences {args.sentences}: the split has {len(dataset)} sentences")
    timed = range(WARMUP, WARMUP + args.sentences)
    runners = []
    for way, cfg in zip(ways, cfgs):
        runner = FairseqRunner(way.spec, cfg, options.seed, len(dataset))
        if way.adapt is not None:
            way.adapt(runner.decoder.generation.generator)
        runners.append(runner)
    rows = measure(runners, timed)
    text = report(rows, skipped, args.sentences, "python " + shlex.join(sys.argv))
    print(text, end="")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
