"""Decoding one fairseq row the way ``fairseq_cli/generate.py`` does (:mod:`nat_plugins.cli.decoding`), as the timing
protocol (:mod:`.schedule`) runs it, and the :class:`Row` of its measurements.

Per decoded sentence a row keeps its best hypothesis (token ids and detokenized), the emitted tokens (EOS included), at
batch 1 the decoder passes (:class:`DecoderPassCounter`), and ``hypo["steps"]`` where the generator reports it.

The rows that print the teacher's greedy output (:func:`prints_teacher_greedy`: the teacher decoded greedily through
another layout, exact blockwise and speculative decoding, their greedy-steps-only variants) are checked against the
greedy teacher row in every timed pass, token for token (:func:`exact_check`): a sentence that differs is a
floating-point near-tie when, at its first differing token, the teacher's log-probabilities of the two tokens given the
common prefix differ by less than :data:`NEAR_TIE_TOLERANCE` (:meth:`FairseqRunner.log_prob_gap`), else a real
divergence.
"""

import functools
import logging
import shlex
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq import options, search, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.iterative_refinement_generator import IterativeRefinementGenerator
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq.sequence_generator import SequenceGenerator
from fairseq_cli.generate import get_symbols_to_strip_from_output
from torch import nn

from ..cli.decoding import Generation, load_generation
from ..engine import STATE
from ..generators.verify_accept_loop import VerifyAcceptLoop
from ..modules.teacher import FrozenTeacher
from .analysis import corpus_bleu
from .rows import BenchmarkError, Row, RowSpec, split_generate_args

logger = logging.getLogger("nat_plugins.bench.benchmark")

# the largest gap between the teacher's log-probabilities of two tokens that still counts as a floating-point near-tie,
# by precision: fp32 rounding moves a logit by a few 1e-6 (generators/verify_accept_loop.py); in fp16 the gap itself
# is computed in fp16, in steps of its unit of least precision (2^-8 to 2^-6 for log-probabilities of -4 to -16): on an
# H200 the plugin's greedy loop and exact decoders differed from fairseq's greedy search on 28-29 of 1,000 sentences,
# every first differing token at a gap of 0, 2^-7 or 2^-6 (0.0156; docs/results.md, GPU run). A real divergence
# (another model's preference) is orders of magnitude larger. bf16 keeps 3 bits fewer than fp16. The one definition:
# the CUDA tests (tests/test_gpu.py) read it too
NEAR_TIE_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-2, "bf16": 1e-1}


def generation_cfg(args, spec: RowSpec, use_cuda: bool):
    """Parse the row's fairseq-generate command line with fairseq's own parser into an omegaconf config."""
    argv = [
        args.data_bin,
        "--path",
        spec.checkpoint,
        "--user-dir",
        args.user_dir,
        "--task",
        "translation_nat",
        "--gen-subset",
        args.gen_subset,
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--post-process",
        args.post_process,
    ]
    argv += ["-s", args.source_lang] if args.source_lang else []
    argv += ["-t", args.target_lang] if args.target_lang else []
    argv += ["--cpu"] if not use_cuda else []
    argv += ["--fp16"] if args.fp16 else []
    argv += split_generate_args(args.generate_args, "--generate-args")
    try:
        namespace = options.parse_args_and_arch(options.get_generation_parser(), input_args=argv + spec.args)
    except SystemExit as err:  # argparse already printed the reason
        raise BenchmarkError(f"row {spec.name!r}: fairseq-generate rejected {shlex.join(spec.args)!r}") from err
    return convert_namespace_to_omegaconf(namespace)


def load_split(cfg, name: str):
    """``cfg``'s task with its split ``cfg.dataset.gen_subset`` loaded; returns (task, dataset)."""
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    try:
        task.load_dataset(cfg.dataset.gen_subset)
    except FileNotFoundError as err:
        raise BenchmarkError(split_error(cfg, name, err)) from err
    return task, task.dataset(cfg.dataset.gen_subset)


def source_lengths(dataset, dictionary) -> List[int]:
    """Subwords of every source of ``dataset``, special symbols (BOS, EOS, padding) excluded."""
    special = torch.tensor([dictionary.bos(), dictionary.eos(), dictionary.pad()])
    return [int((~torch.isin(dataset[i]["source"], special)).sum()) for i in range(len(dataset))]


