"""Criterion ``fertility_nat_loss``: training ``fertility_nat`` (Gu et al., ICLR 2018, §4.1 eq. 5 with the
fertilities from an external aligner as the latent variable's value).

loss = translation NLL of the decoder fed the gold fertilities (label-smoothed with ``--label-smoothing``)
       + ``--fertility-loss-weight`` * NLL of the gold fertilities under the fertility predictor.

The gold fertilities are ``sample["fertility"]`` (the task's ``{split}.fert.{src}``, made by
``nat_plugins.cli.fertility``); the targets are ``sample["target"]`` without EOS, whose length must equal the
fertility sum (checked, with an error naming the file to regenerate). Fertilities above L-1 (``--max-fertility``)
are clamped to L-1 in the fertility NLL only (as the released code does); the decoder still copies the gold
fertilities so the target length is kept; the first batch that holds one logs a warning saying what to change.
Terms are summed over tokens and divided by the number of target tokens
(EOS excluded), or sentences with ``--sentence-avg``. Logged: ``loss``, ``nll_loss`` and ``word_ins_loss`` (per target
token), ``fertility_loss`` (per source subword) and ``fertility_acc`` (argmax accuracy).
"""

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ...modules.loss_metrics import LoggingOutput, Sample, log_bits, log_loss_and_nll, summed
from ...modules.options import check_label_smoothing

if TYPE_CHECKING:
    from .model import FertilityNATModel, NamedOutputs

logger = logging.getLogger(__name__)


@dataclass
class FertilityNATLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing epsilon of the translation NLL"})
    fertility_loss_weight: float = field(default=1.0, metadata={"help": "weight of the fertility NLL"})
    sentence_avg: bool = II("optimization.sentence_avg")


