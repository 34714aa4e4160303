"""The CPU linear layers of verify-accept decoding (modules/cpu_linear.py): F.linear's results up to rounding, F.linear
itself wherever the layout does not apply, parameters untouched, int8 draft copies still quantized."""

from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

from nat_plugins.generators.blockwise_decoding import BlockwiseGenerator
from nat_plugins.modules.cpu_linear import MAX_ROWS, MIN_WEIGHT_FOR_ONE_ROW, WeightFirstLinear, use_weight_first_linears

from .test_blockwise import random_model
from .test_speculative import drafter, random_teacher, speculative
from .utils import with_task_options


def weight_first(bias, seed=0):
    torch.manual_seed(seed)
    return use_weight_first_linears(nn.Sequential(nn.Linear(24, 40, bias=bias)))[0]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "shape, out_features",
    [((2, 24), 40), ((3, 1, 24), 40), ((4, 2, 24), 40), ((MAX_ROWS, 24), 40), ((1, 256), 4096), ((1, 1, 256), 4096)],
)
def test_weight_first_product_is_f_linear_up_to_rounding(bias, shape, out_features):
    """2..MAX_ROWS rows, and one row of a weight with >= MIN_WEIGHT_FOR_ONE_ROW entries (as two columns)."""
    assert shape[-1] * out_features >= MIN_WEIGHT_FOR_ONE_ROW or shape[:-1] != (1,) * (len(shape) - 1)
    torch.manual_seed(0)
    layer = use_weight_first_linears(nn.Sequential(nn.Linear(shape[-1], out_features, bias=bias)))[0]
    assert type(layer) is WeightFirstLinear
    x = torch.randn(shape)
    with torch.no_grad():
        out = layer(x)
    reference = F.linear(x, layer.weight, layer.bias)
    assert out.shape == reference.shape == (*shape[:-1], out_features)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "why, x, grad",
    [
        ("gradients (training)", torch.randn(3, 24), True),
        ("more rows than MAX_ROWS", torch.randn(MAX_ROWS + 1, 24), False),
        ("float64", torch.randn(3, 24, dtype=torch.float64), False),
        ("no rows", torch.randn(0, 24), False),
        ("one row of a small weight", torch.randn(1, 1, 24), False),
    ],
)
def test_f_linear_itself_where_the_layout_does_not_apply(why, x, grad):
    layer = weight_first(True).to(x.dtype)
    with torch.set_grad_enabled(grad):
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)), why


def test_swapping_keeps_parameters_and_state_dict(toy_task):
    model = random_model(toy_task, 3, seed=0, identity_first_head=True)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    parameters = [id(p) for p in model.parameters()]
    linears = [layer for layer in model.modules() if isinstance(layer, nn.Linear)]
    BlockwiseGenerator([model], toy_task, Namespace(beam=1))
    assert linears and all(type(layer) is WeightFirstLinear for layer in linears)
    assert [id(p) for p in model.parameters()] == parameters
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)


def test_int8_drafts_are_still_quantized(toy_task, tmp_path):
    """torch quantizes nn.Linear itself only: int8_copy must turn the generator's WeightFirstLinear layers back."""
    model = random_model(toy_task, 3, seed=0, identity_first_head=True)
    blockwise = BlockwiseGenerator([model], with_task_options(toy_task, int8_drafts=True), Namespace(beam=1))
    assert type(blockwise.draft_projection) is Int8Linear
    assert all(type(layer) is Int8Linear for layer in blockwise.draft_heads.fc2)
    assert type(model.decoder.output_projection) is WeightFirstLinear  # the verifier's

    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 0, path)
    int8 = speculative(drafter(toy_task, 2, 0), toy_task, path, int8_drafts=True)
    fp32 = speculative(drafter(toy_task, 2, 0), toy_task, path)
    assert type(int8.drafter_decoder.output_projection) is Int8Linear
    assert type(fp32.drafter_decoder.output_projection) is WeightFirstLinear
    assert type(fp32.verifier.decoder.output_projection) is WeightFirstLinear


def test_translation_nat_decodes_ar_models_and_teachers_with_weight_first_linears(toy_task, tmp_path):
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 0, path)
    toy_task.build_generator([teacher], Namespace(beam=1))  # fairseq's SequenceGenerator, the model swapped
    assert type(teacher.decoder.output_projection) is WeightFirstLinear
    assert type(teacher.decoder.layers[0].fc1) is WeightFirstLinear
