"""``nat-export-onnx CHECKPOINT OUT_DIR [--int8]``: the fertility NAT's single pass as two ONNX graphs, which
``fairseq-generate``/``fairseq-interactive`` run in ONNX Runtime with ``--onnx-model OUT_DIR``
(:mod:`nat_plugins.systems.fertility_nat.onnx_decoding`).

    nat-export-onnx ckpt/fertility-nat/checkpoint_last.pt onnx/float32
    nat-export-onnx ckpt/fertility-nat/checkpoint_last.pt onnx/int8 --int8     # int8 weights (dynamic quantization)
    fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path CHECKPOINT --cpu --beam 1 \\
        --fertility-decoding argmax --onnx-model onnx/float32

* ``encoder.onnx``: the encoder, the fertility predictor's log-probabilities and the source inputs the decoder copies;
  ``decoder.onnx``: the decoder over the copied inputs and the NAT's output rule (tokens and their log-probabilities).
  Exported with ``torch.onnx.export``'s TorchScript exporter (``dynamo=False``) with dynamic batch, source and target
  lengths; the fertilities and the copy run in PyTorch between them at decoding time.
* Only the fertility NAT is exported: its decoding is one pass; the other systems decode in loops (a decoder call per
  token, group or block, searched on the host), which these two graphs do not express.
* The float32 graphs are checked against the PyTorch pass on a batch of other shapes than the traced one before they
  are written (the same encoder outputs, and at every target position the graph's token is PyTorch's own choice or a
  floating-point near-tie of it). ``--int8``: ONNX Runtime's ``quantize_dynamic`` of both graphs (int8 weights of the
  matrix products, activations quantized per call); not the float32 output.
* ``manifest.json``: the checkpoint's path and sha256, a fingerprint of its weights (what ``--onnx-model`` compares
  with the loaded checkpoint), the model's options (copy mode, max fertility, dictionary sizes, pad/EOS/unk ids),
  int8 or not, the versions that wrote it.

A checkpoint that is not a ``fertility_nat`` model is refused. Its dictionaries are those its task state stores
(``translation_nat`` writes them into every checkpoint), else its data directory's; ``--data DATA_BIN`` names another.
"""

import argparse
import datetime
import hashlib
import json
import logging
import os
import sys
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple
from unittest import mock

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, data_utils
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from torch import nn

from ..modules import nat_decoder
from ..modules.nat_decoder import copy_source, fertility_copy_index, uniform_fertility
from ..modules.teacher import checkpoint_arch, teacher_symbols
from ..systems.fertility_nat import onnx_decoding as graphs
from ..systems.fertility_nat.fertility import nat_output
from ..systems.fertility_nat.model import FertilityNATModel
from ..tasks.translation_nat import TranslationNATTask
from ..version import __version__

logger = logging.getLogger("nat_plugins.cli.export_onnx")

OPSET = 17  # LayerNormalization is an operator from opset 17 on (one fused kernel in ONNX Runtime)
# the largest difference between the graph's and PyTorch's float32 outputs the export check accepts: fp32 rounding
# moves a log-probability by a few 1e-6 (the benchmark's near-tie tolerance, bench/measure.py, is 1e-4)
TOLERANCE = 1e-4


class ExportError(ValueError):
    """A checkpoint or option the export refuses (printed without a traceback)."""


