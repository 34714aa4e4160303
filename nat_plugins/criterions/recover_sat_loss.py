"""Criterion ``recover_sat_loss``: training RecoverSAT (Ran et al., ACL 2020, §3.2–3.3) on ordinary fairseq batches.

For every sentence the segmented decoder inputs and targets are built on the fly from ``sample["target"]``:

* mixed annealing dividing (§3.3): s ~ Bernoulli(p); s = 0 cuts at the EQUAL points ceil(i*n/K), s = 1 at K-1
  distinct RAND points drawn from 1..n (n: an empty last segment); p = max(0, 1 - updates / ``--anneal-steps``)
  goes linearly from 1 to 0 (``--anneal-steps 0``: p = 0, always EQUAL). It follows the model's update count
  (``set_num_updates``), so it continues correctly after ``--restore-file``. No split point falls inside a word
  (``▁``/``@@`` aware).
* pseudo-repetitive segments (§3.2), with probability ``--pseudo-rep-prob`` q per sentence: the sentence is divided
  into K-1 segments, a prefix of random length 1..|S| of a random non-empty segment S is copied, followed by DEL,
  right after S; it is trained like any segment (its tokens, then DEL where a segment ends with EOS).
* empty segments are BOS -> EOS; the loss is label-smoothed NLL (``--label-smoothing``, the paper's 0.15).

Randomness comes from ``random.Random`` seeded with (``--seed``, update number, call within the update): identical on
every rank, reproducible, independent of the data order. Validation uses EQUAL points and no injection.
Logged: ``loss``/``nll_loss`` per trained position, ``anneal_p`` and ``pseudo_rep_rate`` (injected sentences).
"""

import random
from dataclasses import dataclass, field

from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ..modules.options import check_label_smoothing
from ..modules.segments import (
    DEL_SYMBOL,
    allowed_split_points,
    equal_split_points,
    inject_pseudo_repetition,
    random_split_points,
    segment_batch,
    split_at,
    word_boundary_tables,
)
from ._metrics import log_loss_and_nll, summed


@dataclass
class RecoverSATLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing epsilon (the paper: 0.15)"})
    anneal_steps: int = field(
        default=10000,
        metadata={
            "help": "updates over which p (probability of RAND rather than EQUAL split points) goes "
            "linearly from 1 to 0; 0 means p = 0 throughout (always EQUAL)"
        },
    )
    pseudo_rep_prob: float = field(
        default=0.5, metadata={"help": "probability q of injecting a pseudo-repetitive segment into a sentence"}
    )
    sentence_avg: bool = II("optimization.sentence_avg")
    seed: int = II("common.seed")


def annealed_p(num_updates, anneal_steps):
    """p of the mixed annealing dividing after ``num_updates`` updates (§3.3)."""
    if anneal_steps <= 0:
        return 0.0
    return max(0.0, 1.0 - num_updates / anneal_steps)


@register_criterion("recover_sat_loss", dataclass=RecoverSATLossConfig)
class RecoverSATLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing, anneal_steps, pseudo_rep_prob, sentence_avg, seed):
        super().__init__(task)
        if anneal_steps < 0:
            raise ValueError(f"--anneal-steps must be >= 0, got {anneal_steps}")
        if not 0.0 <= pseudo_rep_prob <= 1.0:
            raise ValueError(f"--pseudo-rep-prob must be in [0, 1], got {pseudo_rep_prob}")
        self.eps = check_label_smoothing(label_smoothing)
        self.anneal_steps = anneal_steps
        self.pseudo_rep_prob = pseudo_rep_prob
        self.sentence_avg = sentence_avg
        self.seed = seed
        self.boundary_tables = None  # built on first use: the model adds DEL to the dictionary
        self.draws = (None, 0)  # (update number, batches seen in that update)

    def rng(self, num_updates):
        """The generator of this batch: seeded by (seed, update, batch within the update), the same on every rank."""
        update, calls = self.draws
        calls = calls + 1 if update == num_updates else 0
        self.draws = (num_updates, calls)
        return random.Random((self.seed * 1_000_003 + num_updates) * 1_009 + calls)

    def segment_sentence(self, tokens, num_segments, p, q, rng):
        """Segments and pseudo flags of one target (token ids without EOS); ``rng`` None: EQUAL, no injection."""
        starts_word, continues_word = self.boundary_tables
        allowed = allowed_split_points(tokens, starts_word, continues_word)
        inject = rng is not None and num_segments > 1 and len(tokens) > 0 and rng.random() < q
        parts = num_segments - 1 if inject else num_segments
        if rng is not None and rng.random() < p:
            points = random_split_points(len(tokens), parts, allowed, rng)
        else:
            points = equal_split_points(len(tokens), parts, allowed)
        segments = split_at(tokens, points)
        if not inject:
            return segments, [False] * parts
        index = rng.choice([i for i, segment in enumerate(segments) if segment])
        return inject_pseudo_repetition(segments, index, rng.randint(1, len(segments[index])))

    def build_segments(self, model, target):
        """Step-major decoder inputs and targets for ``target`` (B x T, right-padded, ending in EOS); also p
        and the number of sentences that got a pseudo-repetitive segment."""
        if self.boundary_tables is None:
            self.boundary_tables = word_boundary_tables(self.task.target_dictionary)
        del_index = self.task.target_dictionary.index(DEL_SYMBOL)
        lengths = (target.ne(self.padding_idx).sum(dim=1) - 1).tolist()
        rows = target.tolist()
        p = annealed_p(model.num_updates, self.anneal_steps) if model.training else 0.0
        rng = self.rng(model.num_updates) if model.training else None
        batch_segments, batch_pseudo = [], []
        for row, length in zip(rows, lengths):
            segments, pseudo = self.segment_sentence(row[:length], model.num_segments, p, self.pseudo_rep_prob, rng)
            batch_segments.append(segments)
            batch_pseudo.append(pseudo)
        eos = self.task.target_dictionary.eos()
        inputs, targets = segment_batch(batch_segments, batch_pseudo, eos, self.padding_idx, del_index)
        injected = sum(any(flags) for flags in batch_pseudo)
        return inputs.to(target.device), targets.to(target.device), p, injected

    def forward(self, model, sample, reduce=True):
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
    def reduce_metrics(logging_outputs) -> None:
        total = summed(logging_outputs)
        nsentences = total("nsentences")
        log_loss_and_nll(total, total("sample_size"), total("trained_positions"))
        metrics.log_scalar("anneal_p", total("anneal_p_sum") / max(nsentences, 1), nsentences, round=3)
        metrics.log_scalar("pseudo_rep_rate", total("pseudo_rep") / max(nsentences, 1), nsentences, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
