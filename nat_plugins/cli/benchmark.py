"""Speed/quality benchmark of plugin decoders against the AR teacher (DESIGN.md §7).

Every row is decoded through the path ``fairseq_cli/generate.py`` takes (task, checkpoint ensemble,
``task.build_generator``, ``task.inference_step``) on the same device, data, precision and seed. The two
AR-teacher rows use plain ``--task translation`` (fairseq's ``SequenceGenerator``); each ``--system`` row
defaults to ``--task translation_nat --user-dir <nat_plugins>``. Per row:

* BLEU: sacreBLEU (13a) of the detokenized hypotheses of the throughput pass against the raw references;
* throughput: the whole split in length-sorted batches of ``--batch-size`` sentences, sentences per second
  of summed ``task.inference_step`` time (data loading and detokenization excluded);
* latency: batch 1, sentences in index order, the first ``--warmup`` not counted, median and mean;
* decoder calls per sentence and emitted tokens (EOS included) per call, counted on the timed batch-1
  sentences, plus the mean of ``hypo["steps"]`` where the generator reports it;
* speedups of latency and throughput against both teacher rows;
* Rep and Mis (Ran et al. 2020, eq. 7-10; :mod:`.rep_mis`): the relative increment (%) of the repeated-token
  ratio (a token equal to one of the 2 before it) and of the ratio of reference tokens missing, over the
  teacher's greedy row; and the two ratios themselves (``rep_ratio``, ``mis_ratio``, %), on the words of
  sacreBLEU's 13a tokenization of the detokenized output and the references.

``--paired-test 'BASELINE::SYSTEM'`` adds sacreBLEU's paired bootstrap resampling test (1,000 resamples) of two
rows' BLEU difference: p-value and 95% confidence intervals, in ``results.md`` and ``results.json``.

``--ctranslate2`` adds the teacher decoded by CTranslate2 (beam and greedy; :mod:`.ctranslate2_rows`), the
production baseline a fast decoder has to beat.

Outputs in ``--out-dir``: ``results.md``, ``results.json``, ``bleu_vs_speedup.png`` and ``hyp.<slug>.txt``
(one detokenized hypothesis per line, in test-set order) for every row.
"""

import argparse
import ast
import contextlib
import datetime
import json
import logging
import os
import platform
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import sacrebleu
import torch
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from tqdm import tqdm

import fairseq
from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli.generate import get_symbols_to_strip_from_output

import nat_plugins
from nat_plugins.cli.ctranslate2_rows import CTranslate2Teacher, CTranslate2Unavailable, convert_teacher
from nat_plugins.cli.rep_mis import rep_mis, repeated_ratio

logger = logging.getLogger("nat_plugins.cli.benchmark")

PLOT_FILE = "bleu_vs_speedup.png"
# options the harness sets identically for every row; a --system spec may not override them
HARNESS_OPTIONS = (
    "--path", "--batch-size", "--max-sentences", "--max-tokens", "--gen-subset",
    "--cpu", "--fp16", "--seed", "--post-process", "--remove-bpe",
)


class BenchmarkError(Exception):
    """A user error (bad option, missing file); ``cli_main`` prints it without a traceback."""