# ----- the two graphs ------------------------------------------------------------------------------------------------
class EncoderGraph(nn.Module):
    """``src_tokens`` (B, S) -> encoder states (S, B, C), their padding mask (B, S), fertility log-probabilities
    (B, S, L) and the source inputs (B, S, C): what the generator computes before it chooses fertilities."""

    def __init__(self, model: FertilityNATModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_tokens: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        model = self.model
        encoder_out = model.encode(src_tokens, None)
        lprobs = model.get_normalized_probs((model.fertility_logits(encoder_out), None), log_probs=True)
        states, padding = encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        return states, padding, lprobs, model.source_inputs(src_tokens, encoder_out)


class DecoderGraph(nn.Module):
    """The copied inputs (B, T, C), the target padding mask (B, T), the encoder states (S, B, C) and padding mask
    (B, S), ``--unkpen`` (a scalar) -> the NAT's tokens (B, T) and their log-probabilities (B, T)
    (:func:`~nat_plugins.systems.fertility_nat.fertility.nat_output`)."""

    def __init__(self, model: FertilityNATModel) -> None:
        super().__init__()
        self.model = model
        dictionary = model.decoder.dictionary
        self.pad, self.eos, self.unk = dictionary.pad(), dictionary.eos(), dictionary.unk()

    def forward(
        self,
        inputs: torch.Tensor,
        padding_mask: torch.Tensor,
        encoder_out: torch.Tensor,
        encoder_padding_mask: torch.Tensor,
        unk_penalty: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        encoder = {"encoder_out": [encoder_out], "encoder_padding_mask": [encoder_padding_mask]}
        logits, _extra = self.model.decoder(inputs, padding_mask, encoder)
        # traced with a non-zero penalty: the graph subtracts it (0 subtracts nothing)
        tokens, scores, _lengths = nat_output(logits, padding_mask, self.pad, self.eos, self.unk, unk_penalty)
        return tokens, scores


def source_batch(model: FertilityNATModel, lengths: Sequence[int], seed: int) -> torch.Tensor:
    """Random sources of ``lengths`` tokens (EOS included), left-padded as fairseq collates them."""
    dictionary = model.encoder.dictionary
    generator = torch.Generator().manual_seed(seed)
    sources = [
        torch.cat(
            [
                torch.randint(dictionary.nspecial, len(dictionary), (length - 1,), generator=generator),
                torch.tensor([dictionary.eos()]),
            ]
        )
        for length in lengths
    ]
    return data_utils.collate_tokens(sources, dictionary.pad(), left_pad=True)


def decoder_batch(
    model: FertilityNATModel, src_tokens: torch.Tensor, fertility: torch.Tensor
) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """The decoder graph's inputs for ``src_tokens`` decoded with ``fertility`` (B, S), and PyTorch's logits of them
    (``model.decode``: the model's own copy)."""
    if model.copy_mode == "uniform":  # as model.decode spreads them (the same total: the same fertilities again)
        fertility = uniform_fertility(model.copyable(src_tokens), fertility.sum(dim=1))
    with torch.no_grad():
        encoder_out = model.encode(src_tokens, None)
        logits, padding = model.decode(src_tokens, encoder_out, fertility)
        index, _padding = fertility_copy_index(fertility)
        inputs = copy_source(model.source_inputs(src_tokens, encoder_out), index)
    feed = {
        "inputs": inputs,
        "padding_mask": padding,
        "encoder_out": encoder_out["encoder_out"][0],
        "encoder_padding_mask": encoder_out["encoder_padding_mask"][0],
        "unk_penalty": torch.tensor(1.0),
    }
    return feed, logits


def trace_examples(model: FertilityNATModel) -> Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]:
    """The batches the graphs are traced on: 2 sentences of other lengths (padding on both sides, so the traced
    graphs take the padded path, which computes the unpadded one as well), source and target lengths unequal."""
    src_tokens = source_batch(model, (7, 4), seed=0)
    copyable = model.copyable(src_tokens)
    fertility = torch.tensor([[1, 0, 2, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0]]).masked_fill(~copyable, 0)
    feed, _logits = decoder_batch(model, src_tokens, fertility)
    return (src_tokens,), tuple(feed[name] for name in graphs.DECODER_INPUTS)


def exportable_self_attention_mask(length: int, mask_diagonal: bool, reference: torch.Tensor) -> Optional[torch.Tensor]:
    """:func:`~nat_plugins.modules.nat_decoder.self_attention_mask` (the same values) in operators ONNX has: the
    exporter has no ``fill_diagonal_``."""
    if not mask_diagonal:
        return None
    positions = torch.arange(length, device=reference.device)
    diagonal = positions.unsqueeze(0) == positions.unsqueeze(1)
    return torch.zeros_like(diagonal, dtype=reference.dtype).masked_fill(diagonal, nat_decoder.HIDDEN)


def export_graph(module: nn.Module, example: Tuple[torch.Tensor, ...], path: str, kind: str, opset: int) -> None:
    """``torch.onnx.export`` of ``module`` (evaluation mode) traced on ``example`` to ``path``, with dynamic batch,
    source and target axes."""
    if kind == "encoder":
        names, outputs = graphs.ENCODER_INPUTS, graphs.ENCODER_OUTPUTS
        axes = {
            "src_tokens": {0: "batch", 1: "source"},
            "encoder_out": {0: "source", 1: "batch"},
            "encoder_padding_mask": {0: "batch", 1: "source"},
            "fertility_lprobs": {0: "batch", 1: "source"},
            "source_inputs": {0: "batch", 1: "source"},
        }
    else:
        names, outputs = graphs.DECODER_INPUTS, graphs.DECODER_OUTPUTS
        axes = {
            "inputs": {0: "batch", 1: "target"},
            "padding_mask": {0: "batch", 1: "target"},
            "encoder_out": {0: "source", 1: "batch"},
            "encoder_padding_mask": {0: "batch", 1: "source"},
            "tokens": {0: "batch", 1: "target"},
            "scores": {0: "batch", 1: "target"},
        }
    module.eval()  # the exporter restores the module's mode afterwards: it must be evaluation's to begin with
    exportable = mock.patch.object(nat_decoder, "self_attention_mask", exportable_self_attention_mask)
    with warnings.catch_warnings(), torch.no_grad(), exportable:
        # the tracer's warnings name the model's Python branches on tensors (padding present, a position check): the
        # traced batches take the general branch (trace_examples)
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            path,
            dynamo=False,
            input_names=list(names),
            output_names=list(outputs),
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
        )


