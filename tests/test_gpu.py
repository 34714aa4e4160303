"""On a CUDA GPU (skipped elsewhere, saying so; marker ``gpu``): the exact decoders are fairseq's greedy decoding in
float32, float16 and bfloat16, and the CPU linear layout stays off the GPU.

* Blockwise exact acceptance and speculative exact verification (an untrained drafter, and one drafting fairseq's
  output with random errors) print fairseq's ``SequenceGenerator`` beam-1 output of the same model (head 1 / the
  teacher) on CUDA, on small random models, batch 8 and each sentence alone, except at floating-point near-ties.
  Precisely (:func:`assert_greedy_up_to_near_ties`): the two token sequences may first differ only at a position
  where fairseq's two best next tokens are less than ``NEAR_TIE[dtype]`` apart in log-probability (from a
  teacher-forced forward of the same model, device and dtype on fairseq's output, with fairseq's pad, --min-len and
  maximum-length rules), and the plugin's token there must be less than ``NEAR_TIE`` below fairseq's best; nothing
  is compared after that position. Up to it, positional scores agree to ``NEAR_TIE``. At most ``MAX_DIVERGED`` of
  the sentences may diverge, so that the rule cannot hide a wrong decoder.
* The static step's CUDA graphs (:mod:`~nat_plugins.engine.step_graphs`, on by default, so the cases above decode
  through them): every loop on the static step (the plugin's greedy search, blockwise, speculative with its drafter,
  SAT, RecoverSAT) prints the same tokens and scores bit for bit with graphs as with the same buffers run eagerly
  (``NAT_CUDA_GRAPHS=0``), and no capture failed.
* :mod:`~nat_plugins.engine.cpu_linear`'s W·xᵀ product (a layout for CPU float32) is never computed for models on
  CUDA, whatever their dtype: every generator (blockwise, speculative with its teacher, fairseq's for an AR model
  through translation_nat) decodes through ``F.linear`` there. The probe first sees the layout used on the CPU in
  float32, so it can see it.

The decoding helpers take the device and dtype: the same logic runs on a CPU (where it passes in the three dtypes,
and catches top-2 acceptance, relaxed verification, a wrong --min-len or maximum length)."""

import math
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F
from fairseq.sequence_generator import SequenceGenerator
from torch import nn

from nat_plugins.bench.measure import NEAR_TIE_TOLERANCE
from nat_plugins.engine import step_graphs
from nat_plugins.engine.config import CUDA_GRAPHS_ENV, STATE
from nat_plugins.generators.verify_accept_loop import GreedyLoop
from nat_plugins.systems.blockwise.decoding import BlockwiseGenerator
from nat_plugins.systems.recover_sat.decoding import RecoverSATGenerator
from nat_plugins.systems.sat.decoding import SATGenerator
from nat_plugins.systems.spec_drafter.decoding import SpecDrafterGenerator

from .test_block_call import random_transformer
from .test_blockwise import random_model
from .test_cpu_linear import count_weight_first_products
from .test_recover_sat import build_recover_sat
from .test_sat import batch as sat_batch
from .test_sat import build_sat
from .test_speculative import drafter, random_teacher
from .utils import random_batch, sub_batch, with_task_options

NO_CUDA = not torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")]
NO_BF16 = NO_CUDA or not torch.cuda.is_bf16_supported()
BF16_REASON = "needs a CUDA GPU" if NO_CUDA else "needs a GPU with bfloat16"
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(NO_BF16, reason=BF16_REASON)),
]
# log-probability gap under which fairseq's choice is a floating-point near-tie in this dtype (the benchmark's, defined
# once), and the tolerance of positional scores: above the largest difference measured between the plugin's and
# fairseq's positional scores of these models (on a CPU, 2026-11: fp32 2.4e-6, fp16 6.0e-3, bf16 4.7e-2; logits of up
# to ~10, rounded to 11 bits in fp16 and 8 in bf16, by two computations of other shapes)
NEAR_TIE = {
    torch.float32: NEAR_TIE_TOLERANCE["fp32"],
    torch.float16: NEAR_TIE_TOLERANCE["fp16"],
    torch.bfloat16: NEAR_TIE_TOLERANCE["bf16"],
}
MAX_DIVERGED = 0.25  # at most this share of the sentences may leave fairseq's output (at a near-tie)
MAX_LEN_B = 14  # as tests/test_blockwise.py: random models rarely stop, keep their outputs short
BATCH = 8
SEEDS = range(3)


def to(device, sample):
    return {"net_input": {name: tensor.to(device) for name, tensor in sample["net_input"].items()}}


def fairseq_greedy(model, task, sample):
    return SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_b=MAX_LEN_B).generate(
        [model], sample
    )