@dataclass
class SystemSpec:
    """One row of the table: a display name, checkpoint path(s) and extra fairseq-generate arguments."""

    name: str
    checkpoint: str
    args: List[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        """File-name-safe form of the name, used for ``hyp.<slug>.txt``."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "system"


def parse_system_spec(spec: str) -> SystemSpec:
    """Parse ``'NAME=CHECKPOINT::EXTRA ARGS'`` (``::EXTRA ARGS`` optional; split at the last ``=`` before ``::``,
    so NAME may contain ``=`` and CHECKPOINT may not). Raises :class:`BenchmarkError` if malformed."""
    head, sep, arg_text = spec.partition("::")
    name, eq, checkpoint = head.rpartition("=")
    name, checkpoint = name.strip(), checkpoint.strip()
    if not eq or not name or not checkpoint:
        raise BenchmarkError(
            f"--system {spec!r}: expected 'NAME=CHECKPOINT::EXTRA FAIRSEQ-GENERATE ARGS', "
            "e.g. 'SAT K=2=ckpt/sat2.pt::--beam 1'"
        )
    return SystemSpec(name, checkpoint, split_generate_args(arg_text if sep else "", f"--system {spec!r}"))


def split_generate_args(text: str, where: str) -> List[str]:
    """Split fairseq-generate arguments, refusing the options the harness sets for every row."""
    try:
        extra = shlex.split(text)
    except ValueError as err:
        raise BenchmarkError(f"{where}: cannot split its arguments: {err}") from err
    owned = [a for a in extra if a.split("=", 1)[0] in HARNESS_OPTIONS]
    if owned:
        raise BenchmarkError(
            f"{where}: {' '.join(owned)} is set by the benchmark for all rows "
            "(give the checkpoint before '::' and the rest as benchmark options)"
        )
    return extra


def get_parser() -> argparse.ArgumentParser:
    """The benchmark's command-line parser."""
    parser = argparse.ArgumentParser(
        prog="nat-benchmark",
        description="Decode a test set with the AR teacher (beam and greedy) and plugin systems; write "
        "BLEU, batch-1 latency, throughput, decoder calls and speedups to results.md/results.json and a "
        "BLEU-vs-speedup plot.",
    )
    parser.add_argument("data_bin", help="fairseq data-bin directory (output of fairseq-preprocess)")
    parser.add_argument("--teacher", required=True, help="AR teacher checkpoint (a fairseq transformer)")
    parser.add_argument(
        "--reference", required=True,
        help="raw (untokenized) reference file of the split, one line per sentence in data-bin order",
    )
    parser.add_argument("--out-dir", required=True, help="directory for results.md, results.json, the plot, hyps")
    parser.add_argument(
        "--system", action="append", default=[], metavar="'NAME=CHECKPOINT::ARGS'",
        help="a plugin row: display name, checkpoint (':'-separated for an ensemble) and extra fairseq-generate "
        "arguments, which may override the defaults '--task translation_nat --user-dir <nat_plugins>'; "
        "repeat for more rows",
    )
    parser.add_argument("--gen-subset", default="test", help="data-bin split to decode (default: test)")
    parser.add_argument("--source-lang", "-s", default=None, help="source language (default: from the data-bin)")
    parser.add_argument("--target-lang", "-t", default=None, help="target language (default: from the data-bin)")
    parser.add_argument("--cpu", action="store_true", help="decode on CPU even if CUDA is available")
    parser.add_argument("--fp16", action="store_true", help="decode in half precision (model.half())")
    parser.add_argument(
        "--latency-sentences", type=int, default=None, metavar="N",
        help="time batch-1 latency on the first N sentences of the split, warm-up included (default: all)",
    )
    parser.add_argument(
        "--warmup", type=int, default=10,
        help="leading batch-1 sentences decoded but left out of the latency and decoder-call statistics (default: 10)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch for throughput (default: 64)")
    parser.add_argument(
        "--post-process", default="sentencepiece",
        help="fairseq --post-process applied to hypotheses before scoring; 'none' for word-level data "
        "(default: sentencepiece)",
    )
    parser.add_argument(
        "--user-dir", default=os.path.dirname(os.path.abspath(nat_plugins.__file__)),
        help="fairseq --user-dir for every row (default: the installed nat_plugins package)",
    )
    parser.add_argument(
        "--generate-args", default="", metavar="'ARGS'",
        help="fairseq-generate arguments given to every row, teacher rows included, before the row's own "
        "(e.g. the same length limit for all: '--max-len-a 1.2 --max-len-b 10')",
    )
    parser.add_argument("--teacher-beam", type=int, default=4, help="beam size of the teacher's beam row (default: 4)")
    parser.add_argument(
        "--paired-test", action="append", default=[], metavar="'BASELINE::SYSTEM'",
        help="sacreBLEU's paired bootstrap resampling test (1000 resamples) of SYSTEM's BLEU against BASELINE's "
        "(two row names); repeat for more pairs",
    )
    parser.add_argument(
        "--ctranslate2", action="store_true",
        help="add rows for the teacher decoded by CTranslate2 (beam and greedy): converted once into "
        "OUT_DIR/ctranslate2-teacher, same device, threads, precision and length limit",
    )
    parser.add_argument(
        "--distilled-targets", default=None, metavar="FILE",
        help="the students' distilled training targets (subword text, e.g. DATA_BIN/train.kd.de.txt): their rate "
        "of immediately repeated subwords goes into the report (a teacher that stutters teaches stuttering)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed set before every pass (default: 1)")
    parser.add_argument("--title", default="Decoding benchmark", help="heading of results.md and the plot")
    return parser


def teacher_specs(args) -> List[SystemSpec]:
    """The two reference rows: the teacher with fairseq's SequenceGenerator, beam and greedy."""
    plain = ["--task", "translation"]
    return [
        SystemSpec(f"AR teacher, beam {args.teacher_beam}", args.teacher, plain + ["--beam", str(args.teacher_beam)]),
        SystemSpec("AR teacher, greedy", args.teacher, plain + ["--beam", "1"]),
    ]


def check_inputs(args, systems: List[SystemSpec]) -> List[str]:
    """Fail fast on missing files and bad numbers; returns the reference lines."""
    if not os.path.isdir(args.data_bin):
        raise BenchmarkError(f"DATA_BIN {args.data_bin!r} is not a directory")
    checkpoints = [("--teacher", args.teacher)] + [(f"--system {s.name!r}", s.checkpoint) for s in systems]
    for option, checkpoint in checkpoints:
        for path in utils.split_paths(checkpoint):
            if not os.path.isfile(path):
                raise BenchmarkError(f"{option}: checkpoint {path!r} does not exist")
    slugs = [spec.slug for spec in teacher_specs(args) + systems]
    if len(set(slugs)) != len(slugs):
        raise BenchmarkError(f"row names must differ in their letters and digits (file names: {slugs})")
    if args.batch_size < 1 or args.warmup < 0 or args.teacher_beam < 1:
        raise BenchmarkError("--batch-size and --teacher-beam must be >= 1 and --warmup >= 0")
    if not os.path.isfile(args.reference):
        raise BenchmarkError(f"--reference {args.reference!r} does not exist")
    if args.distilled_targets is not None and not os.path.isfile(args.distilled_targets):
        raise BenchmarkError(f"--distilled-targets {args.distilled_targets!r} does not exist (run_scripts/distill.sh "
                             "writes DATA_BIN/train.kd.TGT.txt)")
    with open(args.reference, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def generation_cfg(args, spec: SystemSpec, use_cuda: bool):
    """Parse the row's fairseq-generate command line with fairseq's own parser into an omegaconf config."""
    argv = [
        args.data_bin, "--path", spec.checkpoint, "--user-dir", args.user_dir, "--task", "translation_nat",
        "--gen-subset", args.gen_subset, "--batch-size", str(args.batch_size), "--seed", str(args.seed),
        "--post-process", args.post_process,
    ]
    argv += ["-s", args.source_lang] if args.source_lang else []
    argv += ["-t", args.target_lang] if args.target_lang else []
    argv += ["--cpu"] if not use_cuda else []
    argv += ["--fp16"] if args.fp16 else []
    argv += split_generate_args(args.generate_args, "--generate-args")
    try:
        namespace = options.parse_args_and_arch(options.get_generation_parser(), input_args=argv + spec.args)
    except SystemExit as err:  # argparse already printed the reason
        raise BenchmarkError(f"row {spec.name!r}: fairseq-generate rejected {shlex.join(spec.args)!r}") from err
    return convert_namespace_to_omegaconf(namespace)


@dataclass
class LoadedSystem:
    """Everything needed to decode one row, set up as fairseq-generate does."""

    cfg: object
    task: object
    models: list
    generator: object
    dataset: object
    to_text: Callable[[torch.Tensor], str]
    emitted_length: Callable[[torch.Tensor], int]
    use_cuda: bool


def load_system(cfg, spec: SystemSpec, use_cuda: bool) -> LoadedSystem:
    """Task, checkpoint ensemble, dataset and generator for one row (fairseq_cli/generate.py's sequence)."""
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    models, saved_cfg = checkpoint_utils.load_model_ensemble(
        utils.split_paths(cfg.common_eval.path),
        arg_overrides=ast.literal_eval(cfg.common_eval.model_overrides),
        task=task,
    )
    try:
        task.load_dataset(cfg.dataset.gen_subset, task_cfg=saved_cfg.task)
    except FileNotFoundError as err:
        raise BenchmarkError(
            f"--gen-subset {cfg.dataset.gen_subset!r}: cannot load it from data-bin {cfg.task.data!r} "
            f"for row {spec.name!r}: {err}"
        ) from err
    for model in models:
        if cfg.common.fp16:
            model.half()
        if use_cuda:
            model.cuda()
        model.prepare_for_inference_(cfg)
    generator = task.build_generator(models, cfg.generation)
    tgt_dict = task.target_dictionary
    strip = get_symbols_to_strip_from_output(generator)
    tokenizer, bpe = task.build_tokenizer(cfg.tokenizer), task.build_bpe(cfg.bpe)
    not_emitted = sorted(set(strip) | {tgt_dict.bos(), tgt_dict.eos(), tgt_dict.pad()})

    def to_text(tokens):
        text = tgt_dict.string(tokens.int().cpu(), cfg.common_eval.post_process, extra_symbols_to_ignore=strip)
        text = bpe.decode(text) if bpe is not None else text
        return tokenizer.decode(text) if tokenizer is not None else text

    def emitted_length(tokens):
        """Output tokens of a hypothesis, special symbols left out, plus one for its EOS."""
        return int((~torch.isin(tokens.cpu(), torch.tensor(not_emitted))).sum()) + 1

    return LoadedSystem(cfg, task, models, generator, task.dataset(cfg.dataset.gen_subset), to_text,
                        emitted_length, use_cuda)


@contextlib.contextmanager
def count_decoder_calls(models):
    """Count calls of each model's ``decoder.forward``; yields one counter per model.

    fairseq's SequenceGenerator calls ``model.decoder.forward(...)`` directly, which bypasses ``nn.Module``
    hooks, so the bound method is wrapped on the decoder instance instead (this catches ``decoder(...)``
    and ``decoder.forward(...)`` alike) and restored afterwards.
    """
    counts = [0] * len(models)

    def counting(i, forward):
        def forward_and_count(*args, **kwargs):
            counts[i] += 1
            return forward(*args, **kwargs)

        return forward_and_count

    for i, model in enumerate(models):
        model.decoder.forward = counting(i, model.decoder.forward)
    try:
        yield counts
    finally:
        for model in models:
            del model.decoder.forward


def seed_everything(seed: int):
    """The same seed before every pass, so sampling decoders are reproducible across rows and passes."""
    np.random.seed(seed)
    utils.set_torch_seed(seed)


def timed_decode(system: LoadedSystem, sample):
    """Decode one batch with ``task.inference_step``; returns (hypotheses, seconds), CUDA synchronised."""
    gen = system.cfg.generation
    prefix_tokens = sample["target"][:, : gen.prefix_size] if gen.prefix_size > 0 else None
    if system.use_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    hypos = system.task.inference_step(
        system.generator, system.models, sample, prefix_tokens=prefix_tokens, constraints=sample.get("constraints")
    )
    if system.use_cuda:
        torch.cuda.synchronize()
    return hypos, time.perf_counter() - start


def measure_throughput(system: LoadedSystem, batch_size: int, seed: int, desc: str):
    """Decode the whole split in length-sorted batches; returns (seconds, hypotheses in sentence order)."""
    seed_everything(seed)
    itr = system.task.get_batch_iterator(
        dataset=system.dataset,
        max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(
            system.task.max_positions(), *[m.max_positions() for m in system.models]
        ),
        seed=seed,
    ).next_epoch_itr(shuffle=False)
    hyps: Dict[int, str] = {}
    seconds = 0.0
    for sample in tqdm(itr, desc=f"{desc}: throughput", unit="batch"):
        sample = utils.move_to_cuda(sample) if system.use_cuda else sample
        hypos, elapsed = timed_decode(system, sample)
        seconds += elapsed
        for i, sample_id in enumerate(sample["id"].tolist()):
            hyps[sample_id] = system.to_text(hypos[i][0]["tokens"])
    missing = len(system.dataset) - len(hyps)
    if missing:
        raise BenchmarkError(f"row {desc!r}: {missing} sentences were not decoded (longer than the model allows?)")
    return seconds, [hyps[i] for i in range(len(system.dataset))]


def measure_batch1(system: LoadedSystem, num_sentences: int, warmup: int, seed: int, desc: str) -> dict:
    """Batch-1 latency, decoder calls and tokens per call over sentences ``warmup..num_sentences-1``."""
    seed_everything(seed)
    latencies, calls, tokens, steps = [], [], [], []
    with count_decoder_calls(system.models) as counts:
        for index in tqdm(range(num_sentences), desc=f"{desc}: batch 1", unit="sent"):
            sample = system.dataset.collater([system.dataset[index]])
            sample = utils.move_to_cuda(sample) if system.use_cuda else sample
            counts[:] = [0] * len(counts)
            hypos, elapsed = timed_decode(system, sample)
            if index < warmup:
                continue
            best = hypos[0][0]
            latencies.append(elapsed)
            calls.append(max(counts))  # ensemble members are called together: one call per step
            tokens.append(system.emitted_length(best["tokens"]))
            if best.get("steps") is not None:
                steps.append(float(best["steps"]))
    return {
        "latency_ms_median": 1000 * statistics.median(latencies),
        "latency_ms_mean": 1000 * statistics.fmean(latencies),
        "latency_sentences_timed": len(latencies),
        "decoder_calls_per_sentence": statistics.fmean(calls),
        "tokens_per_call": sum(tokens) / max(sum(calls), 1),
        "mean_steps": statistics.fmean(steps) if steps else None,
    }


def benchmark_row(args, spec: SystemSpec, cfg, references: List[str], use_cuda: bool) -> dict:
    """Load one row, measure it, write its hypothesis file and return its results."""
    logger.info("row %r: %s %s", spec.name, spec.checkpoint, shlex.join(spec.args))
    system = load_system(cfg, spec, use_cuda)
    size = len(system.dataset)
    if size != len(references):
        raise BenchmarkError(
            f"--reference {args.reference!r} has {len(references)} lines but split {args.gen_subset!r} "
            f"of {args.data_bin!r} has {size} sentences"
        )
    num_latency = size if args.latency_sentences is None else min(args.latency_sentences, size)
    if num_latency <= args.warmup:
        raise BenchmarkError(f"--warmup {args.warmup} leaves none of the {num_latency} latency sentences to time")
    batch1 = measure_batch1(system, num_latency, args.warmup, args.seed, spec.name)
    seconds, hyps = measure_throughput(system, args.batch_size, args.seed, spec.name)
    hyp_file = os.path.join(args.out_dir, f"hyp.{spec.slug}.txt")
    with open(hyp_file, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hyps)
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hyps, [references])
    del system
    if use_cuda:
        torch.cuda.empty_cache()
    return {
        "name": spec.name,
        "slug": spec.slug,
        "checkpoint": spec.checkpoint,
        "args": spec.args,
        "bleu": score.score,
        "bleu_signature": str(bleu.get_signature()),
        "hyp_file": os.path.basename(hyp_file),
        "num_sentences": size,
        "throughput_sent_per_s": size / seconds,
        "throughput_seconds": seconds,
        **batch1,
    }


def ctranslate2_row_names(args) -> List[tuple]:
    """(name, beam) of the CTranslate2 rows (none without ``--ctranslate2``)."""
    if not args.ctranslate2:
        return []
    return [(f"AR teacher, beam {args.teacher_beam} (CTranslate2)", args.teacher_beam),
            ("AR teacher, greedy (CTranslate2)", 1)]


def ctranslate2_rows(args, teacher_cfg, references: List[str], use_cuda: bool) -> List[dict]:
    """The teacher's beam and greedy rows decoded by CTranslate2 (see :mod:`.ctranslate2_rows`)."""
    task = tasks.setup_task(teacher_cfg.task)
    task.load_dataset(args.gen_subset)
    try:
        model_dir = convert_teacher(args.teacher, args.data_bin, args.out_dir, args.user_dir,
                                    task.cfg.source_lang, task.cfg.target_lang)
    except CTranslate2Unavailable as err:
        raise BenchmarkError(str(err)) from err
    decoder = CTranslate2Teacher(model_dir, task.dataset(args.gen_subset), task.source_dictionary,
                                 task.target_dictionary, args.post_process, use_cuda, args.fp16, args.generate_args)
    size = len(decoder.sources)
    num_latency = size if args.latency_sentences is None else min(args.latency_sentences, size)
    rows = []
    for name, beam in ctranslate2_row_names(args):
        spec = SystemSpec(name, args.teacher, ["--beam", str(beam)])
        hyps, measured = decoder.measure(beam, references, num_latency, args.warmup, args.batch_size, spec.name)
        hyp_file = os.path.join(args.out_dir, f"hyp.{spec.slug}.txt")
        with open(hyp_file, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)
        rows.append({"name": spec.name, "slug": spec.slug, "checkpoint": args.teacher,
                     "args": ["ctranslate2", "--beam", str(beam)], "hyp_file": os.path.basename(hyp_file),
                     **measured})
    return rows


def parse_paired_tests(args, specs: List[SystemSpec]) -> List[tuple]:
    """``--paired-test 'BASELINE::SYSTEM'`` pairs of row names, checked against the rows this run will have."""
    names = [spec.name for spec in specs] + [name for name, _beam in ctranslate2_row_names(args)]
    pairs = []
    for text in args.paired_test:
        baseline, sep, system = (part.strip() for part in text.partition("::"))
        if not sep or not baseline or not system:
            raise BenchmarkError(f"--paired-test {text!r}: expected 'BASELINE ROW NAME::SYSTEM ROW NAME'")
        unknown = [name for name in (baseline, system) if name not in names]
        if unknown:
            raise BenchmarkError(f"--paired-test {text!r}: no row named {unknown[0]!r} (rows: {names})")
        pairs.append((baseline, system))
    return pairs


def paired_bootstrap(pairs: List[tuple], rows: List[dict], references: List[str], out_dir: str) -> List[dict]:
    """sacreBLEU's paired bootstrap resampling (Koehn 2004) for every (baseline, system) pair of row names."""
    from sacrebleu.significance import PairedTest

    by_name = {row["name"]: row for row in rows}
    results = []
    for baseline, system in pairs:
        hyps = []
        for name in (baseline, system):
            with open(os.path.join(out_dir, by_name[name]["hyp_file"]), encoding="utf-8") as f:
                hyps.append(f.read().splitlines())
        bleu = sacrebleu.metrics.BLEU(references=[references])
        test = PairedTest([(baseline, hyps[0]), (system, hyps[1])], {"BLEU": bleu}, references=None,
                          test_type="bs", n_samples=1000)
        signatures, scores = test()
        base, other = scores["BLEU"]
        results.append({
            "baseline": baseline, "system": system, "baseline_bleu": base.score, "system_bleu": other.score,
            "delta": other.score - base.score, "p_value": other.p_value,
            "baseline_mean": base.mean, "baseline_ci": base.ci, "system_mean": other.mean, "system_ci": other.ci,
            "signature": str(signatures["BLEU"]),
        })
    return results


def add_speedups(rows: List[dict]):
    """Latency and throughput speedups of every row against the teacher's beam (row 0) and greedy (row 1)."""
    for key, ref in (("ar_beam", rows[0]), ("ar_greedy", rows[1])):
        for row in rows:
            row[f"latency_speedup_vs_{key}"] = ref["latency_ms_median"] / row["latency_ms_median"]
            row[f"throughput_speedup_vs_{key}"] = row["throughput_sent_per_s"] / ref["throughput_sent_per_s"]


def add_rep_mis(rows: List[dict], references: List[str], out_dir: str):
    """Rep and Mis (Ran et al. 2020, eq. 7-10) of every row, relative to the teacher's greedy row (row 1), and the
    repeated/missing-token ratios, on 13a-tokenized words."""
    tokenize = Tokenizer13a()

    def read(row):
        with open(os.path.join(out_dir, row["hyp_file"]), encoding="utf-8") as f:
            return [tokenize(line) for line in f.read().splitlines()]

    tokenized_references = [tokenize(line) for line in references]
    ar_output = read(rows[1])
    for row in rows:
        row.update(rep_mis(read(row), tokenized_references, ar_output))


def device_name(use_cuda: bool) -> str:
    """GPU name, or the CPU model and torch's thread count."""
    if use_cuda:
        return torch.cuda.get_device_name()
    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    return f"{model} ({torch.get_num_threads()} threads)"


def run_metadata(args, use_cuda: bool, rows: List[dict]) -> dict:
    """The header: what was measured, where and how."""
    size = rows[0]["num_sentences"]
    return {
        "title": args.title,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device_name(use_cuda),
        "torch": torch.__version__,
        "fairseq": fairseq.__version__,
        "nat_plugins": nat_plugins.__version__,
        "precision": "fp16" if args.fp16 else "fp32",
        "data_bin": os.path.abspath(args.data_bin),
        "gen_subset": args.gen_subset,
        "reference": os.path.abspath(args.reference),
        "num_sentences": size,
        "latency_sentences": size if args.latency_sentences is None else min(args.latency_sentences, size),
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        "teacher": os.path.abspath(args.teacher),
        "teacher_beam": args.teacher_beam,
        "post_process": args.post_process,
        "generate_args": args.generate_args,
        "seed": args.seed,
        "distilled_targets": distilled_targets_stats(args.distilled_targets),
    }


def distilled_targets_stats(path: Optional[str]) -> Optional[dict]:
    """Sentences and immediately repeated subwords (%) of the distilled training targets at ``path``."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return {"path": os.path.abspath(path), "sentences": len(lines),
            "repeated_subwords": repeated_ratio(lines, window=1)}


def _fmt(value, digits=2, suffix=""):
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def markdown_table(rows: List[dict], teacher_beam: int) -> str:
    """The results as a markdown table."""
    beam = f"beam {teacher_beam}"
    lines = [
        f"| system | BLEU | latency ms (median) | latency ms (mean) | latency × vs {beam} | latency × vs greedy "
        f"| sent/s (batch) | throughput × vs {beam} | throughput × vs greedy | decoder calls / sent "
        "| tokens / call | steps | Rep | Mis | rep. tokens % | missing tokens % |",
        "|---|" + "---:|" * 15,
    ]
    for r in rows:
        cells = [
            r["name"], _fmt(r["bleu"]), _fmt(r["latency_ms_median"], 1), _fmt(r["latency_ms_mean"], 1),
            _fmt(r["latency_speedup_vs_ar_beam"], 2, "×"), _fmt(r["latency_speedup_vs_ar_greedy"], 2, "×"),
            _fmt(r["throughput_sent_per_s"], 1), _fmt(r["throughput_speedup_vs_ar_beam"], 2, "×"),
            _fmt(r["throughput_speedup_vs_ar_greedy"], 2, "×"), _fmt(r["decoder_calls_per_sentence"]),
            _fmt(r["tokens_per_call"]), _fmt(r["mean_steps"]), _fmt(r["rep"]), _fmt(r["mis"]),
            _fmt(r["rep_ratio"]), _fmt(r["mis_ratio"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(meta: dict, rows: List[dict], paired: Optional[List[dict]] = None) -> str:
    """results.md: header with device/versions/data, the table, the per-row decoding arguments and paired tests."""
    header = [
        f"# {meta['title']}",
        "",
        f"- device: {meta['device']}; torch {meta['torch']}, fairseq {meta['fairseq']}, "
        f"nat_plugins {meta['nat_plugins']}; precision {meta['precision']}; {meta['date']}",
        f"- data: `{meta['data_bin']}` split `{meta['gen_subset']}`, {meta['num_sentences']} sentences; "
        f"BLEU = sacreBLEU ({rows[0]['bleu_signature']}) vs `{meta['reference']}`",
        "- Rep/Mis (Ran et al. 2020, eq. 7-10): relative increment (%) of the repeated-token ratio (a token equal "
        "to one of the 2 before it) and of the missing-token ratio (reference tokens the output lacks) over the "
        "teacher's greedy row; rep./missing tokens %: the ratios themselves (13a-tokenized words)",
        f"- latency: batch 1, first {meta['latency_sentences']} sentences, {meta['warmup']} warm-up excluded; "
        f"throughput: batches of {meta['batch_size']} sentences, decode time only",
        f"- teacher: `{meta['teacher']}`; arguments of every row: `{meta['generate_args'] or '(none)'}`",
    ]
    kd = meta.get("distilled_targets")
    if kd:
        header.append(f"- distilled training targets: `{kd['path']}`, {kd['sentences']} sentences, "
                      f"{kd['repeated_subwords']:.2f}% of the subwords repeat the one before")
    header += [
        "",
        markdown_table(rows, meta["teacher_beam"]),
        "",
        "| system | checkpoint | fairseq-generate arguments |",
        "|---|---|---|",
    ]
    header += [f"| {r['name']} | `{r['checkpoint']}` | `{shlex.join(r['args'])}` |" for r in rows]
    if paired:
        header += [
            "",
            f"Paired bootstrap resampling (sacreBLEU, {paired[0]['signature']}): p = share of resamples whose "
            "centred BLEU difference exceeds the observed Δ (small p: SYSTEM's gain is unlikely to be chance; "
            "sacreBLEU's rule also gives identical outputs a small p, so read it with Δ); ± = 95% confidence "
            "interval of the resampled mean.",
            "",
            "| baseline | system | BLEU baseline | BLEU system | Δ | p-value |",
            "|---|---|---:|---:|---:|---:|",
        ]
        header += [f"| {t['baseline']} | {t['system']} | {t['baseline_bleu']:.2f} (± {t['baseline_ci']:.2f}) | "
                   f"{t['system_bleu']:.2f} (± {t['system_ci']:.2f}) | {t['delta']:+.2f} | {t['p_value']:.4f} |"
                   for t in paired]
    return "\n".join(header) + "\n"


def plot(meta: dict, rows: List[dict], path: str):
    """BLEU against batch-1 latency speedup vs the teacher's beam row; one marker per row, named in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    markers = "osD^v<>Pp*hX"
    for i, r in enumerate(rows):
        ax.scatter(r["latency_speedup_vs_ar_beam"], r["bleu"], marker=markers[i % len(markers)], s=45,
                   color=plt.cm.tab20(i % 20), label=r["name"])
    ax.set_xlabel(f"batch-1 latency speedup vs AR beam {meta['teacher_beam']} (×)")
    ax.set_ylabel("BLEU (sacreBLEU)")
    ax.set_title(f"{meta['title']}\n{meta['device']}, {meta['precision']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(args) -> dict:
    """Run the benchmark for parsed ``args``; writes the outputs and returns ``{"meta": ..., "rows": ...}``."""
    systems = [parse_system_spec(spec) for spec in args.system]
    references = check_inputs(args, systems)
    use_cuda = torch.cuda.is_available() and not args.cpu
    specs = teacher_specs(args) + systems
    cfgs = [generation_cfg(args, spec, use_cuda) for spec in specs]  # every row's arguments checked up front
    pairs = parse_paired_tests(args, specs)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = [benchmark_row(args, spec, cfg, references, use_cuda) for spec, cfg in zip(specs, cfgs)]
    if args.ctranslate2:
        rows[2:2] = ctranslate2_rows(args, cfgs[1], references, use_cuda)
    add_speedups(rows)
    add_rep_mis(rows, references, args.out_dir)
    meta = run_metadata(args, use_cuda, rows)
    paired = paired_bootstrap(pairs, rows, references, args.out_dir)
    results = {"meta": meta, "rows": rows, "paired_tests": paired}
    with open(os.path.join(args.out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
    with open(os.path.join(args.out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown_report(meta, rows, paired))
    plot(meta, rows, os.path.join(args.out_dir, PLOT_FILE))
    print(markdown_table(rows, args.teacher_beam))
    return results


def cli_main(argv: Optional[List[str]] = None):
    """Console entry point (``nat-benchmark``)."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
    )
    parser = get_parser()
    args = parser.parse_args(argv)
    try:
        main(args)
    except BenchmarkError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


if __name__ == "__main__":
    cli_main()
