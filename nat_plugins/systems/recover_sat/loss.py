"""Criterion ``recover_sat_loss``: training RecoverSAT (Ran et al., ACL 2020, §3.2–3.3) on ordinary fairseq batches.

The segmented decoder inputs and targets are built on the fly from ``sample["target"]``, for the whole batch in a
few tensor operations (:func:`~.segments.segment_targets`; no per-sentence Python):

* mixed annealing dividing (§3.3, eq. 5-6): s ~ Bernoulli(p); s = 0 cuts at the EQUAL points ceil(i*n/K), s = 1
  at K-1 distinct RAND points drawn from 1..n (n: an empty last segment), n counted in subwords: a split may fall
  at any subword position, as in the paper (``--split-at-word-starts``: only before a word's first subword,
  ``▁``/``@@`` aware). p = max(0, 1 - updates / ``--anneal-steps``) goes linearly from 1 to 0 over the whole
  training by default (``--anneal-steps`` defaults to fairseq's ``--max-update``, as the paper anneals p from 1
  to 0 during training; ``--anneal-steps 0``: p = 0, always EQUAL). It follows the model's update count
  (``set_num_updates``), so it continues correctly after ``--restore-file``.
* pseudo-repetitive segments (§3.2), with probability ``--pseudo-rep-prob`` q per sentence: the sentence is divided
  into K-1 segments, a prefix of random length 1..|S| of a random non-empty segment S is copied, followed by DEL,
  right after S; only its DEL is trained, as in the released code (``--pseudo-rep-tokens``: its copied tokens too,
  which teaches a segment to restart its predecessor: see docs/design-notes.md, *RecoverSAT: a second segment that
  restarts the sentence*).
* empty segments are BOS -> EOS; the loss is label-smoothed NLL (``--label-smoothing``, the paper's 0.15).

Randomness comes from a ``torch.Generator`` on the batch's device seeded with (``--seed``, update number, call within
the update): identical on every rank, reproducible, independent of the data order. Every random decision has uniform
draws of its own (:class:`~.segments.SegmentDraws`). Validation uses EQUAL points and no injection.
Logged: ``loss``/``nll_loss`` per trained position, ``anneal_p`` and ``pseudo_rep_rate`` (injected sentences).
"""

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ...modules.loss_metrics import LoggingOutput, Sample, log_loss_and_nll, summed
from ...modules.options import check_label_smoothing
from .segments import DEL_SYMBOL, SegmentDraws, segment_targets, word_boundary_tables

if TYPE_CHECKING:
    from .model import RecoverSATModel

logger = logging.getLogger(__name__)


@dataclass
class RecoverSATLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing epsilon (the paper: 0.15)"})
    anneal_steps: Optional[int] = field(
        default=None,
        metadata={
            "help": "updates over which p (probability of RAND rather than EQUAL split points) goes "
            "linearly from 1 to 0 (default: --max-update, the whole training, as in the paper); "
            "0 means p = 0 throughout (always EQUAL)"
        },
    )
    pseudo_rep_prob: float = field(
        default=0.5, metadata={"help": "probability q of injecting a pseudo-repetitive segment into a sentence"}
    )
    pseudo_rep_tokens: bool = field(
        default=False,
        metadata={
            "help": "also train the copied tokens of a pseudo-repetitive segment (default: only its DEL, as the "
            "paper's released code; training the copies teaches a segment to restart the one before it)"
        },
    )
    split_at_word_starts: bool = field(
        default=False,
        metadata={
            "help": "split targets into segments only before the first subword of a word (sentencepiece '▁', "
            "subword-nmt '@@' aware), moving EQUAL's points to the nearest word start; default: at any subword "
            "position, as the paper (its released code's word rule never fired); at large K this leaves many "
            "segments empty"
        },
    )
    nonempty_segments_first: bool = field(
        default=False,
        metadata={
            "help": "a target of n < K subwords is cut into n one-subword segments, the K-n empty ones last (beyond "
            "the paper, whose EQUAL/RAND points leave empty segments between the non-empty ones, each still decoded "
            "to its end in step 0); for K near or above the targets' length"
        },
    )
    sentence_avg: bool = II("optimization.sentence_avg")
    seed: int = II("common.seed")
    max_update: int = II("optimization.max_update")


def default_anneal_steps(max_update: Optional[int]) -> int:
    """``--anneal-steps`` when it is not given: the whole training, fairseq's ``--max-update`` (§3.3: p goes from 1
    to 0 during training); a clear error when training has no update limit."""
    if max_update is None or max_update <= 0:
        raise ValueError(
            "--anneal-steps defaults to --max-update (p anneals from 1 to 0 over the whole training), but "
            f"--max-update is {max_update} (no update limit): pass --max-update N, or --anneal-steps N "
            "(0: p = 0, always EQUAL split points)"
        )
    return max_update


