"""Linear layers of decoding on a CPU, where a call multiplies a few rows by every weight matrix. Called through
:func:`~nat_plugins.engine.prepare_for_decoding` (every ``nn.Linear`` of a decoded model), by the lean layers
(:func:`linear`) and by the generators' ``--int8-drafts``/``--int8-decoder`` (:func:`int8_copy`,
:func:`int8_decoder_copy`).

* :class:`WeightFirstLinear` computes the product in the layout this machine runs faster (:func:`layout`): W·xᵀ
  (:func:`weight_first_linear`) or torch's ``F.linear`` (x·Wᵀ). Every output is the same dot product, so results
  change by rounding only; training (gradients enabled), other devices and dtypes keep ``F.linear``. Why, and what it
  gains on which CPU: see docs/design-notes.md, *CPU linear layers*.
* :func:`int8_copy` (``--int8-drafts``): a copy with int8 weights, a quarter of the bytes, for layers that only draft;
  :func:`int8_decoder_copy` (``--int8-decoder``): a model whose decoder is such a copy.

The layout (``NAT_LINEAR_LAYOUT``, :attr:`.config.EngineConfig.linear_layout`): ``auto`` (the default) times both at
the first product on the CPU, at torch's thread count then (:func:`time_layouts`: the linear layers of every model
given to :func:`use_weight_first_linears`, one row and :data:`FEW_ROWS` rows), and keeps the choice for the process
and on disk (``$XDG_CACHE_HOME/nat_plugins/linear_layout.json``, by default under ``~/.cache``; keyed by CPU model,
torch version, thread count and weight shapes, so the processes of one benchmark decide alike; delete the file to
measure again). ``weight-first`` or ``torch`` forces one. The choices and the registered models' shapes are process
state (``STATE.layout_choices``, ``STATE.model_shapes``: :mod:`.config`).
"""

import copy
import hashlib
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import AUTO, STATE, TORCH, WEIGHT_FIRST, engine_config

# from about this many rows on, W·xᵀ is no faster than F.linear (docs/design-notes.md, *CPU linear layers*)
MAX_ROWS = 256
# one row is a matrix-vector product either way; as two columns it gains only on big weights such as the output
# projection (same note)
MIN_WEIGHT_FOR_ONE_ROW = 1 << 20

FEW_ROWS = 4  # rows of the measured few-row products: a verify-accept block, a beam of 4
REPEATS = 9  # timed passes of each layout
# a measurement whose slowest pass of a layout took more than this many times its fastest was disturbed (another
# process on the cores): it decides for this process, by the fastest passes, but is not cached for later ones
MAX_SPREAD = 1.5


@dataclass
class LayoutChoice:
    """The layout :func:`linear` uses at a thread count, and why: ``source`` is ``override`` (``NAT_LINEAR_LAYOUT``),
    ``measured`` (:func:`time_layouts` in this process) or ``cache`` (measured by an earlier process, read from
    ``cache_file``); ``torch_ms``/``weight_first_ms``: the fastest pass of each layout (None when overridden);
    ``spread``: the largest ratio of a layout's slowest pass to its fastest (measured here; above
    :data:`MAX_SPREAD` the choice was not cached)."""

    layout: str
    source: str
    threads: int
    shapes: List[List[int]]  # the distinct (out, in) weight shapes of the pass
    torch_ms: Optional[float] = None
    weight_first_ms: Optional[float] = None
    cpu: str = ""
    torch_version: str = ""
    cache_file: Optional[str] = None
    spread: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def weight_first_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in the W·xᵀ layout: (W·xᵀ)ᵀ, a transposed view, for 2..:data:`MAX_ROWS` rows
    (and for one row, as two equal columns, when the weight has at least :data:`MIN_WEIGHT_FOR_ONE_ROW` entries);
    ``F.linear`` for the other row counts."""
    rows = x if x.dim() == 2 else x.reshape(-1, x.size(-1))
    num_rows = rows.size(0)
    if 1 < num_rows <= MAX_ROWS:
        # xᵀ as a transposed view of row-major rows: BLAS reads it column-major, the fast case. Rows that are
        # themselves a transposed product (another such layer's output: fc1 -> fc2) are copied row-major first:
        # read as they lie, BLAS takes its slow path (docs/design-notes.md, *CPU linear layers*)
        product = weight_first(weight, bias, rows.contiguous().t())
    elif num_rows == 1 and weight.numel() >= MIN_WEIGHT_FOR_ONE_ROW:
        product = weight_first(weight, bias, rows.repeat(2, 1).t())[:1]  # two equal columns: the matrix-matrix path
    else:
        return F.linear(x, weight, bias)
    return product if x.dim() == 2 else product.view(*x.shape[:-1], weight.size(0))


def weight_first(weight: torch.Tensor, bias: Optional[torch.Tensor], columns: torch.Tensor) -> torch.Tensor:
    """(W·columns + b)ᵀ, (rows, out_features): a transposed view."""
    if bias is None:
        return torch.mm(weight, columns).t()
    return torch.addmm(bias.unsqueeze(1), weight, columns).t()


PRODUCTS: Dict[str, Callable] = {WEIGHT_FIRST: weight_first_linear, TORCH: F.linear}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; for float32 on the CPU without gradients computed in this machine's layout
    (:func:`layout`)."""
    if not x.is_cpu or x.dtype is not torch.float32 or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    return PRODUCTS[layout(weight)](x, weight, bias)


