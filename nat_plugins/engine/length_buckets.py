"""Length buckets for the single passes: the fertility NAT's decoder pass, Encoder-NAD-AD's NAD pass and NPD's
teacher rescoring.

On CUDA, cuDNN's attention builds an execution plan for every new attention shape (tens of milliseconds on an
H100/H200), and a pass over a batch's own source and target lengths meets a new shape at almost every batch (the
autoregressive loops already run on bucketed buffers: :mod:`.step_graphs`). So on CUDA these passes pad their lengths
up to a multiple of :data:`~.step_graphs.SOURCE_MULTIPLE`, the static step's bucket of encoder positions (one number
for both): the source with pad columns on the left (fairseq left-pads sources; its positions skip padding, so the
real tokens keep theirs), the target with masked positions on the right that no real position attends to, whose
outputs are dropped. The tokens are those of the unpadded pass, up to floating-point rounding. ``engine/attention.py``
restricts which attention backends run; bucketing bounds the shapes whatever the backend. On the CPU the padded
positions would only be wasted work: off (:func:`length_buckets_wanted`).
"""

from typing import Optional

import torch

from .step_graphs import SOURCE_MULTIPLE, round_up


def length_buckets_wanted(reference: torch.Tensor) -> bool:
    """Whether a single pass on ``reference``'s device pads its lengths to buckets: on CUDA (a plan per shape), not
    on the CPU (tests force it there with monkeypatch, in the modules that import it)."""
    return reference.is_cuda


def bucketed(length: int, limit: Optional[int] = None) -> int:
    """``length`` rounded up to a multiple of :data:`~.step_graphs.SOURCE_MULTIPLE`, at most ``limit`` (the
    positions a decoder has; ``length`` itself is within it)."""
    length = round_up(length, SOURCE_MULTIPLE)
    return length if limit is None else min(length, limit)


def widened(tensor: torch.Tensor, width: int, value: float, on_the_left: bool = False) -> torch.Tensor:
    """``tensor`` (B, S, ...) with columns of ``value`` added on the right (or the left) up to ``width``."""
    if tensor.size(1) >= width:
        return tensor
    extra = tensor.new_full((tensor.size(0), width - tensor.size(1), *tensor.shape[2:]), value)
    return torch.cat([extra, tensor] if on_the_left else [tensor, extra], dim=1)