def split_error(cfg, name: str, err: Exception) -> str:
    return (
        f"--gen-subset {cfg.dataset.gen_subset!r}: cannot load it from data-bin {cfg.task.data!r} "
        f"for row {name!r}: {err}"
    )


@dataclass
class RowDecoder:
    """A row's checkpoint ensemble and generator (:class:`nat_plugins.cli.decoding.Generation`) with its output
    converters."""

    generation: Generation
    to_text: Callable[[torch.Tensor], str]  # hypothesis tokens -> detokenized text
    emitted_length: Callable[[torch.Tensor], int]  # hypothesis tokens -> output tokens + 1 for EOS


def load_row(cfg, spec: RowSpec) -> RowDecoder:
    """Task, checkpoint ensemble, split and generator of one row, as fairseq-generate sets them up."""
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    try:
        generation = load_generation(cfg, task)
    except FileNotFoundError as err:
        raise BenchmarkError(split_error(cfg, spec.name, err)) from err
    tgt_dict = task.target_dictionary
    strip = get_symbols_to_strip_from_output(generation.generator)
    tokenizer, bpe = task.build_tokenizer(cfg.tokenizer), task.build_bpe(cfg.bpe)
    not_emitted = torch.tensor(sorted(set(strip) | {tgt_dict.bos(), tgt_dict.eos(), tgt_dict.pad()}))

    def to_text(tokens):
        text = tgt_dict.string(tokens.int().cpu(), cfg.common_eval.post_process, extra_symbols_to_ignore=strip)
        text = bpe.decode(text) if bpe is not None else text
        return tokenizer.decode(text) if tokenizer is not None else text

    def emitted_length(tokens):
        return int((~torch.isin(tokens.cpu(), not_emitted)).sum()) + 1

    return RowDecoder(generation, to_text, emitted_length)


def decoder_stacks(model: nn.Module) -> List[nn.Module]:
    """The first layer of every stack of decoder layers (fairseq's ``TransformerDecoderLayerBase`` and its
    subclasses, the plugin's NAD layers included) in ``model``: each run of one is one decoder pass, whichever
    method entered the decoder (``forward``, ``extract_features``, Levenshtein's ``forward_word_ins``...)."""
    firsts = {}
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and isinstance(module[0], TransformerDecoderLayerBase):
            firsts[id(module[0])] = module[0]  # stacks shared between heads (Levenshtein) count once
    return list(firsts.values())


def auxiliary_models(generator, models: List[nn.Module]) -> List[nn.Module]:
    """Models with decoder layers that ``generator`` decodes with besides the row's checkpoints ``models``, once each:
    the AR teacher of NPD (one rescoring pass) or of speculative decoding (the verifier), a copy of a decoder that
    drafts (``--int8-drafts``)."""
    seen = {id(layer) for model in models for layer in decoder_stacks(model)}  # a wrapper of them is no new model
    found = []
    for value in vars(generator).values():
        if isinstance(value, FrozenTeacher):
            value = value.model
        layers = decoder_stacks(value) if isinstance(value, nn.Module) else []
        if layers and not any(id(layer) in seen for layer in layers):
            found.append(value)
            seen.update(id(layer) for layer in layers)
    return found


