"""The k proposal heads of blockwise parallel decoding (Stern, Shazeer & Uszkoreit, NeurIPS 2018, §6)."""

from typing import Dict, Iterable, List, Optional

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import FairseqDropout
from torch import nn


class BlockHeads(nn.Module):
    """Multi-output feed-forward layer after the decoder output: head i (i = 1..k) is trained to predict
    y_{t+i} from the decoder state at t.

    §6 (implementation): "we insert a single feedforward layer with hidden size k·d_hidden and output size
    k·d_model after the original decoder output layer", with "residual connections from the original decoder
    output to each of the k outputs"; every output then goes through the decoder's shared output projection. With
    ``identity_first_head`` head 1 bypasses the layer (its output *is* the decoder output, so p1 is exactly the base
    model) and the layer serves heads 2..k only (hidden (k-1)·d_hidden, output (k-1)·d_model).

    The hidden layer ``fc1`` is shared by all heads (as in the paper); the output layer is one ``nn.Linear`` per
    head (``fc2[i]``: the rows of the paper's k·d_model output that belong to head i), so that a head a training step
    does not score gets no gradient and the optimizer leaves it alone (see docs/design-notes.md, *Blockwise heads: an
    identity first head and one output layer per head*).
    """

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        block_size: int,
        identity_first_head: bool,
        dropout: float,
        activation_dropout: float,
        activation_fn: str = "relu",
    ) -> None:
        super().__init__()
        if block_size < 1:
            raise ValueError(f"--block-size must be at least 1, got {block_size}")
        self.embed_dim = embed_dim
        self.block_size = block_size
        self.identity_first_head = identity_first_head
        self.num_ffn_heads = block_size - int(identity_first_head)
        if self.num_ffn_heads > 0:
            self.fc1 = nn.Linear(embed_dim, self.num_ffn_heads * ffn_dim)
            self.fc2 = nn.ModuleList(
                nn.Linear(self.num_ffn_heads * ffn_dim, embed_dim) for _ in range(self.num_ffn_heads)
            )
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=type(self).__name__)

    def upgrade_state_dict_named(self, state_dict: Dict[str, torch.Tensor], name: str) -> None:
        """Split the single (k·d_model)-row output layer of checkpoints written before ``fc2`` became one layer per
        head (fairseq calls this when a checkpoint is loaded)."""
        for kind in ("weight", "bias"):
            old = state_dict.pop(f"{name}.fc2.{kind}", None)
            if old is not None:
                for head, rows in enumerate(old.chunk(self.num_ffn_heads, dim=0)):
                    state_dict[f"{name}.fc2.{head}.{kind}"] = rows.clone()

    def check_heads(self, heads: Optional[Iterable[int]]) -> List[int]:
        """``heads`` (0-based indices, ``None``: all k) as a list; an error unless they are distinct and in range."""
        heads = list(range(self.block_size)) if heads is None else list(heads)
        if not heads or len(set(heads)) != len(heads) or not all(0 <= h < self.block_size for h in heads):
            raise ValueError(f"heads must be distinct head indices within 0..{self.block_size - 1}, got {heads}")
        return heads

    def forward(self, x: torch.Tensor, heads: Optional[Iterable[int]] = None) -> torch.Tensor:
        """Outputs of the heads in ``heads`` (0-based head indices, in that order; all k by default) for decoder
        states ``x`` of shape (..., d): a tensor of shape (..., len(heads), d). Only the requested heads' output
        layers are used."""
        heads = self.check_heads(heads)
        offset = int(self.identity_first_head)
        hidden = None
        outputs = []
        for head in heads:
            if head < offset:
                outputs.append(x)  # identity head 1: the decoder output itself
                continue
            if hidden is None:
                hidden = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
            outputs.append(self.dropout_module(self.fc2[head - offset](hidden)) + x)
        return torch.stack(outputs, dim=-2)


def block_targets(target: torch.Tensor, block_size: int, pad: int) -> torch.Tensor:
    """Targets of the k heads: ``result[b, t, i] = target[b, t + i]`` (head i+1 predicts y_{t+i+1} at the position
    where head 1 predicts y_{t+1}), ``pad`` past the end. ``target`` is right-padded, shape (B, T) -> (B, T, k)."""
    shifted = [F.pad(target[:, i:], (0, min(i, target.size(1))), value=pad) for i in range(block_size)]
    return torch.stack(shifted, dim=-1)
