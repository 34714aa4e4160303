"""Fertility tensor helpers of ``fertility_nat`` (Gu et al., ICLR 2018), shared by its fine-tuning criterion
(``nat_rkl_finetune``, §4.2) and its generator (``--fertility-decoding``, §4.1), so that the fertilities the criterion
rewards and the outputs the teacher scores are exactly those the generator would decode.

* :func:`average_fertility`: §4.1 "average decoding", f_j = Round(sum_f f * p_F(f | x, j));
* :func:`sample_fertilities`: f_j ~ p_F(. | x, j), independently per source position (§4.1 noisy parallel decoding,
  §4.2 the REINFORCE samples);
* :func:`ensure_nonempty` and :func:`cap_total`: the length rules both apply (at least one target token, at most a
  maximum length, cut from the end of the source);
* :func:`nat_output`: what the NAT emits for decoder logits (argmax without pad and EOS).

Fertilities are (B, S) integers aligned with ``src_tokens`` (0 on padding and EOS); fertility log-probabilities are
(B, S, L) (a softmax over 0..L-1).
"""

import math
from typing import Optional, Tuple

import torch

from ...modules.log_probs import logsumexp_fp32


def average_fertility(fertility_lprobs: torch.Tensor) -> torch.Tensor:
    """Round(E[f]) at every position ((B, S), long) of ``fertility_lprobs`` ((B, S, L) log-probabilities): Gu et al.
    §4.1 "average decoding", also the baseline of the REINFORCE term of eq. 11. ``torch.round`` rounds halves to
    even."""
    values = torch.arange(fertility_lprobs.size(-1), device=fertility_lprobs.device, dtype=fertility_lprobs.dtype)
    return (fertility_lprobs.exp() * values).sum(dim=-1).round().long()


def sample_fertilities(fertility_lprobs: torch.Tensor, num_samples: int) -> torch.Tensor:
    """(``num_samples``, B, S) fertilities drawn from p_F (``fertility_lprobs``: (B, S, L)), every position
    independently (Gu et al. §4.1 NPD's samples, §4.2 the REINFORCE samples); from torch's global random state."""
    # validate_args=False: the check of the logits would be a host-device synchronisation
    return torch.distributions.Categorical(logits=fertility_lprobs, validate_args=False).sample((num_samples,))


def ensure_nonempty(
    fertility: torch.Tensor, fertility_lprobs: torch.Tensor, copyable: torch.Tensor, nonpad: torch.Tensor
) -> torch.Tensor:
    """Give fertility 1 to the source position least likely to have fertility 0 in every row of ``fertility`` (B, S)
    whose fertilities sum to 0 (rows without a ``copyable`` position, (B, S) bool, copy their last ``nonpad`` position,
    the EOS); branch-free (no host-device synchronisation): other rows get 0 added."""
    empty = fertility.sum(dim=1).eq(0)
    candidates = copyable | (~copyable.any(dim=1, keepdim=True) & nonpad)
    key = (-fertility_lprobs[..., 0]).masked_fill(~candidates, -math.inf)
    position = key.argmax(dim=1, keepdim=True)
    return fertility.scatter_add(1, position, empty.long().unsqueeze(1))


def cap_total(fertility: torch.Tensor, max_length: torch.Tensor) -> torch.Tensor:
    """Cut fertilities (B, S) from the end of the source so that each row sums to at most ``max_length`` (B,)."""
    ends = fertility.cumsum(dim=1)
    limit = max_length.view(-1, 1)
    return ends.clamp(max=limit) - (ends - fertility).clamp(max=limit)


def nat_output(
    logits: torch.Tensor,
    padding: torch.Tensor,
    pad: int,
    eos: int,
    unk: Optional[int] = None,
    unk_penalty: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the NAT emits for decoder ``logits`` (B, T, V) and the target ``padding`` mask (B, T): at every
    position the most probable token other than pad and EOS (the NAT's targets contain neither; the generator
    appends EOS), with ``unk_penalty`` subtracted from ``unk``'s logit; pad on padding positions.

    Returns ``tokens`` (B, T), their log-probabilities under the NAT ((B, T), 0 on padding) and ``lengths`` (B,).
    ``logits`` is left unchanged (the top-4 candidates hold the best token that is none of pad/EOS/unk). Top-k and
    the log-sum-exp run on the logits' own dtype, the scores are fp32 (:func:`.log_probs.logsumexp_fp32`: no fp32
    copy of the (B, T, V) logits)."""
    values, indices = logits.topk(min(4, logits.size(-1)), dim=-1)
    values = values.float().masked_fill(indices.eq(pad) | indices.eq(eos), -math.inf)
    if unk_penalty:
        values = values - unk_penalty * indices.eq(unk).to(values.dtype)
    best, choice = values.max(dim=-1)
    tokens = indices.gather(-1, choice.unsqueeze(-1)).squeeze(-1).masked_fill(padding, pad)
    scores = (best - logsumexp_fp32(logits)).masked_fill(padding, 0.0)
    return tokens, scores, (~padding).long().sum(dim=1)