@dataclass
class DecoderPassCounter:
    """Counts decoder passes while decoding, with forward pre-hooks on the self-attention layer norm of the first
    layer of every decoder stack (:func:`decoder_stacks`) of the ensemble ``models`` and the generator's
    ``auxiliary`` models: every pass runs it once, through fairseq's layer forward or the lean forward of
    :mod:`~nat_plugins.engine.lean_decoder` (which does not call the layer itself); a traced static step, which runs
    no hooks, reports its pass to ``STATE.pass_observers`` (:mod:`nat_plugins.engine.config`; the run that makes a
    trace is not counted).

    ``passes`` = the most passes of any ensemble member (members are called together, one pass each per step)
    + the auxiliary models' passes. Not observable (None) when a model has no such decoder layers."""

    models: List[nn.Module]
    auxiliary: List[nn.Module] = field(default_factory=list)

    def __post_init__(self):
        self.stacks = [decoder_stacks(model) for model in self.models + self.auxiliary]
        self.counts = [0] * len(self.stacks)
        self.handles = []

    def __enter__(self):
        self.group_of = {}
        for group, layers in enumerate(self.stacks):
            for layer in layers:
                hook = functools.partial(self._count, group)
                self.handles.append(layer.self_attn_layer_norm.register_forward_pre_hook(hook))
                self.group_of[id(layer)] = group
        STATE.pass_observers.append(self._traced_pass)
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        STATE.pass_observers.remove(self._traced_pass)

    def _count(self, group, _module, _inputs):
        if not torch.jit.is_tracing():  # making a trace runs the layers once more
            self.counts[group] += 1

    def _traced_pass(self, decoder: nn.Module) -> None:
        group = self.group_of.get(id(decoder.layers[0]))
        if group is not None:
            self.counts[group] += 1

    def reset(self):
        self.counts = [0] * len(self.stacks)

    @property
    def passes(self) -> Optional[int]:
        if not all(self.stacks):
            return None
        members = len(self.models)
        return max(self.counts[:members]) + sum(self.counts[members:])


class DraftingTimer:
    """The host time a verify-accept loop spends in its drafting calls (blockwise's heads, the speculative drafter:
    :meth:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptLoop.propose`), measured by the benchmark, not by the
    loop: while entered, the ``generator``'s ``propose`` is wrapped with a timer on ``clock`` (an attribute of the
    instance, over its class's method), and ``seconds`` sums its calls since the last :meth:`reset`. Meaningful on the
    CPU, which has computed the drafts when ``propose`` returns (a GPU runs them asynchronously)."""

    def __init__(self, generator: VerifyAcceptLoop, clock: Callable[[], float] = time.perf_counter):
        self.generator, self.clock = generator, clock
        self.seconds = 0.0
        self.saved = None

    def __enter__(self):
        self.saved = vars(self.generator).get("propose")  # an instance's own propose (None: its class's)
        propose = self.generator.propose

        @functools.wraps(propose)
        def timed(*args, **kwargs):
            started = self.clock()
            drafts = propose(*args, **kwargs)
            self.seconds += self.clock() - started
            return drafts

        self.generator.propose = timed
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            del self.generator.propose
        else:
            self.generator.propose = self.saved

    def reset(self):
        self.seconds = 0.0


def seed_everything(seed: int):
    """The same seed before every decoded unit, so a sampling decoder's output does not depend on the schedule."""
    np.random.seed(seed)
    utils.set_torch_seed(seed)


@dataclass
class Output:
    """What a row reports of one decoded sentence: its detokenized best hypothesis, emitted tokens (EOS included),
    ``hypo["steps"]`` where the generator reports it, decoder passes (batch 1 only; None: not observable), the
    hypothesis' token ids (EOS included; None where the row does not keep them) and, for a verify-accept loop, its
    drafting calls (``hypo["drafting_steps"]`` or ``["drafter_steps"]``) and, at batch 1 on the CPU, the seconds they
    took (:class:`DraftingTimer`)."""

    text: str
    tokens: int
    steps: Optional[float] = None
    passes: Optional[int] = None
    ids: Optional[Tuple[int, ...]] = None
    drafting_steps: Optional[int] = None
    drafting_seconds: Optional[float] = None