@torch.no_grad()
def fairseq_log_probs(model, task, sample, reference):
    """``[(T_i, V) float32]``: the log-probabilities of each next token of fairseq's outputs ``reference`` as
    ``SequenceGenerator`` constrains them (never pad; no EOS first, its --min-len 1; EOS alone at the maximum
    length), from one teacher-forced forward of ``model`` on the batch."""
    dictionary = task.target_dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    outputs = [hypos[0]["tokens"] for hypos in reference]
    width = max(len(tokens) for tokens in outputs)
    prev = torch.full((len(outputs), width), pad, dtype=torch.long, device=outputs[0].device)
    for row, tokens in enumerate(outputs):
        prev[row, 0] = eos
        prev[row, 1 : len(tokens)] = tokens[:-1]
    logits, _ = model(**sample["net_input"], prev_output_tokens=prev)
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    lprobs[:, :, pad] = -math.inf
    lprobs[:, 0, eos] = -math.inf
    lprobs[:, MAX_LEN_B:] = -math.inf  # at the maximum length fairseq forces EOS: no choice
    lprobs[:, MAX_LEN_B:, eos] = 0.0
    return [lprobs[row, : len(tokens)] for row, tokens in enumerate(outputs)]


def assert_greedy_up_to_near_ties(ours, reference, log_probs, margin):
    """``ours`` (the plugin's hypotheses) is ``reference`` (fairseq's) up to near-ties (module docstring); returns
    the number of sentences that left fairseq's output."""
    diverged = 0
    for i, (mine, theirs, lprobs) in enumerate(zip(ours, reference, log_probs)):
        mine, theirs = mine[0], theirs[0]
        a, b = mine["tokens"].tolist(), theirs["tokens"].tolist()
        agree = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), min(len(a), len(b)))
        if agree < len(b):  # both end with EOS, so a difference is a token chosen otherwise at `agree`
            best, second = lprobs[agree].topk(2).values.tolist()
            assert best - second < margin, (
                f"sentence {i} leaves fairseq's greedy output at position {agree} ({a[agree]} for {b[agree]}), "
                f"where fairseq's two best tokens are {best - second:.4f} apart (near-tie: < {margin})"
            )
            assert float(lprobs[agree, a[agree]]) > best - margin, (i, agree, a[agree])
            diverged += 1
        else:
            assert a == b, i
            assert float(mine["score"]) == pytest.approx(float(theirs["score"]), abs=margin), i
        torch.testing.assert_close(
            mine["positional_scores"][:agree].float(),
            theirs["positional_scores"][:agree].float(),
            rtol=0,
            atol=margin,
        )
    return diverged


def check_exact_decoder(task, device, dtype, cases):
    """For each ``(reference model, plugin model, build, sample)`` of ``cases``: the plugin generator
    ``build(fairseq's hypotheses)`` decodes the batch and each sentence alone as fairseq's greedy decoding of the
    reference model does, up to near-ties, on ``device`` in ``dtype``. Returns the generators and (diverged
    sentences, compared sentences, emitted tokens, plugin calls), the last two over the batched runs."""
    diverged = sentences = tokens = calls = 0
    margin = NEAR_TIE[dtype]
    generators = []
    for reference_model, model, build, sample in cases:
        sample = to(device, sample)
        reference = fairseq_greedy(reference_model, task, sample)  # before the generator swaps any layer
        log_probs = fairseq_log_probs(reference_model, task, sample, reference)
        generator = build(reference)
        generators.append(generator)
        batched = generator.generate([model], sample)
        alone = []
        for i in range(BATCH):
            generator.sentences = torch.tensor([i], device=device)  # ReferenceDrafter: which reference row
            alone.append(generator.generate([model], sub_batch(sample, i))[0])
        for hypos in (batched, alone):
            assert all(h[0]["tokens"].device.type == torch.device(device).type for h in hypos)
            diverged += assert_greedy_up_to_near_ties(hypos, reference, log_probs, margin)
            sentences += len(hypos)
        tokens += sum(len(h[0]["tokens"]) for h in batched)
        calls += sum(h[0]["steps"] for h in batched)
    assert diverged <= MAX_DIVERGED * sentences, f"{diverged} of {sentences} sentences left fairseq's output"
    return generators, (diverged, sentences, tokens, calls)


def blockwise_cases(task, device, dtype, block_size):
    for seed in SEEDS:
        model = random_model(task, block_size, seed, identity_first_head=seed % 2 == 1).to(device=device, dtype=dtype)

        def build(_reference, model=model):
            return BlockwiseGenerator([model], task, Namespace(beam=1, max_len_b=MAX_LEN_B))

        yield model, model, build, random_batch(task.target_dictionary, BATCH, seed)


