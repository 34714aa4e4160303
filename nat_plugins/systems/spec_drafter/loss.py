"""Criterion ``spec_drafter_loss``: training the drafter of speculative decoding (``spec_drafter``; Xia et al.
2023, §3 Spec-Drafter).

Each target y_1..y_n (EOS included, y_n = EOS) is cut at every prefix length c = 0..n-1: the drafter reads
BOS y_1..y_c, and its k query slots are trained with label-smoothed cross-entropy on y_{c+1..c+k} (slots past EOS are
not scored). All cuts of a batch share one encoder pass and one decoder pass (``every_cut`` of the model: about
n·k scored slots per sentence, where a few random cut points would score a few times k). Train on the teacher's
greedy outputs (``--use-distilled target --distilled-name kd_greedy``, as examples/multi30k/spec_drafter.sh): the
drafts must be what exact verification accepts, the teacher's argmax.

A drafter with ``--read-teacher-states`` reads the teacher's decoder states on the target, computed here by the
teacher ``--spec-drafter-teacher`` (the one that verifies it) teacher-forced on the target without gradient
(:meth:`~nat_plugins.modules.teacher.FrozenTeacher.decoder_states`): on its greedy outputs, the states decoding
computes.

Logged besides ``loss``/``nll_loss`` (per scored slot): ``acc`` (slots whose argmax is the target) and
``accepted_drafts``: per cut, how many leading slots are right — on distilled targets the drafts exact
verification would accept at that prefix, so 1 + ``accepted_drafts`` estimates the tokens per teacher call of
:mod:`nat_plugins.systems.spec_drafter.decoding` (validation uses the real references, so there it is only a
proxy).
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

import torch
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ...modules.loss_metrics import LoggingOutput, Sample, log_loss_and_nll, summed
from ...modules.options import check_label_smoothing
from ...modules.teacher import FrozenTeacher
from .decoding import SpecDrafterDecodingConfig
from .masks import every_cut_slots
from .model import states_before

if TYPE_CHECKING:
    from .model import SpecDrafterModel


@dataclass
class SpecDrafterLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing epsilon (e.g. 0.1)"})
    sentence_avg: bool = II("optimization.sentence_avg")


def every_cut_targets(target: torch.Tensor, draft_size: int, pad: int) -> torch.Tensor:
    """The draft targets of every cut of right-padded ``target`` ((B, T): y_1..y_n, y_n = EOS, then pad): (B, T·k),
    slot i of cut c (the drafter read y_0..y_c) at column c·k + i is y_{c+1+i}, pad past EOS (so every slot of a
    cut c >= n is pad)."""
    padded = torch.cat([target, target.new_full((target.size(0), draft_size), pad)], dim=1)
    return padded[:, every_cut_slots(target.size(1), draft_size, target.device)]


@register_criterion("spec_drafter_loss", dataclass=SpecDrafterLossConfig)
class SpecDrafterLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing, sentence_avg):
        super().__init__(task)
        self.eps = check_label_smoothing(label_smoothing)
        self.sentence_avg = sentence_avg
        self.teacher = None  # loaded at the first batch of a drafter that reads the teacher's states

    def teacher_states(self, model: "SpecDrafterModel", sample: Sample) -> torch.Tensor:
        """The teacher's state before each token of the sample's ``prev_output_tokens`` (B, T, d)."""
        if self.teacher is None:
            path = SpecDrafterDecodingConfig.current(self.task.cfg)["spec_drafter_teacher"]
            if not path:
                raise ValueError(
                    "spec_drafter_loss: this drafter reads the teacher's decoder states (--read-teacher-states): "
                    "pass the teacher that will verify it, --spec-drafter-teacher TEACHER_CKPT"
                )
            self.teacher = FrozenTeacher(path, self.task, "--spec-drafter-teacher")
        net_input = sample["net_input"]
        self.teacher.to(next(model.decoder.parameters()))
        features = self.teacher.decoder_states(
            net_input["src_tokens"], net_input["src_lengths"], net_input["prev_output_tokens"]
        )
        return states_before(features)

    def forward(
        self, model: "SpecDrafterModel", sample: Sample, reduce: bool = True
    ) -> Tuple[torch.Tensor, float, LoggingOutput]:
        net_input = sample["net_input"]
        draft_target = every_cut_targets(sample["target"], model.draft_size, self.padding_idx)
        scored = draft_target.ne(self.padding_idx)
        states = self.teacher_states(model, sample) if model.decoder.reads_teacher_states else None
        logits, _ = model(
            net_input["src_tokens"],
            net_input["src_lengths"],
            net_input["prev_output_tokens"],
            logits_at=scored,
            teacher_states=states,
        )
        targets = draft_target[scored]
        lprobs = utils.log_softmax(logits, dim=-1)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, targets, self.eps, reduce=True)
        correct = torch.zeros_like(scored)
        correct[scored] = lprobs.argmax(dim=-1).eq(targets)
        predicted = int(scored.sum())
        sample_size = sample["target"].size(0) if self.sentence_avg else predicted
        leading = correct.view(correct.size(0), -1, model.draft_size).long().cumprod(dim=2)
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "predicted": predicted,
            "correct": int(correct.sum()),
            "cuts": int(sample["target"].ne(self.padding_idx).sum()),  # one per target token
            "leading_correct": int(leading.sum()),
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: List[LoggingOutput]) -> None:
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