# ----- the check of the float32 graphs -------------------------------------------------------------------------------
def check_graphs(model: FertilityNATModel, directory: str) -> Dict[str, float]:
    """Run the float32 graphs in ``directory`` on a batch of other shapes than the traced one and compare them with
    the PyTorch pass; raise :class:`ExportError` where they differ by more than :data:`TOLERANCE` (the encoder's
    outputs, relative to their largest magnitude when above 1; the decoder's scores, and PyTorch's log-probability of
    every graph token against its best: a graph token that is not PyTorch's must be a near-tie of it). Returns the
    largest differences."""
    encoder = graphs.session(os.path.join(directory, graphs.ENCODER_GRAPH), 1)
    decoder = graphs.session(os.path.join(directory, graphs.DECODER_GRAPH), 1)
    src_tokens = source_batch(model, (11, 3, 6), seed=1)
    with torch.no_grad():
        expected = EncoderGraph(model).eval()(src_tokens)
    got = encoder.run(list(graphs.ENCODER_OUTPUTS), {"src_tokens": src_tokens.numpy()})
    worst = {}
    for name, want, have in zip(graphs.ENCODER_OUTPUTS, expected, got):  # relative to the outputs' scale
        want = want.float()
        scale = max(1.0, float(want.abs().max()))
        worst[name] = float((want - torch.from_numpy(have).float()).abs().max()) / scale
    copyable = model.copyable(src_tokens)
    fertility = torch.randint(0, 3, src_tokens.shape, generator=torch.Generator().manual_seed(2)).masked_fill(
        ~copyable, 0
    )
    fertility[:, -2] += 1  # every sentence gets a token (its last word)
    feed, logits = decoder_batch(model, src_tokens, fertility)
    dictionary = model.decoder.dictionary
    pad, eos, unk = dictionary.pad(), dictionary.eos(), dictionary.unk()
    want_tokens, want_scores, _ = nat_output(logits, feed["padding_mask"], pad, eos, unk, 1.0)
    tokens, scores = decoder.run(list(graphs.DECODER_OUTPUTS), {k: v.numpy() for k, v in feed.items()})
    tokens, scores = torch.from_numpy(tokens), torch.from_numpy(scores)
    worst["scores"] = float((scores - want_scores).abs().max())
    lprobs = torch.log_softmax(logits.float(), dim=-1) - 1.0 * torch.nn.functional.one_hot(
        torch.tensor(unk), logits.size(-1)
    )
    keep = ~feed["padding_mask"]
    of_graph_tokens = lprobs.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    worst["token_gap"] = float((want_scores - of_graph_tokens).masked_fill(~keep, 0.0).abs().max())
    worst["tokens_differ"] = int((tokens.ne(want_tokens) & keep).sum())
    bad = {name: value for name, value in worst.items() if name != "tokens_differ" and not value <= TOLERANCE}
    if bad:
        raise ExportError(
            f"the exported graphs do not reproduce the PyTorch pass (largest differences {bad}, tolerance "
            f"{TOLERANCE}): please report it with the checkpoint's options"
        )
    return worst


