"""Speculative decoding (Xia, Ge, Wang, Chen, Wei & Sui, Findings of EMNLP 2023, "Speculative Decoding: Exploiting
Speculative Execution for Accelerating Seq2seq Generation"; also "Generalized Aggressive Decoding"): the decoder of
``spec_drafter`` checkpoints, verified by the AR teacher ``--spec-drafter-teacher``.

The loop is verify-accept decoding with the teacher as the verifier
(:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptLoop`: one batched teacher call per step on k+1 new
tokens against its cache, rolled back per sentence to the accepted ones). Each step, for a sentence whose accepted
prefix is y_0 = BOS .. y_j and whose next token ŷ_{j+1} the teacher chose in its last call:

1. draft (§3 Spec-Drafter): the drafter reads BOS .. y_j, ŷ_{j+1} and proposes d_1..d_k for y_{j+2..j+k+1} in one
   pass (k = the checkpoint's ``--draft-size``);
2. verify: the teacher reads ŷ_{j+1}, d_1..d_k in one call;
3. accept (§3 Spec-Verification): ŷ_{j+1} and the longest prefix of drafts the teacher agrees with; the teacher's
   argmax after the last accepted token is the next ŷ. ``--spec-drafter-verify exact`` agrees where a draft is the
   teacher's argmax: the output is token for token the teacher's greedy output, whatever the drafter proposes (the
   argmax of the teacher's logits at every position: fairseq's greedy search up to near-ties, see
   :mod:`~nat_plugins.generators.verify_accept_loop`).
   ``relaxed`` agrees where it is among the teacher's ``--spec-drafter-beta`` best tokens and at most
   ``--spec-drafter-tau`` below the best log-probability.

The first step drafts from BOS alone (j = -1, BOS in the place of ŷ_{j+1}): the teacher's first call reads BOS and
the drafts of y_1..y_k, so no call is spent on BOS alone.

The drafter keeps a cache of the prefix it has read, as the teacher does. A drafter trained with
``--read-teacher-states`` also reads, for each prefix token, the teacher's decoder output before it: the loop keeps
every state the teacher computes (:meth:`SpecDrafterGenerator.verify`), so drafting from them costs no teacher call.

Length limits, minimum length, pad/unk rules and scores are those of fairseq's ``SequenceGenerator`` with beam 1 for
the teacher, so exact verification prints what ``fairseq-generate --beam 1`` prints for the teacher (up to near-ties).
Each hypothesis carries ``steps`` (teacher calls), ``drafter_steps`` (drafter calls: one before each teacher call that
verifies drafts, see ``--max-drafting-sentences``) and ``mean_accepted_tokens`` (emitted tokens, EOS included, per
teacher call).

Options: :class:`SpecDrafterDecodingConfig` (teacher, verification) and
:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptDecodingConfig` (int8 drafts, drafting limit).
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.models import FairseqEncoderDecoderModel
from torch import nn

from ...engine import DecodingCache, decoding_cache, inexact_verifier, int8_copy, rollback_cache
from ...generators.base import DecodingConfig, EncoderOut, Hypothesis
from ...generators.verify_accept_loop import VerifyAcceptDecodingConfig, VerifyAcceptLoop
from ...modules.teacher import TEACHER_FIX, FrozenTeacher

SPEC_DRAFTER_VERIFY_MODES = ChoiceEnum(["exact", "relaxed"])
logger = logging.getLogger(__name__)


class Verification(NamedTuple):
    """The verification rule of :class:`SpecDrafterDecodingConfig`, parsed: a draft token is accepted where it is
    among the teacher's ``top_m`` best and at most ``tolerance`` below the best log-probability."""

    teacher: Optional[str]
    top_m: int
    tolerance: float


