"""Criterion ``nad_ad_loss``: training Encoder-NAD-AD (Zhou, Zhang & Zong 2020, §3.3) on fairseq batches.

The joint objective maximises log P_AD(y | x, NAD) + λ·log P_NAD(ỹ | x): the AD learns the real target y
(``sample["target"]``), the NAD the sequence-level distilled target ỹ (``sample["kd_target"]``, loaded by
``--use-distilled side``; its EOS is dropped, the NAD predicts tokens only). As a loss (to minimise):

    loss = L_AD + λ·L_NAD + w·L_len

* L_AD: label-smoothed NLL (``--label-smoothing``, as the teacher's) per token of the real targets (EOS included);
* L_NAD: label-smoothed NLL per token of the distilled targets (EOS excluded), λ = ``--nad-weight``;
* L_len: with ``--nad-input-copy uniform``, cross-entropy of the NAD length predictor per sentence (gold = the
  distilled length, clamped to the last class); with ``--nad-input-copy fertility``, cross-entropy of the fertility
  predictor per copyable source token (gold = ``sample["fertility"]``, clamped to L-1); w = ``--length-loss-weight``.

Each term is normalised per token (sentence) of its own target inside the batch and the batch's ``sample_size``
is 1 (fairseq's ``nat_loss`` contract), so the two targets of different lengths weigh as the equation says.
Logged separately (bits): ``ad_loss``, ``nad_loss``, ``length_loss`` (or ``fertility_loss``), ``nll_loss`` (the
AD's unsmoothed NLL per token, hence ``ppl``) and ``nad_nll_loss``.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ...modules.loss_metrics import LoggingOutput, Sample, log_bits, summed
from ...modules.options import check_label_smoothing

if TYPE_CHECKING:
    from .model import NADADTransformerModel

LOGGED_TERMS = ("ad_loss", "nad_loss", "length_loss", "fertility_loss", "nll_loss", "nad_nll_loss")


@dataclass
class NADADLossConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.0, metadata={"help": "label smoothing epsilon of both decoders (use the teacher's, e.g. 0.1)"}
    )
    nad_weight: float = field(default=1.0, metadata={"help": "λ: weight of the NAD's loss on the distilled target"})
    length_loss_weight: float = field(
        default=0.1, metadata={"help": "weight of the NAD's length (uniform copy) or fertility (fertility copy) loss"}
    )


def nad_targets(kd_target: torch.Tensor, pad: int, length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Distilled targets without EOS, right-padded/cut to the NAD's ``length`` positions; and their lengths."""
    lengths = kd_target.ne(pad).long().sum(dim=1) - 1  # EOS excluded
    positions = torch.arange(kd_target.size(1), device=kd_target.device).unsqueeze(0)
    targets = kd_target.masked_fill(positions >= lengths.unsqueeze(1), pad)
    if targets.size(1) < length:
        targets = F.pad(targets, (0, length - targets.size(1)), value=pad)
    return targets[:, :length], lengths


