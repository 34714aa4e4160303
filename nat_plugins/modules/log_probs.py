"""Log-probabilities of chosen tokens without a full log-softmax: the chosen logit minus the log-sum-exp over the
vocabulary, reduced in fp32 whatever the dtype of the logits.

fairseq's ``get_normalized_probs`` makes an fp32 copy of the (N, T, V) logits and an fp32 log-softmax of the same
size; NPD's rescoring (Gu et al. 2018, §4.1, eq. 8) and the NAT's output scores need one value per position.
"""

import torch

HALF_PRECISION = (torch.float16, torch.bfloat16)


def logsumexp_fp32(logits: torch.Tensor) -> torch.Tensor:
    """log sum_v exp(logits[..., v]) in fp32 (shape ``logits.shape[:-1]``). fp32 logits: ``torch.logsumexp``;
    half precision: the maximum in the native dtype, exp of the shifted logits in the native dtype, their sum
    accumulated and returned in fp32 (no fp32 copy of ``logits``)."""
    if logits.dtype not in HALF_PRECISION:
        return torch.logsumexp(logits, dim=-1)
    maxes = logits.amax(dim=-1, keepdim=True)
    total = (logits - maxes).exp_().sum(dim=-1, dtype=torch.float32)
    return total.log_() + maxes.squeeze(-1).float()


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)`` at ``tokens`` (``logits``: (..., V), ``tokens``: (...), long) in fp32: the gathered logit
    minus :func:`logsumexp_fp32`."""
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float() - logsumexp_fp32(logits)
