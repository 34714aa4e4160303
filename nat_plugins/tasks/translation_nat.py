"""Task ``translation_nat``: fairseq's ``translation`` plus the side inputs and generators of nat_plugins.

One task serves every plugin model, so every system shares one set of side files and options. On top of
:class:`fairseq.tasks.translation.TranslationTask`
it

* loads optional per-split side files from the data directory:

  - ``{split}.fert.{src}``: text, one line per sentence, one non-negative integer per source subword
    (the appended EOS excluded), summing to the length of the target it goes with (without EOS) —
    the distilled target when one is loaded for the split, else the real one; batches carry it as
    ``sample["fertility"]`` (B, S), aligned with ``src_tokens``, 0 on padding and EOS;
  - ``{split}.kd.{tgt}.{bin,idx}``: sequence-level distilled targets binarized with the target
    dictionary (written by ``nat_plugins.cli.distill``; ``--distilled-name NAME`` reads
    ``{split}.NAME.{tgt}``). ``--use-distilled target`` trains on them
    instead of the real targets (training split only: validation BLEU keeps the real references);
    ``--use-distilled side`` keeps the real targets and adds ``sample["kd_target"]`` (Encoder-NAD-AD);

* checks the side files a model or criterion declares it needs (``required_side_inputs``) and fails
  with an error naming the missing or inconsistent file;
* takes every generator's decoding options: :class:`TranslationNATConfig` is composed from the options classes
  declared beside the generators (:data:`DECODING_CONFIGS`), so they stay out of the checkpoint's model options
  (which would freeze them), and :data:`DECODING_OPTIONS`, derived from the declarations, names the models whose
  decoder reads each: :meth:`~TranslationNATTask.check_decoding_options` refuses the others, and the hub
  (:mod:`nat_plugins.hub`) takes exactly these options per call;
* builds the generator the model declares (``model.generator_class(models, task, gen_args)``) in
  :meth:`build_generator`, falling back to fairseq's ``SequenceGenerator`` for plain AR models such as
  the teacher. ``--eval-bleu`` goes through the same method, so every plugin model is validated with its
  own decoder;
* prints the data some generators return with their hypotheses, when asked, in :meth:`inference_step`:
  ``--print-segments`` (RecoverSAT, ``hypo["segments"]``) and ``--print-nad-draft`` (Encoder-NAD-AD,
  ``hypo["nad_draft"]``) as ``SEG-<id>``/``NAD-<id>`` lines before fairseq-generate/-interactive print the batch.
"""

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import torch
from fairseq import utils
from fairseq.data import BaseWrapperDataset, Dictionary, FairseqDataset, LanguagePairDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.models import MODEL_REGISTRY
from fairseq.tasks import FairseqTask, register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch import nn

from ..compat import PluginCheckpointMarker
from ..engine import attention_backends, prepare_for_decoding
from ..generators.base import DecodingConfig, Hypothesis, option_owners
from ..generators.verify_accept_loop import (
    GreedyLoop,
    GreedyLoopDecodingConfig,
    VerifyAcceptDecodingConfig,
    greedy_loop_refusal,
)
from ..modules.teacher import stored_dictionaries
from ..systems.blockwise.decoding import BlockwiseDecodingConfig
from ..systems.fertility_nat.decoding import FertilityNATDecodingConfig
from ..systems.nad_ad.decoding import NADADDecodingConfig
from ..systems.recover_sat.decoding import RecoverSATDecodingConfig
from ..systems.spec_drafter.decoding import SpecDrafterDecodingConfig

logger = logging.getLogger(__name__)

SIDE_INPUTS = ("fertility", "kd_target")
DISTILLED_MODES = ChoiceEnum(["none", "target", "side"])

# every generator's decoding options (declared beside it: systems/*/decoding.py, generators/verify_accept_loop.py),
# in the order --help lists them
DECODING_CONFIGS: Tuple[Type[DecodingConfig], ...] = (
    RecoverSATDecodingConfig,
    BlockwiseDecodingConfig,
    NADADDecodingConfig,
    FertilityNATDecodingConfig,
    VerifyAcceptDecodingConfig,
    GreedyLoopDecodingConfig,
    SpecDrafterDecodingConfig,
)

# {decoding option: the registered model architectures whose decoder reads it}, derived from the declarations;
# build_generator refuses a value other than the default for any other model (the option would be ignored without a
# word), and the hub's per-call options (nat_plugins.hub) are its keys
DECODING_OPTIONS: Dict[str, Tuple[str, ...]] = option_owners(DECODING_CONFIGS)


