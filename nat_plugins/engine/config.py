"""The decoding engine's settings and process-wide state, in one place.

* Settings: :class:`EngineConfig`, one field per environment variable the engine reads, each documented with its
  variable, values, default and what it changes. :func:`engine_config` reads them at every call (a variable changed
  while the process runs counts from the engine's next read; tests set them with monkeypatch) and refuses a bad value
  by naming the variable and the values it takes. The engine modules read their settings through it only.
  (``XDG_CACHE_HOME`` is no setting of the engine: it only says where :mod:`.cpu_linear` caches its measured layout.)
* State: :data:`STATE`, the process's one :class:`EngineState`: what the engine measured, made or counted so far
  (caches and counters, never a setting), each field with what it holds and who reads it. The modules read and write
  its fields at every use (never a copy bound at import), so a test may replace a field with monkeypatch.
"""

import functools
import os
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # annotations only: the engine modules import this one
    from fairseq.models.transformer import TransformerDecoderBase

    from .cpu_linear import LayoutChoice
    from .step_graphs import StepBuffers

# the environment variables of the settings
LINEAR_LAYOUT_ENV = "NAT_LINEAR_LAYOUT"
TRACED_STEP_ENV = "NAT_TRACED_STEP"
CUDA_GRAPHS_ENV = "NAT_CUDA_GRAPHS"
ATTENTION_BACKENDS_ENV = "NAT_ATTENTION_BACKENDS"

# NAT_LINEAR_LAYOUT's values
AUTO, WEIGHT_FIRST, TORCH = "auto", "weight-first", "torch"
LINEAR_LAYOUTS = (AUTO, WEIGHT_FIRST, TORCH)
# NAT_ATTENTION_BACKENDS's values: a comma-separated subset of these backends, or PyTorch's own choice
ATTENTION_BACKEND_NAMES = ("flash", "efficient", "cudnn", "math")
TORCH_ATTENTION = "torch"
DEFAULT_ATTENTION_BACKENDS = "flash,efficient,math"  # every backend but cuDNN's (engine/attention.py: why)
# NAT_TRACED_STEP's and NAT_CUDA_GRAPHS's value that switches them off (unset or any other value: on)
OFF = "0"

