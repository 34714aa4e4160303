"""Self-attention mask of the Semi-Autoregressive Transformer (Wang et al., EMNLP 2018, §3.2, Figure 4)."""

import torch
from fairseq import utils


def relaxed_causal_mask(size: int, group_size: int) -> torch.Tensor:
    """Additive (size, size) mask (0 = visible, -inf = hidden) for target positions grouped by ``group_size`` K.

    The query at position i belongs to group g = i // K and sees every key position j < (g + 1) * K: all of
    its own group and everything before it (the paper's relaxed causal mask). K = 1 is the causal mask of
    fairseq's Transformer decoder.
    """
    if group_size < 1:
        raise ValueError(f"group size K must be >= 1, got {group_size}")
    positions = torch.arange(size)
    group_end = (positions // group_size + 1) * group_size
    visible = positions.unsqueeze(0) < group_end.unsqueeze(1)
    return utils.fill_with_neg_inf(torch.zeros(size, size)).masked_fill_(visible, 0.0)
