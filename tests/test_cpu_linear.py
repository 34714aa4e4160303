"""The CPU linear layers of verify-accept decoding (engine/cpu_linear.py): in the W·xᵀ layout F.linear's results up
to rounding, F.linear itself wherever the layout does not apply, parameters untouched, int8 draft copies still
quantized; the layout chosen per machine (measured with a fake clock here), forced by NAT_LINEAR_LAYOUT, cached."""

import json
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

from nat_plugins.bench import report
from nat_plugins.engine import cpu_linear, prepare_for_decoding
from nat_plugins.engine.config import LINEAR_LAYOUT_ENV, STATE
from nat_plugins.engine.cpu_linear import (
    MAX_ROWS,
    MIN_WEIGHT_FOR_ONE_ROW,
    REPEATS,
    TORCH,
    WEIGHT_FIRST,
    WeightFirstLinear,
    use_weight_first_linears,
)
from nat_plugins.systems.blockwise.decoding import BlockwiseGenerator

from .test_blockwise import random_model
from .test_speculative import drafter, random_teacher, speculative
from .utils import with_task_options


def force_layout(monkeypatch, layout):
    """``linear()`` in ``layout`` from now on (``NAT_LINEAR_LAYOUT``, this process's choices forgotten until the test
    ends)."""
    monkeypatch.setenv(LINEAR_LAYOUT_ENV, layout)
    monkeypatch.setattr(STATE, "layout_choices", {})


def count_weight_first_products(monkeypatch):
    """A list that receives one entry (the device) per W·xᵀ product of :mod:`~nat_plugins.engine.cpu_linear`, the
    layout forced to W·xᵀ wherever it applies (whatever this CPU measures)."""
    force_layout(monkeypatch, WEIGHT_FIRST)
    calls = []
    weight_first = cpu_linear.weight_first

    def counted(weight, bias, columns):
        calls.append(weight.device.type)
        return weight_first(weight, bias, columns)

    monkeypatch.setattr(cpu_linear, "weight_first", counted)
    return calls


@pytest.fixture(autouse=True)
def weight_first_layout(monkeypatch):
    """The tests of the W·xᵀ layout's rules run in it (those of the choice set their own layout); the models they
    build are not registered for this process's own choice."""
    force_layout(monkeypatch, WEIGHT_FIRST)
    monkeypatch.setattr(STATE, "model_shapes", {})


def weight_first(bias, seed=0):
    torch.manual_seed(seed)
    return use_weight_first_linears(nn.Sequential(nn.Linear(24, 40, bias=bias)))[0]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "shape, out_features",
    [((2, 24), 40), ((3, 1, 24), 40), ((4, 2, 24), 40), ((MAX_ROWS, 24), 40), ((1, 256), 4096), ((1, 1, 256), 4096)],
)
def test_weight_first_product_is_f_linear_up_to_rounding(bias, shape, out_features, monkeypatch):
    """2..MAX_ROWS rows, and one row of a weight with >= MIN_WEIGHT_FOR_ONE_ROW entries (as two columns): computed as
    one W·xᵀ product, not by F.linear."""
    assert shape[-1] * out_features >= MIN_WEIGHT_FOR_ONE_ROW or shape[:-1] != (1,) * (len(shape) - 1)
    calls = count_weight_first_products(monkeypatch)
    torch.manual_seed(0)
    layer = use_weight_first_linears(nn.Sequential(nn.Linear(shape[-1], out_features, bias=bias)))[0]
    assert type(layer) is WeightFirstLinear
    x = torch.randn(shape)
    with torch.no_grad():
        out = layer(x)
    reference = F.linear(x, layer.weight, layer.bias)
    assert out.shape == reference.shape == (*shape[:-1], out_features)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    assert calls == ["cpu"]


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
    toy_task.build_generator([model], Namespace(beam=1))
    assert linears and all(type(layer) is WeightFirstLinear for layer in linears)
    assert [id(p) for p in model.parameters()] == parameters
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)


def test_int8_drafts_are_still_quantized(toy_task, tmp_path):
    """torch quantizes nn.Linear itself only: int8_copy must turn the generator's WeightFirstLinear layers back."""
    model = prepare_for_decoding(random_model(toy_task, 3, seed=0, identity_first_head=True))  # as the task does
    blockwise = BlockwiseGenerator([model], with_task_options(toy_task, int8_drafts=True), Namespace(beam=1))
    assert type(blockwise.draft_projection) is Int8Linear
    assert all(type(layer) is Int8Linear for layer in blockwise.draft_heads.fc2)
    assert type(model.decoder.output_projection) is WeightFirstLinear  # the verifier's

    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 0, path)
    int8 = speculative(prepare_for_decoding(drafter(toy_task, 2, 0)), toy_task, path, int8_drafts=True)
    fp32 = speculative(prepare_for_decoding(drafter(toy_task, 2, 0)), toy_task, path)
    assert type(int8.drafter_decoder.output_projection) is Int8Linear
    assert type(fp32.drafter_decoder.output_projection) is WeightFirstLinear
    assert type(fp32.verifier.decoder.output_projection) is WeightFirstLinear


