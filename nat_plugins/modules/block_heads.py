"""The k proposal heads of blockwise parallel decoding (Stern, Shazeer & Uszkoreit, NeurIPS 2018, §6)."""

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import FairseqDropout
from torch import nn


class BlockHeads(nn.Module):
    """Multi-output feed-forward layer after the decoder output: head i (i = 1..k) is trained to predict
    y_{t+i} from the decoder state at t.

    §6 (implementation): "we insert a single feedforward layer with hidden size k·d_hidden and output size k·d_model after the
    original decoder output layer", with "residual connections from the original decoder output to each of the k
    outputs"; every output then goes through the decoder's shared output projection. With
    ``identity_first_head`` head 1 bypasses the layer (its output *is* the decoder output, so p1 is exactly the base
    model — tensor2tensor sends head 1 through the layer too) and the layer serves heads 2..k only
    (hidden (k-1)·d_hidden, output (k-1)·d_model).
    """

    def __init__(self, embed_dim, ffn_dim, block_size, identity_first_head, dropout, activation_dropout,
                 activation_fn="relu"):
        super().__init__()
        if block_size < 1:
            raise ValueError(f"--block-size must be at least 1, got {block_size}")
        self.embed_dim = embed_dim
        self.block_size = block_size
        self.identity_first_head = identity_first_head
        self.num_ffn_heads = block_size - int(identity_first_head)
        if self.num_ffn_heads > 0:
            self.fc1 = nn.Linear(embed_dim, self.num_ffn_heads * ffn_dim)
            self.fc2 = nn.Linear(self.num_ffn_heads * ffn_dim, self.num_ffn_heads * embed_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=type(self).__name__)

    def forward(self, x, heads=None):
        """Outputs of the heads in ``heads`` (a ``range`` of 0-based head indices, all k by default) for decoder
        states ``x`` of shape (..., d): a tensor of shape (..., len(heads), d)."""
        heads = range(self.block_size) if heads is None else heads
        if heads.step != 1 or not 0 <= heads.start < heads.stop <= self.block_size:
            raise ValueError(f"heads must be a non-empty consecutive range within 0..{self.block_size - 1}, got {heads}")
        offset = int(self.identity_first_head)
        outputs = []
        if self.identity_first_head and heads.start == 0:
            outputs.append(x.unsqueeze(-2))
        first, stop = max(heads.start - offset, 0), heads.stop - offset
        if stop > first:
            hidden = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
            # only the rows of fc2 that produce the requested heads (a view: no copy, no wasted work)
            rows = slice(first * self.embed_dim, stop * self.embed_dim)
            out = self.dropout_module(F.linear(hidden, self.fc2.weight[rows], self.fc2.bias[rows]))
            outputs.append(out.view(*x.shape[:-1], stop - first, self.embed_dim) + x.unsqueeze(-2))
        return torch.cat(outputs, dim=-2) if len(outputs) > 1 else outputs[0]


def block_targets(target, block_size, pad):
    """Targets of the k heads: ``result[b, t, i] = target[b, t + i]`` (head i+1 predicts y_{t+i+1} at the position
    where head 1 predicts y_{t+1}), ``pad`` past the end. ``target`` is right-padded, shape (B, T) -> (B, T, k)."""
    shifted = [F.pad(target[:, i:], (0, min(i, target.size(1))), value=pad) for i in range(block_size)]
    return torch.stack(shifted, dim=-1)