class SideFileError(ValueError):
    """A side file (fertilities, distilled targets) is missing or disagrees with the data."""


# a dataclass takes its bases' fields in reverse order of the bases: TranslationConfig's first, then the decoding
# options in the order of DECODING_CONFIGS, then the task's own
@dataclass
class TranslationNATConfig(*reversed(DECODING_CONFIGS), TranslationConfig):
    """fairseq's ``translation`` options, every generator's decoding options (:data:`DECODING_CONFIGS`) and the
    choice of distilled targets."""

    use_distilled: DISTILLED_MODES = field(
        default="none",
        metadata={
            "help": "sequence-level distilled targets ({split}.kd.{tgt}.bin/.idx, made by nat_plugins.cli.distill): "
            "'none' trains on the real targets; 'target' replaces the targets of the training split (validation "
            "keeps real references); 'side' keeps the real targets and adds sample['kd_target'] (Encoder-NAD-AD)"
        },
    )
    distilled_name: str = field(
        default="kd",
        metadata={
            "help": "which distilled targets --use-distilled reads: {split}.NAME.{tgt}.bin/.idx "
            "(nat_plugins.cli.distill --output-name NAME writes them; the speculative drafter's recipe trains on the "
            "teacher's greedy outputs, kd_greedy)"
        },
    )


def segments_string(dictionary: Dictionary, segments: List[torch.Tensor]) -> str:
    """RecoverSAT segments (token tensors) as text, `` | `` between them."""
    return " | ".join(dictionary.string(segment) for segment in segments)


def side_file_paths(data_path: str, split: str, src: str, tgt: str, distilled_name: str = "kd") -> Dict[str, str]:
    """Where the side files of ``split`` live: {"fertility": text file, "kd_target": indexed-dataset prefix}."""
    return {
        "fertility": os.path.join(data_path, f"{split}.fert.{src}"),
        "kd_target": os.path.join(data_path, f"{split}.{distilled_name}.{tgt}"),
    }


def read_fertility_file(path: str, src_sizes: Sequence[int], tgt_sizes: Sequence[int]) -> List[torch.Tensor]:
    """Read ``{split}.fert.{src}`` and check it line by line against the binarized data.

    ``src_sizes``/``tgt_sizes`` are the dataset's token counts *including* the EOS fairseq appends, so a
    line must hold ``src_sizes[i] - 1`` integers summing to ``tgt_sizes[i] - 1``.
    """
    fertilities = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= len(src_sizes):
                raise SideFileError(f"{path} has more lines than the {len(src_sizes)} sentences of its split")
            fields = line.split()
            try:
                values = [int(v) for v in fields]
            except ValueError:
                raise SideFileError(f"{path}:{i + 1}: fertilities must be integers, got {line.strip()!r}") from None
            if any(v < 0 for v in values):
                raise SideFileError(f"{path}:{i + 1}: fertilities must be >= 0")
            if len(values) != src_sizes[i] - 1:
                raise SideFileError(
                    f"{path}:{i + 1}: {len(values)} fertilities for a source of {src_sizes[i] - 1} subwords "
                    "(one per source subword, EOS excluded); was the file made from this data?"
                )
            if sum(values) != tgt_sizes[i] - 1:
                raise SideFileError(
                    f"{path}:{i + 1}: fertilities sum to {sum(values)} but the target has {tgt_sizes[i] - 1} "
                    "subwords (EOS excluded); fertilities must be computed on the target the model is trained on"
                )
            fertilities.append(torch.tensor(values, dtype=torch.long))
    if len(fertilities) != len(src_sizes):
        raise SideFileError(f"{path} has {len(fertilities)} lines but its split has {len(src_sizes)} sentences")
    return fertilities


def load_distilled_targets(
    prefix: str, dictionary: Dictionary, num_sentences: int, split: str, required: bool
) -> Optional[FairseqDataset]:
    """Load ``{prefix}.bin/.idx``; None when absent and not ``required``; an error naming it otherwise."""
    if not os.path.exists(prefix + ".idx"):
        if not required:
            return None
        raise SideFileError(
            f"--use-distilled target needs {prefix}.bin/.idx: run `python -m nat_plugins.cli.distill` "
            "(run_scripts/distill.sh) with the AR teacher on this data-bin first (--output-name NAME for "
            "--distilled-name NAME)"
        )
    kd = data_utils.load_indexed_dataset(prefix, dictionary)
    if kd is None or len(kd) != num_sentences:
        raise SideFileError(
            f"{prefix}.bin/.idx holds {0 if kd is None else len(kd)} sentences but split '{split}' has "
            f"{num_sentences}: it was distilled from other data; re-run nat_plugins.cli.distill on this data-bin"
        )
    return kd