class FairseqRunner:
    """A row decoded the way fairseq-generate does, timed by :func:`.schedule.run_rounds`: the sentences collated
    (source ids) off the clock, ``task.inference_step`` on the clock (CUDA synchronised), the best hypotheses
    detokenized off it; decoder passes counted (:class:`DecoderPassCounter`) in every batch-1 unit, and a
    verify-accept loop's drafting calls timed on the CPU (:class:`DraftingTimer`)."""

    def __init__(self, spec: RowSpec, cfg, seed: int, num_sentences: int):
        logger.info("row %r: %s %s", spec.name, spec.checkpoint, shlex.join(spec.args))
        self.spec, self.seed = spec, seed
        self.decoder = load_row(cfg, spec)
        generation = self.decoder.generation
        if len(generation.dataset) != num_sentences:
            raise BenchmarkError(
                f"row {spec.name!r}: its split has {len(generation.dataset)} sentences, the references {num_sentences}"
            )
        self.generator_name = type(generation.generator).__name__
        self.length_limit = length_limit(cfg.generation.max_len_a, cfg.generation.max_len_b, generation.generator)
        self.npd_samples = cfg.task.get("npd_samples") if cfg.task.get("fertility_decoding") == "npd" else None
        auxiliary = auxiliary_models(generation.generator, generation.models)
        self.counter = DecoderPassCounter(generation.models, auxiliary).__enter__()  # hooks for the whole run
        if not all(self.counter.stacks):
            logger.warning("row %r: no decoder layers to count passes of (not a Transformer decoder?)", spec.name)
        self.drafting_timer = None  # the whole run, as the counter's hooks
        if isinstance(generation.generator, VerifyAcceptLoop) and not generation.use_cuda:
            self.drafting_timer = DraftingTimer(generation.generator).__enter__()
        self.outputs: Dict[int, Output] = {}
        # CUDA: why captures of the static step's graphs failed while decoding this row, with how many
        self.graph_capture_failures: Counter = Counter()

    def inputs(self, indices: List[int]):
        generation = self.decoder.generation
        sample = generation.to_device(generation.dataset.collater([generation.dataset[i] for i in indices]))
        seed_everything(self.seed)
        if generation.use_cuda:
            torch.cuda.synchronize()
        self.counter.reset()
        if self.drafting_timer is not None:
            self.drafting_timer.reset()
        return sample

    def decode(self, sample):
        failed_before = Counter(STATE.capture_failures)
        hypos = self.decoder.generation.decode(sample)
        if self.decoder.generation.use_cuda:
            torch.cuda.synchronize()
        self.graph_capture_failures.update(Counter(STATE.capture_failures) - failed_before)  # this row's
        return [nbest[0] for nbest in hypos]

    def record(self, sample, best):
        passes = self.counter.passes if len(best) == 1 else None
        timer = self.drafting_timer
        drafting_seconds = timer.seconds if timer is not None and len(best) == 1 else None
        for sample_id, hypo in zip(sample["id"].tolist(), best):
            steps = hypo.get("steps")
            self.outputs[sample_id] = Output(
                self.decoder.to_text(hypo["tokens"]),
                self.decoder.emitted_length(hypo["tokens"]),
                None if steps is None else float(steps),
                passes,
                tuple(hypo["tokens"].tolist()),
                hypo.get("drafting_steps", hypo.get("drafter_steps")),
                drafting_seconds,
            )

    @torch.no_grad()
    def log_prob_gap(self, index: int, prefix: Sequence[int], token: int, other: int) -> float:
        """|log p(``token``) - log p(``other``)| under this row's first model for sentence ``index``, after the
        output ``prefix`` (BOS excluded; fairseq's BOS, EOS, is put before it), in float32."""
        generation = self.decoder.generation
        model, net_input = generation.models[0], self.inputs([index])["net_input"]
        bos = generation.task.target_dictionary.eos()
        previous = torch.tensor([[bos, *prefix]], device=net_input["src_tokens"].device)
        net_output = model(net_input["src_tokens"], net_input["src_lengths"], previous)
        log_probs = model.get_normalized_probs(net_output, log_probs=True)[0, -1].float()
        return abs(log_probs[token] - log_probs[other]).item()


def greedy_model(generation: Generation) -> Optional[nn.Module]:
    """The AR model whose greedy output (``fairseq-generate --beam 1``, up to floating-point near-ties) the row's
    generator prints, or None where it prints anything else: fairseq's ``SequenceGenerator`` itself (not a subclass
    such as NAD-AD's) with beam 1, no sampling and no n-gram blocking over one model: that model; a verify-accept loop
    (blockwise, speculative decoding) with exact acceptance: its verifier, which for blockwise decoding is head 1 and
    the base model's own output only with ``--identity-first-head`` (else head 1's layer changes it)."""
    generator = generation.generator
    if isinstance(generator, VerifyAcceptLoop):
        heads = getattr(generator.verifier.decoder, "block_heads", None)
        if not generator.exact or heads is not None and not heads.identity_first_head:
            return None
        return generator.verifier
    if (
        type(generator) is SequenceGenerator
        and generator.beam_size == 1
        and type(generator.search) is search.BeamSearch
        and generator.repeat_ngram_blocker is None
        and len(generation.models) == 1
    ):
        return generation.models[0]
    return None