def annealed_p(num_updates: int, anneal_steps: int) -> float:
    """p of the mixed annealing dividing after ``num_updates`` updates (§3.3)."""
    if anneal_steps <= 0:
        return 0.0
    return max(0.0, 1.0 - num_updates / anneal_steps)


@register_criterion("recover_sat_loss", dataclass=RecoverSATLossConfig)
class RecoverSATLoss(FairseqCriterion):
    def __init__(
        self,
        task,
        label_smoothing,
        anneal_steps,
        pseudo_rep_prob,
        pseudo_rep_tokens,
        split_at_word_starts,
        nonempty_segments_first,
        sentence_avg,
        seed,
        max_update,
    ):
        super().__init__(task)
        if anneal_steps is None:
            anneal_steps = default_anneal_steps(max_update)
            logger.info(f"--anneal-steps {anneal_steps}: p anneals from 1 to 0 over the whole training (--max-update)")
        if anneal_steps < 0:
            raise ValueError(f"--anneal-steps must be >= 0, got {anneal_steps}")
        if not 0.0 <= pseudo_rep_prob <= 1.0:
            raise ValueError(f"--pseudo-rep-prob must be in [0, 1], got {pseudo_rep_prob}")
        self.eps = check_label_smoothing(label_smoothing)
        self.anneal_steps = anneal_steps
        self.pseudo_rep_prob = pseudo_rep_prob
        self.pseudo_rep_tokens = pseudo_rep_tokens
        self.split_at_word_starts = split_at_word_starts
        self.nonempty_segments_first = nonempty_segments_first
        self.sentence_avg = sentence_avg
        self.seed = seed
        self.boundary_tables = None  # --split-at-word-starts: built on first use (the model adds DEL to the dictionary)
        self.calls = (None, 0)  # (update number, batches seen in that update)

    def draws(self, model: "RecoverSATModel", target: torch.Tensor) -> SegmentDraws:
        """The draws of this batch (:class:`~.segments.SegmentDraws`) from a ``torch.Generator`` on
        the target's device, seeded by (seed, update, batch within the update): the same on every rank."""
        update, calls = self.calls
        calls = calls + 1 if update == model.num_updates else 0
        self.calls = (model.num_updates, calls)
        generator = torch.Generator(device=target.device)
        generator.manual_seed((self.seed * 1_000_003 + model.num_updates) * 1_009 + calls)
        return SegmentDraws.sample(target.size(0), target.size(1), model.num_segments, generator, target.device)

    def build_segments(
        self, model: "RecoverSATModel", target: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, float, torch.Tensor]:
        """Step-major decoder inputs and targets for ``target`` ((B, T), right-padded, ending in EOS), built with
        tensor operations (:func:`~.segments.segment_targets`); also p and the number of
        sentences that got a pseudo-repetitive segment (a tensor)."""
        dictionary = self.task.target_dictionary
        stale = self.boundary_tables is None or self.boundary_tables[0].device != target.device
        if self.split_at_word_starts and stale:
            self.boundary_tables = tuple(table.to(target.device) for table in word_boundary_tables(dictionary))
        p = annealed_p(model.num_updates, self.anneal_steps) if model.training else 0.0
        draws = self.draws(model, target) if model.training else None
        inputs, targets, injected = segment_targets(
            target,
            model.num_segments,
            self.padding_idx,
            dictionary.eos(),
            dictionary.index(DEL_SYMBOL),
            self.boundary_tables,
            p=p,
            q=self.pseudo_rep_prob,
            draws=draws,
            pseudo_tokens=self.pseudo_rep_tokens,
            nonempty_first=self.nonempty_segments_first,
        )
        return inputs, targets, p, injected.sum()

    def forward(
        self, model: "RecoverSATModel", sample: Sample, reduce: bool = True
    ) -> Tuple[torch.Tensor, float, LoggingOutput]:
        inputs, targets, p, injected = self.build_segments(model, sample["target"])
        net_input = sample["net_input"]
        scored = targets.ne(self.padding_idx)  # segment fillers are padding: no vocabulary projection there
        net_output = model(net_input["src_tokens"], net_input["src_lengths"], inputs, logits_at=scored)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, targets[scored], self.eps)
        trained = int(scored.sum())
        nsentences = sample["target"].size(0)
        sample_size = nsentences if self.sentence_avg else trained
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": nsentences,
            "sample_size": sample_size,
            "trained_positions": trained,
            "anneal_p_sum": p * nsentences,
            "pseudo_rep": injected,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: List[LoggingOutput]) -> None:
        total = summed(logging_outputs)
        nsentences = total("nsentences")
        log_loss_and_nll(total, total("sample_size"), total("trained_positions"))
        metrics.log_scalar("anneal_p", total("anneal_p_sum") / max(nsentences, 1), nsentences, round=3)
        metrics.log_scalar("pseudo_rep_rate", total("pseudo_rep") / max(nsentences, 1), nsentences, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