@dataclass
class SpecDrafterDecodingConfig(DecodingConfig):
    """Speculative decoding's verifier and its rule (Xia et al. 2023, §3 Spec-Verification): the teacher is a task
    option, not the drafter's, so one drafter can be verified by any teacher of its data; exact verification is the
    default because it keeps the teacher's greedy output."""

    owners = ("spec_drafter",)

    spec_drafter_teacher: Optional[str] = field(
        default=None,
        metadata={
            "help": "spec_drafter: the AR teacher checkpoint that verifies the drafts: fairseq's transformer "
            "architecture trained on this data-bin (its greedy output is the output in --spec-drafter-verify exact)"
        },
    )
    spec_drafter_verify: SPEC_DRAFTER_VERIFY_MODES = field(
        default="exact",
        metadata={
            "help": "spec_drafter: 'exact' accepts a draft token only where it is the teacher's argmax (output = "
            "the teacher's greedy output, up to floating-point near-ties); 'relaxed' where it is among the "
            "teacher's --spec-drafter-beta best and at most --spec-drafter-tau below the best log-probability (Xia et "
            "al. 2023, §3 Spec-Verification)"
        },
    )
    spec_drafter_beta: int = field(
        default=3, metadata={"help": "spec_drafter relaxed verification: top-β candidates of the teacher (β >= 1)"}
    )
    spec_drafter_tau: float = field(
        default=1.0,
        metadata={"help": "spec_drafter relaxed verification: log-probability tolerance τ (>= 0) below the best"},
    )
    # the options' names before they took the system's name: still accepted, with a warning (DEPRECATED_OPTIONS)
    speculative_teacher: Optional[str] = field(
        default=None, metadata={"help": "deprecated name of --spec-drafter-teacher (still works)"}
    )
    speculative_verify: Optional[str] = field(
        default=None, metadata={"help": "deprecated name of --spec-drafter-verify (still works): exact or relaxed"}
    )
    speculative_beta: Optional[int] = field(
        default=None, metadata={"help": "deprecated name of --spec-drafter-beta (still works)"}
    )
    speculative_tau: Optional[float] = field(
        default=None, metadata={"help": "deprecated name of --spec-drafter-tau (still works)"}
    )

    @classmethod
    def current(cls, cfg: Any) -> Dict[str, Any]:
        """``cfg``'s values of the four options by their current names, a deprecated name's value taken where it is
        the one given (with a warning); the two names of one option given different values are refused."""
        options = cls.of(cfg)
        values = {new: getattr(options, new) for new in DEPRECATED_OPTIONS.values()}
        for old, new in DEPRECATED_OPTIONS.items():
            value = getattr(options, old)
            if value is None:
                continue
            old_flag, new_flag = f"--{old.replace('_', '-')}", f"--{new.replace('_', '-')}"
            if values[new] not in (value, cls.__dataclass_fields__[new].default):
                raise ValueError(
                    f"{old_flag} {value} and {new_flag} {values[new]} disagree: {old_flag} is the deprecated name of "
                    f"{new_flag}, give {new_flag} only"
                )
            if new == "spec_drafter_verify" and value not in ("exact", "relaxed"):
                raise ValueError(f"{old_flag} {value!r}: choose exact or relaxed")
            logger.warning("%s is deprecated: use %s (the same option)", old_flag, new_flag)
            values[new] = value
        return values

    @classmethod
    def parsed(cls, cfg: Any) -> Verification:
        """``cfg``'s teacher and verification rule: exact is top 1 with no tolerance; relaxed checks β >= 1, τ >= 0."""
        options = cls.current(cfg)
        teacher, beta, tau = options["spec_drafter_teacher"], options["spec_drafter_beta"], options["spec_drafter_tau"]
        if options["spec_drafter_verify"] == "exact":
            return Verification(teacher, 1, math.inf)
        if beta < 1 or not tau >= 0:
            raise ValueError(
                "--spec-drafter-verify relaxed needs --spec-drafter-beta >= 1 and --spec-drafter-tau >= 0, got "
                f"{beta} and {tau}"
            )
        return Verification(teacher, beta, tau)


