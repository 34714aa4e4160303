"""A frozen autoregressive teacher used at training time (``nat_rkl_finetune``) or decoding time (NPD rescoring,
speculative decoding's verifier), and the checks every teacher checkpoint goes through.

The teacher lives in a plain Python holder, not an ``nn.Module`` attribute of a model or criterion, so it is never
registered as a submodule: it is not saved in the student's checkpoint, not seen by the optimizer, and not wrapped
by DDP. It is put in eval mode with ``requires_grad=False`` and moved to the student's device/dtype on first use.
Checkpoints are pickles: load only trusted files.

A teacher checkpoint (``--npd-teacher``, ``--teacher-path``, ``--spec-drafter-teacher``; ``--init-from-ar`` reads one
too) is refused when its architecture is not an autoregressive encoder-decoder that fairseq's ``SequenceGenerator``
decodes (:func:`refuse_non_autoregressive`: a nat_plugins model, which declares its own decoder, or one of fairseq's
NAT models: their decoders are not run teacher-forced like a Transformer's), and when it was trained with other
dictionaries than the student's data-bin (:func:`check_teacher_dictionaries`): the teacher reads the student's token
ids, so a dictionary of the same size with other symbols gives meaningless scores without an error.
"""

import logging
import os
from typing import Any, Collection, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import Dictionary, data_utils
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, FairseqEncoderDecoderModel
from fairseq.models.nat import FairseqNATModel
from fairseq.tasks import FairseqTask

from ..engine import bucketed, length_buckets_wanted, prepare_for_decoding, widened
from .log_probs import token_log_probs

logger = logging.getLogger(__name__)

TEACHER_FIX = (
    "pass an autoregressive checkpoint of fairseq's transformer architecture (--arch transformer or a transformer_* "
    "preset) trained on this data-bin"
)
# where a checkpoint's vocabulary-sized embeddings sit, per dictionary (fairseq's encoder-decoder models)
EMBEDDINGS = {"source": "encoder.embed_tokens.weight", "target": "decoder.embed_tokens.weight"}


def stored_dictionaries(task: FairseqTask) -> Dict[str, List[str]]:
    """The dictionaries' symbols as ``translation_nat`` stores them in its task state, hence in every checkpoint it
    writes (:meth:`~nat_plugins.tasks.translation_nat.TranslationNATTask.state_dict`): what
    :func:`check_teacher_dictionaries` compares when the checkpoint's data directory is gone."""
    return {"source": list(task.source_dictionary.symbols), "target": list(task.target_dictionary.symbols)}


def checkpoint_arch(state: Dict[str, Any]) -> Optional[str]:
    """The architecture name of a loaded checkpoint (``state``: fairseq's ``load_checkpoint_to_cpu``)."""
    model_cfg = state["cfg"]["model"]
    return getattr(model_cfg, "_name", None) or getattr(model_cfg, "arch", None)


def refuse_non_autoregressive(state: Dict[str, Any], path: str, option: str) -> None:
    """Refuse a checkpoint whose architecture is not an autoregressive encoder-decoder that fairseq's
    ``SequenceGenerator`` decodes, before its model is built (building a RecoverSAT model would add its DEL symbol to
    the student's dictionary): a teacher's decoder is run teacher-forced or step by step like a Transformer's, which
    a SAT (grouped inputs), RecoverSAT (segments), blockwise (extra heads), Encoder-NAD-AD (a NAD memory),
    spec_drafter, fertility NAT or fairseq NAT decoder does not compute."""
    arch = checkpoint_arch(state)
    cls = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)
    if cls is None:
        return  # fairseq's own error names an architecture it does not know
    if getattr(cls, "generator_class", None) is not None:
        what = f"a nat_plugins model, decoded by its own {cls.generator_class.__name__}"
    elif issubclass(cls, FairseqNATModel):
        what = "a fairseq non-autoregressive model"
    elif not issubclass(cls, FairseqEncoderDecoderModel):
        what = f"not an encoder-decoder ({cls.__name__})"
    else:
        return
    raise ValueError(
        f"{option} {path!r} is a {arch} checkpoint ({what}), not an autoregressive teacher: its decoder would be run "
        f"as a Transformer decoder and score with another model than the one trained. Instead, {TEACHER_FIX}"
    )