# ----- the command ---------------------------------------------------------------------------------------------------
def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dictionary_of(symbols: List[str], side: str, path: str) -> Dictionary:
    """A fairseq ``Dictionary`` of ``symbols`` (fairseq's special symbols first, as every dictionary it writes)."""
    dictionary = Dictionary()
    if symbols[: dictionary.nspecial] != dictionary.symbols:
        raise ExportError(f"{path}: its {side} dictionary does not start with fairseq's special symbols")
    for symbol in symbols[dictionary.nspecial :]:
        dictionary.add_symbol(symbol)
    if dictionary.symbols != symbols:
        raise ExportError(f"{path}: its {side} dictionary repeats a symbol")
    return dictionary


def load_fertility_nat(path: str, data: Optional[str] = None) -> Tuple[FertilityNATModel, Dict[str, Any]]:
    """The ``fertility_nat`` model of checkpoint ``path`` (evaluation mode, CPU, float32) and the checkpoint's state;
    :class:`ExportError` for a file that is not one."""
    if not os.path.isfile(path):
        raise ExportError(f"checkpoint {path!r} does not exist")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    arch = checkpoint_arch(state)
    cls = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)
    if cls is None or not issubclass(cls, FertilityNATModel):
        raise ExportError(
            f"{path!r} is a {arch} checkpoint, not a fertility_nat model: nat-export-onnx exports the fertility NAT "
            "(one encoder pass, one decoder pass); the other systems decode in loops of decoder calls searched on the "
            "host, which are not exported. Pass a checkpoint of examples/multi30k/fertility_nat.sh (--arch "
            "fertility_nat)"
        )
    if data is not None:
        state["cfg"]["task"].data = data
    dictionaries = []
    for side in ("source", "target"):
        symbols, where = teacher_symbols(state, side)
        if symbols is None:
            raise ExportError(f"{path!r}: cannot find its {side} dictionary ({where}): pass --data DATA_BIN")
        dictionaries.append(dictionary_of(list(symbols), side, path))
    task = TranslationNATTask(state["cfg"]["task"], *dictionaries)
    models, _cfg = checkpoint_utils.load_model_ensemble([path], task=task, state=state)
    return models[0].eval().float(), state


def export(
    checkpoint: str,
    out_dir: str,
    int8: bool = False,
    data: Optional[str] = None,
    opset: int = OPSET,
) -> Dict[str, Any]:
    """Export ``checkpoint``'s fertility NAT to ``out_dir`` (module docstring); returns the manifest written."""
    graphs.import_onnxruntime()
    model, state = load_fertility_nat(checkpoint, data)
    source = {
        "checkpoint": os.path.abspath(checkpoint),
        "checkpoint_sha256": file_sha256(checkpoint),
        "arch": checkpoint_arch(state),
    }
    return write_graphs(model, out_dir, int8=int8, opset=opset, source=source)


