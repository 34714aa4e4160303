"""``--onnx-model DIR``: the fertility NAT's single pass run by ONNX Runtime on the CPU, from the graphs that
``nat-export-onnx`` (:mod:`nat_plugins.cli.export_onnx`) wrote to DIR.

In PyTorch eager a small model's pass at batch 1 is mostly per-operator overhead; ONNX Runtime runs the same pass as
two graphs:

* ``encoder.onnx``: ``src_tokens`` (B, S) -> the encoder states (S, B, C), their padding mask (B, S), the fertility
  log-probabilities (B, S, L) and the source inputs the decoder copies (scaled token embedding + source position,
  (B, S, C));
* ``decoder.onnx``: the copied inputs (B, T, C), the target padding mask (B, T), the encoder states and mask and
  ``--unkpen`` -> the NAT's output tokens (B, T) and their log-probabilities (B, T)
  (:func:`~.fertility.nat_output`: pad and EOS never emitted, pad and 0 on padding).

Between them the fertilities are chosen and the inputs copied in PyTorch by the generator's own functions
(:meth:`~.decoding.FertilityNATGenerator.fertilities`, ``ensure_nonempty``, ``cap_total``, the model's
copy rule), so ``--fertility-decoding argmax`` and ``average``, the length limits and the hypotheses are the PyTorch
generator's; in float32 the tokens are the PyTorch pass's up to floating-point near-ties (tests/test_onnx.py). NPD (a
teacher pass per candidate set) is not exported.

``manifest.json`` beside the graphs names the checkpoint they were exported from (its sha256 and a fingerprint of its
weights, :func:`weights_fingerprint`) and the model's options; graphs of another checkpoint are refused.
"""

import hashlib
import json
import os
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from ...engine import STATE
from ...modules.nat_decoder import copy_source, fertility_copy_index, uniform_fertility
from .fertility import cap_total, ensure_nonempty

MANIFEST = "manifest.json"
FORMAT = "nat_plugins fertility_nat ONNX graphs"
FORMAT_VERSION = 1
ENCODER_GRAPH, DECODER_GRAPH = "encoder.onnx", "decoder.onnx"
ENCODER_INPUTS = ("src_tokens",)
ENCODER_OUTPUTS = ("encoder_out", "encoder_padding_mask", "fertility_lprobs", "source_inputs")
DECODER_INPUTS = ("inputs", "padding_mask", "encoder_out", "encoder_padding_mask", "unk_penalty")
DECODER_OUTPUTS = ("tokens", "scores")
OPTION = "--onnx-model"
EXPORT_HINT = "export them with `nat-export-onnx CHECKPOINT DIR` (add --int8 for int8 weights)"
MODES = ("argmax", "average")


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 of the model's parameters (names, shapes and float32 values, in module order): the same for a checkpoint
    however it was loaded, different for any other weights. Computed by ``nat-export-onnx`` and by the generator, which
    refuses graphs exported from other weights."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        values = parameter.detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{tuple(values.shape)};".encode())
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()


def model_options(model: nn.Module) -> Dict[str, Any]:
    """What the graphs fix of ``model`` (a ``fertility_nat`` model), written to and checked against the manifest."""
    src_dict, tgt_dict = model.encoder.dictionary, model.decoder.dictionary
    return {
        "copy_mode": model.copy_mode,
        "max_fertility": model.max_fertility,
        "source_dictionary_size": len(src_dict),
        "target_dictionary_size": len(tgt_dict),
        "pad": tgt_dict.pad(),
        "eos": tgt_dict.eos(),
        "unk": tgt_dict.unk(),
        "source_pad": src_dict.pad(),
        "source_eos": src_dict.eos(),
        "max_target_positions": model.max_decoder_positions(),
    }


