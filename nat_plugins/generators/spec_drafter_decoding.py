"""Speculative decoding (Xia, Ge, Wang, Chen, Wei & Sui, Findings of EMNLP 2023, "Speculative Decoding: Exploiting
Speculative Execution for Accelerating Seq2seq Generation"; also "Generalized Aggressive Decoding"): the decoder of
``spec_drafter`` checkpoints, verified by the AR teacher ``--speculative-teacher``.

The loop is verify-accept decoding with the teacher as the verifier
(:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptLoop`: one batched teacher call per step on k+1 new
tokens against its cache, rolled back per sentence to the accepted ones). Each step, for a sentence whose accepted
prefix is y_0 = BOS .. y_j and whose next token ŷ_{j+1} the teacher chose in its last call:

1. draft (§3 Spec-Drafter): the drafter reads BOS .. y_j, ŷ_{j+1} and proposes d_1..d_k for y_{j+2..j+k+1} in one
   pass (k = the checkpoint's ``--draft-size``);
2. verify: the teacher reads ŷ_{j+1}, d_1..d_k in one call;
3. accept (§3 Spec-Verification): ŷ_{j+1} and the longest prefix of drafts the teacher agrees with; the teacher's
   argmax after the last accepted token is the next ŷ. ``--speculative-verify exact`` agrees where a draft is the
   teacher's argmax: the output is token for token the teacher's greedy output, whatever the drafter proposes (the
   argmax of the teacher's logits at every position: fairseq's greedy search up to near-ties, see
   :mod:`~nat_plugins.generators.verify_accept_loop`).
   ``relaxed`` agrees where it is among the teacher's ``--speculative-beta`` best tokens and at most
   ``--speculative-tau`` below the best log-probability.

The first step drafts from BOS alone (j = -1, BOS in the place of ŷ_{j+1}): the teacher's first call reads BOS and
the drafts of y_1..y_k, so no call is spent on BOS alone.

The drafter keeps a cache of the prefix it has read, as the teacher does. A drafter trained with
``--read-teacher-states`` also reads, for each prefix token, the teacher's decoder output before it: the loop keeps
every state the teacher computes (:meth:`SpeculativeGenerator.verify`), so drafting from them costs no teacher call.

Length limits, minimum length, pad/unk rules and scores are those of fairseq's ``SequenceGenerator`` with beam 1 for
the teacher, so exact verification prints what ``fairseq-generate --beam 1`` prints for the teacher (up to near-ties).
Each hypothesis carries ``steps`` (teacher calls), ``drafter_steps`` (drafter calls: one before each teacher call that
verifies drafts, see ``--max-drafting-sentences``) and ``mean_accepted_tokens`` (emitted tokens, EOS included, per
teacher call).

Options: :class:`SpecDrafterDecodingConfig` (teacher, verification) and
:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptDecodingConfig` (int8 drafts, drafting limit).
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.models import FairseqEncoderDecoderModel
from torch import nn

from ..engine.block_call import inexact_verifier, rollback_cache
from ..engine.cpu_linear import int8_copy
from ..engine.lean_decoder import IncrementalState
from ..engine.static_cache import StaticCache, static_unsupported
from ..modules.teacher import TEACHER_FIX, FrozenTeacher
from .base import DecodingConfig, EncoderOut, Hypothesis
from .verify_accept_loop import VerifyAcceptDecodingConfig, VerifyAcceptLoop

SPECULATIVE_VERIFY_MODES = ChoiceEnum(["exact", "relaxed"])


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

    @classmethod
    def parsed(cls, cfg: Any) -> Verification:
        """``cfg``'s teacher and verification rule: exact is top 1 with no tolerance; relaxed checks β >= 1, τ >= 0."""
        options = cls.of(cfg)
        if options.speculative_verify == "exact":
            return Verification(options.speculative_teacher, 1, math.inf)
        if options.speculative_beta < 1 or not options.speculative_tau >= 0:
            raise ValueError(
                "--speculative-verify relaxed needs --speculative-beta >= 1 and --speculative-tau >= 0, got "
                f"{options.speculative_beta} and {options.speculative_tau}"
            )
        return Verification(options.speculative_teacher, options.speculative_beta, options.speculative_tau)


def check_teacher(teacher: FrozenTeacher, path: Optional[str], option: str = "--speculative-teacher") -> None:
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
            f"--speculative-teacher {path!r}: the drafter reads {wanted}-dimensional teacher states "
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


