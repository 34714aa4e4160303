"""What a benchmark row is: its specification (name, checkpoint, fairseq-generate arguments, role) and its
results (:class:`Row`), plus the parsing of the command-line forms of both."""

import argparse
import dataclasses
import logging
import os
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

# options the harness sets identically for every row; a --system spec may not override them
HARNESS_OPTIONS = (
    "--path",
    "--batch-size",
    "--max-sentences",
    "--max-tokens",
    "--gen-subset",
    "--cpu",
    "--fp16",
    "--seed",
    "--post-process",
    "--remove-bpe",
)

# roles, in the order the rows are reported
TEACHER_BEAM = "teacher_beam"  # the AR teacher, fairseq's SequenceGenerator, beam --teacher-beam
TEACHER_GREEDY = "teacher_greedy"  # the same, beam 1: the anchor of every timing ratio
CT2_BEAM = "ctranslate2_beam"  # the teacher decoded by CTranslate2, beam --teacher-beam (one row per compute type)
CT2_GREEDY = "ctranslate2_greedy"  # the same, beam 1
# the teacher greedily through --task translation_nat, whose linear layers get the plugin rows' W·xᵀ layout
TEACHER_GREEDY_PLUGIN = "teacher_greedy_plugin"
SYSTEM = "system"  # a --system row
CTRANSLATE2_ROLES = (CT2_BEAM, CT2_GREEDY)


class BenchmarkError(Exception):
    """A user error (bad option, missing file); ``cli_main`` prints it without a traceback."""


def run_cli(parser: argparse.ArgumentParser, main, argv: Optional[List[str]] = None):
    """A benchmark console entry point: fairseq-style logging to stderr (``LOGLEVEL``), ``main(args)``, and a
    :class:`BenchmarkError` printed as the parser's error (exit status 2)."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
    )
    args = parser.parse_args(argv)
    try:
        return main(args)
    except BenchmarkError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


def slugify(name: str) -> str:
    """File-name-safe form of a row name, used for ``hyp.<slug>.txt``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "system"


@dataclass
class RowSpec:
    """One row of the table: a display name, checkpoint path(s), extra fairseq-generate arguments and its role."""

    name: str
    checkpoint: str
    args: List[str] = field(default_factory=list)
    role: str = SYSTEM

    @property
    def slug(self) -> str:
        return slugify(self.name)

    def option(self) -> str:
        """The row as the benchmark's ``--system`` option value (:func:`parse_system_spec` reads it back)."""
        return f"{self.name}={self.checkpoint}::{shlex.join(self.args)}"

    def relative_to(self, base: str) -> "RowSpec":
        """The row with its checkpoint and every argument that names a file written relative to ``base``."""
        args = [relative_path(arg, base) if os.path.exists(arg) else arg for arg in self.args]
        return RowSpec(self.name, relative_path(self.checkpoint, base), args, self.role)


def relative_path(path: str, base: str) -> str:
    """``path`` (every path of a ':'-separated ensemble) relative to the directory ``base``: reports name the files
    of a run from its work directory, not from the machine's root."""
    return ":".join(os.path.relpath(part, base) for part in path.split(":"))


def parse_system_spec(spec: str) -> RowSpec:
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
    return RowSpec(name, checkpoint, split_generate_args(arg_text if sep else "", f"--system {spec!r}"))


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


def teacher_specs(teacher: str, beam: int) -> List[RowSpec]:
    """The two reference rows: the teacher with fairseq's SequenceGenerator, beam and greedy."""
    plain = ["--task", "translation"]
    return [
        RowSpec(f"AR teacher, beam {beam}", teacher, plain + ["--beam", str(beam)], TEACHER_BEAM),
        RowSpec("AR teacher, greedy", teacher, plain + ["--beam", "1"], TEACHER_GREEDY),
    ]


