"""Which kernels ``F.scaled_dot_product_attention`` may use while the plugin decodes and trains.

On an H100/H200 (sm90) PyTorch's CUDA builds prefer cuDNN's attention, and cuDNN builds an execution plan for every
new attention shape (dims, strides, mask, query and key lengths): tens of milliseconds each, once per shape and
process. Decoding meets a new shape at nearly every call (a growing key length, a new source length per batch), and
so does training (a new batch shape per update). Every other backend runs a new shape at once. So the plugin attends
with the backends :data:`ENV` names, by default ``flash,efficient,math`` (every backend but cuDNN): around every
``inference_step``, ``train_step`` and ``valid_step`` of the ``translation_nat`` task (``fairseq-generate``,
``fairseq-interactive``, the hub, ``fairseq-train``) and around every row the benchmark times (fairseq's own rows
included, so the comparison is one of decoders, not of attention kernels).

``NAT_ATTENTION_BACKENDS``: a comma-separated subset of ``flash``, ``efficient``, ``cudnn``, ``math`` (``math``
always works), or ``torch``: PyTorch's own choice, left as it is. On the CPU PyTorch has no cuDNN attention and the
default changes nothing (its CPU kernels are the flash and math ones, both allowed).
"""

import contextlib
import os
from typing import Iterator, List, Optional

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

ENV = "NAT_ATTENTION_BACKENDS"
DEFAULT = "flash,efficient,math"
TORCH_CHOICE = "torch"
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def chosen_backends() -> Optional[List[SDPBackend]]:
    """The backends :data:`ENV` allows (None: PyTorch's own choice); a value that names no backend is refused."""
    value = os.environ.get(ENV, DEFAULT).strip().lower()
    if value == TORCH_CHOICE:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise ValueError(
            f"{ENV}={value!r}: expected '{TORCH_CHOICE}' or a comma-separated subset of {', '.join(BACKENDS)} "
            f"(default: {DEFAULT})"
        )
    return [BACKENDS[name] for name in names]


def describe() -> str:
    """The choice in words, for reports: e.g. ``flash,efficient,math (NAT_ATTENTION_BACKENDS)``."""
    backends = chosen_backends()
    if backends is None:
        return f"PyTorch's own choice ({ENV}={TORCH_CHOICE})"
    names = [name for name, backend in BACKENDS.items() if backend in backends]
    return f"{','.join(names)} ({ENV})"


@contextlib.contextmanager
def attention_backends() -> Iterator[None]:
    """Run the body with the attention backends of :data:`ENV` (the previous choice is restored on exit)."""
    backends = chosen_backends()
    if backends is None:
        yield
        return
    with sdpa_kernel(backends):
        yield


def cudnn_attention_enabled() -> bool:
    """Whether ``F.scaled_dot_product_attention`` may pick cuDNN's kernel now (a flag PyTorch keeps on every build)."""
    return torch.backends.cuda.cudnn_sdp_enabled()