def teacher_symbols(state: Dict[str, Any], side: str) -> Tuple[Optional[List[str]], str]:
    """The symbols of the teacher's ``side`` ("source"/"target") dictionary and where they come from: stored in its
    checkpoint's task state (``translation_nat``), else ``dict.{lang}.txt`` in its checkpoint's data directory; else
    None and why."""
    stored = (state.get("task_state") or {}).get("dictionaries", {}).get(side)
    if stored is not None:
        return list(stored), "stored in its checkpoint"
    task_cfg = state["cfg"]["task"]
    data = getattr(task_cfg, "data", None)
    if not data:
        return None, "its checkpoint names no data directory"
    directory = utils.split_paths(data)[0]
    if not os.path.isdir(directory):
        return None, f"its data directory {directory} is not there"
    langs = getattr(task_cfg, "source_lang", None), getattr(task_cfg, "target_lang", None)
    if None in langs:  # as fairseq's translation task infers them
        langs = data_utils.infer_language_pair(directory)
    path = os.path.join(directory, f"dict.{langs[side == 'target']}.txt")
    if not os.path.exists(path):
        return None, f"{path} is not there"
    return Dictionary.load(path).symbols, path


def first_difference(theirs: List[str], ours: List[str]) -> str:
    """Where two symbol lists first differ, in words."""
    for index, (their, our) in enumerate(zip(theirs, ours)):
        if their != our:
            return f"symbol {index} is {their!r} there, {our!r} here"
    return f"{len(theirs)} symbols there, {len(ours)} here"


def check_teacher_dictionaries(
    state: Dict[str, Any],
    dictionaries: Sequence[Dictionary],
    option: str,
    path: str,
    fix: str,
    added_symbols: Collection[str] = (),
) -> None:
    """Refuse a teacher checkpoint (``state``) trained with other dictionaries than ``dictionaries`` (the student
    data-bin's source and target dictionaries; ``added_symbols``: symbols the student's model appended to them, e.g.
    RecoverSAT's DEL, left out).

    Its embeddings' row counts are compared with the dictionaries' sizes, and its symbols (:func:`teacher_symbols`:
    stored in the checkpoint by ``translation_nat``, so the check holds after its data directory moved or was
    deleted; else that directory's ``dict.*.txt``) with the data-bin's. A checkpoint with neither (trained under
    fairseq's ``translation`` task, data directory gone) is accepted with a warning. ``fix`` ends the error."""
    for side, dictionary in zip(("source", "target"), dictionaries):
        ours = [symbol for symbol in dictionary.symbols if symbol not in added_symbols]
        embedding = state["model"].get(EMBEDDINGS[side])
        if embedding is not None and embedding.size(0) != len(ours):
            raise ValueError(
                f"{option} {path}: that checkpoint was trained with another {side} dictionary ({EMBEDDINGS[side]} has "
                f"{embedding.size(0)} rows, this data-bin's dictionary has {len(ours)} symbols): {fix}"
            )
        theirs, where = teacher_symbols(state, side)
        if theirs is None:
            logger.warning(
                f"{option} {path!r}: cannot check that the teacher was trained with this data-bin's {side} "
                f"dictionary ({where}, and the checkpoint stores none: another task or an older nat_plugins wrote it); "
                "if it was not, what the teacher computes is meaningless"
            )
        elif theirs != ours:
            raise ValueError(
                f"{option} {path!r} was trained with the {side} dictionary {where}, which is not this data-bin's "
                f"({first_difference(theirs, ours)}): the teacher reads this data-bin's token ids. Instead, {fix}"
            )