def test_translation_nat_decodes_ar_models_and_teachers_with_weight_first_linears(toy_task, tmp_path):
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 0, path)
    toy_task.build_generator([teacher], Namespace(beam=1))  # fairseq's SequenceGenerator, the model swapped
    assert type(teacher.decoder.output_projection) is WeightFirstLinear
    assert type(teacher.decoder.layers[0].fc1) is WeightFirstLinear


# ----- the layout chosen per machine ------------------------------------------------------------------------------
SHAPES = [(40, 24, True), (24, 40, True), (300, 24, False)]  # fc1-, fc2- and output-projection-like
TORCH_CHOICE = cpu_linear.LayoutChoice(TORCH, "measured", 1, [])


def fake_products(monkeypatch, seconds):
    """Make the products of each layout cost ``seconds[layout]`` on a fake clock (their results unchanged); returns
    the clock and the list of layouts in the order their products ran."""
    now, ran = [0.0], []

    def costing(layout, product):
        def timed(x, weight, bias):
            now[0] += seconds[layout]
            ran.append(layout)
            return product(x, weight, bias)

        return timed

    for layout, product in list(cpu_linear.PRODUCTS.items()):
        monkeypatch.setitem(cpu_linear.PRODUCTS, layout, costing(layout, product))
    return (lambda: now[0]), ran


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """An empty cache directory (XDG_CACHE_HOME) and the automatic layout."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(LINEAR_LAYOUT_ENV, raising=False)
    return tmp_path


@pytest.mark.parametrize("faster", [WEIGHT_FIRST, TORCH])
def test_the_measured_faster_layout_is_used(faster, cache_home, monkeypatch):
    """W·xᵀ where its pass is faster (the products then go through it), F.linear itself where it is slower; each
    layout's pass timed REPEATS times after one untimed pass, the layouts alternating which goes first."""
    slower = TORCH if faster == WEIGHT_FIRST else WEIGHT_FIRST
    clock, ran = fake_products(monkeypatch, {faster: 1e-3, slower: 3e-3})
    chosen = cpu_linear.choose(SHAPES, 2, clock)
    assert (chosen.layout, chosen.source, chosen.threads) == (faster, "measured", 2)
    per_pass = 2 * len(SHAPES)  # one row and FEW_ROWS rows through every shape
    pass_ms = {WEIGHT_FIRST: chosen.weight_first_ms, TORCH: chosen.torch_ms}
    assert pass_ms == {faster: pytest.approx(per_pass * 1.0), slower: pytest.approx(per_pass * 3.0)}
    assert len(ran) == 2 * (1 + REPEATS) * per_pass
    firsts = [ran[start] for start in range(2 * per_pass, len(ran), 2 * per_pass)]  # the first layout of each repeat
    assert firsts == [TORCH, WEIGHT_FIRST] * (REPEATS // 2) + [TORCH]
    assert chosen.shapes == [[24, 40], [40, 24], [300, 24]]

    calls = count_weight_first_products(monkeypatch)
    monkeypatch.setattr(STATE, "layout_choices", {torch.get_num_threads(): chosen})
    layer = weight_first(True)
    x = torch.randn(3, 24)
    with torch.no_grad():
        out = layer(x)
    if faster == WEIGHT_FIRST:
        assert calls == ["cpu"]
        torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    else:
        assert calls == [] and torch.equal(out, F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("layout", [WEIGHT_FIRST, TORCH])
def test_nat_linear_layout_forces_the_layout(layout, cache_home, monkeypatch):
    """NAT_LINEAR_LAYOUT=weight-first|torch: that layout, nothing measured or cached; another value is refused."""
    _, ran = fake_products(monkeypatch, {WEIGHT_FIRST: 1.0, TORCH: 1.0})
    calls = count_weight_first_products(monkeypatch)
    monkeypatch.setenv(LINEAR_LAYOUT_ENV, layout)
    layer = weight_first(True)
    with torch.no_grad():
        layer(torch.randn(3, 24))
    chosen = STATE.layout_choices[torch.get_num_threads()]
    assert (chosen.layout, chosen.source, chosen.torch_ms) == (layout, "override", None)
    assert calls == (["cpu"] if layout == WEIGHT_FIRST else []) and ran == [layout]  # the product itself, no timing
    assert not (cache_home / "nat_plugins").exists()
    monkeypatch.setenv(LINEAR_LAYOUT_ENV, "fast")
    with pytest.raises(ValueError, match="NAT_LINEAR_LAYOUT='fast': expected 'auto', 'weight-first' or 'torch'"):
        cpu_linear.choose(SHAPES, 2)


def test_the_choice_is_cached_per_machine_torch_threads_and_shapes(cache_home, monkeypatch):
    """The first process measures and writes the cache; a later one (this process's choices forgotten) reads it
    without timing; another thread count or other shapes are measured anew."""
    clock, ran = fake_products(monkeypatch, {WEIGHT_FIRST: 1e-3, TORCH: 3e-3})
    first = cpu_linear.choose(SHAPES, 2, clock)
    path = cache_home / "nat_plugins" / "linear_layout.json"
    assert first.source == "measured" and first.cache_file == str(path)
    (key,) = json.loads(path.read_text())
    assert key.startswith(f"{cpu_linear.cpu_model()} | torch {torch.__version__} | 2 threads | shapes ")
    measured = len(ran)
    again = cpu_linear.choose(SHAPES, 2, clock)
    assert (again.layout, again.source, again.weight_first_ms) == (WEIGHT_FIRST, "cache", first.weight_first_ms)
    assert len(ran) == measured  # nothing timed
    assert cpu_linear.choose(SHAPES, 1, clock).source == "measured"
    assert cpu_linear.choose(SHAPES[:2], 2, clock).source == "measured"
    assert len(json.loads(path.read_text())) == 3
    path.write_text("{not json")  # a damaged cache is measured again and rewritten
    assert cpu_linear.choose(SHAPES, 2, clock).source == "measured" and len(json.loads(path.read_text())) == 1


def test_a_disturbed_measurement_decides_by_the_fastest_passes_and_is_not_cached(cache_home, monkeypatch):
    """Another process on the cores slows some passes: the layout whose fastest pass is faster wins (not the one
    whose median the load favoured), and the choice is not written for later processes, which measure again."""
    # weight-first is faster when undisturbed (1 against 1.5 ms a pass), but 6 of its 9 timed passes are slowed 4x:
    # its median pass (4 ms) is slower than F.linear's
    disturbed = {TORCH: [1.5e-3] * REPEATS, WEIGHT_FIRST: [1e-3, 4e-3, 4e-3] * (REPEATS // 3)}
    real_time_layouts = cpu_linear.time_layouts
    monkeypatch.setattr(cpu_linear, "time_layouts", lambda shapes, clock=None: disturbed)
    chosen = cpu_linear.choose(SHAPES, 2)
    assert (chosen.layout, chosen.source, chosen.spread) == (WEIGHT_FIRST, "measured", pytest.approx(4.0))
    assert chosen.weight_first_ms == pytest.approx(1.0) and chosen.torch_ms == pytest.approx(1.5)
    assert not (cache_home / "nat_plugins" / "linear_layout.json").exists()
    assert "they varied up to 4.0×, so the choice was not cached" in report.layout_line(
        {"linear_layout": chosen.to_json()}
    )
    monkeypatch.setattr(cpu_linear, "time_layouts", real_time_layouts)
    steady = cpu_linear.choose(SHAPES, 2, fake_products(monkeypatch, {WEIGHT_FIRST: 1e-3, TORCH: 3e-3})[0])
    assert steady.spread == pytest.approx(1.0) and (cache_home / "nat_plugins" / "linear_layout.json").exists()
    assert "not cached" not in report.layout_line({"linear_layout": steady.to_json()})


def test_the_first_product_chooses_over_the_registered_models(cache_home, monkeypatch):
    """The layout is chosen at the first product on the CPU, over the linear layers of every model given to
    use_weight_first_linears (each distinct model once), and kept for the process at that thread count; without a
    registered model, over the product's own weight."""
    shapes = []
    monkeypatch.setattr(cpu_linear, "choose", lambda measured, threads: shapes.append(measured) or TORCH_CHOICE)
    with torch.no_grad():
        cpu_linear.linear(torch.randn(3, 24), torch.randn(40, 24))
    assert shapes == [[(40, 24, True)]]
    monkeypatch.setattr(STATE, "layout_choices", {})
    shapes.clear()
    models = [nn.Sequential(nn.Linear(24, 40), nn.Linear(40, 24, bias=False)) for _ in range(2)]
    for model in models:
        use_weight_first_linears(model)
    with torch.no_grad():
        models[0](torch.randn(3, 24))
        models[1](torch.randn(3, 24))
    assert shapes == [[(40, 24, True), (24, 40, False)]]  # the same model's shapes once, one choice


@pytest.mark.parametrize(
    "source, how",
    [
        ("measured", "measured in this run: one pass of the models' products 1.00 ms in W·xᵀ, 2.00 ms in F.linear"),
        ("cache", "measured by an earlier run on this machine (`c.json`): one pass"),
        ("override", "forced by NAT_LINEAR_LAYOUT (engine"),
    ],
)
def test_results_md_names_the_layout_and_how_it_was_chosen(source, how):
    """The benchmark's header line of the plugin layout row (results.json has the choice in meta.linear_layout)."""
    timed = source != "override"
    chosen = cpu_linear.LayoutChoice(
        WEIGHT_FIRST, source, 2, [[4, 4]], 2.0 if timed else None, 1.0 if timed else None, cache_file="c.json"
    )
    line = report.layout_line({"linear_layout": chosen.to_json()})
    assert "*AR teacher, greedy (plugin layout)*: **weight-first** (W·xᵀ) at 2 threads, " + how in line
    assert "**torch** (F.linear, x·Wᵀ) at 1 thread," in report.layout_line(
        {"linear_layout": cpu_linear.LayoutChoice(TORCH, "override", 1, []).to_json()}
    )
    assert (
        report.layout_line({"linear_layout": None})
        == "- CPU linear layout: not used (no plugin layer decoded on the CPU)"
    )
