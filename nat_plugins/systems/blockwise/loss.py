"""Criterion ``blockwise_loss``: training the k heads of ``blockwise_transformer`` (Stern et al. 2018, §6).

Head i is trained with label-smoothed cross-entropy on y_{t+i} (targets shifted by
:func:`~.heads.block_targets`); the loss is the weighted mean over the scored predictions,
head 1 with weight 1 and heads 2..k with ``--other-heads-weight`` w (Adam normalises each parameter's gradient, so w
mostly sets how far the shared trunk moves to serve heads 2..k rather than head 1). ``--head-sampling`` chooses the
heads an update scores among the trainable ones (head 1 is not trainable under ``--freeze-base
--identity-first-head``):

* ``mean`` (default): all of them. With a frozen trunk the heads share one decoder pass, so this costs k-1 output
  projections instead of one and trains every head in every update;
* ``first-plus-random``: head 1 and one other head drawn from (seed, update): head 1, the only head whose output
  decoding keeps, is trained in every update at the cost of two output projections;
* ``random``: one head drawn from (seed, update) (the paper, §6: "we compute the loss of only one randomly selected
  head per minibatch", which saves memory). When the base trains, head 1 then gets 1/k of the updates while the
  other heads pull the shared trunk toward y_{t+i}: fine-tuning collapses into stutter.

Why the defaults (``mean``, w = 0.1) and the recipe's two stages: see docs/design-notes.md, *Blockwise: why the
loss's defaults*.

Heads an update does not score keep no gradient (``.grad`` stays ``None``): their output layers are left out of
the graph so that the optimizer does not move them (fairseq's Adam applies momentum and weight decay to every
parameter with a gradient, a zero one included).

Validation scores every head and also decodes the batch with verify-accept
(:class:`~.decoding.BlockwiseGenerator`: the task's ``--block-accept`` and
``--min-block-size``, by default exact acceptance of single proposals, and fairseq-generate's default length limits)
to log ``accepted_block``: emitted tokens (EOS included) per decoder call over the whole validation set, the
number ``fairseq-generate --print-step`` reports (§5, "mean accepted block size"). Logged besides:
``loss``/``nll_loss`` over the scored predictions and per head ``nll_h{i}`` and ``acc_h{i}``.
"""

import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import torch
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.configs import GenerationConfig
from fairseq.logging import metrics
from omegaconf import II

from ...modules.loss_metrics import LoggingOutput, Sample, log_bits, log_loss_and_nll, summed
from ...modules.options import check_label_smoothing
from .decoding import BlockwiseGenerator
from .heads import block_targets

if TYPE_CHECKING:
    from .model import BlockwiseTransformerModel

logger = logging.getLogger(__name__)

HEAD_SAMPLING = ChoiceEnum(["mean", "first-plus-random", "random"])
# DDP backends that leave a parameter no rank used without a gradient (with --find-unused-parameters)
UNUSED_SAFE_DDP_BACKENDS = ("c10d", "pytorch_ddp")


@dataclass
class BlockwiseLossConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.0, metadata={"help": "label smoothing epsilon of every head (use the AR teacher's, e.g. 0.1)"}
    )
    head_sampling: HEAD_SAMPLING = field(
        default="mean",
        metadata={
            "help": "heads scored per update, among the trainable ones: 'mean' all (the loss is their "
            "weighted mean); 'first-plus-random' head 1 and one other drawn from the update number; "
            "'random' one head drawn from the update number (the paper; when the base trains, head 1 "
            "then learns in 1/k of the updates and fine-tuning collapses). With 'first-plus-random' or "
            "'random' and several workers use --ddp-backend pytorch_ddp --find-unused-parameters, so "
            "unscored heads stay without a gradient"
        },
    )
    other_heads_weight: float = field(
        default=0.1,
        metadata={
            "help": "weight w of the losses of heads 2..k relative to head 1's when the base trains: the loss is "
            "(L_1 + w·sum of the other scored heads' losses) / (n_1 + w·their token counts). Adam "
            "normalises each parameter's gradient, so w mostly sets how far the shared trunk moves "
            "toward serving heads 2..k rather than head 1, whose output decoding keeps (0.1 kept the "
            "teacher's BLEU when fine-tuning, 1 (the plain mean) lost 17 BLEU; no effect with "
            "--freeze-base --identity-first-head, where head 1 is not scored)"
        },
    )
    sentence_avg: bool = II("optimization.sentence_avg")
    seed: int = II("common.seed")
    distributed_world_size: int = II("distributed_training.distributed_world_size")
    ddp_backend: str = II("distributed_training.ddp_backend")
    find_unused_parameters: bool = II("distributed_training.find_unused_parameters")