class FrozenTeacher:
    """An AR encoder-decoder loaded from ``path`` with the student's task (hence the student's dictionaries), after
    the checks of the module docstring.

    ``option`` names the command-line option in error messages (``--teacher-path``, ``--npd-teacher``,
    ``--spec-drafter-teacher``)."""

    def __init__(self, path: str, task: FairseqTask, option: str) -> None:
        if not path:
            raise ValueError(f"{option} PATH (an AR Transformer checkpoint trained on this data-bin) is required")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{option}: teacher checkpoint {path!r} does not exist")
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        refuse_non_autoregressive(state, path, option)
        check_teacher_dictionaries(state, (task.source_dictionary, task.target_dictionary), option, path, TEACHER_FIX)
        try:
            models, cfg = checkpoint_utils.load_model_ensemble([path], task=task, state=state)
        except RuntimeError as err:  # state-dict size mismatch of parameters other than the embeddings checked
            raise ValueError(
                f"{option} {path!r} does not fit this data-bin (was it trained with the same dictionaries?): {err}"
            ) from err
        model = models[0]
        model.eval()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        self.model = prepare_for_decoding(model)
        self.cfg = cfg  # the checkpoint's own configuration (the data it was trained on, ...)
        self.option = option

    def to(self, reference: torch.Tensor) -> FairseqEncoderDecoderModel:
        """The teacher on ``reference``'s device and floating-point dtype (moved once, then reused)."""
        parameter = next(self.model.parameters())
        if parameter.device != reference.device or parameter.dtype != reference.dtype:
            self.model.to(device=reference.device, dtype=reference.dtype)
        return self.model

    @torch.no_grad()
    def score(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        order: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced log-probabilities, one parallel pass (Gu et al. §4.2 L_RKL, which needs the teacher's full
        distributions; NPD's rescoring needs only :meth:`token_scores`).

        ``tokens`` ((N, T), right-padded with the dictionary's pad, no EOS) of lengths ``lengths`` (N,); row n of
        ``tokens`` translates sentence ``order[n]`` of ``src_tokens`` ((B, S); ``order`` None: N = B, row n =
        sentence n). The encoder runs once per sentence, the decoder once over all N rows. Returns ``lprobs``
        ((N, T+1, V), the teacher's distributions for positions 0..T, the one at ``lengths`` being that of EOS) and
        ``target`` ((N, T+1): tokens then EOS, padded)."""
        net_output, target = self.teacher_forced(src_tokens, src_lengths, tokens, lengths, order)
        return self.model.get_normalized_probs(net_output, log_probs=True), target

    @torch.no_grad()
    def token_scores(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        order: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The teacher's log-probability of every target token, one parallel pass (Gu et al. §4.1, NPD's eq. 8):
        arguments as :meth:`score`; returns (N, T+1) fp32 values, those of ``tokens`` then EOS, 0 on padding.
        Each is the target's logit minus the log-sum-exp over the vocabulary reduced in fp32
        (:func:`.log_probs.token_log_probs`): no (N, T+1, V) log-softmax, nor an fp32 copy of the logits."""
        if getattr(self.model.decoder, "adaptive_softmax", None) is not None:  # its output is no logits
            raise ValueError(f"{self.option}: a teacher with --adaptive-softmax-cutoff cannot rescore candidates")
        net_output, target = self.teacher_forced(src_tokens, src_lengths, tokens, lengths, order)
        pad = self.model.decoder.dictionary.pad()
        return token_log_probs(net_output[0], target).masked_fill_(target.eq(pad), 0.0)

    @torch.no_grad()
    def decoder_states(
        self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, prev_output_tokens: torch.Tensor
    ) -> torch.Tensor:
        """The teacher's decoder outputs (B, T, d) before the output projection, teacher-forced on
        ``prev_output_tokens`` ((B, T): BOS y_1 .. y_{T-1}, right-padded): position t's predicts y_{t+1} (what
        ``--read-teacher-states`` drafters read)."""
        encoder_out = self.model.encoder(src_tokens, src_lengths=src_lengths)
        return self.model.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=True)[0]

    def teacher_forced(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        order: Optional[torch.Tensor],
    ) -> Tuple[Tuple[torch.Tensor, Dict[str, Any]], torch.Tensor]:
        """The teacher's decoder output (logits (N, T+1, V), extra) on ``tokens`` then EOS, and that target.

        On CUDA (:mod:`~nat_plugins.engine.length_buckets`: a cuDNN plan per new shape) the source is left-padded
        and the decoder input right-padded to buckets: the causal mask already keeps every real position from the
        padding after it, and the logits of the padded positions are dropped (``extra`` keeps the padded width)."""
        model = self.model
        dictionary = model.decoder.dictionary
        pad, eos = dictionary.pad(), dictionary.eos()
        buckets = length_buckets_wanted(tokens)
        if buckets:
            width = bucketed(src_tokens.size(1))
            src_tokens = widened(src_tokens, width, model.encoder.padding_idx, on_the_left=True)
        encoder_out = model.encoder(src_tokens, src_lengths=src_lengths)
        if order is not None:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        target = torch.cat([tokens, tokens.new_full((tokens.size(0), 1), pad)], dim=1)
        target.scatter_(1, lengths.view(-1, 1), eos)
        prev = torch.cat([tokens.new_full((tokens.size(0), 1), eos), target[:, :-1]], dim=1)
        prev = prev.masked_fill(prev.eq(eos) & (torch.arange(prev.size(1), device=prev.device) > 0), pad)
        if buckets:
            prev = widened(prev, bucketed(prev.size(1)), pad)
        logits, extra = model.decoder(prev, encoder_out=encoder_out)
        return (logits[:, : target.size(1)], extra), target
