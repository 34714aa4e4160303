"""What the benchmark derives from the rows' measurements: BLEU, speedups against the reference rows, Rep/Mis,
BLEU and latency by source length, and paired bootstrap tests.

Every speedup ("×") is one statistic: the median over the timing rounds of the paired per-round ratio (the reference
row's time on the round's block / the row's on the same block, :mod:`.schedule`), at batch 1 (latency), in the batched
pass (throughput) and at every ``--batch-sizes`` size, against every reference row; its spread is the range of those
ratios over the rounds."""

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional

import sacrebleu

from ..cli.rep_mis import rep_mis
from .rows import CT2_GREEDY, TEACHER_BEAM, TEACHER_GREEDY, TEACHER_GREEDY_PLUGIN, BenchmarkError, Row, spread
from .schedule import unsettled


def corpus_bleu(hyps: List[str], references: List[str]):
    """sacreBLEU (13a) of detokenized ``hyps`` against raw ``references``; returns (score, signature)."""
    bleu = sacrebleu.metrics.BLEU()
    return bleu.corpus_score(hyps, [references]).score, str(bleu.get_signature())


def reference_row(rows: List[Row], role: str, required: bool = True) -> Optional[Row]:
    """The row with ``role`` (the teacher's beam row, ...); None if there is none and it is not ``required``."""
    found = [row for row in rows if row.role == role]
    if len(found) > 1 or required and not found:
        raise BenchmarkError(f"expected one row with role {role!r}, found {len(found)}")
    return found[0] if found else None


def paired_ratios(reference: Row, row: Row, kind: str) -> List[float]:
    """Per round, ``reference``'s time on the round's block / ``row``'s (> 1: ``row`` is faster): ``kind``
    "latency" pairs the batch-1 blocks, "throughput" the batched pass's (as a ratio of sentences per second, the
    blocks being the same)."""
    if kind == "latency":
        return [a / b for a, b in zip(reference.latency_round_seconds, row.latency_round_seconds)]
    return [b / a for a, b in zip(reference.throughput_round_rates, row.throughput_round_rates)]


def compare(rows: List[Row]):
    """Every row's BLEU as % of the teacher's beam row's; its latency and throughput speedups against the teacher's
    beam and greedy rows, the greedy teacher with the plugin layout and the fastest CTranslate2 greedy row (each where
    the run has it), each the median of the paired per-round ratios (:func:`paired_ratios`, kept in
    ``speedup_rounds``); and its ``flag``: the ratios to the greedy teacher that the rounds leave unsettled, and an
    output that differs from the greedy teacher's by more than near-ties."""
    teacher = reference_row(rows, TEACHER_BEAM)
    for row in rows:
        row.bleu_pct_of_teacher = 100 * row.bleu / teacher.bleu if teacher.bleu > 0 else None
    greedy, plugin = reference_row(rows, TEACHER_GREEDY), reference_row(rows, TEACHER_GREEDY_PLUGIN, required=False)
    references = {"ar_beam": (teacher, teacher), "ar_greedy": (greedy, greedy)}
    if plugin is not None:
        references["ar_greedy_plugin"] = (plugin, plugin)
    if fastest_ctranslate2_greedy(rows) is not None:
        references["ct2_greedy"] = fastest_ctranslate2_greedy(rows)
    for key, pair in references.items():
        for kind, reference in zip(("latency", "throughput"), pair):
            name = f"{kind}_speedup_vs_{key}"
            for row in rows:
                row.speedup_rounds[name] = paired_ratios(reference, row, kind)
                setattr(row, name, statistics.median(row.speedup_rounds[name]))
    for row in rows:
        measured = (("latency", row.latency_ratio_rounds), ("throughput", row.throughput_ratio_rounds))
        flags = [name for name, ratios in measured if unsettled(ratios)]
        if row.real_divergences:
            flags.append("≠ greedy")
        row.flag = ", ".join(flags)


def fastest_ctranslate2_greedy(rows: List[Row]) -> Optional[tuple]:
    """The CTranslate2 greedy rows the ``_vs_ct2_greedy`` speedups are against: (the fastest at batch 1, the fastest
    batched), by the median of their paired per-round ratios to the greedy teacher; None without CTranslate2 rows."""
    ct2 = [row for row in rows if row.role == CT2_GREEDY]
    if not ct2:
        return None
    greedy = reference_row(rows, TEACHER_GREEDY)
    return tuple(
        max(ct2, key=lambda row: statistics.median(paired_ratios(greedy, row, kind)))
        for kind in ("latency", "throughput")
    )


def ctranslate2_agreement(rows: List[Row]) -> Optional[dict]:
    """Sentences where CTranslate2's float32 greedy output differs from fairseq's greedy output (None without that
    row): the converted model decodes what fairseq decodes."""
    greedy = reference_row(rows, TEACHER_GREEDY)
    for row in rows:
        if row.role == CT2_GREEDY and row.spec.args[row.spec.args.index("--compute-type") + 1] == "float32":
            differing = sum(a != b for a, b in zip(row.hyps, greedy.hyps))
            return {"row": row.name, "differing_sentences": differing, "sentences": len(row.hyps)}
    return None


