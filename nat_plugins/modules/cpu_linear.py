"""Linear layers of decoding on a CPU, where a call multiplies a few rows by every weight matrix and the weights come
from memory, not from the cache.

* :class:`WeightFirstLinear` computes the product as W·xᵀ instead of x·Wᵀ. On the CPUs measured (docs/results.md,
  ``dev/bench_linear_layout.py``) torch's ``F.linear`` (BLAS with the weight as the transposed right operand) reads
  the weights of such few-row products several times slower than the same product with the weight as the left
  operand; one row takes BLAS's matrix-vector path either way unless it is passed as two equal columns, which pays
  only for big weights; from a few hundred rows on the two orders cost about the same. Every output is the same dot
  product, so results change by rounding only. Training (gradients enabled), other devices and dtypes, and calls
  with more rows keep ``F.linear``. Plugin generators, frozen teachers and models decoded through
  ``translation_nat`` use it (:func:`use_weight_first_linears`).
* :func:`int8_copy` (``--int8-drafts``): a copy with int8 weights, a quarter of the bytes, for layers that only draft.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

# from about this many rows on, W·xᵀ is no faster than F.linear (docs/results.md)
MAX_ROWS = 256
# one row is a matrix-vector product either way; as two columns it gains only on big weights such as the output
# projection (dev/bench_linear_layout.py)
MIN_WEIGHT_FOR_ONE_ROW = 1 << 20


def linear(x, weight, bias=None):
    """``F.linear(x, weight, bias)``, as (W·xᵀ)ᵀ for 2..:data:`MAX_ROWS` rows of float32 on the CPU without gradients
    (and for one row when the weight has at least :data:`MIN_WEIGHT_FOR_ONE_ROW` entries): then a transposed view."""
    if not x.is_cpu or x.dtype is not torch.float32 or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    rows = x if x.dim() == 2 else x.reshape(-1, x.size(-1))
    num_rows = rows.size(0)
    if 1 < num_rows <= MAX_ROWS:
        # xᵀ as a transposed view of row-major rows: BLAS reads it column-major, the fast case. Rows that are
        # themselves a transposed product (another such layer's output: fc1 -> fc2) are copied row-major first:
        # read as they lie, BLAS takes its slow path (dev/bench_linear_layout.py)
        product = weight_first(weight, bias, rows.contiguous().t())
    elif num_rows == 1 and weight.numel() >= MIN_WEIGHT_FOR_ONE_ROW:
        product = weight_first(weight, bias, rows.repeat(2, 1).t())[:1]  # two equal columns: the matrix-matrix path
    else:
        return F.linear(x, weight, bias)
    return product if x.dim() == 2 else product.view(*x.shape[:-1], weight.size(0))


def weight_first(weight, bias, columns):
    """(W·columns + b)ᵀ: rows x out_features, a transposed view."""
    if bias is None:
        return torch.mm(weight, columns).t()
    return torch.addmm(bias.unsqueeze(1), weight, columns).t()


class WeightFirstLinear(nn.Linear):
    """``nn.Linear`` computed by :func:`linear`."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)


def use_weight_first_linears(module):
    """Make every ``nn.Linear`` of ``module`` a :class:`WeightFirstLinear`, in place (the same parameters, state dict
    and results up to rounding; idempotent); returns ``module``."""
    for layer in module.modules():
        if type(layer) is nn.Linear:
            layer.__class__ = WeightFirstLinear
    return module


def int8_copy(module, owner):
    """A copy of ``module`` whose linear layers hold int8 weights (torch's dynamic quantization: activations
    quantized per call, int8 matrix products on the CPU), for layers that only draft (``--int8-drafts``): on a CPU a
    small model's decoding step is bound by reading weights, and these weights are read in every call. ``owner``
    names the layers in the error raised when ``module`` is not on the CPU in float32."""
    weight = next(module.parameters())
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(
            f"--int8-drafts runs {owner} on the CPU in float32 (torch's dynamic int8 quantization); this model is "
            f"on {weight.device} in {weight.dtype}: drop --int8-drafts"
        )
    module = copy.deepcopy(module)
    for layer in module.modules():
        if type(layer) is WeightFirstLinear:
            layer.__class__ = nn.Linear  # torch quantizes nn.Linear itself only
    return torch.ao.quantization.quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8, inplace=True)