@register_criterion("blockwise_loss", dataclass=BlockwiseLossConfig)
class BlockwiseLoss(FairseqCriterion):
    def __init__(
        self,
        task,
        label_smoothing,
        head_sampling,
        sentence_avg,
        seed,
        other_heads_weight=0.1,
        distributed_world_size=1,
        ddp_backend="pytorch_ddp",
        find_unused_parameters=False,
    ):
        super().__init__(task)
        if not other_heads_weight > 0:
            raise ValueError(f"--other-heads-weight must be positive, got {other_heads_weight}")
        if (
            head_sampling != "mean"
            and distributed_world_size > 1
            and not (ddp_backend in UNUSED_SAFE_DDP_BACKENDS and find_unused_parameters)
        ):
            raise ValueError(
                f"--head-sampling {head_sampling} leaves the unscored heads' output layers unused in an update: with "
                f"{distributed_world_size} workers pass --ddp-backend pytorch_ddp --find-unused-parameters (a "
                f"parameter no worker used keeps no gradient, so Adam does not move it; --ddp-backend {ddp_backend} "
                "without it fails or gives it a zero gradient that momentum and weight decay still apply), or use "
                "--head-sampling mean"
            )
        self.eps = check_label_smoothing(label_smoothing)
        self.head_sampling = head_sampling
        self.other_heads_weight = other_heads_weight
        self.sentence_avg = sentence_avg
        self.seed = seed
        self.warned = False

    def heads_to_score(self, model: "BlockwiseTransformerModel") -> List[int]:
        """0-based heads this forward scores: all k in validation; in training the trainable ones (``mean``), or
        draws from (seed, update) — the same heads on every rank, so distributed training sees one loss."""
        if not model.training:
            return list(range(model.decoder.block_size))
        heads = list(model.trainable_heads)
        if self.head_sampling == "mean" or len(heads) == 1:
            return heads
        rng = random.Random(self.seed * 1_000_003 + model.num_updates)
        if self.head_sampling == "random":
            if not model.base_frozen and not self.warned:
                logger.warning(
                    "--head-sampling random with a trainable base trains head 1 in 1/k of the updates "
                    "while the other heads pull the trunk: fine-tuning tends to collapse (use mean)"
                )
                self.warned = True
            return [rng.choice(heads)]
        # first-plus-random: head 1 (when trainable) and one of the others
        if heads[0] != 0:
            return [rng.choice(heads)]
        return [0, rng.choice(heads[1:])]

    def forward(
        self, model: "BlockwiseTransformerModel", sample: Sample, reduce: bool = True
    ) -> Tuple[torch.Tensor, float, LoggingOutput]:
        heads = self.heads_to_score(model)
        targets = block_targets(sample["target"], model.decoder.block_size, self.padding_idx)[..., heads]
        scored = targets.ne(self.padding_idx)  # (B, T, len(heads)); past the end: no vocabulary projection
        logits, _ = model(**sample["net_input"], heads=heads, logits_at=scored)  # (N, V), N = scored predictions
        targets = targets[scored]
        slot_of_row = torch.arange(len(heads), device=targets.device).expand_as(scored)[scored]
        lprobs = utils.log_softmax(logits, dim=-1)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, targets, self.eps, reduce=False)
        correct = lprobs.argmax(dim=-1).eq(targets)

        def per_slot(values: torch.Tensor) -> torch.Tensor:
            return values.new_zeros(len(heads)).index_add_(0, slot_of_row, values)

        per_head_tokens = torch.bincount(slot_of_row, minlength=len(heads))
        per_head_nll = per_slot(nll_loss.squeeze(-1).detach())
        per_head_correct = torch.bincount(slot_of_row[correct], minlength=len(heads))
        weights = loss.new_tensor([1.0 if head == 0 else self.other_heads_weight for head in heads])
        loss = (per_slot(loss.squeeze(-1)) * weights).sum()
        nll_loss = nll_loss.sum()
        predicted = int(per_head_tokens.sum())
        if self.sentence_avg:
            sample_size = sample["target"].size(0) * float(weights.sum())
        else:
            sample_size = float((per_head_tokens * weights).sum())
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "predicted": predicted,
        }
        for i in range(model.decoder.block_size):
            slot = heads.index(i) if i in heads else None
            logging_output[f"h{i + 1}_ntokens"] = 0 if slot is None else int(per_head_tokens[slot])
            logging_output[f"h{i + 1}_nll"] = 0.0 if slot is None else per_head_nll[slot].data
            logging_output[f"h{i + 1}_correct"] = 0 if slot is None else int(per_head_correct[slot])
        if not model.training:
            logging_output.update(self.accepted_block_counts(model, sample))
        return loss, sample_size, logging_output

    def accepted_block_counts(self, model: "BlockwiseTransformerModel", sample: Sample) -> Dict[str, Any]:
        """Verify-accept decoding of the batch: ``block_tokens`` (tokens emitted, EOS included) and
        ``block_steps`` (decoder calls), summed over its sentences, as fairseq-generate counts them."""
        generator = BlockwiseGenerator([model], self.task, GenerationConfig(beam=1), draft_every_step=True)
        hypos = generator.generate([model], sample)
        return {
            "block_tokens": sum(len(h[0]["tokens"]) for h in hypos),
            "block_steps": sum(h[0]["steps"] for h in hypos),
        }

    @staticmethod
    def reduce_metrics(logging_outputs: List[LoggingOutput]) -> None:
        total = summed(logging_outputs)
        log_loss_and_nll(total, total("sample_size"), total("predicted"))
        heads = sorted(
            {
                int(key[1 : -len("_ntokens")])
                for log in logging_outputs
                for key in log
                if key.startswith("h") and key.endswith("_ntokens")
            }
        )
        for head in heads:
            ntokens = total(f"h{head}_ntokens")
            if ntokens > 0:
                log_bits(f"nll_h{head}", total(f"h{head}_nll"), ntokens)
                metrics.log_scalar(f"acc_h{head}", 100.0 * total(f"h{head}_correct") / ntokens, ntokens, round=2)
        steps = total("block_steps")
        if steps > 0:
            # weighted by decoder calls, so batches and workers combine into tokens / calls of the whole set
            metrics.log_scalar("accepted_block", total("block_tokens") / steps, steps, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
