"""What every nat_plugins model shares: the task check, AR initialisation and the hooks ``translation_nat`` calls."""

import argparse
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from fairseq.tasks import TASK_REGISTRY, FairseqTask
from omegaconf import DictConfig

from ..version import __version__
from .teacher import check_teacher_dictionaries

logger = logging.getLogger(__name__)

EncoderOut = Dict[str, List[torch.Tensor]]  # fairseq's encoder output dict
IncrementalState = Dict[str, Dict[str, Optional[torch.Tensor]]]  # fairseq's incremental key/value cache

INIT_FROM_AR_SCOPES = ("all", "paper")
# what SAT (Wang et al. 2018, §4) and RecoverSAT (Ran et al. 2020, §4.1) initialise from the AR model: the encoder,
# the embeddings and the pre-softmax output projection
ENCODER_AND_EMBEDDINGS = (
    "encoder.",
    "decoder.embed_tokens.",
    "decoder.embed_positions.",
    "decoder.layernorm_embedding.",
    "decoder.output_projection.",
)


def logits_at_positions(
    output_layer: Callable[[torch.Tensor], torch.Tensor], features: torch.Tensor, positions: Optional[torch.Tensor]
) -> torch.Tensor:
    """``output_layer(features)`` (..., V), or with ``positions`` (a bool mask over the leading dimensions of
    ``features``) the logits of those positions only, packed (N, V) in the order of ``features[positions]``.

    Criteria pass the positions they score (their targets' non-pad positions) through the model's ``forward``
    (so DistributedDataParallel sees every parameter used): the vocabulary projection and the log-softmax over it
    are most of a small model's training step, and padding is a large share of segmented (RecoverSAT), shifted
    (blockwise heads) and NAD targets."""
    return output_layer(features if positions is None else features[positions])


