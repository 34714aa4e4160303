"""Verify-accept decoding with an autoregressive verifier: the batched loop that blockwise parallel decoding (Stern,
Shazeer & Uszkoreit, NeurIPS 2018, §3-§5) and speculative decoding (Xia et al., Findings of EMNLP 2023) share.

Each step calls the verifier's decoder once on [ŷ_{j+1}, d_{j+2}, …, d_{j+k}] at positions j+1..j+k (j: the last
accepted position; ŷ_{j+1}: the verifier's argmax from the previous call; d: k-1 drafts), accepts the longest prefix of
drafts the verifier agrees with (:func:`accepted_lengths`: exact, top-M, tolerance τ) and takes the verifier's argmax
after it as the next ŷ. With exact acceptance the output is the verifier's greedy output whatever the drafts:
fairseq's ``SequenceGenerator`` with beam 1, token for token, up to floating-point near-ties.

Near-ties, the caveat of every "token for token" claim in nat_plugins (stated here once): where two tokens'
log-probabilities differ by less than the rounding of fairseq's running score or of the verifier's logits, fairseq's
search and a decoder that computes the same logits another way may pick different tokens, and the outputs differ from
there on. The benchmark tells such differences apart (:mod:`nat_plugins.bench.measure`).

The key/value cache is the static step's (:mod:`~nat_plugins.engine.static_cache`: a rejected slot is overwritten
later) or, for decoders it does not run, fairseq's, rolled back per sentence
(:func:`~nat_plugins.engine.block_call.rollback_cache`). A call on k tokens of every sentence costs about k greedy
steps once the batch keeps the device busy, so with exact acceptance the loop takes plain greedy steps while more than
``--max-drafting-sentences`` sentences are decoding (:meth:`VerifyAcceptLoop.block_width`).

A subclass passes ``verifier`` and ``call_width``, the tokens a verifier call scores (ŷ_{j+1} and the drafts: Stern et
al.'s block size k for blockwise decoding, the drafter's k drafts + 1 for speculative decoding; each paper's k keeps
its paper's meaning), and implements :meth:`~VerifyAcceptLoop.propose` (the call_width - 1 drafts,
obeying fairseq's length rules: :meth:`~VerifyAcceptLoop.constrain_logits`); it may override
:meth:`~VerifyAcceptLoop.verifier_logits`, :meth:`~VerifyAcceptLoop.start` and :meth:`~VerifyAcceptLoop.reorder`.
Blockwise decoding drafts with its k-1 extra heads, speculative decoding with a separate drafter;
:class:`GreedyLoop` is the loop without drafts (the plugin's greedy search of a plain Transformer).
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..engine import (
    DecodingCache,
    decoder_block_features,
    decoding_cache,
    inexact_verifier,
    int8_decoder_copy,
    lean_unsupported,
)
from .base import UNSUPPORTED_OPTIONS, DecodingConfig, EncoderOut, Hypothesis, PluginGenerator

# the default of --max-drafting-sentences on the CPU: drafts only for a sentence decoding alone (measurements:
# docs/design-notes.md, "Drafting against batch size")
CPU_MAX_DRAFTING_SENTENCES = 1


@dataclass
class VerifyAcceptDecodingConfig(DecodingConfig):
    """Options of the verify-accept loop that both its drafting systems read: int8 weights for the layers that only
    draft (exact acceptance verifies every draft, so only the drafts change), and the number of sentences of a batch
    up to which the loop drafts (module docstring)."""

    owners = ("blockwise_transformer", "spec_drafter")

    int8_drafts: bool = field(
        default=False,
        metadata={
            "help": "blockwise_transformer, spec_drafter, CPU fp32 only: run the layers that only draft (heads "
            "2..k: their feed-forward layer and output projection; the drafter's decoder) with int8 weights "
            "(torch's dynamic quantization), so each call reads a quarter of their bytes. Exact acceptance keeps "
            "its output (every draft is verified); top-k or relaxed acceptance and --min-block-size may change it"
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

    @staticmethod
    def checked_drafting_limit(value: Optional[float], exact: bool) -> Optional[float]:
        """``--max-drafting-sentences`` (or a generator's own limit: ``math.inf``, drafts at every step) for a loop
        whose acceptance is ``exact`` or not: a limit on drafting is plain greedy steps, which emit other tokens than
        top-k, relaxed or forced acceptance would."""
        if value is not None and not (value == math.inf or (exact and value >= 0)):
            raise ValueError(
                "--max-drafting-sentences needs exact acceptance (plain greedy steps emit other tokens than "
                f"top-k, relaxed or forced acceptance) and a value >= 0, got {value}"
            )
        return value


@dataclass
class GreedyLoopDecodingConfig(DecodingConfig):
    """The option of the plugin's greedy loop of a plain ``transformer`` (:class:`GreedyLoop`): its decoder with int8
    weights (a CPU decoder step reads its weights once per call: a quarter of the bytes)."""

    owners = ("transformer",)

    int8_decoder: bool = field(
        default=False,
        metadata={
            "help": "transformer at --beam 1 (the plugin's greedy loop), CPU fp32 only: the decoder with int8 weights "
            "(torch's dynamic quantization): a quarter of the bytes per call. The output is the int8 decoder's "
            "greedy output, not the float32 model's; activations are quantized per call over the batch's rows, so "
            "at batch > 1 a sentence's output may depend on the others (at batch 1 it does not)"
        },
    )


def accepted_lengths(
    proposals: torch.Tensor,
    verify_scores: torch.Tensor,
    top_m: int,
    min_block_size: int,
    eos: int,
    tolerance: float = math.inf,
    greedy: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How many of its k proposals each sentence accepts in one step (Stern et al. §3 verify/accept, §5
    approximations; Xia et al. 2023's top-β with tolerance τ).

    ``proposals`` (B, k) are ŷ_{j+1..j+k}; ``verify_scores`` (B, k-1, V) are the verifier's constrained scores of
    y_{j+2..j+k} given the proposals before them: log-probabilities or anything that differs from them by a constant
    per row (logits). ŷ_{j+1} (the verifier's argmax) is always accepted; ŷ_{j+i} needs ŷ_{j+2..j+i-1} accepted, a
    score among the ``top_m`` best of its row (``top_m`` = 1: the argmax) and, with a finite ``tolerance`` τ, a score
    at most τ below the row's best; then at least ``min_block_size`` are accepted, and the block is cut after its
    first EOS. ``greedy`` (B, k-1): the argmax of ``verify_scores``, when the caller has it already.

    Returns ``(accepted (B,), finished (B,): the block holds EOS, scores (B, k-1): the scores of ŷ_{j+2..j+k})``.
    """
    k = proposals.size(1)
    scores = verify_scores.gather(-1, proposals[:, 1:].unsqueeze(-1)).squeeze(-1)
    if top_m == 1:
        verified = proposals[:, 1:].eq(verify_scores.argmax(-1) if greedy is None else greedy)
    else:
        best = verify_scores.topk(min(top_m, verify_scores.size(-1)), dim=-1).values
        verified = scores.ge(best[..., -1]) & scores.gt(-math.inf)  # never a token the length rules forbid
        if tolerance < math.inf:
            verified &= scores.ge(best[..., 0] - tolerance)
    accepted = (1 + verified.long().cumprod(dim=1).sum(dim=1)).clamp(min=min_block_size)
    first_eos = torch.where(proposals.eq(eos), torch.arange(1, k + 1, device=proposals.device), k + 1).amin(dim=1)
    return torch.minimum(accepted, first_eos), first_eos.le(accepted), scores


@dataclass
class LoopState:
    """One batch in :meth:`VerifyAcceptLoop.generate`: the rows of the sentences still decoding (row r is sentence
    ``active[r]`` of the batch) and the finished sentences' outputs (row = sentence). L = ``max_len`` + k + 2."""

    max_len: int  # the batch's length limit: output position max_len may only be EOS
    encoder_out: EncoderOut  # the verifier's, of the rows
    cache: Optional[DecodingCache]  # the verifier's; None: every call recomputes the prefix
    offsets: torch.Tensor  # (k,): 1..k, a block's positions after j
    tokens: torch.Tensor  # (B, L): y_t at column t (t = 0: BOS), pad after ŷ_{j+1}
    scores: torch.Tensor  # (B, L): log p(y_t | y_<t)
    active: torch.Tensor  # (B,): sentence of each row
    last: torch.Tensor  # (B,): j, the position of the last accepted token (-1 before a first block after BOS)
    first: torch.Tensor  # (B,): ŷ_{j+1}, the verifier's argmax after j (BOS before a first block after BOS)
    first_score: torch.Tensor  # (B,): its log-probability
    features: Optional[torch.Tensor]  # (B, d): the verifier's decoder output at j, which predicted ŷ_{j+1}
    finished: Optional[torch.Tensor]  # (B,) bool: the last block ended with EOS (None: a block without drafts)
    out_tokens: torch.Tensor  # (B, L), the finished sentences' tokens ...
    out_scores: torch.Tensor  # (B, L) ... and scores
    out_lengths: torch.Tensor  # (B,): output tokens, EOS included
    out_steps: torch.Tensor  # (B, 2): the finished sentences' verifier calls, those of them that verified drafts
    bos_block: bool  # the next block is [BOS, drafts] at positions 0..k-1 (j = -1)
    accepted: Optional[torch.Tensor] = None  # (B,): tokens accepted by the last call (None before the first block)
    width: int = 0  # tokens per sentence the last call read
    max_last: int = 0  # the largest j of the rows (known after :meth:`VerifyAcceptLoop.retire_finished`)
    # verifier calls so far, and those of them that verified drafts: the same for every row still decoding (a row
    # leaves the batch when it ends), so they are counted on the host and copied to a sentence's row when it ends
    calls: int = 0
    drafting_calls: int = 0
    # the batch's drafting limit (:meth:`VerifyAcceptLoop.drafting_limit_on`; None: drafts at every step)
    drafting_limit: Optional[float] = None
    # whether the current call's positions can reach the length limit, or be below --min-len: the rules
    # :meth:`VerifyAcceptLoop.constrain_logits` skips where they cannot apply (set before each call)
    may_reach_max_len: bool = True
    may_be_below_min_len: bool = True
    own: Any = None  # a subclass's own state of the batch (what :meth:`VerifyAcceptLoop.start` returned)


class VerifyAcceptLoop(PluginGenerator):
    """Batched verify-accept decoding against an AR ``verifier`` with a rolled-back cache (see the module).

    Length limits, minimum length, pad/unk rules and scores are those of fairseq's ``SequenceGenerator`` with beam 1
    for the verifier (the maximum length is ``max_len_a`` × the padded source length of the batch + ``max_len_b``,
    as there), so exact acceptance gives the hypotheses ``fairseq-generate --beam 1`` gives for the verifier (up to
    near-ties: see the module). Each hypothesis also carries ``steps`` (verifier calls for its sentence, a first call
    on BOS alone included), ``drafting_steps`` (those of them that verified drafts), ``mean_accepted_block``
    (emitted tokens, EOS included, per verifier call); the loop measures nothing (the benchmark times the drafting
    calls from outside: :class:`~nat_plugins.bench.measure.DraftingTimer`). With ``use_cache=False`` every
    call recomputes the whole prefix (the reference path). ``min_block_size``: the caller's checked value (blockwise:
    :meth:`~nat_plugins.systems.blockwise.decoding.BlockwiseDecodingConfig.parsed`). ``max_drafting_sentences``
    (exact acceptance only, :meth:`VerifyAcceptDecodingConfig.checked_drafting_limit`): drafts only while at most that
    many sentences are decoding, greedy steps before (:meth:`block_width`); ``math.inf``: drafts at every step; None:
    :data:`CPU_MAX_DRAFTING_SENTENCES` on the CPU, drafts at every step on a GPU or with inexact acceptance.
    """

    name = "verify-accept decoding"
    unsupported_options = {**UNSUPPORTED_OPTIONS, "nbest": 1, "temperature": 1.0}
    # whether propose() can draft from BOS alone (a separate drafter, not heads on the verifier's state): the first
    # call then verifies [BOS, d_1, …, d_{k-1}] instead of BOS alone, one verifier call fewer per sentence
    drafts_after_bos = False

    def __init__(
        self,
        models: List[nn.Module],
        task: Any,
        gen_args: Any,
        verifier: nn.Module,
        call_width: int,
        top_m: int = 1,
        min_block_size: int = 1,
        tolerance: float = math.inf,
        use_cache: bool = True,
        max_drafting_sentences: Optional[float] = None,
    ) -> None:
        super().__init__(models, task, gen_args)
        self.require_greedy("emits one greedy hypothesis per sentence (no beam search)")
        self.verifier = verifier
        self.call_width = call_width
        self.top_m, self.min_block_size, self.tolerance = top_m, min_block_size, tolerance
        self.exact = top_m == 1 and min_block_size == 1
        self.max_drafting_sentences = VerifyAcceptDecodingConfig.checked_drafting_limit(
            max_drafting_sentences, self.exact
        )
        self.use_cache = use_cache
        self.max_positions = verifier.max_decoder_positions()
        # the batch being decoded, for the hooks the loop calls without it (verify, propose: constrain_logits)
        self.batch_state: Optional[LoopState] = None

    # ----- hooks ---------------------------------------------------------------------------------------------------

    def verifier_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The verifier's logits (..., V) for its decoder output ``features`` (..., d)."""
        return self.verifier.decoder.output_layer(features)

    def propose(
        self,
        first: torch.Tensor,
        features: Optional[torch.Tensor],
        tokens: torch.Tensor,
        last: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """The k-1 drafts d_{j+2..j+k} (B, k-1) after ``first`` ŷ_{j+1} (B,), the verifier's argmax at j+1, for the
        sentences still decoding.

        ``features`` (B, d): the verifier's decoder output at the last accepted position j (``last`` (B,)), the one
        that predicted ``first``; ``tokens`` (B, W): BOS, the accepted tokens and ``first`` at j+1, then pad (W: the
        longest such prefix); ``max_len``: the batch's length limit (output position ``max_len`` may only be EOS).
        With :attr:`drafts_after_bos`, the first call has j = -1, ``first`` = BOS and no ``features``."""
        raise NotImplementedError

    def start(self, sample: Dict[str, Any], encoder_out: EncoderOut) -> Any:
        """Called once per batch before the first call (``encoder_out``: the verifier's); what it returns is kept in
        the batch's state as ``own`` (a drafter's own per-batch state)."""

    def reorder(self, keep: torch.Tensor) -> None:
        """Sentences ``keep`` (indices into the current batch) stay in the batch, the others have ended."""

    # ----- the loop ------------------------------------------------------------------------------------------------

    def drafting_limit_on(self, device: torch.device) -> Optional[float]:
        """The drafting limit of a batch on ``device`` (:meth:`block_width`): ``max_drafting_sentences``, by default
        :data:`CPU_MAX_DRAFTING_SENTENCES` on the CPU with exact acceptance, else None (drafts at every step)."""
        if self.max_drafting_sentences is not None:
            return self.max_drafting_sentences
        return CPU_MAX_DRAFTING_SENTENCES if self.exact and device.type == "cpu" else None

    def block_width(self, state: LoopState) -> int:
        """Tokens per sentence of the next call: k (ŷ_{j+1} and k-1 drafts), or 1 (a greedy step: ŷ_{j+1} alone)
        while more than the batch's drafting limit of sentences are still decoding (see the module). Sentences only
        leave the batch, so a batch takes greedy steps first and drafts from the step where few enough are left."""
        limit = state.drafting_limit
        return self.call_width if limit is None or state.last.size(0) <= limit else 1

    def constrain_logits(self, logits: torch.Tensor, position: torch.Tensor, max_len: int) -> torch.Tensor:
        """``SequenceGenerator``'s rules on ``logits`` (..., V) of the 0-based output ``position``, in place (see
        :meth:`~nat_plugins.generators.base.PluginGenerator.constrain`), skipping those that cannot apply: the
        forced EOS at ``max_len`` and the held-back EOS below ``--min-len`` are checked only when this step's positions
        can reach them (the batch's :class:`LoopState`; every rule outside a batch)."""
        state = self.batch_state
        logits[..., self.pad] = -math.inf
        if self.unk_penalty:
            logits[..., self.unk] -= self.unk_penalty
        if self.min_len > 0 and (state is None or state.may_be_below_min_len):
            logits[..., self.eos].masked_fill_(position < self.min_len, -math.inf)
        if state is None or state.may_reach_max_len:
            self.force_eos(logits, position >= max_len)
        return logits

    def verify(
        self, features: torch.Tensor, position: torch.Tensor, max_len: int
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The verifier at decoder output ``features`` (..., d) of 0-based output ``position``: its argmax (...), the
        argmax's log-probability (float32, as ``SequenceGenerator``'s: logit - logsumexp), its constrained float32
        logits (..., V) and their logsumexp before the rules (...). No log-softmax over the vocabulary."""
        # contiguous: a CPU projection returns the transposed product (cpu_linear), whose rows reduce 3x slower
        logits = self.verifier_logits(features).float().contiguous()
        logsumexp = logits.logsumexp(dim=-1)
        logits = self.constrain_logits(logits, position, max_len)
        best, greedy = logits.max(dim=-1)
        return greedy, best - logsumexp, logits, logsumexp

    def new_cache(self, encoder_out: EncoderOut, length: int) -> DecodingCache:
        """The verifier's cache for a batch (:func:`~nat_plugins.engine.decoding_cache`): the static step
        (:mod:`~nat_plugins.engine.static_cache`, ``length`` slots per sentence) where it runs the verifier's decoder,
        else fairseq's ``incremental_state`` rolled back after every call."""
        return decoding_cache(self.verifier.decoder, encoder_out, length)

    def recompute_block(
        self,
        tokens: torch.Tensor,
        proposals: torch.Tensor,
        index: torch.Tensor,
        encoder_out: EncoderOut,
        max_len: int,
        width: int,
    ) -> torch.Tensor:
        """Cache-off step: run the decoder on the whole prefix (``width`` positions) with the proposals (B, w) at
        ``index`` (B, w), return the states (B, w, d) of the proposals."""
        sequence = tokens[:, :width].scatter(1, index, proposals)
        positions = torch.arange(width, device=index.device).expand_as(sequence).clamp(max=max_len)
        x = decoder_block_features(self.verifier.decoder, sequence, positions, encoder_out, None)
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(-1)))

    @torch.no_grad()
    def generate(
        self,
        models: List[nn.Module],
        sample: Dict[str, Any],
        prefix_tokens: Optional[torch.Tensor] = None,
        constraints: Optional[torch.Tensor] = None,
        bos_token: Optional[int] = None,
    ) -> List[List[Hypothesis]]:
        """fairseq's generator interface: for each sentence of ``sample`` a one-element list of hypotheses (no
        ``prefix_tokens`` or ``constraints``: :meth:`~nat_plugins.generators.base.PluginGenerator.
        refuse_search_inputs`). The loop: :meth:`start_batch`, then per step :meth:`retire_finished` and
        :meth:`draft_verify_accept` until every sentence has ended."""
        self.refuse_search_inputs(prefix_tokens, constraints)
        try:
            state = self.start_batch(sample, bos_token)
            while self.retire_finished(state):
                self.draft_verify_accept(state)
        finally:
            self.batch_state = None  # the batch's tensors (its cache among them) are not kept past it
        return self.hypotheses(state.out_tokens, state.out_scores, state.out_lengths, state.out_steps)

    def start_batch(self, sample: Dict[str, Any], bos_token: Optional[int]) -> LoopState:
        """Set up a batch: its length limit (one for the batch, as ``SequenceGenerator``'s: :meth:`batch_max_len`),
        the verifier's encoder output, the batch's state (:meth:`new_state`, kept as :attr:`batch_state` while the
        batch decodes), and ŷ_1 (:meth:`first_call`) unless the first block drafts after BOS."""
        net_input = sample["net_input"]
        max_len = self.batch_max_len(net_input["src_tokens"], self.max_positions - 1)
        encoder_out = self.verifier.encoder.forward_torchscript(net_input)
        own = self.start(sample, encoder_out)
        self.batch_state = state = self.new_state(net_input["src_tokens"], bos_token, max_len, encoder_out)
        state.own = own
        if state.bos_block:
            state.last = state.last - 1
        else:
            self.first_call(state)
        return state

    def new_state(
        self, src_tokens: torch.Tensor, bos_token: Optional[int], max_len: int, encoder_out: EncoderOut
    ) -> LoopState:
        """The state of a batch of ``src_tokens`` before its first call: the verifier's cache, the token and score
        rows (BOS at column 0) and the drafting limit on the batch's device (:meth:`drafting_limit_on`)."""
        width, bsz, device = self.call_width, src_tokens.size(0), src_tokens.device
        cache = self.new_cache(encoder_out, max_len + width + 2) if self.use_cache else None
        tokens = src_tokens.new_full((bsz, max_len + width + 2), self.pad)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        scores = torch.zeros(bsz, max_len + width + 2, device=device)
        last = torch.zeros(bsz, dtype=torch.long, device=device)
        return LoopState(
            max_len=max_len,
            encoder_out=encoder_out,
            cache=cache,
            offsets=torch.arange(1, width + 1, device=device),
            tokens=tokens,
            scores=scores,
            active=torch.arange(bsz, device=device),
            last=last,
            first=tokens[:, 0].clone(),  # BOS plays ŷ_{j+1} of a first block after BOS
            first_score=scores[:, 0].clone(),
            features=None,
            finished=torch.zeros(bsz, dtype=torch.bool, device=device),
            out_tokens=tokens.clone(),
            out_scores=scores.clone(),
            out_lengths=torch.zeros_like(last),
            out_steps=last.new_zeros(bsz, 2),
            bos_block=self.drafts_after_bos,
            width=width,
            drafting_limit=self.drafting_limit_on(device),
        )

    def first_call(self, state: LoopState) -> None:
        """The verifier's first call, on BOS alone: its argmax y_1 is ŷ_{j+1} of the first block (j = 0)."""
        state.calls = 1
        state.may_reach_max_len = self.call_width >= state.max_len
        state.may_be_below_min_len = True
        bos, last = state.tokens[:, :1], state.last
        if state.cache is None:
            features = decoder_block_features(self.verifier.decoder, bos, last.unsqueeze(1), state.encoder_out, None)
        else:
            features = state.cache.step(bos, last.unsqueeze(1), last.unsqueeze(1), state.encoder_out)
        state.features = features[:, 0]
        state.first, state.first_score, _, _ = self.verify(state.features, state.last, state.max_len)

    def retire_finished(self, state: LoopState) -> bool:
        """Write ŷ_{j+1} (accepted whatever the next call says), let the cache keep the tokens the last call
        accepted, and move the sentences whose block or ŷ_{j+1} is EOS to the output; False once none is left.
        Holds the step's one host sync (whether any ended; after a call with drafts also how many, and the largest
        j)."""
        s = state
        slot = (s.last + 1).unsqueeze(1)
        s.tokens.scatter_(1, slot, s.first.unsqueeze(1))
        s.scores.scatter_(1, slot, s.first_score.unsqueeze(1))
        if s.finished is None:  # after a greedy step: every row's j is the same (rows start drafting, never stop)
            done = s.first.eq(self.eos)
            s.max_last += 1
            if not done.any():
                return True
            num_done = int(done.sum())
        else:
            done = s.finished if s.bos_block else s.finished | s.first.eq(self.eos)  # a first block's BOS ends nothing
            num_done, s.max_last = torch.stack([done.sum(), s.last.max()]).tolist()
        if s.accepted is not None and s.cache is not None:
            s.cache.accept(s.width, s.accepted, s.max_last + 1)
        return not num_done or self.retire(s, done, num_done)

    def retire(self, state: LoopState, done: torch.Tensor, num_done: int) -> bool:
        """Move the ``num_done`` sentences ``done`` (B,) to the output (tokens, scores, length, calls) and keep the
        rows of the others, in the state, the cache and the subclass's (:meth:`reorder`); False when none is left."""
        s = state
        remaining = s.last.size(0) - num_done
        order = done.to(torch.uint8).argsort(stable=True)  # the sentences still decoding first
        gone, keep = order[remaining:], order[:remaining]
        rows = s.active[gone]
        s.out_tokens[rows], s.out_scores[rows] = s.tokens[gone], s.scores[gone]
        s.out_steps[rows] = rows.new_tensor([s.calls, s.drafting_calls])
        if s.finished is None:
            s.out_lengths[rows] = s.last[gone] + 1
        else:
            s.out_lengths[rows] = torch.where(s.finished[gone], s.last[gone], s.last[gone] + 1)
        if remaining == 0:
            return False
        s.active, s.last, s.first, s.first_score = s.active[keep], s.last[keep], s.first[keep], s.first_score[keep]
        s.tokens, s.scores = s.tokens[keep], s.scores[keep]
        s.features = s.features[keep]
        s.encoder_out = self.verifier.encoder.reorder_encoder_out(s.encoder_out, keep)
        if s.cache is not None:
            s.cache.reorder(keep)
        self.reorder(keep)
        return True

    def draft_verify_accept(self, state: LoopState) -> None:
        """One step (Stern et al. §4, combined scoring and proposal): the block [ŷ_{j+1}, drafts] (or ŷ_{j+1} alone:
        a greedy step, :meth:`block_width`) in one verifier call, which scores it and holds the states for the next
        one; the accepted prefix written (:func:`accepted_lengths`), and the verifier's argmax after it as the next
        ŷ_{j+1}."""
        s = state
        width = self.begin_step(s)
        if width == 1 and s.cache is not None and not s.bos_block:
            self.greedy_step(s)
            return
        proposals = s.first.unsqueeze(1)
        if width > 1:
            drafts = self.propose(s.first, s.features, s.tokens[:, : s.max_last + 2], s.last, s.max_len)
            proposals = torch.cat([proposals, drafts], dim=1)
        index = s.last.unsqueeze(1) + s.offsets[:width]
        self.accept_block(s, proposals, index, self.block_features(s, proposals, index))

    def begin_step(self, state: LoopState) -> int:
        """The next call's width (:meth:`block_width`), with the length rules its positions can meet
        (:meth:`constrain_logits`) and the call counted."""
        s = state
        width = self.block_width(s)
        s.may_reach_max_len = s.max_last + width >= s.max_len
        # every row's j is at least the calls so far - 1 (each call accepts a token or more), and the positions this
        # call verifies are after j
        s.may_be_below_min_len = s.calls < self.min_len
        s.calls += 1
        s.drafting_calls += width > 1
        return width

    def block_features(self, state: LoopState, proposals: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The verifier's decoder output (B, w, d) for the block ``proposals`` (B, w) at positions ``index`` (B, w):
        one call against the cache, or (cache off) on the whole prefix."""
        s = state
        if s.cache is not None:
            positions = index.clamp(max=s.max_len) if s.may_reach_max_len else index
            return s.cache.step(proposals, positions, index, s.encoder_out)
        width = proposals.size(1)
        return self.recompute_block(s.tokens, proposals, index, s.encoder_out, s.max_len, s.max_last + width + 1)

    def accept_block(self, state: LoopState, proposals: torch.Tensor, index: torch.Tensor, x: torch.Tensor) -> None:
        """Verify the block ``proposals`` (B, w) at ``index`` from its decoder output ``x`` (B, w, d): write the
        accepted prefix (:func:`accepted_lengths`) and take the verifier's argmax after it as the next ŷ_{j+1}."""
        s, width = state, proposals.size(1)
        block_offsets = s.offsets[:width]
        greedy, greedy_scores, logits, logsumexp = self.verify(x, index, s.max_len)
        # a first block's BOS (= EOS in fairseq) does not end it
        checked = proposals.masked_fill(block_offsets.eq(1), self.pad) if s.bos_block else proposals
        s.bos_block = False
        accepted, s.finished, draft_scores = accepted_lengths(
            checked, logits[:, :-1], self.top_m, self.min_block_size, self.eos, self.tolerance, greedy[:, :-1]
        )
        s.tokens.scatter_(1, index, proposals.masked_fill(block_offsets > accepted.unsqueeze(1), self.pad))
        s.scores.scatter_(1, index, torch.cat([s.first_score.unsqueeze(1), draft_scores - logsumexp[:, :-1]], 1))
        s.last = s.last + accepted
        # the next block starts after the last accepted token
        at = (accepted - 1).unsqueeze(1)
        s.first, s.first_score = greedy.gather(1, at).squeeze(1), greedy_scores.gather(1, at).squeeze(1)
        s.features = x.gather(1, at.unsqueeze(2).expand(-1, -1, x.size(-1))).squeeze(1)
        s.accepted, s.width = accepted, width

    def greedy_step(self, state: LoopState) -> None:
        """A step without drafts: ŷ_{j+1} alone in one verifier call, whose argmax is the next ŷ_{j+1} (what
        :meth:`draft_verify_accept` does at width 1, without its acceptance bookkeeping: the one token is accepted,
        and :meth:`retire_finished` has written it)."""
        s = state
        index = s.last.unsqueeze(1) + 1
        positions = index.clamp(max=s.max_len) if s.may_reach_max_len else index
        s.features = s.cache.step(s.first.unsqueeze(1), positions, index, s.encoder_out)[:, 0]
        s.last = index.squeeze(1)
        s.first, s.first_score, _, _ = self.verify(s.features, s.last, s.max_len)
        s.finished, s.accepted, s.width = None, None, 1

    def hypotheses(
        self, tokens: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, steps: torch.Tensor
    ) -> List[List[Hypothesis]]:
        """fairseq's hypothesis format, one (best-only) list per sentence from ``tokens`` and ``scores`` (B, L) (BOS
        at column 0), ``lengths`` (B,) and ``steps`` (B, 2): calls, drafting calls."""
        return [
            [
                self.hypothesis(
                    tokens[row, 1 : length + 1],
                    scores[row, 1 : length + 1],
                    num_steps,
                    mean_accepted_block=length / num_steps,
                    drafting_steps=drafting_steps,
                )
            ]
            for row, (length, (num_steps, drafting_steps)) in enumerate(zip(lengths.tolist(), steps.tolist()))
        ]


class GreedyLoop(VerifyAcceptLoop):
    """An autoregressive model's greedy search as the loop without drafts (block size 1): fairseq's
    ``SequenceGenerator`` with beam 1 token for token, up to near-ties (see the module), each step one static decoder
    step (:mod:`~nat_plugins.engine.static_cache`) and an argmax, no per-sentence Python work.
    ``TranslationNATTask.build_generator`` decodes a plain AR model at ``--beam 1`` with it where
    :func:`greedy_loop_refusal` finds nothing against it. ``--int8-decoder`` (:class:`GreedyLoopDecodingConfig`): the
    greedy output of the model with an int8 copy of its decoder
    (:func:`~nat_plugins.engine.cpu_linear.int8_decoder_copy`)."""

    name = "greedy search (the plugin's loop)"

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        verifier = models[0]
        if GreedyLoopDecodingConfig.of(task.cfg).int8_decoder:
            verifier = int8_decoder_copy(verifier, "the decoder", "--int8-decoder")
        super().__init__(models, task, gen_args, verifier=verifier, call_width=1)


def greedy_loop_refusal(models: List[nn.Module], gen_args: Any, **build_kwargs: Any) -> Optional[str]:
    """Why :class:`GreedyLoop` does not decode ``models`` with ``gen_args`` (a string: fairseq's generator does), or
    None: one model of fairseq's Transformer decoder that the static step runs, ``--beam 1``, no option of fairseq's
    generator the loop does not implement (sampling, n-best, ``--score-reference``, ...) and no other generator
    class or argument asked for (``build_kwargs``)."""
    if len(models) != 1:
        return "an ensemble"
    if getattr(gen_args, "beam", None) != 1:
        return "beam search"
    for name, off in GreedyLoop.unsupported_options.items():
        if getattr(gen_args, name, off) not in (off, None):
            return f"--{name.replace('_', '-')}"
    extra = dict(build_kwargs.pop("extra_gen_cls_kwargs", None) or {})
    if extra.get("lm_model") is None:  # fairseq-generate always passes lm_model and lm_weight
        extra.pop("lm_weight", None)
    asked = sorted(name for name, value in {**build_kwargs, **extra}.items() if value is not None)
    if asked:
        return f"build_generator arguments {asked}"
    decoder = getattr(models[0], "decoder", None)
    if decoder is None or getattr(models[0], "encoder", None) is None:
        return "not an encoder-decoder model"
    return inexact_verifier(decoder) or lean_unsupported(decoder)
