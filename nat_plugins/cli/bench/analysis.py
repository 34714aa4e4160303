"""What the benchmark derives from the rows' measurements: BLEU, speedups against the reference rows, Rep/Mis
and paired bootstrap tests."""

from typing import Dict, List, Optional

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from ..rep_mis import rep_mis
from .rows import CT2_GREEDY, TEACHER_BEAM, TEACHER_GREEDY, BenchmarkError, Row


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


def compare(rows: List[Row]):
    """Every row's BLEU as % of the teacher's beam row's, and its latency and throughput speedups against the
    teacher's beam and greedy rows and, when it was measured, the teacher decoded greedily by CTranslate2."""
    teacher = reference_row(rows, TEACHER_BEAM)
    for row in rows:
        row.bleu_pct_of_teacher = 100 * row.bleu / teacher.bleu if teacher.bleu > 0 else None
    for key, role in (("ar_beam", TEACHER_BEAM), ("ar_greedy", TEACHER_GREEDY), ("ct2_greedy", CT2_GREEDY)):
        ref = reference_row(rows, role, required=role != CT2_GREEDY)
        if ref is None:
            continue
        for row in rows:
            setattr(row, f"latency_speedup_vs_{key}", ref.latency_ms_median / row.latency_ms_median)
            setattr(row, f"throughput_speedup_vs_{key}", row.throughput_sent_per_s / ref.throughput_sent_per_s)


def add_rep_mis(rows: List[Row], references: List[str]):
    """Rep and Mis (Ran et al. 2020, eq. 7-10) of every row, relative to the teacher's greedy row, and the
    repeated/missing-token ratios, on 13a-tokenized words."""
    tokenize = Tokenizer13a()
    tokenized_references = [tokenize(line) for line in references]
    ar_output = [tokenize(line) for line in reference_row(rows, TEACHER_GREEDY).hyps]
    for row in rows:
        measures = rep_mis([tokenize(line) for line in row.hyps], tokenized_references, ar_output)
        row.rep, row.mis, row.rep_ratio, row.mis_ratio = (measures[k] for k in ("rep", "mis", "rep_ratio", "mis_ratio"))


def paired_bootstrap(pairs: List[tuple], hyps: Dict[str, List[str]], references: List[str]) -> List[dict]:
    """sacreBLEU's paired bootstrap resampling (Koehn 2004, 1,000 resamples) for every (baseline, system) pair of
    row names; ``hyps`` maps row names to their hypotheses."""
    from sacrebleu.significance import PairedTest

    results = []
    for baseline, system in pairs:
        bleu = sacrebleu.metrics.BLEU(references=[references])
        test = PairedTest([(baseline, hyps[baseline]), (system, hyps[system])], {"BLEU": bleu}, references=None,
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