# {deprecated option: its current name} (SpecDrafterDecodingConfig)
DEPRECATED_OPTIONS = {
    "speculative_teacher": "spec_drafter_teacher",
    "speculative_verify": "spec_drafter_verify",
    "speculative_beta": "spec_drafter_beta",
    "speculative_tau": "spec_drafter_tau",
}


def check_teacher(teacher: FrozenTeacher, path: Optional[str], option: str = "--spec-drafter-teacher") -> None:
    """Refuse a teacher (:class:`~nat_plugins.modules.teacher.FrozenTeacher`, which refused non-autoregressive
    checkpoints and other dictionaries) whose decoder the verifier would not reproduce exactly
    (:func:`~nat_plugins.engine.block_call.inexact_verifier`)."""
    reason = inexact_verifier(teacher.model.decoder)
    if reason is not None:
        raise ValueError(
            f"{option} {path!r} cannot verify the drafts exactly: {reason}. Verification recomputes fairseq's "
            "Transformer decoder layer by layer, so for this model it would compute other features than its own: "
            f"{TEACHER_FIX}"
        )


def check_state_size(drafter: nn.Module, teacher: FrozenTeacher, path: Optional[str]) -> None:
    """Refuse a teacher whose decoder states are not the size a ``--read-teacher-states`` drafter reads."""
    wanted, given = drafter.decoder.state_projection.in_features, teacher.model.decoder.output_embed_dim
    if wanted != given:
        raise ValueError(
            f"--spec-drafter-teacher {path!r}: the drafter reads {wanted}-dimensional teacher states "
            f"(--read-teacher-states) and this teacher's are {given}-dimensional: verify it with the teacher it was "
            "trained with"
        )


def share_unchanged_teacher_parts(drafter: FairseqEncoderDecoderModel, teacher: FairseqEncoderDecoderModel) -> bool:
    """Where the drafter's tensors equal the teacher's (a drafter trained with ``--freeze-encoder`` from this
    teacher), decoding uses the teacher's: the drafter's token embeddings and output projection become the
    teacher's decoder tensors (one vocabulary matrix read by both models' calls), and the returned bool says
    whether the encoders are equal, so one encoder pass serves both."""
    for name in ("embed_tokens", "output_projection"):
        own, theirs = getattr(drafter.decoder, name), getattr(teacher.decoder, name)
        if own.weight.shape == theirs.weight.shape and torch.equal(own.weight, theirs.weight):
            own.weight = theirs.weight
    own, theirs = drafter.encoder.state_dict(), teacher.encoder.state_dict()
    return own.keys() == theirs.keys() and all(
        own[name].shape == theirs[name].shape and torch.equal(own[name], theirs[name]) for name in own
    )


@dataclass
class DrafterState:
    """The drafter's side of one batch, kept in the loop's state (``LoopState.own``) while the batch decodes."""

    encoder_out: EncoderOut  # the drafter's encoder output of the rows (the teacher's where the encoders are equal)
    drafted: torch.Tensor  # (B,): prefix tokens in the drafter's cache
    drafted_width: Optional[int]  # a single sentence's cache width (its prefix read so far); None for batches
    cache: Optional[DecodingCache] = None  # made by the first call, which knows the batch's length limit
    # --read-teacher-states: (B, L, d), column t the teacher's output at position t - 1 (zeros before BOS); made by
    # the first call too
    teacher_states: Optional[torch.Tensor] = None

    def reorder(self, keep: torch.Tensor, encoder: nn.Module) -> None:
        """Keep the rows ``keep`` (``encoder``: the drafter's, which reorders its output)."""
        self.encoder_out = encoder.reorder_encoder_out(self.encoder_out, keep)
        if self.cache is not None:
            self.cache.reorder(keep)
        self.drafted = self.drafted[keep]
        if self.teacher_states is not None:
            self.teacher_states = self.teacher_states[keep]