def plugin_layout_spec(teacher: str) -> RowSpec:
    """The teacher decoded greedily through ``--task translation_nat``: the plugin's greedy loop
    (:class:`~nat_plugins.generators.verify_accept_loop.GreedyLoop`, a static decoder step per token) with the plugin
    rows' linear layout; fairseq's greedy output, at the cost of a decoder call the plugin's rows pay."""
    return RowSpec(
        "AR teacher, greedy (plugin layout)",
        teacher,
        ["--task", "translation_nat", "--beam", "1"],
        TEACHER_GREEDY_PLUGIN,
    )


def plugin_int8_spec(teacher: str) -> RowSpec:
    """The teacher decoded greedily by the plugin's loop with an int8 copy of its decoder (``--int8-decoder``, CPU):
    the plugin's row at CTranslate2 int8's precision; not the float32 teacher's output."""
    return RowSpec(
        "AR teacher, greedy, int8 decoder (plugin)",
        teacher,
        ["--task", "translation_nat", "--beam", "1", "--int8-decoder"],
    )


def ctranslate2_specs(teacher: str, beam: int, compute_types: List[str]) -> List[RowSpec]:
    """The teacher decoded by CTranslate2 (:mod:`nat_plugins.bench.ctranslate2_rows`), beam and greedy, for every
    compute type; the first (the run's precision) is named without it."""
    specs = []
    for i, compute_type in enumerate(compute_types):
        suffix = "CTranslate2" if i == 0 else f"CTranslate2 {compute_type}"
        for size, role, label in ((beam, CT2_BEAM, f"beam {beam}"), (1, CT2_GREEDY, "greedy")):
            args = ["ctranslate2", "--compute-type", compute_type, "--beam", str(size)]
            specs.append(RowSpec(f"AR teacher, {label} ({suffix})", teacher, args, role))
    return specs


def npd_name(samples: int) -> str:
    """The display name of the noisy-parallel-decoding row with ``samples`` fertility samples."""
    return f"NAT, NPD S={samples}"


def npd_args(samples: int, teacher) -> list:
    """fairseq-generate arguments of noisy parallel decoding: ``samples`` candidates rescored by ``teacher``."""
    return ["--beam", "1", "--fertility-decoding", "npd", "--npd-samples", str(samples), "--npd-teacher", teacher]


def npd_specs(checkpoint: str, teacher: str, text: str) -> List[RowSpec]:
    """``--npd-checkpoint`` and ``--npd-samples 'S,S,...'``: one noisy-parallel-decoding row of the fertility_nat
    ``checkpoint`` per number of samples S (distinct, >= 1, in the given order), rescored by ``teacher``."""
    try:
        samples = [int(part) for part in text.split(",")]
    except ValueError:
        samples = []
    if not samples or min(samples) < 1 or len(set(samples)) != len(samples):
        raise BenchmarkError(f"--npd-samples {text!r}: expected distinct numbers >= 1, e.g. 1,5,10,25,100")
    return [RowSpec(npd_name(s), checkpoint, npd_args(s, teacher)) for s in samples]