def layout(weight: torch.Tensor) -> str:
    """The layout of :func:`linear` at torch's current thread count (:func:`choice`; ``weight``: the product asking,
    measured alone when no model was registered)."""
    chosen = STATE.layout_choices.get(torch.get_num_threads())
    return (chosen or choice(weight)).layout


def choice(weight: Optional[torch.Tensor] = None) -> LayoutChoice:
    """This process's layout at torch's current thread count, chosen once (:func:`choose`) over the linear layers of
    every model given to :func:`use_weight_first_linears` so far, else over ``weight`` alone; kept for the process
    (a model registered later does not change it)."""
    threads, choices = torch.get_num_threads(), STATE.layout_choices
    if threads not in choices:
        shapes = [shape for model in sorted(STATE.model_shapes) for shape in model]
        if not shapes and weight is not None:
            shapes = [(weight.size(0), weight.size(1), True)]
        choices[threads] = choose(shapes, threads)
    return choices[threads]


def choose(
    shapes: List[Tuple[int, int, bool]], threads: int, clock: Callable[[], float] = time.perf_counter
) -> LayoutChoice:
    """The :class:`LayoutChoice` for products of the weight ``shapes`` (out, in, bias) at ``threads`` threads: the one
    ``NAT_LINEAR_LAYOUT`` forces; else the one cached for this CPU model, torch version, thread count and shapes;
    else W·xᵀ where :func:`time_layouts` times its fastest pass faster than ``F.linear``'s, cached unless the passes
    varied more than :data:`MAX_SPREAD` (the minimum is what another process's load disturbs least; a disturbed
    measurement is not kept for the processes after)."""
    override = engine_config().linear_layout  # a bad value refused there
    distinct = [list(shape) for shape in sorted({(out, into) for out, into, _ in shapes})]
    where = {"threads": threads, "shapes": distinct, "cpu": cpu_model(), "torch_version": torch.__version__}
    if override != AUTO:
        return LayoutChoice(override, "override", **where)
    path, key = cache_file(), cache_key(shapes, threads)
    entry = read_cache(path).get(key)
    source, spread = "cache", None
    if entry is None:
        passes = time_layouts(shapes, clock)
        fastest = {name: min(seconds) for name, seconds in passes.items()}
        spread = max(max(seconds) / max(min(seconds), 1e-12) for seconds in passes.values())
        entry = {
            "layout": WEIGHT_FIRST if fastest[WEIGHT_FIRST] < fastest[TORCH] else TORCH,
            "torch_ms": 1000 * fastest[TORCH],
            "weight_first_ms": 1000 * fastest[WEIGHT_FIRST],
        }
        if spread <= MAX_SPREAD:
            write_cache(path, key, {**entry, "shapes": distinct, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
        source = "measured"
    return LayoutChoice(
        entry["layout"],
        source,
        torch_ms=entry["torch_ms"],
        weight_first_ms=entry["weight_first_ms"],
        cache_file=path,
        spread=spread,
        **where,
    )


def time_layouts(
    shapes: List[Tuple[int, int, bool]], clock: Callable[[], float] = time.perf_counter
) -> Dict[str, List[float]]:
    """The seconds of each timed pass of each layout (:data:`PRODUCTS`) over one weight per shape of ``shapes`` (out,
    in, bias; random values), at one row and at :data:`FEW_ROWS` rows: one untimed pass each, then :data:`REPEATS`
    timed passes each, the layouts alternating which goes first."""
    generator = torch.Generator().manual_seed(0)
    layers = [
        (torch.randn(out, into, generator=generator), torch.randn(out, generator=generator) if bias else None)
        for out, into, bias in shapes
    ]
    inputs = [torch.randn(rows, weight.size(1), generator=generator) for rows in (1, FEW_ROWS) for weight, _ in layers]

    def one_pass(product: Callable[..., torch.Tensor]) -> None:
        for x, (weight, bias) in zip(inputs, layers + layers):
            product(x, weight, bias)

    seconds = {TORCH: [], WEIGHT_FIRST: []}
    with torch.no_grad():
        for name in seconds:
            one_pass(PRODUCTS[name])
        for repeat in range(REPEATS):
            for name in (TORCH, WEIGHT_FIRST) if repeat % 2 == 0 else (WEIGHT_FIRST, TORCH):
                start = clock()
                one_pass(PRODUCTS[name])
                seconds[name].append(clock() - start)
    return seconds


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cache_file() -> str:
    """``$XDG_CACHE_HOME/nat_plugins/linear_layout.json`` (``~/.cache`` without ``XDG_CACHE_HOME``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "nat_plugins", "linear_layout.json")


def cache_key(shapes: List[Tuple[int, int, bool]], threads: int) -> str:
    """CPU model, torch version, thread count and a digest of the measured weight shapes."""
    digest = hashlib.sha1(json.dumps([list(shape) for shape in shapes]).encode()).hexdigest()[:16]
    return f"{cpu_model()} | torch {torch.__version__} | {threads} threads | shapes {digest}"


def read_cache(path: str) -> Dict[str, Any]:
    """The cached choices (an empty dict when the file is missing or unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_cache(path: str, key: str, entry: Dict[str, Any]) -> None:
    """Add ``entry`` under ``key`` (written to a temporary file, then renamed: a reader never sees half a file); an
    unwritable cache only costs a measurement per process."""
    entries = {**read_cache(path), key: entry}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False, encoding="utf-8") as f:
            json.dump(entries, f, indent=1)
        os.replace(f.name, path)
    except OSError:
        pass


class WeightFirstLinear(nn.Linear):
    """``nn.Linear`` computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_weight_first_linears(module: nn.Module) -> nn.Module:
    """Make every ``nn.Linear`` of ``module`` a :class:`WeightFirstLinear`, in place (the same parameters, state dict
    and results up to rounding; idempotent), and register its layers' shapes for the choice of the layout
    (:func:`choice`); returns ``module``."""
    shapes = []
    for layer in module.modules():
        if type(layer) in (nn.Linear, WeightFirstLinear):
            layer.__class__ = WeightFirstLinear
            shapes.append((layer.out_features, layer.in_features, layer.bias is not None))
    if shapes:
        STATE.model_shapes[tuple(shapes)] = None
    return module


def int8_copy(module: nn.Module, owner: str, option: str = "--int8-drafts") -> nn.Module:
    """A copy of ``module`` whose linear layers hold int8 weights (torch's dynamic quantization: activations
    quantized per call, int8 matrix products on the CPU), for layers that only draft (``--int8-drafts``) or a
    decoder decoded in int8 (``--int8-decoder``): on a CPU a small model's decoding step is bound by reading weights,
    and these weights are read in every call. ``owner`` names the layers in the error raised when ``module`` is not on
    the CPU in float32."""
    weight = next(module.parameters())
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(
            f"{option} runs {owner} on the CPU in float32 (torch's dynamic int8 quantization); this model is "
            f"on {weight.device} in {weight.dtype}: drop {option}"
        )
    module = copy.deepcopy(module)
    for layer in module.modules():
        if type(layer) is WeightFirstLinear:
            layer.__class__ = nn.Linear  # torch quantizes nn.Linear itself only
    return torch.ao.quantization.quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8, inplace=True)


def int8_decoder_copy(model: nn.Module, owner: str, option: str) -> nn.Module:
    """``model`` with an int8 copy of its decoder (:func:`int8_copy`), everything else shared: the model of
    ``--int8-decoder``, whose output is the int8 decoder's greedy output, not the float32 model's."""
    copied = copy.copy(model)
    copied._modules = dict(model._modules)  # a shallow copy shares the submodule dict: the original keeps its decoder
    copied.decoder = int8_copy(model.decoder, owner, option)
    return copied
