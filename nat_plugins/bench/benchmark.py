"""Speed/quality benchmark of plugin decoders against the AR teacher, as ratios measured in one run.

Every row is decoded through the path ``fairseq_cli/generate.py`` takes (task, checkpoint ensemble,
``task.build_generator``, ``task.inference_step``) on the same device, data, precision and seed. The two
AR-teacher rows use plain ``--task translation`` (fairseq's ``SequenceGenerator``); each ``--system`` row
defaults to ``--task translation_nat --user-dir <nat_plugins>``. Per row:

* BLEU: sacreBLEU (13a) of the detokenized hypotheses of the throughput pass against the raw references;
* speed, one protocol for every row (:mod:`.schedule`): the same units of sentences for all rows (batch 1:
  the first ``--latency-sentences`` after ``--warmup``; batch B: the split's length-sorted batches), dealt into
  ``--rounds`` interleaved blocks and timed round-robin (each round every row on the same block, the rows in a
  random order per round drawn from ``--seed``), fairseq's greedy teacher re-timed at the end (its drift), after a
  cold pass (every row decodes every unit once, timed apart: its cost per new shape, reported beside the warm
  rounds; ``--no-cold-pass`` skips it); the timed region is source ids in, best hypothesis ids out; threads fixed
  (``--threads``), ``OMP_WAIT_POLICY=ACTIVE`` with ``--ctranslate2``; every row attends with the attention
  backends of :mod:`nat_plugins.engine.attention` (fairseq's rows too);
* latency: batch 1, median, 90th percentile and mean per sentence; throughput: batches of ``--batch-size``,
  the median over rounds of sentences per second; ``--batch-sizes``: tokens/s and ms/sentence at each;
* every speedup ("× fairseq greedy", × the beam, plugin-layout and CTranslate2 rows; batch 1, batched, at every
  ``--batch-sizes`` size; tables, plots and ``results.json``) is one statistic: the median over rounds of the paired
  per-round ratio (the reference row's seconds on the round's block / the row's on the same block), shown with its
  range over the rounds; a ``flag`` where the median is no further from 1 than that spread (no settled win);
* the rows that print the teacher's greedy output (:func:`.measure.prints_teacher_greedy`: the teacher
  decoded greedily by the plugin's greedy loop, exact blockwise and speculative decoding, greedy steps only) checked
  against the greedy teacher row token for token in every timed pass (batch 1 and every batch size): the sentences
  that differ, and how many of them are floating-point near-ties (at the first differing token the teacher's
  log-probabilities of the two tokens differ by less than :data:`.measure.NEAR_TIE_TOLERANCE`); a divergence
  that is no near-tie is flagged; with ``--solo`` the solo pass too (``exact_check["solo"]``, and ``["solo B"]``
  with ``--solo-batched``; by token ids: a sentence that is neither the teacher's greedy output nor the row's own
  round-robin output counts as no near-tie);
* decoder calls per sentence and emitted tokens (EOS included) per call, counted on the timed batch-1
  sentences as runs of any decoder layer stack (:class:`.measure.DecoderPassCounter`: fairseq's
  ``SequenceGenerator`` and ``IterativeRefinementGenerator`` and every plugin generator, auxiliary passes such
  as NPD's teacher rescoring and NAD-AD's NAD included), plus the mean of ``hypo["steps"]`` where the generator
  reports it;
* BLEU as % of the teacher beam row's; speedups of latency and throughput against both teacher rows, the greedy
  teacher decoded through ``--task translation_nat`` (the plugin rows' linear layout) and, with ``--ctranslate2``,
  the fastest CTranslate2 greedy row;
* Rep and Mis (Ran et al. 2020, eq. 7-10; :mod:`nat_plugins.cli.rep_mis`): the relative increment (%) of the
  repeated-token ratio (a token equal to any of the 9 before it, eq. 8) and of the ratio of reference tokens
  missing, over the teacher's greedy row; and the two ratios themselves (``rep_ratio``, ``mis_ratio``, %), on the
  words of sacreBLEU's 13a tokenization of the detokenized output and the references (as ``python -m
  nat_plugins.cli.rep_mis`` counts them).

``--paired-test 'BASELINE::SYSTEM'`` adds sacreBLEU's paired bootstrap resampling test (1,000 resamples) of two
rows' BLEU difference: p-value and 95% confidence intervals, in ``results.md`` and ``results.json``.

``--ctranslate2`` adds the teacher decoded by CTranslate2 (beam and greedy at the run's precision and at int8 on
CPU, float16/int8_float16 on GPU; :mod:`.ctranslate2_rows`), the production baseline a fast decoder has to beat,
and counts the sentences where its float32 greedy output differs from fairseq's.

``--int8-decoder-row`` adds the teacher decoded by the plugin's greedy loop with an int8 copy of its decoder
(``--int8-decoder``, CPU): the plugin's row at CTranslate2 int8's precision (not the float32 teacher's output).

``--solo`` also times every greedy engine (fairseq greedy, the plugin rows, CTranslate2 greedy) alone in its own
process, at the OpenMP wait policy and thread count a short calibration picks for it on this machine
(:mod:`.solo`): a table beside the round-robin one in ``results.md``, ``solo`` in ``results.json``.

``--npd-checkpoint CKPT --npd-samples 1,5,10,25,100`` adds one row per number of samples S of noisy parallel decoding
(Gu et al. 2018 §4.1) of a ``fertility_nat`` checkpoint, rescored by the teacher (``NAT, NPD S=<S>``), and
``npd.png``: latency and BLEU against S (their Figure 7), drawn whenever a checkpoint has NPD rows of two or more S
(``--system`` rows decoded with ``--fertility-decoding npd`` count too).

``--time-budget SECONDS`` bounds the whole run (a GPU lent for minutes): every row first decodes its warm-up, timed (a
few batch-1 sentences and a median-length batch), and the plan made from it keeps every row not named by
``--optional-row``, batch 1 on as many latency sentences as fit, then the ``--optional-row`` rows in their order while
both their passes still fit; the rows kept decode the ``--batch-size`` pass (their BLEU), then batch 1 (a round that
ends past the budget is the last), then the other batch sizes whose estimate still fits. ``results.md`` says what was
left out (rows, sentences, rounds, batch sizes).
Every run writes ``progress.json`` after every timing round (:mod:`.progress`): a run cut off still leaves each row's
BLEU and timings so far.

By source length (``--length-buckets``, subwords of the source, EOS excluded): every row's BLEU over each bucket's
sentences and median batch-1 latency over its timed sentences, as a table in ``results.md``/``results.json`` and
the plot ``by_length.png`` (rows chosen with ``--length-plot-rows``; Ran et al. 2020 Fig. 2, Gu et al. 2018 Fig. 7).

``pareto.png``: every row's BLEU as % of the teacher beam row's against its batch-1 latency speedup over it (log
scale), with this run's Pareto front and the papers' own claims (relative to their AR baselines;
:mod:`.paper_points`) as a grey reference.

Outputs in ``--out-dir``: ``results.md``, ``results.json``, ``pareto.png``, ``by_length.png``, ``by_batch_size.png``
(``npd.png``) and
``hyp.<slug>.txt`` (one detokenized hypothesis per line, in test-set order) for every row. The reports name files
(data, checkpoints, references, files in the rows' arguments) relative to ``--work-dir``, the run's work directory.
The plots need matplotlib (the ``plot`` extra); ``--no-plots`` writes the tables alone.
"""

