"""The papers' own quality/speed claims, drawn as a relative reference in ``pareto.png``.

Each point is a system's BLEU as % of the same paper's AR baseline BLEU and its batch-1 latency speedup over that
baseline, all on WMT14 en-de, from the papers' tables. They are other data, models and hardware: compare
shapes (how much BLEU a speedup costs), not numbers.

Left out because no baseline BLEU expresses them as a %: blockwise parallel decoding (Stern et
al. 2018: best wall-clock speedup 3.3x at k=8, 26.11 BLEU on newstest2013) and Encoder-NAD-AD (Zhou et al. 2020:
+0.59 BLEU over its AR baseline at 8% slower decoding).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperPoint:
    """One published (BLEU, speedup) claim and the paper's AR baseline BLEU."""

    label: str
    paper: str
    bleu: float
    baseline_bleu: float
    speedup: float

    @property
    def bleu_pct(self) -> float:
        """BLEU as % of the paper's AR baseline."""
        return 100 * self.bleu / self.baseline_bleu


# Gu et al.'s AR baseline (beam 4, WMT14 en-de): 23.45 BLEU, their Table 1
GU_AR_BLEU = 23.45
WANG_AR_BLEU = 27.11  # SAT paper's Transformer, beam 4
RAN_AR_BLEU = 27.17  # RecoverSAT paper's Transformer

PAPER_POINTS = (
    PaperPoint("NAT+FT", "Gu et al. 2018", 17.69, GU_AR_BLEU, 15.6),
    PaperPoint("NAT+FT NPD s=10", "Gu et al. 2018", 18.66, GU_AR_BLEU, 7.68),
    PaperPoint("NAT+FT NPD s=100", "Gu et al. 2018", 19.17, GU_AR_BLEU, 2.36),
    PaperPoint("SAT K=2 b=4", "Wang et al. 2018", 26.90, WANG_AR_BLEU, 1.51),
    PaperPoint("SAT K=2", "Wang et al. 2018", 26.09, WANG_AR_BLEU, 2.07),
    PaperPoint("SAT K=4", "Wang et al. 2018", 24.67, WANG_AR_BLEU, 3.80),
    PaperPoint("SAT K=6", "Wang et al. 2018", 23.93, WANG_AR_BLEU, 5.58),
    PaperPoint("RecoverSAT K=2", "Ran et al. 2020", 27.11, RAN_AR_BLEU, 2.16),
    PaperPoint("RecoverSAT K=5", "Ran et al. 2020", 26.91, RAN_AR_BLEU, 3.17),
    PaperPoint("RecoverSAT K=10", "Ran et al. 2020", 26.32, RAN_AR_BLEU, 4.31),
)