class NATPluginModel:
    """Mixin for plugin models (put it first in the bases: ``class M(NATPluginModel, TransformerModel)``).

    * ``build_model`` refuses any task but ``translation_nat``: fairseq picks the generator from the
      command-line task, so ``fairseq-generate --task translation`` would otherwise decode a plugin model
      with the autoregressive ``SequenceGenerator`` and print wrong translations without a word; and it
      refuses ``--left-pad-target``: the plugin criteria and decoders index targets from the left.
    * ``generator_class`` is the model's decoder, built as ``generator_class(models, task, gen_args)`` by
      ``TranslationNATTask.build_generator``, hence by fairseq-generate/-interactive and ``--eval-bleu``;
      ``scored_by_fairseq``: the model's ``forward`` takes fairseq's batches (``prev_output_tokens``), so
      ``--score-reference`` uses fairseq's ``SequenceScorer`` instead.
    * ``required_side_inputs`` names the side files training needs ("fertility", "kd_target").
    * ``load_state_dict`` turns torch's parameter mismatch into an error saying why it happens with a checkpoint:
      an option that shapes the model overridden at decoding time, or a checkpoint of another nat_plugins version
      (``checkpoint_plugin_version``, set by the task from the checkpoint's task state; models that change their
      parameters upgrade older checkpoints in ``upgrade_state_dict_named``).
    * ``init_from_ar(path)`` copies the matching parameters of an AR Transformer checkpoint; the task calls it
      for a freshly built model when the model's args have ``init_from_ar`` set (never when a checkpoint is
      loaded, so ``fairseq-generate`` does not need the teacher file). ``ar_parameter_name`` maps a name of
      this model to the AR checkpoint's name (identity by default; ``None`` = never initialise it).
      ``--init-from-ar-scope paper`` copies only the parameters whose names start with one of the model's
      ``ar_init_paper_prefixes`` (what its paper initialises from the AR model, described by ``ar_init_paper``).
      ``ar_added_symbols``: symbols the model appends to the data's dictionaries (RecoverSAT's DEL), whose rows of
      the vocabulary-sized parameters start random while the other rows are the AR model's.
    """

    required_side_inputs = ()
    scored_by_fairseq = False
    checkpoint_plugin_version = None
    ar_init_paper_prefixes = ENCODER_AND_EMBEDDINGS
    ar_init_paper = "the encoder, the embeddings and the output projection"
    ar_added_symbols = ()
    init_from_ar_scope = "all"  # --init-from-ar-scope, set by build_model

    @classmethod
    def add_init_from_ar_args(cls, parser: argparse.ArgumentParser) -> None:
        """``--init-from-ar PATH`` and ``--init-from-ar-scope`` (call from ``add_args``); the architecture functions
        default ``init_from_ar`` to None, :meth:`build_model` the scope to ``all``."""
        parser.add_argument(
            "--init-from-ar",
            type=str,
            metavar="PATH",
            help="initialise the parameters whose name and shape match this AR Transformer checkpoint "
            "(of the same data-bin's dictionaries) when training starts (logged); never used when a "
            "checkpoint is loaded",
        )
        parser.add_argument(
            "--init-from-ar-scope",
            choices=INIT_FROM_AR_SCOPES,
            help="with --init-from-ar: 'all' (default) copies every matching parameter, decoder layers "
            f"included; 'paper' copies only {cls.ar_init_paper}",
        )

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "NATPluginModel":
        if not isinstance(task, TASK_REGISTRY["translation_nat"]):  # the plugin's task, registered by nat_plugins.tasks
            task_name = getattr(getattr(task, "cfg", None), "_name", type(task).__name__)
            raise ValueError(
                f"{cls.__name__} is a nat_plugins model: run fairseq with `--user-dir nat_plugins --task "
                f"translation_nat` (got task '{task_name}'); other tasks would decode it with the wrong generator"
            )
        if task.cfg.left_pad_target:
            raise ValueError(f"{cls.__name__} needs right-padded targets: drop --left-pad-target")
        args.init_from_ar_scope = getattr(args, "init_from_ar_scope", None) or "all"
        model = super().build_model(args, task)
        model.init_from_ar_scope = args.init_from_ar_scope
        return model

    def load_state_dict(
        self,
        state_dict: Dict[str, torch.Tensor],
        strict: bool = True,
        model_cfg: Optional[DictConfig] = None,
        args: Optional[argparse.Namespace] = None,
    ) -> Tuple[List[str], List[str]]:  # torch's (missing_keys, unexpected_keys)
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            written_by = self.checkpoint_plugin_version or "a version before 0.1.0 or unknown"
            raise ValueError(
                f"the checkpoint's parameters do not fit the {type(self).__name__} built from its options "
                f"({' '.join(str(err).split())[:600]}). Options that shape the model (--group-size, "
                "--num-segments, --block-size, --max-fertility, layer sizes) are fixed by training: drop them "
                "from --model-overrides (or from_pretrained's keyword arguments). A checkpoint written by another "
                f"nat_plugins (this one: {written_by}; installed: {__version__}) needs that version"
            ) from err

    def ar_parameter_name(self, name: str) -> Optional[str]:
        return name

    def in_init_from_ar_scope(self, name: str) -> bool:
        """Whether ``--init-from-ar-scope`` lets ``--init-from-ar`` initialise the parameter ``name``."""
        return self.init_from_ar_scope == "all" or name.startswith(self.ar_init_paper_prefixes)

    def vocabulary_parameters(self) -> Dict[str, Dictionary]:
        """``{name: dictionary}`` of the parameters with one row per symbol of a dictionary."""
        return {
            "encoder.embed_tokens.weight": self.encoder.dictionary,
            "decoder.embed_tokens.weight": self.decoder.dictionary,
            "decoder.output_projection.weight": self.decoder.dictionary,
        }

    def init_from_ar(self, path: str) -> List[str]:
        """Copy every parameter (with ``--init-from-ar-scope paper``: of the paper's scope) whose mapped name and
        shape match the AR checkpoint at ``path``, and the AR rows of the vocabulary-sized parameters when the model
        appends symbols; returns the names loaded. Refuses a missing file, a checkpoint with other dictionaries
        (:func:`~nat_plugins.modules.teacher.check_teacher_dictionaries`: their sizes, and their symbols where the
        checkpoint stores them or its data directory is there) and one of which nothing matches; logs what was
        loaded, what had another shape and what stayed random."""
        fix = "pass the AR teacher's checkpoint (e.g. checkpoints/teacher/checkpoint_best.pt), or drop --init-from-ar"
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--init-from-ar {path}: no such file: {fix}")
        checkpoint = checkpoint_utils.load_checkpoint_to_cpu(path)
        check_teacher_dictionaries(
            checkpoint,
            (self.encoder.dictionary, self.decoder.dictionary),
            "--init-from-ar",
            path,
            "its embeddings cannot initialise this model: binarize the data with the teacher's dictionaries "
            "(fairseq-preprocess --srcdict/--tgtdict of the teacher's data-bin), or drop --init-from-ar",
            added_symbols=self.ar_added_symbols,
        )
        ar_state = checkpoint["model"]
        own_state, vocabulary = self.state_dict(), self.vocabulary_parameters()
        loaded, wrong_shape = {}, []
        for name, tensor in own_state.items():
            ar_name = self.ar_parameter_name(name)
            if ar_name is None or ar_name not in ar_state or not self.in_init_from_ar_scope(name):
                continue
            ar_tensor = ar_state[ar_name].to(tensor.dtype)
            if ar_tensor.shape == tensor.shape:
                loaded[name] = ar_tensor
            elif name in vocabulary and ar_tensor.shape[1:] == tensor.shape[1:]:  # rows checked: ar_added_symbols
                loaded[name] = torch.cat([ar_tensor, tensor[ar_tensor.size(0) :]])
            else:
                wrong_shape.append(name)
        if not loaded.keys() & dict(self.named_parameters()).keys():  # buffers (fairseq's "version") do not count
            raise ValueError(
                f"--init-from-ar {path}: no parameter of {type(self).__name__} (--init-from-ar-scope "
                f"{self.init_from_ar_scope}) has a name and shape in that checkpoint: is it an AR Transformer with "
                f"this model's sizes (--encoder-embed-dim, --decoder-embed-dim, ...)? {fix}"
            )
        self.load_state_dict(loaded, strict=False)
        left = sorted(set(own_state) - set(loaded) - set(wrong_shape))
        logger.info(
            f"initialised {len(loaded)}/{len(own_state)} tensors of {type(self).__name__} from {path} "
            f"(--init-from-ar-scope {self.init_from_ar_scope})"
        )
        if wrong_shape:
            logger.warning(f"kept random (other shape in the AR checkpoint): {', '.join(wrong_shape)}")
        if left:
            logger.info(f"kept random (not in the AR checkpoint or not in scope): {', '.join(left)}")
        return sorted(loaded)