class ReferenceDrafter(SpecDrafterGenerator):
    """Drafts fairseq's greedy output of the teacher (``reference``: B x L, y_1.. then EOS, on the device), each token
    replaced by a random one with probability ``noise`` (a seeded CPU generator: the same on every device), so that
    sentences of a batch accept different numbers of drafts; ``sentences``: the reference rows of the batch (None:
    all), followed through the batch's reorders (tests/test_speculative.py's, on any device)."""

    reference, sentences, noise = None, None, 0.3

    def start(self, sample, encoder_out):
        self.rows = torch.arange(len(self.reference), device=self.reference.device)
        if self.sentences is not None:
            self.rows = self.sentences
        self.rng = torch.Generator().manual_seed(0)
        return super().start(sample, encoder_out)

    def reorder(self, keep):
        super().reorder(keep)
        self.rows = self.rows[keep]

    def propose(self, first, features, tokens, last, max_len):
        index = (last + 1).unsqueeze(1) + torch.arange(self.call_width - 1, device=last.device)
        drafts = self.reference[self.rows].gather(1, index.clamp(max=self.reference.size(1) - 1))
        noisy = (torch.rand(drafts.shape, generator=self.rng) < self.noise).to(drafts.device)
        random = torch.randint(self.tgt_dict.nspecial, len(self.tgt_dict), drafts.shape, generator=self.rng)
        return torch.where(noisy, random.to(drafts.device), drafts)


def speculative_cases(task, device, dtype, draft_size, tmp_path, generator_class=SpecDrafterGenerator):
    for seed in SEEDS:
        path = str(tmp_path / f"teacher{seed}.pt")
        teacher = random_teacher(task, seed, path).to(device=device, dtype=dtype)
        model = drafter(task, draft_size, seed + 10).to(device=device, dtype=dtype)

        def build(reference, model=model, path=path):
            options = with_task_options(task, spec_drafter_teacher=path)
            generator = generator_class([model], options, Namespace(beam=1, max_len_b=MAX_LEN_B))
            eos, width = task.target_dictionary.eos(), MAX_LEN_B + draft_size + 3
            rows = [hypos[0]["tokens"] for hypos in reference]
            generator.reference = torch.stack([F.pad(row, (0, width - len(row)), value=eos) for row in rows])
            return generator

        yield teacher, model, build, random_batch(task.target_dictionary, BATCH, seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [2, 4])
def test_blockwise_exact_acceptance_is_fairseqs_greedy_decoding_on_cuda(toy_task, dtype, block_size):
    _generators, (_diverged, _sentences, tokens, calls) = check_exact_decoder(
        toy_task, "cuda", dtype, blockwise_cases(toy_task, "cuda", dtype, block_size)
    )
    assert calls < tokens  # blocks of more than one token were accepted


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("draft_size", [1, 3])
def test_speculative_exact_verification_is_fairseqs_greedy_decoding_on_cuda(toy_task, tmp_path, dtype, draft_size):
    """An untrained drafter and one that drafts fairseq's output with random errors (drafts accepted, in blocks of
    different lengths per sentence); the teacher checkpoint is loaded by the decoder and moved to the drafter's
    device and dtype."""
    for generator_class in (SpecDrafterGenerator, ReferenceDrafter):
        cases = speculative_cases(toy_task, "cuda", dtype, draft_size, tmp_path, generator_class)
        generators, (_diverged, _sentences, tokens, calls) = check_exact_decoder(toy_task, "cuda", dtype, cases)
        for generator in generators:
            parameter = next(generator.teacher.model.parameters())
            assert parameter.device.type == "cuda" and parameter.dtype == dtype
    assert calls < tokens  # the reference drafter's drafts were accepted


# ----- the static step's CUDA graphs --------------------------------------------------------------------------------


def graph_cases(task, data_bin, device, dtype, tmp_path):
    """``(model, build, sample)``: the plugin's greedy loop, blockwise exact acceptance, speculative exact
    verification (an untrained drafter: drafter and teacher on the static step; the reference drafter: drafts
    accepted), SAT K=2 greedy and RecoverSAT K=3 (hidden slots)."""
    dictionary = task.target_dictionary
    teacher = random_transformer(task, seed=3).to(device=device, dtype=dtype).eval()
    gen_args = Namespace(beam=1, max_len_b=MAX_LEN_B)
    yield teacher, lambda: GreedyLoop([teacher], task, gen_args), random_batch(dictionary, BATCH, 3)
    for model, _, build, sample in blockwise_cases(task, device, dtype, 3):
        yield model, lambda build=build: build(None), sample
    for generator_class in (SpecDrafterGenerator, ReferenceDrafter):
        for spec_teacher, model, build, sample in speculative_cases(task, device, dtype, 3, tmp_path, generator_class):
            reference = fairseq_greedy(spec_teacher, task, to(device, sample))  # what the reference drafter drafts
            yield model, lambda build=build, reference=reference: build(reference), sample
    torch.manual_seed(0)
    for build_grouped, generator_class, group_size in (
        (build_sat, SATGenerator, 2),
        (build_recover_sat, RecoverSATGenerator, 3),
    ):
        model = build_grouped(data_bin, task, group_size).to(device=device, dtype=dtype)
        yield model, lambda g=generator_class, m=model: g([m], task, gen_args), sat_batch(task, range(BATCH))