def same_weights(model: nn.Module, reference: nn.Module) -> bool:
    """Whether every tensor of ``reference``'s state dict is in ``model``'s, under the same name and equal (``model``
    may have more: the heads of a blockwise model on the frozen teacher)."""
    own = model.state_dict()
    return all(
        name in own and own[name].shape == tensor.shape and torch.equal(own[name], tensor.to(own[name]))
        for name, tensor in reference.state_dict().items()
    )


def prints_teacher_greedy(runner, teacher: FairseqRunner) -> bool:
    """Whether ``runner``'s row claims to print the teacher's greedy output: a fairseq row whose generator prints
    the greedy output of a model (:func:`greedy_model`) with the weights of ``teacher``'s (the greedy teacher row's),
    whatever its layout, task or drafts."""
    if not isinstance(runner, FairseqRunner):
        return False
    model = greedy_model(runner.decoder.generation)
    return model is not None and same_weights(model, teacher.decoder.generation.models[0])


def first_difference(ids: Sequence[int], other: Sequence[int]) -> int:
    """The first position where two token sequences differ (the shorter one's length where it is a prefix of the
    other)."""
    return next((t for t, (a, b) in enumerate(zip(ids, other)) if a != b), min(len(ids), len(other)))


def exact_check(
    outputs: Dict[int, Output], greedy: Dict[int, Output], gap: Callable[..., float], tolerance: float
) -> dict:
    """How a row's ``outputs`` of one timed pass differ from the greedy teacher row's ``greedy`` of the same pass,
    token for token: ``sentences``, the number that ``differ``, how many of those are ``near_ties`` (at the first
    differing token the teacher's log-probabilities of the two tokens, ``gap(sentence, prefix, token, other)``,
    differ by less than ``tolerance``) and per differing sentence its first differing ``position`` and the
    ``log_prob_gap`` there (None where one output is a prefix of the other: a real divergence)."""
    divergences = []
    for i in sorted(outputs):
        ids, other = outputs[i].ids, greedy[i].ids
        if ids != other:
            t = first_difference(ids, other)
            value = gap(i, ids[:t], ids[t], other[t]) if t < min(len(ids), len(other)) else None
            divergences.append({"sentence": i, "position": t, "log_prob_gap": value})
    return pass_check(len(outputs), divergences, tolerance)


class SoloOutput(NamedTuple):
    """A sentence's hypothesis in a solo process: its text and token ids (None: the engine gives none)."""

    text: str
    ids: Optional[Tuple[int, ...]]

    def same_as(self, other) -> bool:
        """Whether this is ``other``'s hypothesis (a :class:`.measure.Output`): by token ids where both have them,
        else by text."""
        if self.ids is not None and other.ids is not None:
            return self.ids == other.ids
        return self.text == other.text


def solo_exact_check(
    solo: Dict[int, SoloOutput], greedy: Dict[int, Output], own: Dict[int, Output], own_check: dict, tolerance: float
) -> dict:
    """:func:`exact_check` of a row's solo pass at one batch size (``solo``: its timed hypotheses by sentence) against
    the greedy teacher row's round-robin outputs ``greedy`` at that size, compared by token ids where the solo process
    returned them (:meth:`SoloOutput.same_as`, else by text): a sentence that is the teacher's does not differ; one
    that is the row's own round-robin output ``own`` keeps that sentence's verdict in ``own_check`` (the round-robin
    check at that size: a near-tie there is one here); any other differs by a divergence no near-tie covers
    (``log_prob_gap`` None, ``position`` None)."""
    checked = {d["sentence"]: d for d in own_check["divergences"]}
    divergences = []
    for i in sorted(solo):
        if solo[i].same_as(greedy[i]):
            continue
        unchecked = {"sentence": i, "position": None, "log_prob_gap": None}
        divergences.append(checked[i] if solo[i].same_as(own[i]) and i in checked else unchecked)
    return pass_check(len(solo), divergences, tolerance)