def write_graphs(
    model: FertilityNATModel,
    out_dir: str,
    int8: bool = False,
    opset: int = OPSET,
    source: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The graphs of ``model`` (a ``fertility_nat`` model in evaluation mode, float32 on the CPU) and their manifest
    in ``out_dir``; ``source``: where the model comes from (the checkpoint's path, sha256 and architecture), written
    to the manifest. The manifest is removed first and written last, so a directory whose export did not finish is
    refused. Returns the manifest."""
    graphs.import_onnxruntime()
    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, graphs.MANIFEST)
    if os.path.exists(manifest_path):
        os.remove(manifest_path)
    model.eval()
    encoder_example, decoder_example = trace_examples(model)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as scratch:
        float_dir = os.path.join(scratch, "float32")
        os.makedirs(float_dir)
        export_graph(
            EncoderGraph(model), encoder_example, os.path.join(float_dir, graphs.ENCODER_GRAPH), "encoder", opset
        )
        export_graph(
            DecoderGraph(model), decoder_example, os.path.join(float_dir, graphs.DECODER_GRAPH), "decoder", opset
        )
        check = check_graphs(model, float_dir)
        logger.info("float32 graphs checked against PyTorch: largest differences %s", check)
        written = float_dir
        if int8:
            written = os.path.join(scratch, "int8")
            os.makedirs(written)
            for name in (graphs.ENCODER_GRAPH, graphs.DECODER_GRAPH):
                quantize(os.path.join(float_dir, name), os.path.join(written, name))
        for name in (graphs.ENCODER_GRAPH, graphs.DECODER_GRAPH):
            os.replace(os.path.join(written, name), os.path.join(out_dir, name))
    manifest = manifest_of(model, source or {}, int8, opset, check)
    with open(manifest_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(manifest_path + ".tmp", manifest_path)
    return manifest


def quantize(source: str, target: str) -> None:
    """ONNX Runtime's dynamic quantization of the graph ``source`` into ``target``: int8 weights of the matrix
    products (per output channel), uint8 activations quantized at every call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the quantizer logs on the root logger every tensor it leaves alone (INFO) and advice to pre-process the graphs
    # (WARNING: measured on the CPU preset's NAT, ONNX Runtime's pre-processing changed neither speed nor agreement)
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        quantize_dynamic(
            source, target, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul", "Gemm"]
        )
    finally:
        root.setLevel(level)


def manifest_of(
    model: FertilityNATModel, source: Dict[str, Any], int8: bool, opset: int, check: Dict[str, float]
) -> Dict[str, Any]:
    """The manifest of ``model``'s graphs (module docstring)."""
    import onnx
    import onnxruntime

    return {
        "format": graphs.FORMAT,
        "format_version": graphs.FORMAT_VERSION,
        "checkpoint": source.get("checkpoint"),
        "checkpoint_sha256": source.get("checkpoint_sha256"),
        "arch": source.get("arch", "fertility_nat"),
        "weights_fingerprint": graphs.weights_fingerprint(model),
        "model": graphs.model_options(model),
        "int8": int8,
        "quantization": "onnxruntime quantize_dynamic: int8 weights per channel, uint8 activations" if int8 else None,
        "graphs": {"encoder": graphs.ENCODER_GRAPH, "decoder": graphs.DECODER_GRAPH},
        "opset": opset,
        "float32_check": check,
        "exported": datetime.datetime.now().isoformat(timespec="seconds"),
        "versions": {
            "nat_plugins": __version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
    }


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nat-export-onnx",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", help="a fertility_nat checkpoint")
    parser.add_argument("out_dir", help="where the graphs and manifest.json are written (created)")
    parser.add_argument("--int8", action="store_true", help="int8 weights (ONNX Runtime's dynamic quantization)")
    parser.add_argument(
        "--data",
        metavar="DATA_BIN",
        help="the data-bin whose dictionaries the checkpoint reads (default: the ones "
        "its task state stores, else its own data directory)",
    )
    parser.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    return parser


def cli_main(argv: Optional[List[str]] = None) -> None:
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr
    )
    args = get_parser().parse_args(argv)
    try:
        manifest = export(args.checkpoint, args.out_dir, int8=args.int8, data=args.data, opset=args.opset)
    except (ExportError, ImportError, FileNotFoundError) as err:
        sys.exit(f"nat-export-onnx: error: {err}")
    kind = "int8" if manifest["int8"] else "float32"
    logger.info(
        "wrote %s graphs of %s to %s: decode with --onnx-model %s", kind, args.checkpoint, args.out_dir, args.out_dir
    )


if __name__ == "__main__":
    cli_main()