import argparse
import os
import sys
import time
from typing import List, Optional

import torch
from fairseq import utils

import nat_plugins
from nat_plugins.bench.analysis import (
    add_length_buckets,
    add_rep_mis,
    bucket_counts,
    compare,
    paired_bootstrap,
    parse_length_buckets,
    speed_at,
)
from nat_plugins.bench.ctranslate2_rows import compute_types, ctranslate2_runners
from nat_plugins.bench.measure import (
    NEAR_TIE_TOLERANCE,
    FairseqRunner,
    batch1_stats,
    exact_check,
    first_difference,
    generation_cfg,
    load_split,
    make_row,
    pass_check,
    prints_teacher_greedy,
    same_weights,
    solo_exact_check,
    source_lengths,
)
from nat_plugins.bench.progress import Progress
from nat_plugins.bench.report import initial_environment, markdown_table, pyplot, run_metadata, write_report
from nat_plugins.bench.rows import (
    CTRANSLATE2_ROLES,
    SYSTEM,
    TEACHER_GREEDY,
    BenchmarkError,
    RowSpec,
    ctranslate2_specs,
    npd_specs,
    parse_paired_tests,
    parse_system_spec,
    plugin_int8_spec,
    plugin_layout_spec,
    run_cli,
    teacher_specs,
)
from nat_plugins.bench.schedule import TimeBudget, time_batch_sizes
from nat_plugins.bench.solo import add_solo_options, run_solo


