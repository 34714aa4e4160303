"""Criterion ``blockwise_loss``: training the k heads of ``blockwise_transformer`` (Stern et al. 2018, §6).

Head i is trained with label-smoothed cross-entropy on y_{t+i} (targets shifted by
:func:`~nat_plugins.modules.block_heads.block_targets`). ``--head-sampling random`` (the paper: "we compute the
loss of only one randomly selected head per minibatch", which saves the memory of k output projections) or
``mean`` (every head; the loss is the mean over all head predictions). Heads that cannot learn (head 1 under
``--freeze-base --identity-first-head``) are never sampled in training. Validation always scores every head.
Logged: ``loss``/``nll_loss`` over the scored predictions and per head ``nll_h{i}`` and ``acc_h{i}``.
"""

import random
from dataclasses import dataclass, field

from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ._metrics import log_bits, log_loss_and_nll, summed
from ..modules.block_heads import block_targets


@dataclass
class BlockwiseLossConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.0, metadata={"help": "label smoothing epsilon of every head (use the AR teacher's, e.g. 0.1)"}
    )
    head_sampling: ChoiceEnum(["random", "mean"]) = field(
        default="random",
        metadata={"help": "'random': the loss of one head per batch, drawn from the update number (the paper); "
                          "'mean': the mean over all heads"},
    )
    sentence_avg: bool = II("optimization.sentence_avg")
    seed: int = II("common.seed")


@register_criterion("blockwise_loss", dataclass=BlockwiseLossConfig)
class BlockwiseLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing, head_sampling, sentence_avg, seed):
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"--label-smoothing must be in [0, 1), got {label_smoothing}")
        if task.cfg.left_pad_target:
            raise ValueError("blockwise_loss shifts right-padded targets: do not set --left-pad-target")
        self.eps = label_smoothing
        self.head_sampling = head_sampling
        self.sentence_avg = sentence_avg
        self.seed = seed

    def heads_to_score(self, model):
        """All heads in validation; in training the trainable ones, or one of them drawn from (seed, update) —
        the same head on every rank, so distributed training sees one loss."""
        if not model.training:
            return range(model.decoder.block_size)
        heads = model.trainable_heads
        if self.head_sampling == "mean":
            return heads
        head = heads[random.Random(self.seed * 1_000_003 + model.num_updates).randrange(len(heads))]
        return range(head, head + 1)

    def forward(self, model, sample, reduce=True):
        heads = self.heads_to_score(model)
        logits, _ = model(**sample["net_input"], heads=heads)  # B x T x len(heads) x V
        targets = block_targets(sample["target"], model.decoder.block_size, self.padding_idx)[..., heads.start:heads.stop]
        lprobs = utils.log_softmax(logits, dim=-1)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, targets, self.eps, ignore_index=self.padding_idx, reduce=False)
        non_pad = targets.ne(self.padding_idx)
        correct = lprobs.argmax(dim=-1).eq(targets) & non_pad
        per_head_tokens = non_pad.sum(dim=(0, 1))
        per_head_nll = nll_loss.squeeze(-1).sum(dim=(0, 1))
        per_head_correct = correct.sum(dim=(0, 1))
        loss, nll_loss = loss.sum(), nll_loss.sum()
        if model.training and heads == range(1) and model.decoder.block_heads.identity_first_head:
            # head 1 bypasses the new layer: keep its parameters in the graph (zero gradient) for DDP
            loss = loss + 0.0 * sum(p.sum() for p in model.decoder.block_heads.parameters())
        predicted = int(per_head_tokens.sum())
        sample_size = sample["target"].size(0) * len(heads) if self.sentence_avg else predicted
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "predicted": predicted,
        }
        for i in range(model.decoder.block_size):
            scored = i in heads
            logging_output[f"h{i + 1}_ntokens"] = int(per_head_tokens[i - heads.start]) if scored else 0
            logging_output[f"h{i + 1}_nll"] = per_head_nll[i - heads.start].data if scored else 0.0
            logging_output[f"h{i + 1}_correct"] = int(per_head_correct[i - heads.start]) if scored else 0
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = summed(logging_outputs)
        log_loss_and_nll(total, total("sample_size"), total("predicted"))
        heads = sorted({int(key[1:-len("_ntokens")]) for log in logging_outputs for key in log
                        if key.startswith("h") and key.endswith("_ntokens")})
        for head in heads:
            ntokens = total(f"h{head}_ntokens")
            if ntokens > 0:
                log_bits(f"nll_h{head}", total(f"h{head}_nll"), ntokens)
                metrics.log_scalar(f"acc_h{head}", 100.0 * total(f"h{head}_correct") / ntokens, ntokens, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