class SideInputDataset(BaseWrapperDataset):
    """A :class:`LanguagePairDataset` whose batches also carry fertilities and/or distilled targets."""

    def __init__(
        self,
        pair: LanguagePairDataset,
        fertility: Optional[List[torch.Tensor]] = None,
        kd_target: Optional[FairseqDataset] = None,
    ) -> None:
        super().__init__(pair)
        self.fertility = fertility
        self.kd_target = kd_target
        self.fertility_error = None  # why a fertility file next to the data could not be used (if so)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        item = self.dataset[index]
        if self.fertility is not None:
            item["fertility"] = self.fertility[index]
        if self.kd_target is not None:
            item["kd_target"] = self.kd_target[index]
        return item

    def collater(self, samples: List[Dict[str, Any]]) -> Dict[str, Any]:
        batch = self.dataset.collater(samples)
        if len(samples) == 0 or "id" not in batch:
            return batch
        by_id = {s["id"]: s for s in samples}
        ordered = [by_id[i] for i in batch["id"].tolist()]  # the pair collater sorts by source length
        pair = self.dataset
        if self.fertility is not None:
            # pad like the source (--required-seq-len-multiple included) and give EOS fertility 0, so fertility[b, j]
            # belongs to src_tokens[b, j]
            fert = [torch.cat([s["fertility"], s["fertility"].new_zeros(1)]) for s in ordered]
            batch["fertility"] = data_utils.collate_tokens(
                fert, 0, left_pad=pair.left_pad_source, pad_to_multiple=pair.pad_to_multiple
            )
        if self.kd_target is not None:
            kd = [s["kd_target"] for s in ordered]
            # pad like the target (--required-seq-len-multiple included)
            batch["kd_target"] = data_utils.collate_tokens(
                kd, pair.tgt_dict.pad(), left_pad=pair.left_pad_target, pad_to_multiple=pair.pad_to_multiple
            )
            batch["kd_ntokens"] = sum(len(t) for t in kd)
        return batch