def read_manifest(directory: str) -> Dict[str, Any]:
    """The manifest of the graphs in ``directory``, after checking that it and both graphs are there."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{OPTION} {directory!r}: no such directory; {EXPORT_HINT}")
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{OPTION} {directory!r} has no {MANIFEST}: it is not a directory of exported graphs (or the export did "
            f"not finish); {EXPORT_HINT}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{OPTION}: cannot read {path}: {err}; {EXPORT_HINT}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{OPTION}: {path} is not a manifest of nat-export-onnx ({FORMAT!r}); {EXPORT_HINT}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{OPTION}: {path} is of format version {manifest.get('format_version')}, this nat_plugins reads "
            f"{FORMAT_VERSION}: export the graphs again with this version; {EXPORT_HINT}"
        )
    for graph in manifest["graphs"].values():
        if not os.path.isfile(os.path.join(directory, graph)):
            raise FileNotFoundError(
                f"{OPTION} {directory!r}: {graph} is missing (the manifest names it); {EXPORT_HINT}"
            )
    return manifest


def check_manifest(manifest: Dict[str, Any], model: nn.Module, directory: str) -> None:
    """Refuse graphs exported from another checkpoint than ``model``'s (its weights' fingerprint) or with other
    options."""
    ours = model_options(model)
    theirs = manifest.get("model", {})
    different = [
        f"{key} {theirs.get(key)!r} there, {value!r} here" for key, value in ours.items() if theirs.get(key) != value
    ]
    if different:
        raise ValueError(
            f"{OPTION} {directory!r} holds the graphs of another model ({'; '.join(different)}; exported from "
            f"{manifest.get('checkpoint')!r}): export this checkpoint's graphs (`nat-export-onnx CHECKPOINT DIR`)"
        )
    if manifest.get("weights_fingerprint") != weights_fingerprint(model):
        raise ValueError(
            f"{OPTION} {directory!r} holds the graphs of another checkpoint ({manifest.get('checkpoint')!r}, sha256 "
            f"{str(manifest.get('checkpoint_sha256'))[:12]}...): the weights loaded by --path differ from the ones "
            "exported. Export this checkpoint's graphs (`nat-export-onnx CHECKPOINT DIR`) and pass that directory"
        )


def session(path: str, threads: int, profile_prefix: Optional[str] = None):
    """An ONNX Runtime CPU session of the graph ``path`` at ``threads`` intra-op threads (one inter-op thread: the
    graphs are sequences of small operators), whose idle threads do not spin; with ``profile_prefix``, ONNX Runtime's
    per-operator profile written to a file of that prefix (dev/onnx_stages.py)."""
    import onnxruntime  # the optional `onnx` extra: imported only for --onnx-model

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    # idle pool threads sleep instead of spinning: spinning, they would take the cores from torch's OpenMP team in the
    # same process (the benchmark's round-robin pass times every row in one process; --solo times each alone)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if profile_prefix is not None:
        options.enable_profiling, options.profile_file_prefix = True, profile_prefix
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def import_onnxruntime() -> None:
    """Refuse ``--onnx-model`` with a clear message where ONNX Runtime is not installed."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"{OPTION} runs the graphs with ONNX Runtime, which is not installed: `pip install -e '.[onnx]'` in the "
            "nat-plugins checkout (run_scripts/setup_env.sh installs it by default)"
        ) from err


class OnnxFertilityNAT:
    """The pass of a :class:`~.decoding.FertilityNATGenerator` (``generator``) run by ONNX Runtime from
    the graphs in ``directory`` (module docstring). ONNX Runtime's intra-op threads: torch's thread count when the
    generator is built (fairseq's default, the benchmark's per row setting)."""

    def __init__(self, directory: str, generator: Any) -> None:
        if generator.mode not in MODES:
            raise ValueError(
                f"{OPTION} runs --fertility-decoding argmax or average in ONNX Runtime; --fertility-decoding "
                f"{generator.mode} (noisy parallel decoding: candidates rescored by the AR teacher) is not exported: "
                f"drop {OPTION}, or decode with --fertility-decoding argmax or average"
            )
        model = generator.model
        parameter = next(model.parameters())
        if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
            raise ValueError(
                f"{OPTION} runs the NAT in ONNX Runtime on the CPU in the graphs' precision: load the checkpoint on "
                f"the CPU in float32 (--cpu, no --fp16/--bf16; the model is {parameter.dtype} on {parameter.device})"
            )
        import_onnxruntime()
        self.directory = directory
        self.manifest = read_manifest(directory)
        check_manifest(self.manifest, model, directory)
        self.generator, self.model = generator, model
        threads = torch.get_num_threads()
        graphs = self.manifest["graphs"]
        self.encoder = session(os.path.join(directory, graphs["encoder"]), threads)
        self.decoder = session(os.path.join(directory, graphs["decoder"]), threads)
        self.int8 = bool(self.manifest.get("int8"))

    def decode(self, sample: Dict[str, Any]) -> List[List[Dict[str, Any]]]:
        """The generator's hypotheses for ``sample`` (fairseq's batch), the pass run by ONNX Runtime."""
        generator, model = self.generator, self.model
        src_tokens = sample["net_input"]["src_tokens"].cpu()
        src_lengths = generator.source_lengths(sample["net_input"]).cpu()
        encoder_out, encoder_padding_mask, fertility_lprobs, source_inputs = self.encoder.run(
            list(ENCODER_OUTPUTS), {"src_tokens": src_tokens.numpy()}
        )
        fertility_lprobs = torch.from_numpy(fertility_lprobs)
        copyable = model.copyable(src_tokens)
        # the PyTorch generator's rules: its mode's fertilities, at least one token, at most the length limit
        fertility = generator.fertilities(fertility_lprobs, copyable)
        fertility = ensure_nonempty(fertility, fertility_lprobs, copyable, src_tokens.ne(generator.pad))
        fertility = cap_total(fertility, generator.output_max_lengths(src_lengths))
        if model.copy_mode == "uniform":  # the model's decode: the same total spread evenly
            fertility = uniform_fertility(copyable, fertility.sum(dim=1))
        index, padding = fertility_copy_index(fertility)
        inputs = copy_source(torch.from_numpy(source_inputs), index)
        tokens, scores = self.decoder.run(
            list(DECODER_OUTPUTS),
            {
                "inputs": inputs.numpy(),
                "padding_mask": padding.numpy(),
                "encoder_out": encoder_out,
                "encoder_padding_mask": encoder_padding_mask,
                "unk_penalty": np.array(generator.unk_penalty, dtype=np.float32),
            },
        )
        for observe in STATE.pass_observers:  # the benchmark counts the decoder pass it did not see run
            observe(model.decoder.nad)
        lengths = (~padding).long().sum(dim=1)
        return generator.hypotheses(torch.from_numpy(tokens), torch.from_numpy(scores), lengths, 1, None)