class SpeculativeGenerator(VerifyAcceptLoop):
    """Draft with a ``spec_drafter``, verify with the teacher (module docstring); task options
    ``--speculative-teacher``, ``--speculative-verify``, ``--speculative-beta``, ``--speculative-tau``
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
        self.teacher = FrozenTeacher(verification.teacher, task, "--speculative-teacher")
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
        self.drafter_out = self.drafter_cache = self.drafted = None
        self.reads_teacher_states = drafter.decoder.reads_teacher_states
        if self.reads_teacher_states:
            check_state_size(drafter, self.teacher, verification.teacher)
        # --read-teacher-states: (B, L, d), column t the teacher's output at position t - 1 (zeros before BOS)
        self.teacher_states = None
        self.same_encoder = None  # whether the drafter's encoder is the teacher's (known at the first batch)
        self.drafted_width = None

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

    def start(self, sample: Dict[str, Any], encoder_out: EncoderOut) -> None:
        """The drafter's encoder output (the teacher's where the encoders are equal) and an empty drafter cache."""
        if self.same_encoder:  # the teacher's encoder output is the drafter's
            self.drafter_out = encoder_out
        else:
            self.drafter_out = self.model.encoder.forward_torchscript(sample["net_input"])
        self.drafter_cache = None  # made by the first call, which knows the batch's length limit
        self.teacher_states = None  # made by the first call too
        self.drafted = torch.zeros_like(sample["net_input"]["src_tokens"][:, 0])  # prefix tokens in the cache
        # a single sentence's cache width (its prefix read so far); None for batches, whose rows differ
        self.drafted_width = 0 if self.drafted.numel() == 1 else None

    def reorder(self, keep: torch.Tensor) -> None:
        """Keep the rows ``keep`` of the drafter's encoder output and cache."""
        self.drafter_out = self.model.encoder.reorder_encoder_out(self.drafter_out, keep)
        if isinstance(self.drafter_cache, StaticCache):
            self.drafter_cache.reorder(keep)
        elif self.drafter_cache is not None:
            self.drafter_decoder.reorder_incremental_state_scripting(self.drafter_cache, keep)
        self.drafted = self.drafted[keep]
        if self.teacher_states is not None:
            self.teacher_states = self.teacher_states[keep]

    def states_buffer(self, max_len: int, batch_size: int) -> torch.Tensor:
        """The batch's buffer of the teacher's states (module docstring), made at its first use: one column per
        position the loop can verify, in the drafter's device and dtype (the teacher's, :meth:`generate`)."""
        if self.teacher_states is None:
            width, dim = max_len + self.block_size + 3, self.teacher.model.decoder.output_embed_dim
            self.teacher_states = next(self.model.parameters()).new_zeros(batch_size, width, dim)
        return self.teacher_states

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

    def new_drafter_cache(self, max_len: int) -> Union[StaticCache, IncrementalState]:
        """The drafter's cache for a batch whose length limit is ``max_len``: the static step's buffers
        (:meth:`~nat_plugins.models.spec_drafter.SpecDrafterDecoder.draft_on_static_cache`: every prefix position,
        the k queries after the longest prefix and a last slot for padding) where it runs the drafter's decoder,
        else fairseq's ``incremental_state``, rolled back after every call."""
        if static_unsupported(self.drafter_decoder, self.drafter_out) is None:
            return StaticCache(self.drafter_decoder, self.drafter_out, max_len + self.drafter_decoder.draft_size + 3)
        return {}

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
        decoder, width = self.drafter_decoder, tokens.size(1)
        if self.drafter_cache is None:
            self.drafter_cache = self.new_drafter_cache(max_len)
        if self.drafted_width is None:
            new_width = int((last + 2 - self.drafted).max())
        else:
            new_width = width - self.drafted_width
        prefix_lengths = last + 2
        index = self.drafted.unsqueeze(1) + torch.arange(new_width, device=tokens.device)
        padding = index >= prefix_lengths.unsqueeze(1)
        index = index.clamp(max=width - 1)
        new_tokens = tokens.gather(1, index).masked_fill(padding, self.pad)
        states = None
        if self.reads_teacher_states:
            buffer = self.states_buffer(max_len, tokens.size(0))
            states = buffer.gather(1, index.unsqueeze(2).expand(-1, -1, buffer.size(2)))
        if isinstance(self.drafter_cache, StaticCache):
            logits = decoder.draft_on_static_cache(
                self.drafter_cache, new_tokens, self.drafted, prefix_lengths, teacher_states=states
            )
        else:
            logits, _ = decoder(
                new_tokens,
                encoder_out=self.drafter_out,
                prefix_lengths=prefix_lengths,
                incremental_state=self.drafter_cache,
                prefix_start=self.drafted,
                teacher_states=states,
            )
            rollback_cache(
                decoder, self.drafter_cache, new_width + decoder.draft_size, prefix_lengths - self.drafted, width
            )
        self.drafted = prefix_lengths
        if self.drafted_width is not None:
            self.drafted_width = width
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