def get_parser() -> argparse.ArgumentParser:
    """The benchmark's command-line parser."""
    parser = argparse.ArgumentParser(
        prog="nat-benchmark",
        description="Decode a test set with the AR teacher (beam and greedy) and plugin systems; write "
        "BLEU, batch-1 latency, throughput, decoder calls and speedups to results.md/results.json, a "
        "BLEU-vs-speedup plot (pareto.png) and a by-source-length plot (by_length.png).",
    )
    parser.add_argument("data_bin", help="fairseq data-bin directory (output of fairseq-preprocess)")
    parser.add_argument("--teacher", required=True, help="AR teacher checkpoint (a fairseq transformer)")
    parser.add_argument(
        "--reference",
        required=True,
        help="raw (untokenized) reference file of the split, one line per sentence in data-bin order",
    )
    parser.add_argument("--out-dir", required=True, help="directory for results.md, results.json, the plot, hyps")
    parser.add_argument(
        "--system",
        action="append",
        default=[],
        metavar="'NAME=CHECKPOINT::ARGS'",
        help="a plugin row: display name, checkpoint (':'-separated for an ensemble) and extra fairseq-generate "
        "arguments, which may override the defaults '--task translation_nat --user-dir <nat_plugins>'; "
        "repeat for more rows",
    )
    parser.add_argument(
        "--npd-checkpoint",
        metavar="CKPT",
        help="a fertility_nat checkpoint: one row of noisy parallel decoding per --npd-samples S, rescored by the "
        "teacher ('NAT, NPD S=<S>'), and npd.png, latency and BLEU against S",
    )
    parser.add_argument(
        "--npd-samples",
        metavar="S,S,...",
        help="the numbers of samples of the --npd-checkpoint rows (default: 1,5,10,25,100)",
    )
    parser.add_argument("--gen-subset", default="test", help="data-bin split to decode (default: test)")
    parser.add_argument("--source-lang", "-s", default=None, help="source language (default: from the data-bin)")
    parser.add_argument("--target-lang", "-t", default=None, help="target language (default: from the data-bin)")
    parser.add_argument("--cpu", action="store_true", help="decode on CPU even if CUDA is available")
    parser.add_argument("--fp16", action="store_true", help="decode in half precision (model.half())")
    parser.add_argument(
        "--latency-sentences",
        type=int,
        default=None,
        metavar="N",
        help="time batch-1 latency on the first N sentences of the split, warm-up included (default: all)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=10,
        help="leading batch-1 sentences decoded but left out of the latency and decoder-call statistics (default: 10)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="sentences per batch of the throughput columns; its pass gives the rows' hypotheses (default: 64)",
    )
    parser.add_argument(
        "--batch-sizes",
        default=None,
        metavar="B,B,...",
        help="batch sizes of the speed-against-batch-size table and plot, each timed like the others (batch 1 on "
        "the latency sentences, larger ones on the whole split); 1 and --batch-size are always timed "
        "(default: 1,BATCH_SIZE)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the round-robin timing at every batch size (>= 3): the units of sentences are dealt into "
        "this many interleaved blocks, each round times every row on one block (default: 3)",
    )
    parser.add_argument(
        "--no-cold-pass",
        action="store_true",
        help="skip the cold pass: by default every row decodes every unit of every batch size once before its rounds, "
        "timed apart and reported beside the warm rounds (what a row pays once per new shape: kernel plans, traces, "
        "graph captures), so such a cost is charged to no timed round",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads of torch (torch.set_num_threads) and of CTranslate2 (intra_threads; inter_threads 1) "
        "(default: torch's default)",
    )
    parser.add_argument(
        "--post-process",
        default="sentencepiece",
        help="fairseq --post-process applied to hypotheses before scoring; 'none' for word-level data "
        "(default: sentencepiece)",
    )
    parser.add_argument(
        "--user-dir",
        default=os.path.dirname(os.path.abspath(nat_plugins.__file__)),
        help="fairseq --user-dir for every row (default: the installed nat_plugins package)",
    )
    parser.add_argument(
        "--generate-args",
        default="",
        metavar="'ARGS'",
        help="fairseq-generate arguments given to every row, teacher rows included, before the row's own "
        "(e.g. the same length limit for all: '--max-len-a 1.2 --max-len-b 10')",
    )
    parser.add_argument("--teacher-beam", type=int, default=4, help="beam size of the teacher's beam row (default: 4)")
    parser.add_argument(
        "--paired-test",
        action="append",
        default=[],
        metavar="'BASELINE::SYSTEM'",
        help="sacreBLEU's paired bootstrap resampling test (1000 resamples) of SYSTEM's BLEU against BASELINE's "
        "(two row names); repeat for more pairs",
    )
    parser.add_argument(
        "--ctranslate2",
        action="store_true",
        help="add rows for the teacher decoded by CTranslate2 (beam and greedy): converted once into "
        "OUT_DIR/ctranslate2-teacher, same device, threads, precision and length limit",
    )
    parser.add_argument(
        "--int8-decoder-row",
        action="store_true",
        help="add the teacher decoded by the plugin's greedy loop with an int8 decoder (--int8-decoder; CPU): the "
        "plugin's row at CTranslate2 int8's precision",
    )
    parser.add_argument(
        "--distilled-targets",
        default=None,
        metavar="FILE",
        help="the students' distilled training targets (subword text, e.g. DATA_BIN/train.kd.de.txt): their rate "
        "of immediately repeated subwords goes into the report (a teacher that stutters teaches stuttering)",
    )
    parser.add_argument(
        "--length-buckets",
        default="10,20,30",
        metavar="N,N,...",
        help="upper bounds of the source-length buckets (subwords, EOS excluded) of the by-length table and plot "
        "(default: 10,20,30 = 1-10, 11-20, 21-30, 31+)",
    )
    parser.add_argument(
        "--length-plot-rows",
        action="extend",
        nargs="+",
        default=None,
        metavar="NAME",
        help="row names drawn in by_length.png (default: every row but the CTranslate2 ones); the table has all",
    )
    parser.add_argument(
        "--work-dir",
        default=".",
        metavar="DIR",
        help="the run's work directory: results.md and results.json name files (data, checkpoints, references, "
        "files in the rows' arguments) relative to it (default: the current directory)",
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="write the tables only, no plots (which need matplotlib)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="random seed set before every decoded unit, and of the rows' order in every timing round (default: 1)",
    )
    parser.add_argument("--title", default="Decoding benchmark", help="heading of results.md and the plot")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wall time of the whole benchmark (models loaded to report written): a plan from every row's timed "
        "warm-up keeps the rows and batch-1 sentences that fit, the --optional-row rows last; then the --batch-size "
        "pass (BLEU), batch 1 (a round ending past the budget is the last), the other --batch-sizes that still fit; "
        "what was left out is listed in results.md (default: no budget)",
    )
    parser.add_argument(
        "--optional-row",
        action="append",
        default=[],
        metavar="NAME",
        help="a row decoded only if --time-budget leaves time for it (repeat: highest priority first); every other "
        "row is decoded whatever the budget, batch 1 on fewer sentences if need be",
    )
    add_solo_options(parser)
    return parser