def pass_check(sentences: int, divergences: List[dict], tolerance: float) -> dict:
    """One timed pass's exact check: its ``sentences``, how many ``differ``, how many of those are ``near_ties`` (a
    ``log_prob_gap`` below ``tolerance``) and the ``divergences`` themselves."""
    return {
        "sentences": sentences,
        "differ": len(divergences),
        "near_ties": sum(d["log_prob_gap"] is not None and d["log_prob_gap"] < tolerance for d in divergences),
        "divergences": divergences,
    }


@dataclass
class Batch1:
    """The timed batch-1 sentences of a row: ids, latencies and what the decoder did for them."""

    ids: List[int]
    latency_ms: List[float]
    decoder_calls_per_sentence: Optional[float] = None  # None: not observable
    tokens_per_call: Optional[float] = None
    mean_steps: Optional[float] = None
    tokens_per_step: Optional[float] = None  # emitted tokens per hypo["steps"] (speculative: per teacher call)
    drafting_ms_per_call: Optional[float] = None  # a verify-accept loop's drafting time per drafting call (CPU)
    verify_ms_per_call: Optional[float] = None  # the rest of its time (encoder included) per verifier call (CPU)


def batch1_stats(latency_ms: Dict[int, float], outputs: Dict[int, Output]) -> Batch1:
    """Latency, decoder calls, tokens per call and per ``hypo["steps"]`` over the timed sentences (``latency_ms``:
    sentence -> ms), in sentence order; where every sentence reports its drafting time, the time per drafting call
    and the rest per verifier call."""
    ids = sorted(latency_ms)
    timed = [outputs[i] for i in ids]
    stepped = [out for out in timed if out.steps is not None]
    steps = sum(out.steps for out in stepped)
    mean_steps = statistics.fmean(out.steps for out in stepped) if stepped else None
    tokens_per_step = sum(out.tokens for out in stepped) / steps if steps > 0 else None
    batch1 = Batch1(ids, [latency_ms[i] for i in ids], mean_steps=mean_steps, tokens_per_step=tokens_per_step)
    if all(out.passes is not None for out in timed):
        calls = sum(out.passes for out in timed)
        batch1.decoder_calls_per_sentence = calls / len(timed)
        batch1.tokens_per_call = sum(out.tokens for out in timed) / max(calls, 1)
    if timed and steps > 0 and all(out.drafting_seconds is not None for out in timed):
        drafting_ms = 1000 * sum(out.drafting_seconds for out in timed)
        drafting_calls = sum(out.drafting_steps for out in timed)
        batch1.drafting_ms_per_call = drafting_ms / drafting_calls if drafting_calls else None
        batch1.verify_ms_per_call = (sum(batch1.latency_ms) - drafting_ms) / steps
    return batch1


def length_limit(max_len_a: float, max_len_b: int, generator=None) -> str:
    """The output length limit a row's decoder applies: fairseq's ``--max-len-a/--max-len-b`` (every plugin
    generator, SequenceGenerator, CTranslate2 here), except for fairseq's IterativeRefinementGenerator."""
    if isinstance(generator, IterativeRefinementGenerator):
        return "the model's predicted length (IterativeRefinementGenerator ignores --max-len-a/b)"
    return f"{max_len_a:g}·|x| + {max_len_b}"


def make_row(runner, hyps: List[str], references: List[str], rates: List[float], batch1: Batch1) -> Row:
    """The :class:`Row` of a runner's measurements (BLEU: sacreBLEU of ``hyps`` against ``references``; ``rates``:
    sentences per second of each round of the batched pass)."""
    bleu, signature = corpus_bleu(hyps, references)
    return Row(
        runner.spec,
        hyps,
        bleu,
        signature,
        rates,
        batch1.ids,
        batch1.latency_ms,
        runner.generator_name,
        runner.length_limit,
        batch1.decoder_calls_per_sentence,
        batch1.tokens_per_call,
        batch1.mean_steps,
        batch1.tokens_per_step,
        runner.npd_samples,
        drafting_ms_per_call=batch1.drafting_ms_per_call,
        verify_ms_per_call=batch1.verify_ms_per_call,
        graph_capture_failures=dict(getattr(runner, "graph_capture_failures", {})) or None,  # none: CTranslate2's
    )