def parse_paired_tests(texts: List[str], names: List[str]) -> List[tuple]:
    """``--paired-test 'BASELINE::SYSTEM'`` pairs of row names, checked against the rows this run will have."""
    pairs = []
    for text in texts:
        baseline, sep, system = (part.strip() for part in text.partition("::"))
        if not sep or not baseline or not system:
            raise BenchmarkError(f"--paired-test {text!r}: expected 'BASELINE ROW NAME::SYSTEM ROW NAME'")
        unknown = [name for name in (baseline, system) if name not in names]
        if unknown:
            raise BenchmarkError(f"--paired-test {text!r}: no row named {unknown[0]!r} (rows: {names})")
        pairs.append((baseline, system))
    return pairs


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated between the order statistics (numpy's
    default: the p90 of 1..10 is 9.1)."""
    if not values:
        raise ValueError("percentile of no values")
    return float(np.percentile(values, q))


def spread(ratios: List[float]) -> Optional[float]:
    """Largest minus smallest of per-round ratios (None without rounds)."""
    return max(ratios) - min(ratios) if ratios else None


@dataclass
class Row:
    """One row's measurements (:mod:`.measure`, :mod:`nat_plugins.bench.ctranslate2_rows`) and what is derived from
    them against the other rows (:mod:`.analysis`). ``to_json`` gives the ``results.json`` row."""

    spec: RowSpec
    hyps: List[str]  # detokenized hypotheses of the throughput pass, in sentence order
    bleu: float
    bleu_signature: str
    throughput_round_rates: List[float]  # sentences per second of the batched pass, per round (.schedule)
    timed_ids: List[int]  # the batch-1 sentences timed (warm-up excluded), in sentence order
    timed_latency_ms: List[float]  # their batch-1 latencies
    generator: str  # what decoded the row: the generator's class name
    length_limit: str  # the longest output it allowed (measure.length_limit)
    decoder_calls_per_sentence: Optional[float] = None  # None: not observable (CTranslate2)
    tokens_per_call: Optional[float] = None
    mean_steps: Optional[float] = None  # mean of hypo["steps"] where the generator reports it
    # emitted tokens (EOS included) per hypo["steps"]: the mean accepted block (blockwise), the mean accepted tokens
    # per teacher call (speculative decoding)
    tokens_per_step: Optional[float] = None
    npd_samples: Optional[int] = None  # S of a row decoded with noisy parallel decoding (fertility_nat)
    # a verify-accept loop's batch-1 cost split (CPU): ms per drafting call (the drafter's call, or blockwise's heads),
    # and the rest of the time per verifier call (its decoder call, the encoder pass and the loop's bookkeeping)
    drafting_ms_per_call: Optional[float] = None
    verify_ms_per_call: Optional[float] = None
    # CUDA: why captures of the static step's graphs failed while decoding it (those call shapes ran eagerly: the
    # same output, not the graphs' speed), with how many (nat_plugins.engine.step_graphs)
    graph_capture_failures: Optional[Dict[str, int]] = None
    # batch-1 seconds of each round's block (.schedule): the latency ratios to the other rows pair them round by round
    latency_round_seconds: List[float] = field(default_factory=list)
    # per timed pass ("1", str(--batch-size), every --batch-sizes size), for a row that prints the teacher's greedy
    # output (.measure.prints_teacher_greedy): {"sentences", "differ", "near_ties", "divergences"}
    # (.measure.exact_check); None: not such a row
    exact_check: Optional[Dict[str, dict]] = None
    # a row that must print another row's tokens (the NAT through ONNX Runtime float32: its PyTorch row's),
    # {"reference": that row's name, "passes": {pass: .measure.pass_check}} (benchmark.add_twin_checks); None: none
    twin_check: Optional[Dict[str, Any]] = None
    # derived against the other rows by .analysis (None where the reference row is absent): BLEU as % of the teacher's
    # beam row's, and every speedup as the median over rounds of the paired per-round ratios (the reference's time on
    # the round's block / this row's; batch 1 for latency, the batched pass for throughput)
    bleu_pct_of_teacher: Optional[float] = None
    latency_speedup_vs_ar_beam: Optional[float] = None
    latency_speedup_vs_ar_greedy: Optional[float] = None
    latency_speedup_vs_ar_greedy_plugin: Optional[float] = None  # the teacher greedy with the plugin's layout
    latency_speedup_vs_ct2_greedy: Optional[float] = None  # the fastest CTranslate2 greedy row of the run
    throughput_speedup_vs_ar_beam: Optional[float] = None
    throughput_speedup_vs_ar_greedy: Optional[float] = None
    throughput_speedup_vs_ar_greedy_plugin: Optional[float] = None
    throughput_speedup_vs_ct2_greedy: Optional[float] = None
    # the per-round ratios behind every speedup above, by its name (their range is the speedup's spread)
    speedup_rounds: Dict[str, List[float]] = field(default_factory=dict)
    # what the rounds leave unsettled (.schedule.unsettled) and a divergence from greedy that is no near-tie
    flag: str = ""
    by_batch_size: List[dict] = field(default_factory=list)  # speed at every --batch-sizes size (.analysis)
    rep: Optional[float] = None
    mis: Optional[float] = None
    rep_ratio: Optional[float] = None
    mis_ratio: Optional[float] = None
    timed_src_lengths: List[int] = field(default_factory=list)  # source subwords of the timed sentences
    by_length: List[dict] = field(default_factory=list)  # BLEU and latency per source-length bucket (analysis)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def hyp_file(self) -> str:
        return f"hyp.{self.spec.slug}.txt"

    @property
    def num_sentences(self) -> int:
        return len(self.hyps)

    @property
    def throughput_sent_per_s(self) -> float:
        """The median over rounds: one preempted round does not count in full."""
        return statistics.median(self.throughput_round_rates)

    @property
    def latency_ratio_rounds(self) -> List[float]:
        """Per round: the greedy teacher's batch-1 time on the round's block / this row's."""
        return self.speedup_rounds.get("latency_speedup_vs_ar_greedy", [])

    @property
    def throughput_ratio_rounds(self) -> List[float]:
        """Per round: the greedy teacher's time on the round's batched block / this row's."""
        return self.speedup_rounds.get("throughput_speedup_vs_ar_greedy", [])

    @property
    def real_divergences(self) -> Optional[int]:
        """Sentences, over every checked pass, where this row's output differs from the greedy teacher's by more than
        a near-tie (None: the row is not checked against it)."""
        if self.exact_check is None:
            return None
        return sum(check["differ"] - check["near_ties"] for check in self.exact_check.values())

    @property
    def latency_ratio_spread(self) -> Optional[float]:
        return spread(self.latency_ratio_rounds)

    @property
    def throughput_ratio_spread(self) -> Optional[float]:
        return spread(self.throughput_ratio_rounds)

    @property
    def latency_ms_median(self) -> float:
        return statistics.median(self.timed_latency_ms)

    @property
    def latency_ms_p90(self) -> float:
        return percentile(self.timed_latency_ms, 90)

    @property
    def latency_ms_mean(self) -> float:
        return statistics.fmean(self.timed_latency_ms)

    @property
    def ms_per_decoder_call(self) -> Optional[float]:
        """Batch-1 time per decoder pass: mean latency / decoder calls per sentence (the encoder pass and the
        generator's per-sentence work spread over the calls). A greedy step against a verify-accept call of the
        same model: Stern et al.'s speed-up over greedy is (mean accepted block) × the inverse of their ratio."""
        if not self.decoder_calls_per_sentence:
            return None
        return self.latency_ms_mean / self.decoder_calls_per_sentence

    def write_hyps(self, out_dir: str):
        """``hyp.<slug>.txt``: one hypothesis per line, in sentence order."""
        with open(os.path.join(out_dir, self.hyp_file), "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in self.hyps)

    def to_json(self) -> Dict:
        """The ``results.json`` row: the spec, every measurement and the summary statistics (hypotheses are in
        ``hyp_file``)."""
        measured = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("spec", "hyps")}
        return {
            "name": self.name,
            "slug": self.spec.slug,
            "role": self.role,
            "checkpoint": self.spec.checkpoint,
            "args": self.spec.args,
            "hyp_file": self.hyp_file,
            "num_sentences": self.num_sentences,
            "throughput_sent_per_s": self.throughput_sent_per_s,
            "latency_ms_median": self.latency_ms_median,
            "latency_ms_p90": self.latency_ms_p90,
            "latency_ms_mean": self.latency_ms_mean,
            "latency_sentences_timed": len(self.timed_latency_ms),
            "latency_ratio_rounds": self.latency_ratio_rounds,
            "throughput_ratio_rounds": self.throughput_ratio_rounds,
            "latency_ratio_spread": self.latency_ratio_spread,
            "throughput_ratio_spread": self.throughput_ratio_spread,
            "ms_per_decoder_call": self.ms_per_decoder_call,
            **measured,
        }
