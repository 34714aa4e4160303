"""What every nat_plugins model shares: the task check, AR initialisation and the hooks ``translation_nat`` calls."""

import logging

from fairseq import checkpoint_utils

from ..tasks.translation_nat import TranslationNATTask

logger = logging.getLogger(__name__)


def logits_at_positions(output_layer, features, positions):
    """``output_layer(features)`` (... x V), or with ``positions`` (a bool mask over the leading dimensions of
    ``features``) the logits of those positions only, packed N x V in the order of ``features[positions]``.

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
    """

    required_side_inputs = ()
    scored_by_fairseq = False
    checkpoint_plugin_version = None

    @staticmethod
    def add_init_from_ar_args(parser):
        """``--init-from-ar PATH`` (call from ``add_args``); the architecture functions default it to None."""
        parser.add_argument(
            "--init-from-ar",
            type=str,
            metavar="PATH",
            help="initialise every parameter whose name and shape match this AR Transformer "
            "checkpoint when training starts (logged); never used when a checkpoint is loaded",
        )

    @classmethod
    def build_model(cls, args, task):
        if not isinstance(task, TranslationNATTask):
            task_name = getattr(getattr(task, "cfg", None), "_name", type(task).__name__)
            raise ValueError(
                f"{cls.__name__} is a nat_plugins model: run fairseq with `--user-dir nat_plugins --task "
                f"translation_nat` (got task '{task_name}'); other tasks would decode it with the wrong generator"
            )
        if task.cfg.left_pad_target:
            raise ValueError(f"{cls.__name__} needs right-padded targets: drop --left-pad-target")
        return super().build_model(args, task)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            from .. import __version__

            written_by = self.checkpoint_plugin_version or "a version before 0.1.0 or unknown"
            raise ValueError(
                f"the checkpoint's parameters do not fit the {type(self).__name__} built from its options "
                f"({' '.join(str(err).split())[:600]}). Options that shape the model (--group-size, "
                "--num-segments, --block-size, --max-fertility, layer sizes) are fixed by training: drop them "
                "from --model-overrides (or from_pretrained's keyword arguments). A checkpoint written by another "
                f"nat_plugins (this one: {written_by}; installed: {__version__}) needs that version"
            ) from err

    def ar_parameter_name(self, name):
        return name

    def init_from_ar(self, path):
        """Copy every parameter whose (mapped) name and shape match the AR checkpoint at ``path``; returns the
        names loaded. Logs what was loaded, what had another shape and what stayed randomly initialised."""
        try:
            ar_state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
        except FileNotFoundError as err:
            raise FileNotFoundError(f"--init-from-ar: AR checkpoint {path!r} does not exist") from err
        own_state = self.state_dict()
        loaded, wrong_shape = {}, []
        for name, tensor in own_state.items():
            ar_name = self.ar_parameter_name(name)
            if ar_name is None or ar_name not in ar_state:
                continue
            if ar_state[ar_name].shape != tensor.shape:
                wrong_shape.append(name)
                continue
            loaded[name] = ar_state[ar_name].to(tensor.dtype)
        if not loaded:
            raise ValueError(f"--init-from-ar {path!r}: no parameter of {type(self).__name__} matches that checkpoint")
        self.load_state_dict(loaded, strict=False)
        left = sorted(set(own_state) - set(loaded) - set(wrong_shape))
        logger.info(f"initialised {len(loaded)}/{len(own_state)} tensors of {type(self).__name__} from {path}")
        if wrong_shape:
            logger.info(f"kept random (other shape in the AR checkpoint): {', '.join(wrong_shape)}")
        if left:
            logger.info(f"kept random (not in the AR checkpoint): {', '.join(left)}")
        return sorted(loaded)
