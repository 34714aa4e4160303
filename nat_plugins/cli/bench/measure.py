"""Decoding and measuring one fairseq row: the path ``fairseq_cli/generate.py`` takes (:mod:`..decoding`), timed.

* throughput: the whole split in length-sorted batches of ``--batch-size`` sentences, summed
  ``task.inference_step`` time (data loading and detokenization excluded); its hypotheses are the row's output;
* batch 1: sentences in index order, the first ``--warmup`` decoded but not counted; per sentence the latency,
  the decoder passes (:class:`DecoderPassCounter`) and the emitted tokens (EOS included), and ``hypo["steps"]``
  where the generator reports it.
"""

import functools
import logging
import shlex
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.iterative_refinement_generator import IterativeRefinementGenerator
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq_cli.generate import get_symbols_to_strip_from_output
from torch import nn

from ...modules.teacher import FrozenTeacher
from ..decoding import Generation, load_generation, progress
from .analysis import corpus_bleu
from .rows import BenchmarkError, Row, RowSpec, split_generate_args

logger = logging.getLogger("nat_plugins.cli.benchmark")


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
    """A row's checkpoint ensemble and generator (:class:`..decoding.Generation`) with its output converters."""

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
    :mod:`~nat_plugins.modules.lean_decoder` (which does not call the layer itself).

    ``passes`` = the most passes of any ensemble member (members are called together, one pass each per step)
    + the auxiliary models' passes. Not observable (None) when a model has no such decoder layers."""

    models: List[nn.Module]
    auxiliary: List[nn.Module] = field(default_factory=list)

    def __post_init__(self):
        self.stacks = [decoder_stacks(model) for model in self.models + self.auxiliary]
        self.counts = [0] * len(self.stacks)
        self.handles = []

    def __enter__(self):
        for group, layers in enumerate(self.stacks):
            for layer in layers:
                hook = functools.partial(self._count, group)
                self.handles.append(layer.self_attn_layer_norm.register_forward_pre_hook(hook))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _count(self, group, _module, _inputs):
        self.counts[group] += 1

    def reset(self):
        self.counts = [0] * len(self.stacks)

    @property
    def passes(self) -> Optional[int]:
        if not all(self.stacks):
            return None
        members = len(self.models)
        return max(self.counts[:members]) + sum(self.counts[members:])


def seed_everything(seed: int):
    """The same seed before every pass, so sampling decoders are reproducible across rows and passes."""
    np.random.seed(seed)
    utils.set_torch_seed(seed)


def timed_decode(generation: Generation, sample):
    """Decode one batch; returns (hypotheses, seconds), CUDA synchronised."""
    if generation.use_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    hypos = generation.decode(sample)
    if generation.use_cuda:
        torch.cuda.synchronize()
    return hypos, time.perf_counter() - start


@dataclass
class Batch1:
    """The timed batch-1 sentences of a row: ids, latencies and what the decoder did for them; ``hyps``: the
    detokenized output of every sentence decoded, warm-up included, in sentence order."""

    ids: List[int]
    latency_ms: List[float]
    decoder_calls_per_sentence: Optional[float] = None  # None: not observable
    tokens_per_call: Optional[float] = None
    mean_steps: Optional[float] = None
    tokens_per_step: Optional[float] = None  # emitted tokens per hypo["steps"] (speculative: per teacher call)
    hyps: List[str] = field(default_factory=list)


def measure_throughput(decoder: RowDecoder, seed: int, desc: str):
    """Decode the whole split in length-sorted batches; returns (seconds, hypotheses in sentence order)."""
    generation = decoder.generation
    seed_everything(seed)
    hyps: Dict[int, str] = {}
    seconds = 0.0
    for sample in generation.batches(f"{desc}: throughput", num_workers=0):
        hypos, elapsed = timed_decode(generation, sample)
        seconds += elapsed
        for i, sample_id in enumerate(sample["id"].tolist()):
            hyps[sample_id] = decoder.to_text(hypos[i][0]["tokens"])
    size = len(generation.dataset)
    if len(hyps) != size:
        raise BenchmarkError(
            f"row {desc!r}: {size - len(hyps)} sentences were not decoded (longer than the model allows?)"
        )
    return seconds, [hyps[i] for i in range(size)]


