"""Criterion ``nat_rkl_finetune``: fine-tuning ``fertility_nat`` towards its AR teacher (Gu et al., ICLR 2018, §4.2).

Eq. 10, the "word-level knowledge distillation" loss of the NAT fed fertilities f, in the cross-entropy form the
paper writes (``--rkl-form ce``, the default):

    L_RKL(f) = - sum_t sum_y p_NA(y_t = y | x, f) * log p_AR(y_t = y | ŷ_<t, x)

where ŷ is the NAT's own argmax output for f and p_AR the frozen teacher, teacher-forced on ŷ in one parallel pass
(the paper's reverse direction: "more favorable towards highly peaked student output distributions"). ``--rkl-form
kl`` adds the student's negative entropy, sum_y p_NA log p_NA: the full reverse KL divergence KL(p_NA || p_AR), whose
extra term rewards a spread p_NA.

Eq. 11, the fine-tuning objective implemented here (the released salesforce code weighs the terms otherwise):

    L_FT = λ * ( E_{f ~ p_F}[ L_RKL(f) - L_RKL(f_avg) ] + L_RKL(f_gold) ) + (1 - λ) * L_KD

* the first term is trained with REINFORCE on the fertility predictor (a score-function loss, since
  ``Variable.reinforce`` no longer exists): (L_RKL(f) - L_RKL(f_avg)).detach() * log p_F(f), one f sampled per
  sentence, with the average-fertility decode (f_avg = Round(E[f]), §4.1) as the baseline; L_RKL summed over the
  output's positions as eq. 10 writes it, which rewards shorter outputs, or per position with ``--rkl-reward mean``
  (beyond the paper: :func:`reinforce_surrogate`);
* the second term is backpropagated through the decoder fed the aligner (gold) fertilities f_gold;
* L_KD is ``fertility_nat_loss`` on the (distilled) training batch, reusing the same gold-fertility decoder pass;
* λ = ``--rkl-weight`` (paper: 0.25).

Every pass of the student goes through ``model(...)`` (its ``forward``), so that DistributedDataParallel all-reduces
its gradients (``model.encode``/``decode`` would bypass it). There are two:

* the gold-fertility pass, with gradient and the training-time dropout: L_KD, L_RKL(f_gold) and log p_F(f);
* one pass without gradient and **without dropout** over 3B rows, the gold, the sampled and the average fertilities:
  the NAT outputs ŷ that the teacher is fed, exactly what the generator would emit for those fertilities
  (:func:`~.fertility.nat_output`: argmax without pad and EOS), and the distributions of L_RKL(f)
  and L_RKL(f_avg). Why without dropout: see docs/design-notes.md, *NAT RKL fine-tuning: a decode pass without
  dropout*.

The teacher (``--teacher-path``) is loaded once with the student's task, kept in eval mode with
``requires_grad=False`` in a plain holder (:class:`~nat_plugins.modules.teacher.FrozenTeacher`, not a submodule, so
it is neither optimised nor saved in the student's checkpoint) and moved to the student's device/dtype on first use;
it scores all 3B outputs in one teacher-forced pass. Sampled and average fertilities are cut (from the end of the
source) to ``--rkl-max-len-a`` * |x| + ``--rkl-max-len-b`` tokens and the decoder's positions, and a zero total gets
one token, as at inference; the REINFORCE log-probability is that of the drawn sample. The logged ``loss`` includes
the REINFORCE surrogate (its value is not a likelihood and may be negative); ``word_ins_loss``/``fertility_loss``
are the L_KD terms. Logged on top of ``fertility_nat_loss``'s terms (per sentence): ``rkl_gold``, ``rkl_sampled``,
``rkl_baseline`` and ``reinforce_loss``.
"""

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

import torch
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum
from torch import nn

from ...modules.loss_metrics import LoggingOutput, Sample
from ...modules.teacher import FrozenTeacher
from .fertility import average_fertility, cap_total, ensure_nonempty, nat_output, sample_fertilities
from .loss import FertilityNATLoss, FertilityNATLossConfig

if TYPE_CHECKING:
    from .model import FertilityNATModel

RKL_FORMS = ChoiceEnum(["ce", "kl"])
RKL_REWARDS = ChoiceEnum(["sum", "mean"])


@dataclass
class NATRKLFinetuneConfig(FertilityNATLossConfig):
    teacher_path: Optional[str] = field(
        default=None, metadata={"help": "the AR teacher checkpoint (required; frozen, never saved with the student)"}
    )
    rkl_weight: float = field(default=0.25, metadata={"help": "λ of Gu et al. eq. 11 (the paper: 0.25)"})
    rkl_max_len_a: float = field(
        default=2.0,
        metadata={
            "help": "sampled/average fertilities are cut to at most a * source length + b target "
            "tokens (an untrained predictor samples very long outputs)"
        },
    )
    rkl_max_len_b: int = field(default=10, metadata={"help": "see --rkl-max-len-a"})
    rkl_form: RKL_FORMS = field(
        default="ce",
        metadata={
            "help": "L_RKL of Gu et al. eq. 10: 'ce' (default), the paper's cross-entropy form -sum_y p_NA log p_AR, "
            "which favours peaked student distributions; 'kl', the full reverse KL sum_y p_NA (log p_NA - log p_AR), "
            "whose extra student-entropy term rewards spread"
        },
    )
    rkl_reward: RKL_REWARDS = field(
        default="sum",
        metadata={
            "help": "the REINFORCE reward of the sampled fertilities (eq. 11's first term): 'sum' (default, the "
            "paper's), L_RKL summed over the output's positions, which a shorter output lowers (on Multi30k the "
            "fine-tuning then shortens the NAT's outputs); 'mean', L_RKL per output position (beyond the paper), "
            "which does not favour length"
        },
    )


