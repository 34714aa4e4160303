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
   argmax of the teacher's logits at every position: fairseq's greedy search except at floating-point near-ties,
   :mod:`~nat_plugins.generators.verify_accept_loop`).
   ``relaxed`` agrees where it is among the teacher's ``--speculative-beta`` best tokens and at most
   ``--speculative-tau`` below the best log-probability.

The first step drafts from BOS alone (j = -1, BOS in the place of ŷ_{j+1}): the teacher's first call reads BOS and
the drafts of y_1..y_k, so no call is spent on BOS alone.

The drafter keeps a cache of the prefix it has read, as the teacher does. Length limits, minimum length, pad/unk rules
and scores are those of fairseq's ``SequenceGenerator`` with beam 1 for the teacher, so exact verification prints what
``fairseq-generate --beam 1`` prints for the teacher (up to floating-point near-ties). Each hypothesis carries ``steps``
(teacher calls), ``drafter_steps`` (drafter calls: one before each teacher call that verifies drafts, see
``--max-drafting-sentences``) and ``mean_accepted_tokens`` (emitted tokens, EOS included, per
teacher call).
"""

import math

import torch

from ..engine.block_call import inexact_verifier, rollback_cache
from ..engine.cpu_linear import int8_copy
from ..modules.teacher import TEACHER_FIX, FrozenTeacher
from .verify_accept_loop import VerifyAcceptLoop


def check_teacher(teacher, path, option="--speculative-teacher"):
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


def share_unchanged_teacher_parts(drafter, teacher):
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
    ``--speculative-teacher``, ``--speculative-verify``, ``--speculative-beta``, ``--speculative-tau`` and
    ``--int8-drafts`` (CPU: the drafter's decoder with int8 weights; exact verification keeps the output)."""

    name = "speculative decoding (spec_drafter)"
    drafts_after_bos = True  # the first teacher call verifies the drafts after BOS (no call on BOS alone)

    def __init__(self, models, task, gen_args):
        drafter = models[0]
        if not hasattr(drafter, "draft_size"):
            raise ValueError(f"speculative decoding needs a spec_drafter checkpoint, got {type(drafter).__name__}")
        cfg = task.cfg
        if cfg.speculative_verify == "exact":
            top_m, tolerance = 1, math.inf
        else:
            if cfg.speculative_beta < 1 or not cfg.speculative_tau >= 0:
                raise ValueError(
                    "--speculative-verify relaxed needs --speculative-beta >= 1 and --speculative-tau >= 0, got "
                    f"{cfg.speculative_beta} and {cfg.speculative_tau}"
                )
            top_m, tolerance = cfg.speculative_beta, cfg.speculative_tau
        self.teacher = FrozenTeacher(cfg.speculative_teacher, task, "--speculative-teacher")
        check_teacher(self.teacher, cfg.speculative_teacher)
        super().__init__(
            models,
            task,
            gen_args,
            self.teacher.model,
            drafter.draft_size + 1,
            top_m=top_m,
            tolerance=tolerance,
            max_drafting_sentences=cfg.max_drafting_sentences,
        )
        # the decoder that drafts: the drafter's, or with --int8-drafts an int8 copy of it
        self.drafter_decoder = drafter.decoder
        if cfg.int8_drafts:
            self.drafter_decoder = int8_copy(drafter.decoder, "the drafter's decoder")
        self.drafter_out = self.drafter_cache = self.drafted = None
        self.same_encoder = None  # whether the drafter's encoder is the teacher's (known at the first batch)
        self.drafted_width = None

    @torch.no_grad()
    def generate(self, models, sample, bos_token=None, **kwargs):
        self.teacher.to(next(self.model.parameters()))  # the drafter's device and dtype
        if self.same_encoder is None:
            self.same_encoder = share_unchanged_teacher_parts(self.model, self.teacher.model)
        return super().generate(models, sample, bos_token=bos_token, **kwargs)

    def start(self, sample, encoder_out):
        if self.same_encoder:  # the teacher's encoder output is the drafter's
            self.drafter_out = encoder_out
        else:
            self.drafter_out = self.model.encoder.forward_torchscript(sample["net_input"])
        self.drafter_cache = {}
        self.drafted = torch.zeros_like(sample["net_input"]["src_tokens"][:, 0])  # prefix tokens in the cache
        # a single sentence's cache width (its prefix read so far); None for batches, whose rows differ
        self.drafted_width = 0 if self.drafted.numel() == 1 else None

    def reorder(self, keep):
        self.drafter_out = self.model.encoder.reorder_encoder_out(self.drafter_out, keep)
        self.drafter_decoder.reorder_incremental_state_scripting(self.drafter_cache, keep)
        self.drafted = self.drafted[keep]

    def propose(self, first, features, tokens, last, max_len):
        """The drafter's k drafts after ŷ_{j+1} (at ``last`` + 1 in ``tokens``; BOS at the first call), never pad.

        The drafter's cache holds the prefix it read in its last call; it reads the tokens accepted since and ŷ_{j+1}
        (the k+1 a drafting step adds at most, more after greedy steps of the loop; with batch size 1 exactly those)
        and its k queries, then drops the queries from its cache (:func:`~nat_plugins.engine.block_call.
        rollback_cache`)."""
        decoder, width = self.drafter_decoder, tokens.size(1)
        if self.drafted_width is None:
            new_width = int((last + 2 - self.drafted).max())
        else:
            new_width = width - self.drafted_width
        prefix_lengths = last + 2
        index = self.drafted.unsqueeze(1) + torch.arange(new_width, device=tokens.device)
        new_tokens = tokens.gather(1, index.clamp(max=width - 1)).masked_fill(
            index >= prefix_lengths.unsqueeze(1), self.pad
        )
        logits, _ = decoder(
            new_tokens,
            encoder_out=self.drafter_out,
            prefix_lengths=prefix_lengths,
            incremental_state=self.drafter_cache,
            prefix_start=self.drafted,
        )
        rollback_cache(
            decoder, self.drafter_cache, new_width + decoder.draft_size, prefix_lengths - self.drafted, width
        )
        self.drafted = prefix_lengths
        if self.drafted_width is not None:
            self.drafted_width = width
        logits[..., self.pad] = -math.inf
        return logits.argmax(dim=-1)

    def hypotheses(self, tokens, scores, lengths, steps):
        """The loop's hypotheses; the drafter is called once before every teacher call that verifies drafts."""
        hypos = super().hypotheses(tokens, scores, lengths, steps)
        for (hypo,) in hypos:
            hypo["drafter_steps"] = hypo.pop("drafting_steps")
            hypo["mean_accepted_tokens"] = hypo.pop("mean_accepted_block")
        return hypos