class SpecDrafterGenerator(VerifyAcceptLoop):
    """Draft with a ``spec_drafter``, verify with the teacher (module docstring); task options
    ``--spec-drafter-teacher``, ``--spec-drafter-verify``, ``--spec-drafter-beta``, ``--spec-drafter-tau``
    (:class:`SpecDrafterDecodingConfig`), ``--int8-drafts`` (CPU: the drafter's decoder with int8 weights; exact
    verification keeps the output) and ``--max-drafting-sentences``
    (:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptDecodingConfig`)."""

    name = "speculative decoding (spec_drafter)"
    drafts_after_bos = True  # the first teacher call verifies the drafts after BOS (no call on BOS alone)

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        drafter = models[0]
        if not hasattr(drafter, "draft_size"):
            raise ValueError(f"speculative decoding needs a spec_drafter checkpoint, got {type(drafter).__name__}")
        verification = SpecDrafterDecodingConfig.parsed(task.cfg)
        drafting = VerifyAcceptDecodingConfig.of(task.cfg)
        self.teacher = FrozenTeacher(verification.teacher, task, "--spec-drafter-teacher")
        check_teacher(self.teacher, verification.teacher)
        super().__init__(
            models,
            task,
            gen_args,
            self.teacher.model,
            drafter.draft_size + 1,
            top_m=verification.top_m,
            tolerance=verification.tolerance,
            max_drafting_sentences=drafting.max_drafting_sentences,
        )
        # the decoder that drafts: the drafter's, or with --int8-drafts an int8 copy of it
        self.drafter_decoder = drafter.decoder
        if drafting.int8_drafts:
            self.drafter_decoder = int8_copy(drafter.decoder, "the drafter's decoder")
        self.reads_teacher_states = drafter.decoder.reads_teacher_states
        if self.reads_teacher_states:
            check_state_size(drafter, self.teacher, verification.teacher)
        self.same_encoder = None  # whether the drafter's encoder is the teacher's (known at the first batch)

    @torch.no_grad()
    def generate(
        self, models: List[nn.Module], sample: Dict[str, Any], bos_token: Optional[int] = None, **kwargs: Any
    ) -> List[List[Hypothesis]]:
        """The loop's ``generate``, with the teacher moved to the drafter's device and dtype and, at the first batch,
        the tensors the drafter shares with the teacher found (:func:`share_unchanged_teacher_parts`)."""
        self.teacher.to(next(self.model.parameters()))  # the drafter's device and dtype
        if self.same_encoder is None:
            self.same_encoder = share_unchanged_teacher_parts(self.model, self.teacher.model)
        return super().generate(models, sample, bos_token=bos_token, **kwargs)

    @property
    def drafter(self) -> DrafterState:
        """The drafter's side of the batch being decoded (the loop's state keeps it: :meth:`start`)."""
        return self.batch_state.own

    def start(self, sample: Dict[str, Any], encoder_out: EncoderOut) -> DrafterState:
        """The drafter's state for this batch: its encoder output (the teacher's where the encoders are equal), no
        prefix read yet, no cache."""
        if self.same_encoder:  # the teacher's encoder output is the drafter's
            drafter_out = encoder_out
        else:
            drafter_out = self.model.encoder.forward_torchscript(sample["net_input"])
        drafted = torch.zeros_like(sample["net_input"]["src_tokens"][:, 0])
        return DrafterState(drafter_out, drafted, 0 if drafted.numel() == 1 else None)

    def reorder(self, keep: torch.Tensor) -> None:
        """Keep the rows ``keep`` of the drafter's state."""
        self.drafter.reorder(keep, self.model.encoder)

    def states_buffer(self, max_len: int, batch_size: int) -> torch.Tensor:
        """The batch's buffer of the teacher's states (module docstring), made at its first use: one column per
        position the loop can verify, in the drafter's device and dtype (the teacher's, :meth:`generate`)."""
        drafter = self.drafter
        if drafter.teacher_states is None:
            width, dim = max_len + self.call_width + 3, self.teacher.model.decoder.output_embed_dim
            drafter.teacher_states = next(self.model.parameters()).new_zeros(batch_size, width, dim)
        return drafter.teacher_states

    def verify(
        self, features: torch.Tensor, position: torch.Tensor, max_len: int
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loop's verification; a drafter that reads the teacher's states keeps ``features`` (the teacher's
        output at ``position``) in column ``position`` + 1 of :meth:`states_buffer`."""
        if self.reads_teacher_states:
            columns = (position + 1).view(position.size(0), -1, 1)
            states = features.view(columns.size(0), columns.size(1), -1)
            self.states_buffer(max_len, features.size(0)).scatter_(1, columns.expand_as(states), states)
        return super().verify(features, position, max_len)

    def new_drafter_cache(self, max_len: int) -> DecodingCache:
        """The drafter's cache for a batch whose length limit is ``max_len``: the static step's buffers
        (:meth:`~.model.SpecDrafterDecoder.draft_on_static_cache`: every prefix position,
        the k queries after the longest prefix and a last slot for padding) where it runs the drafter's decoder,
        else fairseq's ``incremental_state``, rolled back after every call."""
        length = max_len + self.drafter_decoder.draft_size + 3
        return decoding_cache(self.drafter_decoder, self.drafter.encoder_out, length)

    def propose(
        self,
        first: torch.Tensor,
        features: Optional[torch.Tensor],
        tokens: torch.Tensor,
        last: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """The drafter's k drafts (B, k) after ŷ_{j+1} (at ``last`` + 1 in ``tokens``; BOS at the first call), never
        pad.

        The drafter's cache holds the prefix it read in its last call; it reads the tokens accepted since and ŷ_{j+1}
        (the k+1 a drafting step adds at most, more after greedy steps of the loop; with batch size 1 exactly those)
        and its k queries, then drops the queries from its cache (:func:`~nat_plugins.engine.block_call.
        rollback_cache`)."""
        decoder, width, drafter = self.drafter_decoder, tokens.size(1), self.drafter
        if drafter.cache is None:
            drafter.cache = self.new_drafter_cache(max_len)
        if drafter.drafted_width is None:
            new_width = int((last + 2 - drafter.drafted).max())
        else:
            new_width = width - drafter.drafted_width
        prefix_lengths = last + 2
        index = drafter.drafted.unsqueeze(1) + torch.arange(new_width, device=tokens.device)
        padding = index >= prefix_lengths.unsqueeze(1)
        index = index.clamp(max=width - 1)
        new_tokens = tokens.gather(1, index).masked_fill(padding, self.pad)
        states = None
        if self.reads_teacher_states:
            buffer = self.states_buffer(max_len, tokens.size(0))
            states = buffer.gather(1, index.unsqueeze(2).expand(-1, -1, buffer.size(2)))
        state = drafter.cache.incremental_state
        if state is None:  # the static step on the cache's buffers
            logits = decoder.draft_on_static_cache(
                drafter.cache, new_tokens, drafter.drafted, prefix_lengths, teacher_states=states
            )
        else:  # the drafter's forward on fairseq's state, its queries rolled back after
            logits, _ = decoder(
                new_tokens,
                encoder_out=drafter.encoder_out,
                prefix_lengths=prefix_lengths,
                incremental_state=state,
                prefix_start=drafter.drafted,
                teacher_states=states,
            )
            rollback_cache(decoder, state, new_width + decoder.draft_size, prefix_lengths - drafter.drafted, width)
        drafter.drafted = prefix_lengths
        if drafter.drafted_width is not None:
            drafter.drafted_width = width
        logits[..., self.pad] = -math.inf
        return logits.argmax(dim=-1)

    def hypotheses(
        self, tokens: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, steps: torch.Tensor
    ) -> List[List[Hypothesis]]:
        """The loop's hypotheses; the drafter is called once before every teacher call that verifies drafts."""
        hypos = super().hypotheses(tokens, scores, lengths, steps)
        for (hypo,) in hypos:
            hypo["drafter_steps"] = hypo.pop("drafting_steps")
            hypo["mean_accepted_tokens"] = hypo.pop("mean_accepted_block")
        return hypos