@register_task("translation_nat", dataclass=TranslationNATConfig)
class TranslationNATTask(TranslationTask):
    """fairseq's translation task with side files and model-declared generators (see module docstring)."""

    cfg: TranslationNATConfig

    def __init__(self, cfg: TranslationNATConfig, src_dict: Dictionary, tgt_dict: Dictionary) -> None:
        super().__init__(cfg, src_dict, tgt_dict)
        self.required_side_inputs = set()

    # ----- data -------------------------------------------------------------------------------------
    def side_file_paths(self, split: str, epoch: int = 1) -> Dict[str, str]:
        """Side files of ``split`` sit next to its binarized data (same directory choice as fairseq's)."""
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        return side_file_paths(
            paths[(epoch - 1) % len(paths)], split, self.cfg.source_lang, self.cfg.target_lang, self.cfg.distilled_name
        )

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs: Any) -> None:
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        pair = self.datasets[split]
        paths = self.side_file_paths(split, epoch)

        replace_targets = self.cfg.use_distilled == "target" and split == self.cfg.train_subset
        kd = None
        if replace_targets or self.cfg.use_distilled == "side":
            kd = load_distilled_targets(paths["kd_target"], self.tgt_dict, len(pair), split, required=replace_targets)
        if replace_targets:
            pair = LanguagePairDataset(
                pair.src,
                pair.src_sizes,
                pair.src_dict,
                kd,
                kd.sizes,
                pair.tgt_dict,
                left_pad_source=pair.left_pad_source,
                left_pad_target=pair.left_pad_target,
                shuffle=pair.shuffle,
                pad_to_multiple=self.cfg.required_seq_len_multiple,
            )
            logger.info(f"{split}: training on the distilled targets {paths['kd_target']}")
            kd = None  # the targets *are* the distilled ones now

        fertility, fertility_error = None, None
        if os.path.exists(paths["fertility"]):
            fertility_tgt_sizes = kd.sizes if kd is not None else pair.tgt_sizes
            try:
                fertility = read_fertility_file(paths["fertility"], pair.src_sizes, fertility_tgt_sizes)
            except SideFileError as err:
                # e.g. fertilities of the distilled targets next to a run on the real ones (an AR baseline):
                # only a model or criterion that needs fertilities fails on it (check_side_inputs)
                fertility_error = err
                logger.info(f"{split}: not using {paths['fertility']} ({err})")

        self.datasets[split] = SideInputDataset(pair, fertility=fertility, kd_target=kd)
        self.datasets[split].fertility_error = fertility_error
        self.check_side_inputs(split)

    def check_side_inputs(self, split: str) -> None:
        """Fail early, naming the file, when a loaded split lacks a side input the model/criterion needs."""
        dataset = self.datasets.get(split)
        if not isinstance(dataset, SideInputDataset):
            return
        paths = self.side_file_paths(split)
        for name in sorted(self.required_side_inputs):
            if name == "fertility" and dataset.fertility_error is not None:
                raise dataset.fertility_error
            if getattr(dataset, name) is None:
                how = {
                    "fertility": "make it with the fertility pipeline: bash run_scripts/fertility.sh DATA_BIN "
                    "(python -m nat_plugins.cli.fertility)",
                    "kd_target": f"make it with nat_plugins.cli.distill --gen-subset {split} and pass "
                    "--use-distilled side",
                }[name]
                suffix = ".bin/.idx" if name == "kd_target" else ""
                raise SideFileError(f"split '{split}' needs {paths[name]}{suffix} ({name}), which is missing: {how}")

    def require_side_inputs(self, names: Sequence[str], who: str) -> None:
        """Record side inputs a model/criterion needs and check the splits already loaded."""
        unknown = set(names) - set(SIDE_INPUTS)
        if unknown:
            raise ValueError(f"{who} asks for unknown side inputs {sorted(unknown)}; known: {SIDE_INPUTS}")
        self.required_side_inputs |= set(names)
        for split in list(self.datasets):
            self.check_side_inputs(split)

    def state_dict(self) -> Dict[str, Any]:
        """Task state plus a marker whose unpickling imports nat_plugins (see ``compat.plugin_checkpoint_loaded``) and
        the dictionaries' symbols, so that a checkpoint used as a teacher is checked against a student's data-bin
        wherever its own data directory went (:func:`~nat_plugins.modules.teacher.check_teacher_dictionaries`)."""
        return {
            **super().state_dict(),
            "nat_plugins": PluginCheckpointMarker(),
            "dictionaries": stored_dictionaries(self),
        }

    def get_batch_iterator(
        self, dataset: FairseqDataset, *args: Any, required_batch_size_multiple: int = 1, **kwargs: Any
    ) -> Any:
        """fairseq's iterator, except that no split but the training one loses sentences.

        fairseq 0.12's ``data_utils.batch_by_size`` drops the last batch when its size is not a multiple of
        ``--required-batch-size-multiple`` (default 8), so ``fairseq-generate`` and ``--eval-bleu``
        validation would silently skip up to 7 of the longest sentences. Here the multiple is 1 off the
        training split."""
        if dataset is not self.datasets.get(self.cfg.train_subset):
            required_batch_size_multiple = 1
        return super().get_batch_iterator(
            dataset, *args, required_batch_size_multiple=required_batch_size_multiple, **kwargs
        )

    # ----- models, criterions, generators ----------------------------------------------------------
    def build_model(self, cfg: Any, from_checkpoint: bool = False) -> nn.Module:
        """The model, and with ``--eval-bleu`` the validation generator of the model being trained only: a model
        loaded from a checkpoint into this task (a teacher of speculative decoding, NPD or L_RKL) gets none, since
        its generator would be built with the trained model's decoding options (``--spec-drafter-teacher``)."""
        if from_checkpoint:
            model = FairseqTask.build_model(self, cfg, from_checkpoint)
        else:
            model = super().build_model(cfg, from_checkpoint)
        if from_checkpoint and hasattr(model, "checkpoint_plugin_version"):  # fairseq loaded its task state first
            model.checkpoint_plugin_version = self.state.state_dict.get("nat_plugins", {}).get("version")
        else:
            self.require_side_inputs(getattr(model, "required_side_inputs", ()), type(model).__name__)
            init_path = getattr(cfg, "init_from_ar", None)
            if init_path:
                model.init_from_ar(init_path)
        return model

    def build_criterion(self, cfg: Any, from_checkpoint: bool = False) -> nn.Module:
        """fairseq's criterion, with the side inputs it declares required of the data."""
        criterion = super().build_criterion(cfg, from_checkpoint)
        self.require_side_inputs(getattr(criterion, "required_side_inputs", ()), type(criterion).__name__)
        return criterion

    def build_generator(
        self,
        models: List[nn.Module],
        args: Any,
        seq_gen_cls: Optional[type] = None,
        extra_gen_cls_kwargs: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Any:
        """``generator_class(models, task, args)`` of the model; for models that declare none (AR teachers) the
        plugin's greedy loop at ``--beam 1`` (:class:`~nat_plugins.generators.verify_accept_loop.GreedyLoop`, where
        :func:`~nat_plugins.generators.verify_accept_loop.greedy_loop_refusal` allows) or fairseq's generator, and
        fairseq's scorer for ``--score-reference`` where the model declares ``scored_by_fairseq``.
        Every model goes through the decoding engine's switch first (:func:`~nat_plugins.engine.prepare_for_decoding`).
        A declared generator takes no ``prefix_allowed_tokens_fn`` (the hub's ``generate``): refused."""
        self.check_decoding_options(models[0])
        for model in models:
            prepare_for_decoding(model)  # the decoding engine's switch (nat_plugins.engine)
        generator_class = getattr(models[0], "generator_class", None)
        if generator_class is None or (getattr(args, "score_reference", False) and models[0].scored_by_fairseq):
            extra = dict(seq_gen_cls=seq_gen_cls, extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs)
            refusal = greedy_loop_refusal(models, args, **extra) if generator_class is None else "a declared generator"
            if refusal is None:
                return GreedyLoop(models, self, args)  # fairseq's greedy output, a static decoder step per token
            if self.cfg.int8_decoder:
                raise ValueError(
                    f"--int8-decoder decodes with the plugin's greedy loop, which does not decode this ({refusal}): "
                    "use --beam 1 and no option of fairseq's generator beyond it, or drop --int8-decoder"
                )
            return super().build_generator(
                models, args, seq_gen_cls=seq_gen_cls, extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs
            )
        if kwargs.get("prefix_allowed_tokens_fn") is not None:
            raise ValueError(
                f"prefix_allowed_tokens_fn (the hub's generate) is not supported by the decoder of "
                f"{type(models[0]).__name__}: decode without it"
            )
        return generator_class(models, self, args)

    def check_decoding_options(self, model: nn.Module) -> None:
        """Refuse a decoding option of another system (:data:`DECODING_OPTIONS`) set for ``model``."""
        name = next((n for n, cls in MODEL_REGISTRY.items() if cls is type(model)), type(model).__name__)
        defaults = TranslationNATConfig()
        for option, owners in DECODING_OPTIONS.items():
            value = getattr(self.cfg, option, None)
            if name not in owners and value != getattr(defaults, option):
                flag = "--" + option.replace("_", "-")
                given = flag if isinstance(value, bool) else f"{flag} {value}"
                raise ValueError(
                    f"{given} is a decoding option of {' and '.join(owners)} models; this checkpoint is a {name} "
                    f"model, whose decoder does not read it: drop {flag}"
                )

    def inference_step(
        self,
        generator: Any,
        models: List[nn.Module],
        sample: Dict[str, Any],
        prefix_tokens: Optional[torch.Tensor] = None,
        constraints: Optional[torch.Tensor] = None,
    ) -> List[List[Hypothesis]]:
        """fairseq's inference step, then the ``SEG-``/``NAD-`` lines of ``--print-segments``/``--print-nad-draft``.

        fairseq-generate has no hook for extra lines, so they are printed here, to ``sys.stdout``: the stream
        fairseq-generate and fairseq-interactive print to, unless ``--results-path`` sends the hypotheses to a
        file (the task does not see that option). Decoding attends with the engine's attention backends
        (:mod:`~nat_plugins.engine.attention`). A plugin generator's ``generate`` refuses ``prefix_tokens`` and
        ``constraints`` (:meth:`~nat_plugins.generators.base.PluginGenerator.refuse_search_inputs`) rather than drop
        them."""
        with attention_backends():  # no attention kernel that plans per shape (engine/attention.py)
            hypos = super().inference_step(
                generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints
            )
        lines = []
        for sample_id, sentence_hypos in zip(sample["id"].tolist() if "id" in sample else [], hypos):
            best = sentence_hypos[0] if sentence_hypos else {}
            if self.cfg.print_segments and "segments" in best:
                lines.append(f"SEG-{sample_id}\t{segments_string(self.tgt_dict, best['segments'])}")
            if self.cfg.print_nad_draft and "nad_draft" in best:
                lines.append(f"NAD-{sample_id}\t{self.tgt_dict.string(best['nad_draft'])}")
        if lines:
            print("\n".join(lines), file=sys.stdout)
        return hypos

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """fairseq's training step, attending with the engine's attention backends
        (:mod:`~nat_plugins.engine.attention`: a new batch shape costs no new kernel plan)."""
        with attention_backends():
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad=ignore_grad)

    def valid_step(self, sample, model, criterion):
        """fairseq's validation step (``--eval-bleu`` decoding included), with the engine's attention backends."""
        with attention_backends():
            return super().valid_step(sample, model, criterion)