def speed_at(rounds, row: int, outputs: Dict[int, object]) -> dict:
    """Row ``row``'s speed at the batch size of ``rounds`` (:class:`.schedule.Rounds`; ``outputs``: its
    :class:`.measure.Output` by sentence): medians over rounds of emitted tokens per second and ms per sentence, and
    the per-round ratios to the greedy teacher (> 1: faster) with their median, spread and whether they settle it, and
    the cold pass's ms per sentence (None: no cold pass)."""
    seconds, ratios = rounds.totals(row), rounds.ratios(row)
    tokens = [sum(outputs[i].tokens for unit in block for i in unit) for block in rounds.blocks]
    return {
        "batch_size": rounds.batch_size,
        "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, seconds)),
        "ms_per_sentence": statistics.median(1000 * s / n for s, n in zip(seconds, rounds.sentences())),
        "speedup_vs_ar_greedy": statistics.median(ratios),
        "ratio_rounds": ratios,
        "ratio_spread": spread(ratios),
        "unsettled": unsettled(ratios),
        "cold_ms_per_sentence": rounds.cold_ms_per_sentence(row),
    }


def add_rep_mis(rows: List[Row], references: List[str]):
    """Rep and Mis (Ran et al. 2020, eq. 7-10) of every row, relative to the teacher's greedy row, and the
    repeated/missing-token ratios, on the words of sacreBLEU's 13a tokenization
    (:func:`nat_plugins.cli.rep_mis.rep_mis`)."""
    ar_output = reference_row(rows, TEACHER_GREEDY).hyps
    for row in rows:
        measures = rep_mis(row.hyps, references, ar_output)
        row.rep, row.mis, row.rep_ratio, row.mis_ratio = (measures[k] for k in ("rep", "mis", "rep_ratio", "mis_ratio"))


@dataclass(frozen=True)
class LengthBucket:
    """Sources of ``low``..``high`` subwords (``high`` None: no upper bound)."""

    low: int
    high: Optional[int]

    @property
    def label(self) -> str:
        return f"{self.low}+" if self.high is None else f"{self.low}-{self.high}"

    def __contains__(self, length: int) -> bool:
        return length >= self.low and (self.high is None or length <= self.high)


def parse_length_buckets(text: str) -> List[LengthBucket]:
    """``--length-buckets 10,20,30`` (increasing upper bounds) -> 1-10, 11-20, 21-30, 31+."""
    try:
        bounds = [int(part) for part in text.split(",")]
    except ValueError:
        raise BenchmarkError(f"--length-buckets {text!r}: expected increasing integers, e.g. 10,20,30") from None
    if not bounds or bounds[0] < 1 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise BenchmarkError(f"--length-buckets {text!r}: expected increasing integers >= 1, e.g. 10,20,30")
    lows = [1] + [bound + 1 for bound in bounds]
    return [LengthBucket(low, high) for low, high in zip(lows, bounds + [None])]


def bucket_of(length: int, buckets: List[LengthBucket]) -> int:
    """Index of the bucket of a source of ``length`` subwords (an empty source counts in the first)."""
    return next((i for i, bucket in enumerate(buckets) if length in bucket), 0)


def bucket_counts(source_lengths: List[int], timed_ids: List[int], buckets: List[LengthBucket]) -> List[dict]:
    """Sentences of the split and timed batch-1 sentences in every bucket."""
    counts = [{"bucket": b.label, "low": b.low, "high": b.high, "sentences": 0, "timed_sentences": 0} for b in buckets]
    for length in source_lengths:
        counts[bucket_of(length, buckets)]["sentences"] += 1
    for i in timed_ids:
        counts[bucket_of(source_lengths[i], buckets)]["timed_sentences"] += 1
    return counts


def add_length_buckets(rows: List[Row], source_lengths: List[int], references: List[str], buckets: List[LengthBucket]):
    """Per row and source-length bucket: sacreBLEU over the bucket's sentences and the median batch-1 latency of its
    timed sentences (None where it has none); ``source_lengths``: subwords of every source, EOS excluded."""
    members = [[] for _ in buckets]
    for i, length in enumerate(source_lengths):
        members[bucket_of(length, buckets)].append(i)
    for row in rows:
        row.timed_src_lengths = [source_lengths[i] for i in row.timed_ids]
        latencies = [[] for _ in buckets]
        for length, ms in zip(row.timed_src_lengths, row.timed_latency_ms):
            latencies[bucket_of(length, buckets)].append(ms)
        row.by_length = [
            {
                "bucket": bucket.label,
                "sentences": len(ids),
                "bleu": corpus_bleu([row.hyps[i] for i in ids], [references[i] for i in ids])[0] if ids else None,
                "timed_sentences": len(ms),
                "latency_ms_median": statistics.median(ms) if ms else None,
            }
            for bucket, ids, ms in zip(buckets, members, latencies)
        ]


def pareto_front(points: List[tuple]) -> List[int]:
    """Indices of the (speedup, quality) ``points`` no other point beats on both, fastest first."""
    front, best = [], float("-inf")
    for i in sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1])):
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def paired_bootstrap(pairs: List[tuple], hyps: Dict[str, List[str]], references: List[str]) -> List[dict]:
    """sacreBLEU's paired bootstrap resampling (Koehn 2004, 1,000 resamples) for every (baseline, system) pair of
    row names; ``hyps`` maps row names to their hypotheses."""
    from sacrebleu.significance import PairedTest

    results = []
    for baseline, system in pairs:
        bleu = sacrebleu.metrics.BLEU(references=[references])
        test = PairedTest(
            [(baseline, hyps[baseline]), (system, hyps[system])],
            {"BLEU": bleu},
            references=None,
            test_type="bs",
            n_samples=1000,
        )
        signatures, scores = test()
        base, other = scores["BLEU"]
        results.append(
            {
                "baseline": baseline,
                "system": system,
                "baseline_bleu": base.score,
                "system_bleu": other.score,
                "delta": other.score - base.score,
                "p_value": other.p_value,
                "baseline_mean": base.mean,
                "baseline_ci": base.ci,
                "system_mean": other.mean,
                "system_ci": other.ci,
                "signature": str(signatures["BLEU"]),
            }
        )
    return results