def check_inputs(args, specs: List[RowSpec]) -> List[str]:
    """Fail fast on missing files and bad numbers; returns the reference lines."""
    if not os.path.isdir(args.data_bin):
        raise BenchmarkError(f"DATA_BIN {args.data_bin!r} is not a directory")
    checkpoints = [("--teacher", args.teacher)] + [
        (f"--system {s.name!r}", s.checkpoint) for s in specs if s.role == SYSTEM
    ]
    for option, checkpoint in checkpoints:
        for path in utils.split_paths(checkpoint):
            if not os.path.isfile(path):
                raise BenchmarkError(f"{option}: checkpoint {path!r} does not exist")
    slugs = [spec.slug for spec in specs]
    if len(set(slugs)) != len(slugs):
        raise BenchmarkError(f"row names must differ in their letters and digits (file names: {slugs})")
    if args.batch_size < 1 or args.warmup < 0 or args.teacher_beam < 1:
        raise BenchmarkError("--batch-size and --teacher-beam must be >= 1 and --warmup >= 0")
    if args.rounds < 3:
        raise BenchmarkError(f"--rounds {args.rounds}: at least 3 rounds, so that they can disagree")
    if args.threads is not None and args.threads < 1:
        raise BenchmarkError(f"--threads {args.threads}: expected >= 1")
    if args.time_budget is not None and args.time_budget <= 0:
        raise BenchmarkError(f"--time-budget {args.time_budget}: expected a number of seconds > 0")
    names = [spec.name for spec in specs]
    unknown = [name for name in args.optional_row if name not in names]
    if unknown:
        raise BenchmarkError(f"--optional-row: no row named {unknown[0]!r} (rows: {names})")
    if args.optional_row and args.time_budget is None:
        raise BenchmarkError("--optional-row marks rows the --time-budget may leave out: give a --time-budget too")
    if not os.path.isfile(args.reference):
        raise BenchmarkError(f"--reference {args.reference!r} does not exist")
    if args.distilled_targets is not None and not os.path.isfile(args.distilled_targets):
        raise BenchmarkError(
            f"--distilled-targets {args.distilled_targets!r} does not exist (run_scripts/distill.sh "
            "writes DATA_BIN/train.kd.TGT.txt)"
        )
    with open(args.reference, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def length_plot_rows(args, specs: List[RowSpec]) -> List[str]:
    """The rows of by_length.png: ``--length-plot-rows`` (checked) or every row but the CTranslate2 ones."""
    names = [spec.name for spec in specs]
    if args.length_plot_rows is None:
        return [spec.name for spec in specs if spec.role not in CTRANSLATE2_ROLES]
    unknown = [name for name in args.length_plot_rows if name not in names]
    if unknown:
        raise BenchmarkError(f"--length-plot-rows: no row named {unknown[0]!r} (rows: {names})")
    return list(args.length_plot_rows)


def parse_batch_sizes(text: Optional[str], batch_size: int) -> List[int]:
    """``--batch-sizes 'B,B,...'`` with 1 and ``--batch-size`` added, increasing."""
    try:
        sizes = [int(part) for part in text.split(",")] if text else []
    except ValueError:
        sizes = [0]
    if min(sizes, default=1) < 1:
        raise BenchmarkError(f"--batch-sizes {text!r}: expected numbers >= 1, e.g. 1,8,32,64")
    return sorted(set(sizes) | {1, batch_size})


def row_specs(args) -> List[RowSpec]:
    """The fairseq rows: the teacher's, the greedy teacher through the plugin's loop (and with ``--int8-decoder-row``
    with an int8 decoder), the ``--system`` rows and the ``--npd-checkpoint`` rows, in that order."""
    specs = teacher_specs(args.teacher, args.teacher_beam) + [plugin_layout_spec(args.teacher)]
    if args.int8_decoder_row:
        specs.append(plugin_int8_spec(args.teacher))
    specs += [parse_system_spec(spec) for spec in args.system]
    if args.npd_checkpoint:
        specs += npd_specs(args.npd_checkpoint, args.teacher, args.npd_samples or "1,5,10,25,100")
    elif args.npd_samples:
        raise BenchmarkError("--npd-samples is the number of samples of the --npd-checkpoint rows: give both")
    return specs


def main(args) -> dict:
    """Run the benchmark for parsed ``args``; writes the outputs and returns the content of ``results.json``."""
    started = time.perf_counter()
    use_cuda = torch.cuda.is_available() and not args.cpu
    if not args.no_plots:
        pyplot()  # fails now, not after the decoding, when matplotlib is missing
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    specs = row_specs(args)
    types = compute_types(use_cuda, args.fp16) if args.ctranslate2 else []
    ct2_specs = ctranslate2_specs(args.teacher, args.teacher_beam, types) if args.ctranslate2 else []
    references = check_inputs(args, specs + ct2_specs)
    sizes = parse_batch_sizes(args.batch_sizes, args.batch_size)
    cfgs = [generation_cfg(args, spec, use_cuda) for spec in specs]  # every row's arguments checked up front
    pairs = parse_paired_tests(args.paired_test, [spec.name for spec in specs + ct2_specs])
    buckets = parse_length_buckets(args.length_buckets)
    plot_rows = length_plot_rows(args, specs + ct2_specs)
    task, dataset = load_split(cfgs[0], specs[0].name)  # the teacher's view of the split
    if len(dataset) != len(references):
        raise BenchmarkError(
            f"--reference {args.reference!r} has {len(references)} lines but split "
            f"{args.gen_subset!r} of {args.data_bin!r} has {len(dataset)} sentences"
        )
    num_latency = len(dataset) if args.latency_sentences is None else min(args.latency_sentences, len(dataset))
    if num_latency <= args.warmup:
        raise BenchmarkError(f"--warmup {args.warmup} leaves none of the {num_latency} latency sentences to time")
    os.makedirs(args.out_dir, exist_ok=True)
    latency_ids, warmup_ids = range(args.warmup, num_latency), range(args.warmup)
    length_order = dataset.ordered_indices().tolist()
    # first, while this process holds no OpenMP team that could spin beside the solo processes (bench/solo.py)
    solo = run_solo(args, specs + ct2_specs, len(dataset), warmup_ids, latency_ids, length_order) if args.solo else None
    runners = [FairseqRunner(spec, cfg, args.seed, len(references)) for spec, cfg in zip(specs, cfgs)]
    if args.ctranslate2:  # reported after the teacher's fairseq rows
        runners[2:2] = ctranslate2_runners(args, ct2_specs, task, dataset, use_cuda, threads)
    anchor = next(i for i, runner in enumerate(runners) if runner.spec.role == TEACHER_GREEDY)
    names = [runner.spec.name for runner in runners]
    budget = None
    if args.time_budget is not None:  # a tenth of it kept for the report
        optional = [names.index(name) for name in args.optional_row]
        budget = TimeBudget(started + args.time_budget, reserve=0.1 * args.time_budget, optional=optional)
    progress = Progress(
        args.out_dir, [runner.spec for runner in runners], references, args.batch_size, args.time_budget
    )
    order = [args.batch_size] + [size for size in sizes if size not in (1, args.batch_size)] + [1]  # BLEU first
    load_start = os.getloadavg()
    timings, plan, sizes_skipped = time_batch_sizes(
        runners,
        order,
        args.rounds,
        anchor,
        latency_ids,
        warmup_ids,
        length_order,
        args.seed,
        budget=budget,
        progress=progress,
        cold=not args.no_cold_pass,
        row_done=progress.row_done,
    )
    load_end = os.getloadavg()
    if plan is not None:
        left_out = [runners[k].spec.name for k in plan.left_out]
        runners = [runners[k] for k in plan.rows]
        anchor = next(i for i, runner in enumerate(runners) if runner.spec.role == TEACHER_GREEDY)
        num_latency = args.warmup + plan.sentences
        pairs = [pair for pair in pairs if not set(pair) & set(left_out)]
        plot_rows = [name for name in plot_rows if name not in left_out]
    rows = [row_of(k, runner, timings, args.batch_size, references) for k, runner in enumerate(runners)]
    tolerance = NEAR_TIE_TOLERANCE["fp16" if args.fp16 else "fp32"]
    add_exact_checks(rows, runners, anchor, timings, tolerance)
    add_twin_checks(rows, runners, timings, tolerance)
    if solo:
        solo.check_outputs({runner.spec.name: outputs for runner, outputs in zip(runners, timings[1][1])})
        add_solo_exact_checks(rows, anchor, timings, solo.outputs, tolerance)
        add_solo_twin_checks(rows, runners, timings, solo.outputs, tolerance)
    for row in rows:
        row.write_hyps(args.out_dir)
        row.spec = row.spec.relative_to(args.work_dir)  # as the reports name it
    compare(rows)
    add_rep_mis(rows, references)
    lengths = source_lengths(dataset, task.source_dictionary)
    add_length_buckets(rows, lengths, references, buckets)
    counts = bucket_counts(lengths, rows[0].timed_ids, buckets)  # every row times the same sentences
    meta = run_metadata(args, use_cuda, len(dataset), num_latency, rows, counts, plot_rows)
    meta["timing"] = {
        "protocol": "round-robin over shared blocks, rows in a random order per round (seeded with --seed and the "
        "batch size); anchor: fairseq greedy; every speedup: the median over rounds of paired per-round ratios",
        "rounds": args.rounds,
        "cold_pass": not args.no_cold_pass,
        "batch_sizes": list(timings),
        "threads": threads,
        "ctranslate2_threads": {"intra": 1 if use_cuda else threads, "inter": 1} if args.ctranslate2 else None,
        "omp_wait_policy": initial_environment().get("OMP_WAIT_POLICY"),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "anchor_drift": {str(size): timed.drift for size, (timed, _) in timings.items()},
        "orders": {
            str(size): [[runners[k].spec.name for k in order] for order in timed.order]
            for size, (timed, _) in timings.items()
        },
    }
    if plan is not None:
        meta["latency_sentences_timed"] = timings[1][0].distinct_sentences()
        meta["time_budget"] = {
            "seconds": args.time_budget,
            "spent": round(time.perf_counter() - started, 1),
            "latency_sentences_available": len(latency_ids),
            "latency_sentences_planned": plan.sentences,
            "rounds_cut": {str(size): timed.rounds_cut for size, (timed, _) in timings.items()},
            "batch_sizes_not_timed": sizes_skipped,
            "estimates": {  # from each row's warm-up: what the plan was made from
                name: {"batch1_ms_per_sentence": round(1000 * one, 2), "batched_pass_s": round(batched, 2)}
                for name, one, batched in zip(names, plan.estimates, plan.batched_estimates)
            },
            "rows_left_out": left_out,
        }
    meta["exact_check"] = {
        "near_tie_tolerance": tolerance,
        "rule": "a row that prints the teacher's greedy output is exact when, in every timed pass, every sentence "
        "that differs from the greedy teacher row's is a near-tie: at the first differing token the teacher's "
        "log-probabilities of the two tokens, given the common prefix, differ by less than near_tie_tolerance",
    }
    paired = paired_bootstrap(pairs, {row.name: row.hyps for row in rows}, references)
    results = write_report(args.out_dir, meta, rows, paired, plots=not args.no_plots, solo=solo)
    progress.write(finished=True)
    print(markdown_table(rows, args.teacher_beam))
    return results


def row_of(k: int, runner, timings: dict, batch_size: int, references: List[str]):
    """The :class:`.rows.Row` of runner ``k`` from the timings of every batch size: latency (per sentence and
    per round's block) from batch 1, throughput and hypotheses from ``batch_size``, the speed at every size."""
    ones, ones_outputs = timings[1]
    batched, batched_outputs = timings[batch_size]
    latency_ms = {
        unit[0]: 1000 * seconds
        for block, block_seconds in zip(ones.blocks, ones.seconds[k])
        for unit, seconds in zip(block, block_seconds)
    }
    hyps = [batched_outputs[k][i].text for i in range(len(references))]
    rates = [n / seconds for n, seconds in zip(batched.sentences(), batched.totals(k))]
    row = make_row(runner, hyps, references, rates, batch1_stats(latency_ms, ones_outputs[k]))
    row.latency_round_seconds = ones.totals(k)
    row.by_batch_size = [speed_at(timed, k, outputs[k]) for timed, outputs in timings.values()]
    return row


def add_exact_checks(rows, runners, anchor: int, timings: dict, tolerance: float):
    """``exact_check`` of every row but the anchor's that prints the teacher's greedy output
    (:func:`.measure.prints_teacher_greedy`): its outputs against the anchor's (fairseq's greedy teacher) in
    every timed pass, by batch size (:func:`.measure.exact_check`, near-ties scored by the anchor's model)."""
    teacher = runners[anchor]
    for k, (row, runner) in enumerate(zip(rows, runners)):
        if k != anchor and prints_teacher_greedy(runner, teacher):
            row.exact_check = {
                str(size): exact_check(outputs[k], outputs[anchor], teacher.log_prob_gap, tolerance)
                for size, (_, outputs) in timings.items()
            }


def add_solo_exact_checks(rows, anchor: int, timings: dict, solo_outputs: dict, tolerance: float):
    """The solo pass checked like the others (:func:`.measure.solo_exact_check`), at every batch size it timed, as
    ``exact_check["solo"]`` (batch 1) and ``exact_check["solo <size>"]`` (``--solo-batched``) of every row that has an
    exact check and was timed alone: the speed-ups a user is shown come from that pass, so the verdict "prints the
    teacher's greedy output" covers it."""
    for k, row in enumerate(rows):
        if row.exact_check is not None and row.name in solo_outputs:
            check_solo_passes(row.exact_check, k, anchor, timings, solo_outputs[row.name], tolerance)


def check_solo_passes(passes: dict, k: int, reference: int, timings: dict, solo: dict, tolerance: float):
    """Row ``k``'s solo outputs ``solo`` ({batch size: outputs}) checked against row ``reference``'s round-robin
    outputs of the same size (:func:`.measure.solo_exact_check`, with row ``k``'s own check of that pass), written into
    ``passes`` as ``"solo"`` (batch 1) and ``"solo <size>"``."""
    for size, alone in sorted(solo.items()):
        outputs = timings[size][1]
        key = "solo" if size == 1 else f"solo {size}"
        passes[key] = solo_exact_check(alone, outputs[reference], outputs[k], passes[str(size)], tolerance)


def pytorch_twin(runner, runners) -> Optional[int]:
    """The row whose tokens ``runner``'s must be: for the fertility NAT decoded by ONNX Runtime in float32
    (``--onnx-model``), the same NAT's PyTorch row with the same fertility rule in this run (None: no such row, or
    ``runner`` is not such a row; int8 graphs are another precision, checked by their BLEU)."""
    if not isinstance(runner, FairseqRunner):
        return None
    generator = runner.decoder.generation.generator
    onnx = getattr(generator, "onnx", None)
    if onnx is None or onnx.int8:
        return None
    model = runner.decoder.generation.models[0]
    for j, other in enumerate(runners):
        if other is runner or not isinstance(other, FairseqRunner):
            continue
        twin = other.decoder.generation.generator
        if (
            type(twin) is type(generator)
            and twin.onnx is None
            and twin.mode == generator.mode
            and same_weights(other.decoder.generation.models[0], model)
        ):
            return j
    return None


def twin_check(outputs: dict, twin: dict, twin_runner, tolerance: float) -> dict:
    """:func:`.measure.pass_check` of a row's ``outputs`` of one timed pass against its twin's ``twin`` (the PyTorch
    row's): a differing sentence is a near-tie where the twin's own pass nearly chose the row's tokens
    (:meth:`~nat_plugins.systems.fertility_nat.decoding.FertilityNATGenerator.choice_margin`)."""
    generation = twin_runner.decoder.generation
    divergences = []
    for i in sorted(outputs):
        ids, other = outputs[i].ids, twin[i].ids
        if ids != other:
            source = generation.to_device(generation.dataset[i]["source"]).unsqueeze(0)
            margin = generation.generator.choice_margin(source, torch.tensor(other), torch.tensor(ids))
            divergences.append({"sentence": i, "position": first_difference(ids, other), "log_prob_gap": margin})
    return pass_check(len(outputs), divergences, tolerance)


def add_twin_checks(rows, runners, timings: dict, tolerance: float):
    """``twin_check`` of every row that must print another row's tokens (:func:`pytorch_twin`): ``reference`` (that
    row's name) and, by timed pass, :func:`twin_check`."""
    for k, runner in enumerate(runners):
        j = pytorch_twin(runner, runners)
        if j is not None:
            passes = {
                str(size): twin_check(outputs[k], outputs[j], runners[j], tolerance)
                for size, (_, outputs) in timings.items()
            }
            rows[k].twin_check = {"reference": runners[j].spec.name, "passes": passes}


def add_solo_twin_checks(rows, runners, timings: dict, solo_outputs: dict, tolerance: float):
    """The solo pass of a row with a ``twin_check``, checked against its twin's round-robin outputs as
    :func:`add_solo_exact_checks` checks the exact rows (``passes["solo"]``, ``["solo <size>"]``)."""
    names = [runner.spec.name for runner in runners]
    for k, row in enumerate(rows):
        if row.twin_check is not None and row.name in solo_outputs:
            twin = names.index(row.twin_check["reference"])
            check_solo_passes(row.twin_check["passes"], k, twin, timings, solo_outputs[row.name], tolerance)


def active_openmp(argv: List[str]):
    """With ``--ctranslate2``, re-execute the command with ``OMP_WAIT_POLICY=ACTIVE`` unless the process started
    with a policy: torch and CTranslate2 bring their own OpenMP runtimes, and the policy decides whether their idle
    threads spin or sleep between parallel regions; sleeping slowed every row, CTranslate2 most (docs/design-notes.md,
    "OpenMP wait policy"). The runtimes read the variable when they load, before this code runs, hence the exec."""
    if "--ctranslate2" in argv and "OMP_WAIT_POLICY" not in initial_environment():
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        os.execv(sys.executable, [sys.executable, "-m", "nat_plugins.bench.benchmark"] + argv)


def cli_main(argv: Optional[List[str]] = None):
    """Console entry point (``nat-benchmark``)."""
    if argv is None:  # the command line: a caller's own process is not re-executed
        active_openmp(sys.argv[1:])
    run_cli(get_parser(), main, argv)


if __name__ == "__main__":
    cli_main()
