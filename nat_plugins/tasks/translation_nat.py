"""Task ``translation_nat``: fairseq's ``translation`` plus the side inputs and generators of nat_plugins.

One task serves every plugin model, so every system shares one set of side files and options. On top of
:class:`fairseq.tasks.translation.TranslationTask`
it

* loads optional per-split side files from the data directory:

  - ``{split}.fert.{src}``: text, one line per sentence, one non-negative integer per source subword
    (the appended EOS excluded), summing to the length of the target it goes with (without EOS) —
    the distilled target when one is loaded for the split, else the real one; batches carry it as
    ``sample["fertility"]`` (B x S, aligned with ``src_tokens``, 0 on padding and EOS);
  - ``{split}.kd.{tgt}.{bin,idx}``: sequence-level distilled targets binarized with the target
    dictionary (written by ``nat_plugins.cli.distill``; ``--distilled-name NAME`` reads
    ``{split}.NAME.{tgt}``). ``--use-distilled target`` trains on them
    instead of the real targets (training split only: validation BLEU keeps the real references);
    ``--use-distilled side`` keeps the real targets and adds ``sample["kd_target"]`` (Encoder-NAD-AD);

* checks the side files a model or criterion declares it needs (``required_side_inputs``) and fails
  with an error naming the missing or inconsistent file;
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
from typing import Optional

import torch
from fairseq import utils
from fairseq.data import BaseWrapperDataset, LanguagePairDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.models import MODEL_REGISTRY
from fairseq.tasks import FairseqTask, register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..compat import PluginCheckpointMarker
from ..engine import prepare_for_decoding
from ..generators.verify_accept_loop import CPU_MAX_DRAFTING_SENTENCES, GreedyLoop, greedy_loop_refusal
from ..modules.teacher import stored_dictionaries

logger = logging.getLogger(__name__)

SIDE_INPUTS = ("fertility", "kd_target")
DISTILLED_MODES = ChoiceEnum(["none", "target", "side"])
FERTILITY_DECODING_MODES = ChoiceEnum(["argmax", "average", "npd"])
NPD_CANDIDATES = ChoiceEnum(["argmax_and_samples", "samples"])
SPECULATIVE_VERIFY_MODES = ChoiceEnum(["exact", "relaxed"])


# the task's decoding options and the registered model(s) whose decoder reads each; build_generator refuses a value
# other than the default for any other model (the option would be ignored without a word). The one table: the hub's
# per-call options (nat_plugins.hub) are its keys
DECODING_OPTIONS = {
    "print_segments": "recover_sat",
    "block_accept": "blockwise_transformer",
    "min_block_size": "blockwise_transformer",
    "print_nad_draft": "nad_ad_transformer",
    "fertility_decoding": "fertility_nat",
    "npd_samples": "fertility_nat",
    "npd_candidates": "fertility_nat",
    "npd_teacher": "fertility_nat",
    "npd_length_normalize": "fertility_nat",
    "int8_drafts": ("blockwise_transformer", "spec_drafter"),
    "int8_decoder": "transformer",
    "max_drafting_sentences": ("blockwise_transformer", "spec_drafter"),
    "speculative_teacher": "spec_drafter",
    "speculative_verify": "spec_drafter",
    "speculative_beta": "spec_drafter",
    "speculative_tau": "spec_drafter",
}


class SideFileError(ValueError):
    """A side file (fertilities, distilled targets) is missing or disagrees with the data."""


@dataclass
class TranslationNATConfig(TranslationConfig):
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
    # RecoverSAT (recover_sat, Ran et al. 2020): segment decoding options
    print_segments: bool = field(
        default=False, metadata={"help": "recover_sat: print each hypothesis's segments as SEG-<id> lines (' | ')"}
    )
    # blockwise parallel decoding (blockwise_transformer, Stern et al. 2018): verify-accept options
    block_accept: str = field(
        default="exact",
        metadata={
            "help": "blockwise: accept a proposal if it is p1's argmax ('exact': output = greedy decoding of "
            "head 1, fairseq's up to floating-point near-ties) or among p1's top M ('topk:M')"
        },
    )
    min_block_size: int = field(
        default=1, metadata={"help": "blockwise: accept at least this many proposals per step (1..--block-size)"}
    )
    # Encoder-NAD-AD (nad_ad_transformer, Zhou, Zhang & Zong 2020): decoding options
    print_nad_draft: bool = field(
        default=False,
        metadata={"help": "nad_ad_transformer: print the NAD's argmax draft of each sentence as a NAD-<id> line"},
    )
    # NAT with fertility (fertility_nat, Gu et al. 2018): decoding options (generators/fertility_nat_decoding.py)
    fertility_decoding: FERTILITY_DECODING_MODES = field(
        default="argmax",
        metadata={
            "help": "fertility_nat: 'argmax' fertilities, 'average' (rounded expected fertility) or 'npd' "
            "(noisy parallel decoding: --npd-samples candidates rescored by --npd-teacher)"
        },
    )
    npd_samples: int = field(
        default=10,
        metadata={
            "help": "fertility_nat NPD: S, the candidate fertility sequences per sentence; with --npd-candidates "
            "argmax_and_samples (the default) S counts the argmax sequence: it is the argmax plus S-1 samples"
        },
    )
    npd_candidates: NPD_CANDIDATES = field(
        default="argmax_and_samples",
        metadata={
            "help": "fertility_nat NPD: 'argmax_and_samples' (default): the argmax fertility sequence and S-1 samples "
            "from the fertility predictor, so the output never scores below argmax decoding under the teacher; "
            "'samples': S samples and no argmax (Gu et al. 2018 §4.1's protocol)"
        },
    )
    npd_teacher: Optional[str] = field(
        default=None, metadata={"help": "fertility_nat NPD: the AR teacher checkpoint that rescores the candidates"}
    )
    npd_length_normalize: bool = field(
        default=False,
        metadata={
            "help": "fertility_nat NPD: rank the candidates by the teacher's log-probability divided by "
            "(length + 1) ** --lenpen instead of the plain log-probability (Gu et al. eq. 8)"
        },
    )
    # speculative decoding (spec_drafter, Xia et al. 2023): the teacher that verifies the drafts, and how
    speculative_teacher: Optional[str] = field(
        default=None,
        metadata={
            "help": "spec_drafter: the AR teacher checkpoint that verifies the drafts: fairseq's transformer "
            "architecture trained on this data-bin (its greedy output is the output in --speculative-verify exact)"
        },
    )
    speculative_verify: SPECULATIVE_VERIFY_MODES = field(
        default="exact",
        metadata={
            "help": "spec_drafter: 'exact' accepts a draft token only where it is the teacher's argmax (output = "
            "the teacher's greedy output, up to floating-point near-ties); 'relaxed' where it is among the "
            "teacher's --speculative-beta best and at most --speculative-tau below the best log-probability (Xia et "
            "al. 2023, §3 Spec-Verification)"
        },
    )
    speculative_beta: int = field(
        default=3, metadata={"help": "spec_drafter relaxed verification: top-β candidates of the teacher (β >= 1)"}
    )
    speculative_tau: float = field(
        default=1.0,
        metadata={"help": "spec_drafter relaxed verification: log-probability tolerance τ (>= 0) below the best"},
    )
    int8_drafts: bool = field(
        default=False,
        metadata={
            "help": "blockwise_transformer, spec_drafter, CPU fp32 only: run the layers that only draft (heads "
            "2..k: their feed-forward layer and output projection; the drafter's decoder) with int8 weights "
            "(torch's dynamic quantization), so each call reads a quarter of their bytes. Exact acceptance keeps "
            "its output (every draft is verified); top-k or relaxed acceptance and --min-block-size may change it"
        },
    )
    int8_decoder: bool = field(
        default=False,
        metadata={
            "help": "transformer at --beam 1 (the plugin's greedy loop), CPU fp32 only: the decoder with int8 weights "
            "(torch's dynamic quantization): a quarter of the bytes per call. The output is the int8 decoder's "
            "greedy output, not the float32 model's; activations are quantized per call over the batch's rows, so "
            "at batch > 1 a sentence's output may depend on the others (at batch 1 it does not)"
        },
    )
    max_drafting_sentences: Optional[int] = field(
        default=None,
        metadata={
            "help": "blockwise_transformer, spec_drafter, exact acceptance: verify drafts only while at most N "
            "sentences of a batch are still decoding; while more are, take plain greedy steps of the verifier "
            "(same output: one token per sentence and call, no drafts), because a call over k tokens of every "
            "sentence costs about k greedy steps once the batch keeps the device busy. Default: "
            f"{CPU_MAX_DRAFTING_SENTENCES} on the CPU, no limit on a GPU; 0: greedy "
            "steps only; a number >= --batch-size: drafts at every step"
        },
    )


def segments_string(dictionary, segments):
    """RecoverSAT segments (token tensors) as text, `` | `` between them."""
    return " | ".join(dictionary.string(segment) for segment in segments)


def side_file_paths(data_path, split, src, tgt, distilled_name="kd"):
    """Where the side files of ``split`` live: {"fertility": text file, "kd_target": indexed-dataset prefix}."""
    return {
        "fertility": os.path.join(data_path, f"{split}.fert.{src}"),
        "kd_target": os.path.join(data_path, f"{split}.{distilled_name}.{tgt}"),
    }


def read_fertility_file(path, src_sizes, tgt_sizes):
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


def load_distilled_targets(prefix, dictionary, num_sentences, split, required):
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

    def __init__(self, pair, fertility=None, kd_target=None):
        super().__init__(pair)
        self.fertility = fertility
        self.kd_target = kd_target
        self.fertility_error = None  # why a fertility file next to the data could not be used (if so)

    def __getitem__(self, index):
        item = self.dataset[index]
        if self.fertility is not None:
            item["fertility"] = self.fertility[index]
        if self.kd_target is not None:
            item["kd_target"] = self.kd_target[index]
        return item

    def collater(self, samples):
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

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.required_side_inputs = set()

    # ----- data -------------------------------------------------------------------------------------
    def side_file_paths(self, split, epoch=1):
        """Side files of ``split`` sit next to its binarized data (same directory choice as fairseq's)."""
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        return side_file_paths(
            paths[(epoch - 1) % len(paths)], split, self.cfg.source_lang, self.cfg.target_lang, self.cfg.distilled_name
        )

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
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

    def check_side_inputs(self, split):
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

    def require_side_inputs(self, names, who):
        """Record side inputs a model/criterion needs and check the splits already loaded."""
        unknown = set(names) - set(SIDE_INPUTS)
        if unknown:
            raise ValueError(f"{who} asks for unknown side inputs {sorted(unknown)}; known: {SIDE_INPUTS}")
        self.required_side_inputs |= set(names)
        for split in list(self.datasets):
            self.check_side_inputs(split)

    def state_dict(self):
        """Task state plus a marker whose unpickling imports nat_plugins (see ``compat.plugin_checkpoint_loaded``) and
        the dictionaries' symbols, so that a checkpoint used as a teacher is checked against a student's data-bin
        wherever its own data directory went (:func:`~nat_plugins.modules.teacher.check_teacher_dictionaries`)."""
        return {
            **super().state_dict(),
            "nat_plugins": PluginCheckpointMarker(),
            "dictionaries": stored_dictionaries(self),
        }

    def get_batch_iterator(self, dataset, *args, required_batch_size_multiple=1, **kwargs):
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
    def build_model(self, cfg, from_checkpoint=False):
        """The model, and with ``--eval-bleu`` the validation generator of the model being trained only: a model
        loaded from a checkpoint into this task (a teacher of speculative decoding, NPD or L_RKL) gets none, since
        its generator would be built with the trained model's decoding options (``--speculative-teacher``)."""
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

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint)
        self.require_side_inputs(getattr(criterion, "required_side_inputs", ()), type(criterion).__name__)
        return criterion

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
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

    def check_decoding_options(self, model):
        """Refuse a decoding option of another system (:data:`DECODING_OPTIONS`) set for ``model``."""
        name = next((n for n, cls in MODEL_REGISTRY.items() if cls is type(model)), type(model).__name__)
        defaults = TranslationNATConfig()
        for option, owners in DECODING_OPTIONS.items():
            owners = (owners,) if isinstance(owners, str) else owners
            value = getattr(self.cfg, option, None)
            if name not in owners and value != getattr(defaults, option):
                flag = "--" + option.replace("_", "-")
                given = flag if isinstance(value, bool) else f"{flag} {value}"
                raise ValueError(
                    f"{given} is a decoding option of {' and '.join(owners)} models; this checkpoint is a {name} "
                    f"model, whose decoder does not read it: drop {flag}"
                )

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """fairseq's inference step, then the ``SEG-``/``NAD-`` lines of ``--print-segments``/``--print-nad-draft``.

        fairseq-generate has no hook for extra lines, so they are printed here, to ``sys.stdout``: the stream
        fairseq-generate and fairseq-interactive print to, unless ``--results-path`` sends the hypotheses to a
        file (the task does not see that option). A plugin generator's ``generate`` refuses ``prefix_tokens`` and
        ``constraints`` (:meth:`~nat_plugins.generators.base.PluginGenerator.refuse_search_inputs`) rather than drop
        them."""
        hypos = super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints)
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