@register_criterion("nad_ad_loss", dataclass=NADADLossConfig)
class NADADLoss(FairseqCriterion):
    """Joint AD + NAD loss of Encoder-NAD-AD (module docstring)."""

    required_side_inputs = ("kd_target",)

    def __init__(self, task, label_smoothing, nad_weight, length_loss_weight):
        super().__init__(task)
        if nad_weight < 0 or length_loss_weight < 0:
            raise ValueError(
                f"--nad-weight and --length-loss-weight must be >= 0, got {nad_weight}, {length_loss_weight}"
            )
        use_distilled = getattr(task.cfg, "use_distilled", None)
        if use_distilled != "side":
            raise ValueError(
                f"nad_ad_loss trains the AD on the real targets and the NAD on the distilled ones: pass "
                f"--use-distilled side (got --use-distilled {use_distilled}; 'target' would train both on the "
                "distilled targets, 'none' loads none)"
            )
        self.eps = check_label_smoothing(label_smoothing)
        self.nad_weight = nad_weight
        self.length_loss_weight = length_loss_weight

    def smoothed_nll(
        self, logits: torch.Tensor, target: torch.Tensor, model: "NADADTransformerModel", extra: Dict[str, Any]
    ) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """(label-smoothed loss, NLL, tokens) per token of ``target`` (the targets of the N rows of ``logits``,
        padding ignored)."""
        lprobs = model.get_normalized_probs((logits, extra), log_probs=True)
        loss, nll = label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx)
        tokens = int(target.ne(self.padding_idx).sum())
        return loss / max(tokens, 1), nll / max(tokens, 1), tokens

    def forward(
        self, model: "NADADTransformerModel", sample: Sample, reduce: bool = True
    ) -> Tuple[torch.Tensor, float, LoggingOutput]:
        if "kd_target" not in sample:
            raise ValueError(
                "nad_ad_loss needs sample['kd_target']: train with --use-distilled side and the "
                "{split}.kd.{tgt}.bin/.idx side files (nat_plugins.cli.distill)"
            )
        net_input = sample["net_input"]
        kd_target = sample["kd_target"]
        kd_lengths = kd_target.ne(self.padding_idx).long().sum(dim=1) - 1
        fertility_mode = model.encoder.input_copy == "fertility"
        if fertility_mode and "fertility" not in sample:
            raise ValueError(
                "--nad-input-copy fertility needs sample['fertility'] ({split}.fert.{src} side files "
                "computed on the distilled targets)"
            )
        target = sample["target"]
        scored = target.ne(self.padding_idx)  # logits of the scored positions only (packed, (N, V))
        logits, extra = model(
            net_input["src_tokens"],
            net_input["src_lengths"],
            net_input["prev_output_tokens"],
            nad_lengths=None if fertility_mode else kd_lengths,
            nad_fertility=sample["fertility"] if fertility_mode else None,
            logits_at=scored,
        )

        ad_loss, ad_nll, ad_tokens = self.smoothed_nll(logits, target[scored], model, extra)
        nad_padding = extra["nad_padding_mask"]  # the NAD logits come at its unpadded positions
        targets, _ = nad_targets(kd_target, self.padding_idx, nad_padding.size(1))
        nad_loss, nad_nll, nad_tokens = self.smoothed_nll(extra["nad_logits"], targets[~nad_padding], model, {})
        logging_output = {
            "ad_loss": ad_loss.data,
            "nad_loss": nad_loss.data,
            "nll_loss": ad_nll.data,
            "nad_nll_loss": nad_nll.data,
        }
        loss = ad_loss + self.nad_weight * nad_loss
        if fertility_mode:
            fert_logits = extra["nad_fertility_logits"]
            copyable = model.encoder.copyable(net_input["src_tokens"])
            gold = sample["fertility"].clamp(max=fert_logits.size(-1) - 1)
            predictor_loss = F.cross_entropy(fert_logits[copyable].float(), gold[copyable])
            logging_output["fertility_loss"] = predictor_loss.data
        else:
            length_logits = extra["nad_length_logits"]
            predictor_loss = F.cross_entropy(length_logits.float(), kd_lengths.clamp(max=length_logits.size(-1) - 1))
            logging_output["length_loss"] = predictor_loss.data
        loss = loss + self.length_loss_weight * predictor_loss

        logging_output.update(
            {
                "loss": loss.data,
                "ntokens": ad_tokens,
                "nad_ntokens": nad_tokens,
                "nsentences": sample["target"].size(0),
                "sample_size": 1,
            }
        )
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: List[LoggingOutput]) -> None:
        total = summed(logging_outputs)
        sample_size = total("sample_size")
        log_bits("loss", total("loss"), sample_size)
        for key in LOGGED_TERMS:
            if any(key in log for log in logging_outputs):
                log_bits(key, total(key), sample_size)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
