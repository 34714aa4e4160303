"""Which kernels ``F.scaled_dot_product_attention`` may use while the plugin decodes and trains.

On an H100/H200 (sm90) PyTorch's CUDA builds prefer cuDNN's attention, and cuDNN builds an execution plan for every
new attention shape (dims, strides, mask, query and key lengths): tens of milliseconds each, once per shape and
process. Decoding meets a new shape at nearly every call (a growing key length, a new source length per batch), and
so does training (a new batch shape per update). Every other backend runs a new shape at once. So the plugin attends
with the backends ``NAT_ATTENTION_BACKENDS`` names, by default ``flash,efficient,math`` (every backend but cuDNN):
around every ``inference_step``, ``train_step`` and ``valid_step`` of the ``translation_nat`` task
(``fairseq-generate``, ``fairseq-interactive``, the hub, ``fairseq-train``) and around every row the benchmark times
(fairseq's own rows included, so the comparison is one of decoders, not of attention kernels).

``NAT_ATTENTION_BACKENDS`` (:attr:`.config.EngineConfig.attention_backends`): a comma-separated subset of ``flash``,
``efficient``, ``cudnn``, ``math`` (``math`` always works), or ``torch``: PyTorch's own choice, left as it is. On the
CPU PyTorch has no cuDNN attention and the default changes nothing (its CPU kernels are the flash and math ones, both
allowed).
"""

import contextlib
from typing import Iterator, List, Optional

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .config import ATTENTION_BACKEND_NAMES, ATTENTION_BACKENDS_ENV, TORCH_ATTENTION, engine_config

# the backend of each name NAT_ATTENTION_BACKENDS takes (config.ATTENTION_BACKEND_NAMES, in that order)
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
assert tuple(BACKENDS) == ATTENTION_BACKEND_NAMES


def chosen_backends() -> Optional[List[SDPBackend]]:
    """The backends ``NAT_ATTENTION_BACKENDS`` allows (None: PyTorch's own choice); a value that names no backend is
    refused (:func:`~.config.engine_config`)."""
    names = engine_config().attention_backends
    return None if names is None else [BACKENDS[name] for name in names]


def describe() -> str:
    """The choice in words, for reports: e.g. ``flash,efficient,math (NAT_ATTENTION_BACKENDS)``."""
    backends = chosen_backends()
    if backends is None:
        return f"PyTorch's own choice ({ATTENTION_BACKENDS_ENV}={TORCH_ATTENTION})"
    names = [name for name, backend in BACKENDS.items() if backend in backends]
    return f"{','.join(names)} ({ATTENTION_BACKENDS_ENV})"


@contextlib.contextmanager
def attention_backends() -> Iterator[None]:
    """Run the body with the attention backends of ``NAT_ATTENTION_BACKENDS`` (the previous choice is restored on
    exit)."""
    backends = chosen_backends()
    if backends is None:
        yield
        return
    with sdpa_kernel(backends):
        yield


def cudnn_attention_enabled() -> bool:
    """Whether ``F.scaled_dot_product_attention`` may pick cuDNN's kernel now (a flag PyTorch keeps on every build)."""
    return torch.backends.cuda.cudnn_sdp_enabled()