def rkl_loss(
    nat_logits: torch.Tensor, teacher_lprobs: torch.Tensor, mask: torch.Tensor, form: str = "ce"
) -> torch.Tensor:
    """Per-row L_RKL of Gu et al. eq. 10, (N,): ``nat_logits`` (N, T, V), ``teacher_lprobs`` (N, T, V), ``mask``
    ((N, T), True = a real target position). ``form`` 'ce': -sum_t sum_y p_NA log p_AR (the paper's); 'kl': plus
    sum_t sum_y p_NA log p_NA, the reverse KL divergence KL(p_NA || p_AR)."""
    if form not in ("ce", "kl"):
        raise ValueError(f"--rkl-form must be 'ce' or 'kl', got {form!r}")
    nat_lprobs = utils.log_softmax(nat_logits.float(), dim=-1)
    nat_probs = nat_lprobs.exp()
    teacher_lprobs = teacher_lprobs.float().masked_fill(torch.isinf(teacher_lprobs), -1e4)  # 0 * -inf -> 0
    per_position = -(nat_probs * teacher_lprobs).sum(dim=-1)
    if form == "kl":
        per_position = per_position + (nat_probs * nat_lprobs).sum(dim=-1)
    return (per_position * mask.to(per_position.dtype)).sum(dim=1)


def reinforce_surrogate(
    rkl_sampled: torch.Tensor,
    rkl_baseline: torch.Tensor,
    sample_lprob: torch.Tensor,
    positions: Tuple[torch.Tensor, torch.Tensor],
    reward: str = "sum",
) -> torch.Tensor:
    """The score-function surrogate of eq. 11's first term, sum_n (L_RKL(f_n) - L_RKL(f_avg,n)).detach() *
    log p_F(f_n), from the rows' L_RKL (:func:`rkl_loss`, detached) of the sampled and the average fertilities and
    ``sample_lprob`` log p_F(f) (N,); ``reward`` 'mean' divides each L_RKL by its output's ``positions`` (sampled,
    average; (N,) each) first, so that a shorter output is not a lower loss for being shorter."""
    if reward not in ("sum", "mean"):
        raise ValueError(f"--rkl-reward must be 'sum' or 'mean', got {reward!r}")
    if reward == "mean":
        sampled_positions, baseline_positions = (p.clamp(min=1).to(rkl_sampled.dtype) for p in positions)
        rkl_sampled, rkl_baseline = rkl_sampled / sampled_positions, rkl_baseline / baseline_positions
    return ((rkl_sampled - rkl_baseline).detach() * sample_lprob).sum()  # rewards are -L_RKL: lower is better