def check_graphs_print_the_eager_output(task, data_bin, device, dtype, tmp_path, monkeypatch):
    """Each decoder of :func:`graph_cases` prints the same tokens and scores, bit for bit, with the static step's
    graphs as without (``NAT_CUDA_GRAPHS=0``: the same bucketed buffers, run eagerly), on a batch whose sentences
    leave at different steps and on each sentence alone; graphs were replayed, no capture failed. Returns the
    replays."""
    replays = []
    replay = step_graphs.replay
    monkeypatch.setattr(step_graphs, "replay", lambda *args: replays.append(1) or replay(*args))
    monkeypatch.setattr(STATE, "capture_failures", {})
    for model, build, sample in graph_cases(task, data_bin, device, dtype, tmp_path):
        sample = to(device, sample)
        decoded = {}
        for graphs in ("1", "0"):
            monkeypatch.setenv(CUDA_GRAPHS_ENV, graphs)
            generator = build()
            decoded[graphs] = generator.generate([model], sample)
            for i in range(BATCH):
                generator.sentences = torch.tensor([i], device=device)  # ReferenceDrafter: which reference row
                decoded[graphs] += generator.generate([model], sub_batch(sample, i))
        for with_graphs, eager in zip(decoded["1"], decoded["0"]):
            assert torch.equal(with_graphs[0]["tokens"], eager[0]["tokens"]), type(generator).__name__
            assert torch.equal(with_graphs[0]["positional_scores"], eager[0]["positional_scores"])
    monkeypatch.delenv(CUDA_GRAPHS_ENV)
    assert replays and STATE.capture_failures == {}
    return replays


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_static_steps_cuda_graphs_print_what_the_eager_step_prints(
    dummy_data_bin, sat_task, tmp_path, monkeypatch, dtype
):
    """:func:`check_graphs_print_the_eager_output` with real CUDA graphs (tests/test_step_graphs.py runs it on any
    machine, and checks the rest of the graphs' path)."""
    check_graphs_print_the_eager_output(sat_task, dummy_data_bin, "cuda", dtype, tmp_path, monkeypatch)


# ----- the CPU linear layout ----------------------------------------------------------------------------------------


def decode_every_way(task, device, dtype, tmp_path):
    """Blockwise, speculative (drafter and teacher) and translation_nat's fairseq generator for an AR model, on
    ``device`` in ``dtype``; returns the linear layers of the decoded models."""
    sample = to(device, random_batch(task.target_dictionary, BATCH, 0))
    model = random_model(task, 3, 0).to(device=device, dtype=dtype)
    BlockwiseGenerator([model], task, Namespace(beam=1, max_len_b=MAX_LEN_B)).generate([model], sample)
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(task, 0, path).to(device=device, dtype=dtype)
    spec = drafter(task, 3, 0).to(device=device, dtype=dtype)
    speculative = SpecDrafterGenerator(
        [spec], with_task_options(task, spec_drafter_teacher=path), Namespace(beam=1, max_len_b=MAX_LEN_B)
    )
    speculative.generate([spec], sample)
    task.build_generator([teacher], Namespace(beam=1, max_len_b=MAX_LEN_B)).generate([teacher], sample)
    modules = (model, spec, speculative.teacher.model, teacher)
    return [layer for module in modules for layer in module.modules() if isinstance(layer, nn.Linear)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_cpu_linear_layout_is_not_applied_on_cuda(toy_task, tmp_path, monkeypatch, dtype):
    if dtype is torch.bfloat16 and NO_BF16:
        pytest.skip(BF16_REASON)
    calls = count_weight_first_products(monkeypatch)
    decode_every_way(toy_task, "cpu", torch.float32, tmp_path)
    assert calls, "the probe sees the layout where it applies (CPU, float32)"
    calls.clear()
    layers = decode_every_way(toy_task, "cuda", dtype, tmp_path)
    assert calls == [], f"{len(calls)} W·xᵀ products computed on {set(calls)}"
    x = torch.randn(4, 32, device="cuda", dtype=dtype)
    with torch.no_grad():
        for layer in layers:
            if layer.in_features == 32:
                assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)), type(layer)