def targets_without_eos(
    target: torch.Tensor, fertility: torch.Tensor, pad: int, length: Optional[int] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``target`` ((B, T), right-padded, EOS last) without EOS, padded to ``length`` columns, and its lengths;
    checks that every length equals the sentence's fertility sum."""
    lengths = target.ne(pad).long().sum(dim=1) - 1
    sums = fertility.long().sum(dim=1)
    if not torch.equal(lengths, sums):
        bad = (lengths != sums).nonzero()[0, 0].item()
        raise ValueError(
            f"fertilities sum to {int(sums[bad])} but the target has {int(lengths[bad])} subwords (EOS excluded): "
            "the fertility file ({split}.fert.{src}) must be made from the target the model trains on "
            "(with --use-distilled target, from train.kd.{tgt}); re-run nat_plugins.cli.fertility"
        )
    length = length if length is not None else max(int(lengths.max()), 1)
    columns = torch.arange(length, device=target.device)
    out = target.new_full((target.size(0), length), pad)
    width = min(length, target.size(1))
    out[:, :width] = target[:, :width]
    return out.masked_fill(columns.unsqueeze(0) >= lengths.unsqueeze(1), pad), lengths


@register_criterion("fertility_nat_loss", dataclass=FertilityNATLossConfig)
class FertilityNATLoss(FairseqCriterion):
    required_side_inputs = ("fertility",)

    def __init__(self, task, label_smoothing=0.0, fertility_loss_weight=1.0, sentence_avg=False):
        super().__init__(task)
        if fertility_loss_weight < 0:
            raise ValueError(f"--fertility-loss-weight must be >= 0, got {fertility_loss_weight}")
        self.eps = check_label_smoothing(label_smoothing)
        self.fertility_loss_weight = fertility_loss_weight
        self.sentence_avg = sentence_avg
        self.eos = task.target_dictionary.eos()
        self.warned_max_fertility = False

    def terms(
        self, model: "FertilityNATModel", sample: Sample, net_output: Optional["NamedOutputs"] = None
    ) -> Tuple[Dict[str, Any], "NamedOutputs"]:
        """Summed translation loss/NLL, fertility NLL and counts for ``sample`` (the model is run when
        ``net_output`` is not given); also returns the net output (``nat_rkl_finetune`` reuses it)."""
        if "fertility" not in sample:
            raise ValueError(
                "fertility_nat_loss needs sample['fertility']: the task loads it from {split}.fert.{src} "
                "(make it with nat_plugins.cli.fertility)"
            )
        net_input = sample["net_input"]
        if net_output is None:
            net_output = model(net_input["src_tokens"], net_input["src_lengths"], sample["fertility"])
        word = net_output["word_ins"]
        target, _lengths = targets_without_eos(
            sample["target"], sample["fertility"], self.padding_idx, length=word["out"].size(1)
        )
        mask = word["mask"] & target.ne(self.padding_idx)
        lprobs = model.get_normalized_probs((word["out"][mask], None), log_probs=True)  # no log-softmax on padding
        word_loss, word_nll = label_smoothed_nll_loss(lprobs, target[mask], self.eps, reduce=True)

        fert = net_output["fertility"]
        fert_lprobs = utils.log_softmax(fert["out"], dim=-1)
        fert_target = sample["fertility"].long()
        if not self.warned_max_fertility and fert_target.ge(model.max_fertility).any():
            self.warned_max_fertility = True
            largest, limit = int(fert_target.max()), model.max_fertility
            logger.warning(
                f"a fertility of {largest} in the training data ({{split}}.fert.{{src}}) is above --max-fertility "
                f"{limit} - 1: the fertility loss clamps it to {limit - 1}, so the model never predicts it; train "
                f"with --max-fertility {largest + 1} or more, or make the files with nat-fertility --max-fertility "
                f"{limit} (it moves the excess to neighbouring subwords, keeping the sum)"
            )
        fert_target = fert_target.clamp(max=model.max_fertility - 1)
        fert_mask = fert["mask"]
        fert_nll = -fert_lprobs[fert_mask].gather(-1, fert_target[fert_mask].unsqueeze(-1)).sum()
        fert_correct = fert_lprobs[fert_mask].argmax(dim=-1).eq(fert_target[fert_mask]).sum()
        return {
            "word_loss": word_loss,
            "word_nll": word_nll,
            "fertility_nll": fert_nll,
            "fertility_correct": fert_correct,
            "ntarget": int(mask.sum()),
            "nsource": int(fert_mask.sum()),
        }, net_output

    def forward(
        self, model: "FertilityNATModel", sample: Sample, reduce: bool = True
    ) -> Tuple[torch.Tensor, float, LoggingOutput]:
        terms, _ = self.terms(model, sample)
        loss = terms["word_loss"] + self.fertility_loss_weight * terms["fertility_nll"]
        nsentences = sample["target"].size(0)
        sample_size = nsentences if self.sentence_avg else terms["ntarget"]
        return loss, sample_size, self.logging_output(loss, terms, nsentences, sample_size, sample["ntokens"])

    @staticmethod
    def logging_output(
        loss: torch.Tensor, terms: Dict[str, Any], nsentences: int, sample_size: float, ntokens: int
    ) -> LoggingOutput:
        return {
            "loss": loss.data,
            "nll_loss": terms["word_nll"].data,
            "word_ins_loss": terms["word_loss"].data,
            "fertility_loss": terms["fertility_nll"].data,
            "fertility_correct": terms["fertility_correct"].data,
            "ntarget": terms["ntarget"],
            "nsource": terms["nsource"],
            "ntokens": ntokens,
            "nsentences": nsentences,
            "sample_size": sample_size,
        }

    @staticmethod
    def reduce_metrics(logging_outputs: List[LoggingOutput]) -> None:
        total = summed(logging_outputs)
        ntarget, nsource = total("ntarget"), total("nsource")
        log_loss_and_nll(total, total("sample_size"), ntarget)
        log_bits("word_ins_loss", total("word_ins_loss"), ntarget)
        log_bits("fertility_loss", total("fertility_loss"), nsource)
        metrics.log_scalar("fertility_acc", float(total("fertility_correct")) / max(nsource, 1), nsource, round=3)
        for key in ("rkl_gold", "rkl_sampled", "rkl_baseline", "reinforce_loss"):
            if any(key in log for log in logging_outputs):
                log_bits(key, total(key), total("nsentences"))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