# a decoder's traces in EngineState.traces: the weights version they were made with, the traces by key, the eager
# calls by key
DecoderTraces = Tuple[tuple, Dict[tuple, Callable], Dict[tuple, int]]
# a decoder's bank in EngineState.banks: the weights version its graphs were made with, its buffer sets by shape
DecoderBank = Tuple[tuple, Dict[tuple, List["StepBuffers"]]]


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings (module docstring): :func:`engine_config` reads them from the environment; the
    defaults are those of unset variables."""

    linear_layout: str = AUTO
    """``NAT_LINEAR_LAYOUT``: ``auto`` (default), ``weight-first`` or ``torch``; another value is refused. The layout
    of the few-row float32 linear products on the CPU (:mod:`.cpu_linear`): ``auto`` times W·xᵀ against
    ``F.linear`` (x·Wᵀ) at the first product and keeps the faster for the process and on disk; ``weight-first`` or
    ``torch`` forces one, nothing timed or cached. Results differ by rounding only."""

    traced_step: bool = True
    """``NAT_TRACED_STEP``: ``0`` off; unset (default) or any other value on. Whether the static step runs one
    sentence (batch 1, on the CPU, without gradients) as a TorchScript trace of its layers once a call width recurs
    (:mod:`.static_cache`: the same operations without Python's cost per operation); off, they run eagerly."""

    cuda_graphs: bool = True
    """``NAT_CUDA_GRAPHS``: ``0`` off; unset (default) or any other value on. Whether the static step on CUDA
    replays each call shape as a CUDA graph once it recurs (:mod:`.step_graphs`); off, the same bucketed buffers run
    eagerly (the same kernels on the same shapes: the same tokens)."""

    attention_backends: Optional[Tuple[str, ...]] = tuple(DEFAULT_ATTENTION_BACKENDS.split(","))
    """``NAT_ATTENTION_BACKENDS``: a comma-separated subset of ``flash``, ``efficient``, ``cudnn``, ``math`` (default
    ``flash,efficient,math``), or ``torch`` (None here: PyTorch's own choice, left as it is); case and spaces are
    ignored, another value is refused. The kernels ``F.scaled_dot_product_attention`` may use while the task decodes
    and trains and while the benchmark times a row (:mod:`.attention`: by default none that plans per new shape)."""


@functools.lru_cache(maxsize=16)
def parse_environment(
    linear_layout: Optional[str],
    traced_step: Optional[str],
    cuda_graphs: Optional[str],
    attention_backends: Optional[str],
) -> EngineConfig:
    """The :class:`EngineConfig` of these values of the variables (None: unset); a bad value is refused
    (``ValueError`` naming the variable and its values). Cached by the values: the engine reads its settings at
    every decoder call."""
    layout = AUTO if linear_layout is None else linear_layout
    if layout not in LINEAR_LAYOUTS:
        raise ValueError(f"{LINEAR_LAYOUT_ENV}={layout!r}: expected {AUTO!r}, {WEIGHT_FIRST!r} or {TORCH!r}")
    backends = (DEFAULT_ATTENTION_BACKENDS if attention_backends is None else attention_backends).strip().lower()
    names = None
    if backends != TORCH_ATTENTION:
        names = tuple(name.strip() for name in backends.split(",") if name.strip())
        if not names or any(name not in ATTENTION_BACKEND_NAMES for name in names):
            raise ValueError(
                f"{ATTENTION_BACKENDS_ENV}={backends!r}: expected '{TORCH_ATTENTION}' or a comma-separated subset of "
                f"{', '.join(ATTENTION_BACKEND_NAMES)} (default: {DEFAULT_ATTENTION_BACKENDS})"
            )
    return EngineConfig(
        linear_layout=layout,
        traced_step=traced_step != OFF,
        cuda_graphs=cuda_graphs != OFF,
        attention_backends=names,
    )


def engine_config() -> EngineConfig:
    """The engine's settings as the environment gives them now (:func:`parse_environment`)."""
    get = os.environ.get
    return parse_environment(
        get(LINEAR_LAYOUT_ENV), get(TRACED_STEP_ENV), get(CUDA_GRAPHS_ENV), get(ATTENTION_BACKENDS_ENV)
    )


@dataclass(eq=False)
class EngineState:
    """The engine's process-wide state (module docstring): one instance, :data:`STATE`."""

    # cpu_linear: the layout chosen at each torch thread count (LayoutChoice), once per process; read by
    # cpu_linear.layout/choice at every CPU product, and by the benchmark's report and solo processes
    layout_choices: Dict[int, "LayoutChoice"] = field(default_factory=dict)
    # cpu_linear: the (out, in, bias) of every linear layer of each model given to use_weight_first_linears, once per
    # distinct model: what cpu_linear.choice times; the benchmark reports a layout only when some model is here
    model_shapes: Dict[Tuple[Tuple[int, int, bool], ...], None] = field(default_factory=dict)
    # static_cache: per decoder (a weak key: copies, state dicts and pickles carry none), the weights version its
    # traces were made with, the traces by StaticCache.run's key and the eager calls of each key so far; read and
    # filled by StaticCache.trace, dropped by static_cache.forget_traces before a forward in training mode
    traces: "weakref.WeakKeyDictionary[TransformerDecoderBase, DecoderTraces]" = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # static_cache: called with the decoder of every pass that runs no module hooks (a traced step, a graph's
    # replay; the ONNX decoder of the fertility NAT too): the benchmark's DecoderPassCounter adds itself while it counts
    pass_observers: List[Callable[["TransformerDecoderBase"], None]] = field(default_factory=list)
    # step_graphs: why CUDA graph captures failed, with how many, over the process (graph_for counts them); the
    # benchmark attributes them to rows by difference
    capture_failures: Dict[str, int] = field(default_factory=dict)
    # step_graphs: per decoder (a weak key), the weights version its bank's graphs were made with and its buffer sets
    # by shape; read and filled by step_graphs.checkout, dropped by forget_graphs before a forward in training mode
    banks: "weakref.WeakKeyDictionary[TransformerDecoderBase, DecoderBank]" = field(
        default_factory=weakref.WeakKeyDictionary
    )


STATE = EngineState()