def measure_batch1(decoder: RowDecoder, num_sentences: int, warmup: int, seed: int, desc: str) -> Batch1:
    """Batch-1 latency, decoder calls, tokens per call and per ``hypo["steps"]`` over sentences
    ``warmup..num_sentences-1``."""
    generation = decoder.generation
    dataset = generation.dataset
    seed_everything(seed)
    ids, latencies, calls, tokens, steps, step_tokens, hyps = [], [], [], [], [], [], []
    with DecoderPassCounter(generation.models, auxiliary_models(generation.generator, generation.models)) as counter:
        for index in progress(range(num_sentences), f"{desc}: batch 1", generation.cfg.common):
            sample = generation.to_device(dataset.collater([dataset[index]]))
            counter.reset()
            hypos, elapsed = timed_decode(generation, sample)
            best = hypos[0][0]
            hyps.append(decoder.to_text(best["tokens"]))
            if index < warmup:
                continue
            ids.append(index)
            latencies.append(1000 * elapsed)
            calls.append(counter.passes)
            tokens.append(decoder.emitted_length(best["tokens"]))
            if best.get("steps") is not None:
                steps.append(float(best["steps"]))
                step_tokens.append(tokens[-1])
    mean_steps = statistics.fmean(steps) if steps else None
    tokens_per_step = sum(step_tokens) / sum(steps) if sum(steps) > 0 else None
    if None in calls:
        logger.warning("row %r: no decoder layers to count passes of (not a Transformer decoder?)", desc)
        return Batch1(ids, latencies, mean_steps=mean_steps, tokens_per_step=tokens_per_step, hyps=hyps)
    return Batch1(
        ids, latencies, statistics.fmean(calls), sum(tokens) / max(sum(calls), 1), mean_steps, tokens_per_step, hyps
    )


def length_limit(max_len_a: float, max_len_b: int, generator=None) -> str:
    """The output length limit a row's decoder applies: fairseq's ``--max-len-a/--max-len-b`` (every plugin
    generator, SequenceGenerator, CTranslate2 here), except for fairseq's IterativeRefinementGenerator."""
    if isinstance(generator, IterativeRefinementGenerator):
        return "the model's predicted length (IterativeRefinementGenerator ignores --max-len-a/b)"
    return f"{max_len_a:g}·|x| + {max_len_b}"


def make_row(
    spec: RowSpec,
    hyps: List[str],
    references: List[str],
    throughput_seconds: float,
    batch1: Batch1,
    generator: str,
    limit: str,
    npd_samples: Optional[int] = None,
) -> Row:
    """A :class:`Row` of measurements (BLEU: sacreBLEU of ``hyps`` against ``references``)."""
    bleu, signature = corpus_bleu(hyps, references)
    return Row(
        spec,
        hyps,
        bleu,
        signature,
        throughput_seconds,
        batch1.ids,
        batch1.latency_ms,
        generator,
        limit,
        batch1.decoder_calls_per_sentence,
        batch1.tokens_per_call,
        batch1.mean_steps,
        batch1.tokens_per_step,
        npd_samples,
    )


def measure_row(spec: RowSpec, cfg, references: List[str], num_latency: int, warmup: int, seed: int) -> Row:
    """Load one row and measure it: batch 1 first, then the throughput pass (its output is the row's)."""
    logger.info("row %r: %s %s", spec.name, spec.checkpoint, shlex.join(spec.args))
    decoder = load_row(cfg, spec)
    if len(decoder.generation.dataset) != len(references):
        raise BenchmarkError(
            f"row {spec.name!r}: its split has {len(decoder.generation.dataset)} sentences, the "
            f"references {len(references)}"
        )
    batch1 = measure_batch1(decoder, num_latency, warmup, seed, spec.name)
    seconds, hyps = measure_throughput(decoder, seed, spec.name)
    generator = decoder.generation.generator
    limit = length_limit(cfg.generation.max_len_a, cfg.generation.max_len_b, generator)
    npd = cfg.task.get("npd_samples") if cfg.task.get("fertility_decoding") == "npd" else None
    row = make_row(spec, hyps, references, seconds, batch1, type(generator).__name__, limit, npd)
    if decoder.generation.use_cuda:
        del decoder, generator
        torch.cuda.empty_cache()
    return row
