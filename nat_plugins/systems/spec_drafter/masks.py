"""The self-attention masks and layout of the speculative drafter (Xia et al., Findings of EMNLP 2023, §3
Spec-Drafter; :mod:`~.model`): a prefix read causally followed by k query slots, at decoding
(one group of queries) and in the every-cut training pass (one group per cut point, what
:mod:`~.loss` scores)."""

from typing import Optional

import torch

# an additive mask value that hides a key (finite, so a row that sees only itself keeps a defined softmax in fp16)
HIDDEN = -1e4


def draft_attention_mask(prefix_width: int, num_queries: int, reference: torch.Tensor) -> torch.Tensor:
    """Additive self-attention mask (P+k, P+k) of a right-padded prefix of width P followed by k queries:
    prefix rows causal over the prefix and blind to the queries; query rows see everything. Per-sentence prefix
    lengths are applied through the key padding mask (padding tokens are hidden)."""
    width = prefix_width + num_queries
    mask = torch.zeros(width, width, dtype=reference.dtype, device=reference.device)
    mask[:prefix_width] = HIDDEN
    mask[:prefix_width, :prefix_width].triu_(1)  # keeps HIDDEN above the diagonal only
    return mask


def every_cut_slots(prefix_width: int, draft_size: int, device: Optional[torch.device]) -> torch.Tensor:
    """The layout of the every-cut training pass, (P·k,): for each of its query slots (slot i of cut c at c·k + i),
    c + i, the 0-based index of the target token y_{c+1+i} it drafts (its decoder position is c + i + 1)."""
    return (torch.arange(prefix_width, device=device).unsqueeze(1) + torch.arange(draft_size, device=device)).flatten()


def every_cut_attention_mask(prefix_width: int, draft_size: int, reference: torch.Tensor) -> torch.Tensor:
    """Additive self-attention mask (P+P·k, P+P·k) of a prefix of width P followed by one group of k queries
    per cut column c = 0..P-1 (training): prefix rows causal and blind to the queries; the queries of cut c see
    prefix columns 0..c and each other, as the k queries after the prefix y_0..y_c do in
    :func:`draft_attention_mask`."""
    width = prefix_width * (1 + draft_size)
    mask = torch.full((width, width), HIDDEN, dtype=reference.dtype, device=reference.device)
    mask[:prefix_width, :prefix_width] = draft_attention_mask(prefix_width, 0, reference)
    columns = torch.arange(prefix_width, device=reference.device)
    cut = columns.repeat_interleave(draft_size)  # the cut column of each query row
    mask[prefix_width:, :prefix_width].masked_fill_(columns <= cut.unsqueeze(1), 0)
    mask[prefix_width:, prefix_width:].masked_fill_(cut.unsqueeze(1) == cut, 0)
    return mask