@contextlib.contextmanager
def without_dropout(model: nn.Module) -> Iterator[None]:
    """Every submodule of ``model`` (a DDP wrapper included) in eval mode inside the block, then as before."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@register_criterion("nat_rkl_finetune", dataclass=NATRKLFinetuneConfig)
class NATRKLFinetune(FertilityNATLoss):
    def __init__(
        self,
        task,
        teacher_path=None,
        rkl_weight=0.25,
        rkl_form="ce",
        rkl_reward="sum",
        rkl_max_len_a=2.0,
        rkl_max_len_b=10,
        label_smoothing=0.0,
        fertility_loss_weight=1.0,
        sentence_avg=False,
    ):
        super().__init__(task, label_smoothing, fertility_loss_weight, sentence_avg)
        if not 0.0 <= rkl_weight <= 1.0:
            raise ValueError(f"--rkl-weight must be in [0, 1], got {rkl_weight}")
        self.rkl_weight = rkl_weight
        self.rkl_form = rkl_form
        self.rkl_reward = rkl_reward  # checked where it is used, as rkl_form (reinforce_surrogate)
        self.max_len_a, self.max_len_b = rkl_max_len_a, rkl_max_len_b
        self.teacher = FrozenTeacher(teacher_path, task, "--teacher-path")  # a plain object: not a submodule

    def forward(
        self, model: "FertilityNATModel", sample: Sample, reduce: bool = True
    ) -> Tuple[torch.Tensor, float, LoggingOutput]:
        terms = self.losses(model, sample)
        loss = self.rkl_weight * (terms["reinforce"] + terms["rkl_gold"].sum()) + (1.0 - self.rkl_weight) * terms["kd"]
        bsz = sample["net_input"]["src_tokens"].size(0)
        sample_size = bsz if self.sentence_avg else terms["ntarget"]
        logging_output = self.logging_output(loss, terms, bsz, sample_size, sample["ntokens"])
        logging_output.update(
            {
                "rkl_gold": terms["rkl_gold"].detach().sum(),
                "rkl_sampled": terms["rkl_sampled"].sum(),
                "rkl_baseline": terms["rkl_baseline"].sum(),
                "reinforce_loss": terms["reinforce"].detach(),
            }
        )
        return loss, sample_size, logging_output

    def losses(self, model: "FertilityNATModel", sample: Sample) -> Dict[str, Any]:
        """The terms of eq. 11 for one batch (module docstring), with what they were computed from: ``kd``,
        ``rkl_gold`` ((B,), with gradient), ``reinforce`` (the score-function surrogate), ``rkl_sampled`` and
        ``rkl_baseline`` ((B,), no gradient), ``sampled`` (the drawn f, (B, S)), ``sample_lprob`` (log p_F(f), (B,)),
        ``fertility`` (the 3B decoded fertilities: gold, sampled, average), ``tokens``/``lengths`` (the 3B
        outputs fed to the teacher) and the ``fertility_nat_loss`` terms."""
        net_input = sample["net_input"]
        src_tokens, src_lengths = net_input["src_tokens"], net_input["src_lengths"]
        gold = sample["fertility"] if "fertility" in sample else None
        if gold is None:
            raise ValueError(
                "nat_rkl_finetune needs sample['fertility'] ({split}.fert.{src}, nat_plugins.cli.fertility)"
            )
        bsz = src_tokens.size(0)

        # the gold-fertility pass with gradient, shared by L_KD and the backprop term L_RKL(f_gold)
        net_output = model(src_tokens, src_lengths, gold)
        terms, _ = self.terms(model, sample, net_output)
        kd_loss = terms["word_loss"] + self.fertility_loss_weight * terms["fertility_nll"]
        gold_logits, gold_mask = net_output["word_ins"]["out"], net_output["word_ins"]["mask"]
        copyable = net_output["fertility"]["mask"]

        # f ~ p_F (REINFORCE) and the average-fertility baseline, limited as at inference
        fert_lprobs = utils.log_softmax(net_output["fertility"]["out"].float(), dim=-1)
        sampled = sample_fertilities(fert_lprobs.detach(), 1)[0].masked_fill(~copyable, 0)
        sample_lprob = (fert_lprobs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1) * copyable).sum(dim=1)
        average = average_fertility(fert_lprobs.detach()).masked_fill(~copyable, 0)
        noisy = torch.cat([sampled, average])
        noisy_src = torch.cat([src_tokens, src_tokens])
        max_length = (src_lengths.double() * self.max_len_a + self.max_len_b).long().repeat(2).to(noisy.device)
        limit = min(model.max_decoder_positions(), self.teacher.model.max_decoder_positions() - 1)
        noisy = ensure_nonempty(
            noisy, fert_lprobs.detach().repeat(2, 1, 1), copyable.repeat(2, 1), noisy_src.ne(self.padding_idx)
        )
        noisy = cap_total(noisy, max_length.clamp(min=1, max=limit))

        # gold, sampled and average fertilities decoded without gradient or dropout, as the generator would
        fertility = torch.cat([gold.long(), noisy])
        with torch.no_grad(), without_dropout(model):
            decoded = model(torch.cat([src_tokens, noisy_src]), src_lengths.repeat(3), fertility)["word_ins"]
        tokens, _scores, lengths = nat_output(decoded["out"], ~decoded["mask"], self.padding_idx, self.eos)

        # the teacher on those outputs: one teacher-forced pass over the 3B rows
        self.teacher.to(gold_logits)  # the student's device/dtype (moved once)
        teacher_lprobs, _target = self.teacher.score(
            src_tokens, src_lengths, tokens, lengths, order=torch.arange(bsz, device=src_tokens.device).repeat(3)
        )
        rkl_gold = rkl_loss(gold_logits, teacher_lprobs[:bsz, : gold_logits.size(1)], gold_mask, self.rkl_form)
        with torch.no_grad():
            width = decoded["out"].size(1)
            rkl_noisy = rkl_loss(
                decoded["out"][bsz:], teacher_lprobs[bsz:, :width], decoded["mask"][bsz:], self.rkl_form
            )
        rkl_sampled, rkl_baseline = rkl_noisy[:bsz], rkl_noisy[bsz:]
        positions = decoded["mask"][bsz:].sum(dim=1)
        reinforce = reinforce_surrogate(
            rkl_sampled, rkl_baseline, sample_lprob, (positions[:bsz], positions[bsz:]), self.rkl_reward
        )
        return dict(
            terms,
            kd=kd_loss,
            rkl_gold=rkl_gold,
            reinforce=reinforce,
            rkl_sampled=rkl_sampled,
            rkl_baseline=rkl_baseline,
            sampled=sampled,
            sample_lprob=sample_lprob,
            fertility=fertility,
            tokens=tokens,
            lengths=lengths,
        )
