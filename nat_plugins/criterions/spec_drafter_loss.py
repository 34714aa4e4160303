"""Criterion ``spec_drafter_loss``: training the drafter of speculative decoding (``spec_drafter``; Xia et al.
2023, §3 Spec-Drafter).

Each target y_1..y_n (EOS included, y_n = EOS) is cut ``--cuts-per-sentence`` times at prefix lengths c drawn
uniformly from 0..n-1 (torch's generator, which fairseq seeds from (seed, update)); the drafter reads BOS y_1..y_c
and its k query slots are trained with label-smoothed cross-entropy on y_{c+1..c+k} (slots past EOS are not
scored). The cuts of a batch share one encoder pass. Train on the teacher's distilled outputs
(``--use-distilled target``): the drafts must be what the teacher itself will emit.

Logged besides ``loss``/``nll_loss`` (per scored slot): ``acc`` (slots whose argmax is the target) and
``accepted_drafts``: per cut, how many leading slots are right — on distilled targets the drafts exact
verification would accept at that prefix, so 1 + ``accepted_drafts`` estimates the tokens per teacher call of
:mod:`nat_plugins.generators.speculative_decoding` (validation uses the real references, so there it is only a
proxy).
"""

from dataclasses import dataclass, field

import torch
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ..modules.options import check_label_smoothing
from ._metrics import log_loss_and_nll, summed


@dataclass
class SpecDrafterLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing epsilon (e.g. 0.1)"})
    cuts_per_sentence: int = field(
        default=2,
        metadata={
            "help": "random prefix cut points per sentence and batch, each a row of k draft slots; the encoder "
            "runs once for all of them"
        },
    )
    sentence_avg: bool = II("optimization.sentence_avg")


def draft_examples(target, prev_output_tokens, cuts_per_sentence, draft_size, pad):
    """Prefixes and draft targets at random cut points of right-padded ``target`` (B x T, each row ending with EOS)
    and its ``prev_output_tokens`` (BOS y_1 .. y_{n-1}): returns ``prefix`` (R·B x P: BOS y_1..y_c, then pad),
    ``prefix_lengths`` (R·B, = c + 1) and ``draft_target`` (R·B x k: y_{c+1..c+k}, pad past EOS); row r·B + b
    is cut r of sentence b (R = ``cuts_per_sentence``)."""
    lengths = target.ne(pad).long().sum(dim=1).repeat(cuts_per_sentence)
    cuts = (torch.rand(lengths.shape, device=target.device) * lengths).long()  # uniform over 0..n-1
    width = int(cuts.max()) + 1
    prev = prev_output_tokens.repeat(cuts_per_sentence, 1)[:, :width]
    columns = torch.arange(width, device=target.device)
    prefix = prev.masked_fill(columns > cuts.unsqueeze(1), pad)
    index = cuts.unsqueeze(1) + torch.arange(draft_size, device=target.device)
    padded = torch.cat([target, target.new_full((target.size(0), draft_size), pad)], dim=1)
    draft_target = padded.repeat(cuts_per_sentence, 1).gather(1, index)
    return prefix, cuts + 1, draft_target


@register_criterion("spec_drafter_loss", dataclass=SpecDrafterLossConfig)
class SpecDrafterLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing, cuts_per_sentence, sentence_avg):
        super().__init__(task)
        if cuts_per_sentence < 1:
            raise ValueError(f"--cuts-per-sentence must be at least 1, got {cuts_per_sentence}")
        self.eps = check_label_smoothing(label_smoothing)
        self.cuts_per_sentence = cuts_per_sentence
        self.sentence_avg = sentence_avg

    def forward(self, model, sample, reduce=True):
        net_input = sample["net_input"]
        prefix, prefix_lengths, draft_target = draft_examples(
            sample["target"],
            net_input["prev_output_tokens"],
            self.cuts_per_sentence,
            model.draft_size,
            self.padding_idx,
        )
        scored = draft_target.ne(self.padding_idx)
        logits, _ = model(
            net_input["src_tokens"], net_input["src_lengths"], prefix, prefix_lengths=prefix_lengths, logits_at=scored
        )
        targets = draft_target[scored]
        lprobs = utils.log_softmax(logits, dim=-1)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, targets, self.eps, reduce=True)
        correct = torch.zeros_like(scored)
        correct[scored] = lprobs.argmax(dim=-1).eq(targets)
        predicted = int(scored.sum())
        sample_size = sample["target"].size(0) * self.cuts_per_sentence if self.sentence_avg else predicted
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "predicted": predicted,
            "correct": int(correct.sum()),
            "cuts": prefix.size(0),
            "leading_correct": int(correct.long().cumprod(dim=1).sum()),
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = summed(logging_outputs)
        predicted = total("predicted")
        log_loss_and_nll(total, total("sample_size"), predicted)
        if predicted > 0:
            metrics.log_scalar("acc", 100.0 * total("correct") / predicted, predicted, round=2)
        if total("cuts") > 0:
            metrics.log_scalar("accepted_drafts", total("leading_correct") / total("cuts"), total("cuts"), round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
