"""Verify-accept decoding with an autoregressive verifier: the batched loop that blockwise parallel decoding (Stern,
Shazeer & Uszkoreit, NeurIPS 2018, §3-§5) and speculative decoding (Xia et al., Findings of EMNLP 2023) share.

Each step calls the verifier's decoder once on [ŷ_{j+1}, d_{j+2}, …, d_{j+k}] at positions j+1..j+k (j: the last
accepted position; ŷ_{j+1}: the verifier's argmax from the previous call; d: k-1 drafts), accepts the longest prefix of
drafts the verifier agrees with (:func:`accepted_lengths`: exact, top-M, tolerance τ) and takes the verifier's argmax
after it as the next ŷ. With exact acceptance the output is the verifier's greedy output whatever the drafts:
fairseq's ``SequenceGenerator`` with beam 1, token for token, except at floating-point near-ties (two tokens whose
log-probabilities differ by less than the rounding of fairseq's running score or of the verifier's logits).

The key/value cache is the static step's (:mod:`~nat_plugins.engine.static_cache`: a rejected slot is overwritten
later) or, for decoders it does not run, fairseq's, rolled back per sentence
(:func:`~nat_plugins.engine.block_call.rollback_cache`). A call on k tokens of every sentence costs about k greedy
steps once the batch keeps the device busy, so with exact acceptance the loop takes plain greedy steps while more than
``--max-drafting-sentences`` sentences are decoding (:meth:`VerifyAcceptLoop.block_width`).

A subclass passes ``verifier`` and ``block_size`` k and implements :meth:`~VerifyAcceptLoop.propose` (the k-1 drafts,
obeying fairseq's length rules: :meth:`~VerifyAcceptLoop.constrain_logits`); it may override
:meth:`~VerifyAcceptLoop.verifier_logits`, :meth:`~VerifyAcceptLoop.start` and :meth:`~VerifyAcceptLoop.reorder`.
Blockwise decoding drafts with its k-1 extra heads, speculative decoding with a separate drafter;
:class:`GreedyLoop` is the loop without drafts (the plugin's greedy search of a plain Transformer).
"""

import math

import torch

from ..engine.block_call import IncrementalCache, decoder_block_features, inexact_verifier
from ..engine.cpu_linear import int8_decoder_copy
from ..engine.lean_decoder import lean_unsupported
from ..engine.static_cache import StaticCache, static_unsupported
from .base import UNSUPPORTED_OPTIONS, PluginGenerator

# the default of --max-drafting-sentences on the CPU: drafts only for a sentence decoding alone. On 2 cores with the
# quickstart's models the loop's greedy steps beat drafting from 2 sentences on (docs/design-notes.md, "Drafting against
# batch size"); drafting gained 18-28% at batch 1.
CPU_MAX_DRAFTING_SENTENCES = 1


def accepted_lengths(proposals, verify_scores, top_m, min_block_size, eos, tolerance=math.inf, greedy=None):
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


class VerifyAcceptLoop(PluginGenerator):
    """Batched verify-accept decoding against an AR ``verifier`` with a rolled-back cache (see the module).

    Length limits, minimum length, pad/unk rules and scores are those of fairseq's ``SequenceGenerator`` with beam 1
    for the verifier (the maximum length is ``max_len_a`` × the padded source length of the batch + ``max_len_b``,
    as there), so exact acceptance gives the hypotheses ``fairseq-generate --beam 1`` gives for the verifier (up to
    floating-point near-ties: see the module). Each
    hypothesis also carries ``steps`` (verifier calls for its sentence, a first call on BOS alone included),
    ``drafting_steps`` (those of them that verified drafts) and
    ``mean_accepted_block`` (emitted tokens, EOS included, per verifier call). With ``use_cache=False`` every call
    recomputes the whole prefix (the reference path). ``max_drafting_sentences`` (exact acceptance only): drafts only
    while at most that many sentences are decoding, greedy steps before (:meth:`block_width`); ``math.inf``: drafts
    at every step; None: :data:`CPU_MAX_DRAFTING_SENTENCES` on the CPU, drafts at every step on a GPU or with inexact
    acceptance.
    """

    name = "verify-accept decoding"
    unsupported_options = {**UNSUPPORTED_OPTIONS, "nbest": 1, "temperature": 1.0}
    # whether propose() can draft from BOS alone (a separate drafter, not heads on the verifier's state): the first
    # call then verifies [BOS, d_1, …, d_{k-1}] instead of BOS alone, one verifier call fewer per sentence
    drafts_after_bos = False

    def __init__(
        self,
        models,
        task,
        gen_args,
        verifier,
        block_size,
        top_m=1,
        min_block_size=1,
        tolerance=math.inf,
        use_cache=True,
        max_drafting_sentences=None,
    ):
        super().__init__(models, task, gen_args)
        self.require_greedy("emits one greedy hypothesis per sentence (no beam search)")
        if not 1 <= min_block_size <= block_size:
            raise ValueError(f"the minimum block size must be between 1 and {block_size}, got {min_block_size}")
        self.verifier = verifier
        self.block_size = block_size
        self.top_m, self.min_block_size, self.tolerance = top_m, min_block_size, tolerance
        self.exact = top_m == 1 and min_block_size == 1
        if max_drafting_sentences is not None and not (
            max_drafting_sentences == math.inf or (self.exact and max_drafting_sentences >= 0)
        ):
            raise ValueError(
                "--max-drafting-sentences needs exact acceptance (plain greedy steps emit other tokens than "
                f"top-k, relaxed or forced acceptance) and a value >= 0, got {max_drafting_sentences}"
            )
        self.max_drafting_sentences = max_drafting_sentences
        self.use_cache = use_cache
        self.max_positions = verifier.max_decoder_positions()
        self.may_reach_max_len = True  # whether the current step's positions can reach the length limit

    # ----- hooks ---------------------------------------------------------------------------------------------------

    def verifier_logits(self, features):
        """The verifier's logits (..., V) for its decoder output ``features`` (..., d)."""
        return self.verifier.decoder.output_layer(features)

    def propose(self, first, features, tokens, last, max_len):
        """The k-1 drafts d_{j+2..j+k} (B, k-1) after ``first`` ŷ_{j+1} (B,), the verifier's argmax at j+1, for the
        sentences still decoding.

        ``features`` (B, d): the verifier's decoder output at the last accepted position j (``last`` (B,)), the one
        that predicted ``first``; ``tokens`` (B, W): BOS, the accepted tokens and ``first`` at j+1, then pad (W: the
        longest such prefix); ``max_len``: the batch's length limit (output position ``max_len`` may only be EOS).
        With :attr:`drafts_after_bos`, the first call has j = -1, ``first`` = BOS and no ``features``."""
        raise NotImplementedError

    def start(self, sample, encoder_out):
        """Called once per batch before the first call (``encoder_out``: the verifier's)."""

    def reorder(self, keep):
        """Sentences ``keep`` (indices into the current batch) stay in the batch, the others have ended."""

    # ----- the loop ------------------------------------------------------------------------------------------------

    def block_width(self, num_sentences):
        """Tokens per sentence of the next call: k (ŷ_{j+1} and k-1 drafts), or 1 (a greedy step: ŷ_{j+1} alone)
        while more than ``max_drafting_sentences`` sentences are still decoding (see the module). Sentences only
        leave the batch, so a batch takes greedy steps first and drafts from the step where few enough are left."""
        limit = self.drafting_limit
        return self.block_size if limit is None or num_sentences <= limit else 1

    def constrain_logits(self, logits, position, max_len):
        """``SequenceGenerator``'s rules on ``logits`` (..., V) of the 0-based output ``position``, in place (see
        :meth:`~nat_plugins.generators.base.PluginGenerator.constrain`), skipping those that cannot apply: the
        forced EOS at ``max_len`` is checked only when this step's positions can reach it."""
        logits[..., self.pad] = -math.inf
        if self.unk_penalty:
            logits[..., self.unk] -= self.unk_penalty
        if self.min_len > 0:
            logits[..., self.eos].masked_fill_(position < self.min_len, -math.inf)
        if self.may_reach_max_len:
            self.force_eos(logits, position >= max_len)
        return logits

    def verify(self, features, position, max_len):
        """The verifier at decoder output ``features`` (..., d) of 0-based output ``position``: its argmax (...), the
        argmax's log-probability (float32, as ``SequenceGenerator``'s: logit - logsumexp), its constrained float32
        logits (..., V) and their logsumexp before the rules (...). No log-softmax over the vocabulary."""
        # contiguous: a CPU projection returns the transposed product (cpu_linear), whose rows reduce 3x slower
        logits = self.verifier_logits(features).float().contiguous()
        logsumexp = logits.logsumexp(dim=-1)
        logits = self.constrain_logits(logits, position, max_len)
        best, greedy = logits.max(dim=-1)
        return greedy, best - logsumexp, logits, logsumexp

    def new_cache(self, encoder_out, length):
        """The verifier's cache for a batch: the static step (:mod:`~nat_plugins.engine.static_cache`, ``length``
        slots per sentence) where it runs the verifier's decoder, else fairseq's ``incremental_state`` rolled back
        after every call."""
        decoder = self.verifier.decoder
        if static_unsupported(decoder, encoder_out) is None:
            return StaticCache(decoder, encoder_out, length)
        return IncrementalCache(decoder)

    def recompute_block(self, tokens, proposals, index, encoder_out, max_len, width):
        """Cache-off step: run the decoder on the whole prefix (``width`` positions) with the proposals at ``index``,
        return the states of the proposals."""
        sequence = tokens[:, :width].scatter(1, index, proposals)
        positions = torch.arange(width, device=index.device).expand_as(sequence).clamp(max=max_len)
        x = decoder_block_features(self.verifier.decoder, sequence, positions, encoder_out, None)
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(-1)))

    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, bos_token=None):
        """fairseq's generator interface: for each sentence of ``sample`` a one-element list of hypotheses (no
        ``prefix_tokens`` or ``constraints``: :meth:`~nat_plugins.generators.base.PluginGenerator.
        refuse_search_inputs`)."""
        self.refuse_search_inputs(prefix_tokens, constraints)
        verifier, decoder, k = self.verifier, self.verifier.decoder, self.block_size
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.shape[:2]
        device = src_tokens.device
        # one limit for the batch, from its padded source length, as SequenceGenerator's
        max_len = self.max_lengths(src_tokens.new_full((1,), src_len), self.max_positions - 1)
        self.check_min_len(max_len)
        max_len = int(max_len)

        self.drafting_limit = self.max_drafting_sentences
        if self.drafting_limit is None:
            self.drafting_limit = CPU_MAX_DRAFTING_SENTENCES if self.exact and device.type == "cpu" else None
        encoder_out = verifier.encoder.forward_torchscript(net_input)
        self.start(sample, encoder_out)
        cache = self.new_cache(encoder_out, max_len + k + 2) if self.use_cache else None
        offsets = torch.arange(1, k + 1, device=device)
        # rows of the sentences still decoding: tokens[:, t] = y_t (t = 0: BOS; pad after the next token),
        # scores[:, t] = log p(y_t | y_<t)
        tokens = src_tokens.new_full((bsz, max_len + k + 2), self.pad)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        scores = torch.zeros(bsz, max_len + k + 2, device=device)
        active = torch.arange(bsz, device=device)
        last = torch.zeros(bsz, dtype=torch.long, device=device)  # position of the last accepted token
        out_tokens, out_scores = tokens.clone(), scores.clone()
        out_lengths = torch.zeros_like(last)
        # steps[:, 0]: verifier calls of the sentence; steps[:, 1]: those that verified drafts (not greedy steps)
        out_steps = last.new_zeros(bsz, 2)

        bos_block = self.drafts_after_bos  # the first block is [BOS, drafts] at positions 0..k-1 (j = -1)
        if bos_block:  # BOS plays ŷ_{j+1}
            steps = out_steps.clone()
            last = last - 1
            first, first_score, features = tokens[:, 0].clone(), scores[:, 0].clone(), None
        else:  # first call: BOS -> the verifier's y_1 (ŷ_{j+1} of the first block)
            steps = out_steps.clone()
            steps[:, 0] = 1
            self.may_reach_max_len = k >= max_len
            if cache is None:
                features = decoder_block_features(decoder, tokens[:, :1], last.unsqueeze(1), encoder_out, None)[:, 0]
            else:
                features = cache.step(tokens[:, :1], last.unsqueeze(1), last.unsqueeze(1), 1, encoder_out)[:, 0]
            first, first_score, _, _ = self.verify(features, last, max_len)
        finished = torch.zeros(bsz, dtype=torch.bool, device=device)  # the last block ended with EOS
        accepted, width = None, k  # tokens accepted per sentence by the last call, tokens per sentence it read
        while True:
            # ŷ_{j+1} is accepted whatever happens: write it, and end sentences whose next token is EOS
            tokens.scatter_(1, (last + 1).unsqueeze(1), first.unsqueeze(1))
            scores.scatter_(1, (last + 1).unsqueeze(1), first_score.unsqueeze(1))
            done = finished if bos_block else finished | first.eq(self.eos)
            num_done, max_last = torch.stack([done.sum(), last.max()]).tolist()  # the step's one host sync
            if accepted is not None and cache is not None:
                cache.accept(width, accepted, max_last + 1)
            if num_done:
                remaining = last.size(0) - num_done
                order = done.to(torch.uint8).argsort(stable=True)  # the sentences still decoding first
                gone, keep = order[remaining:], order[:remaining]
                rows = active[gone]
                out_tokens[rows], out_scores[rows], out_steps[rows] = tokens[gone], scores[gone], steps[gone]
                out_lengths[rows] = torch.where(finished[gone], last[gone], last[gone] + 1)
                if remaining == 0:
                    break
                active, last, first, first_score = active[keep], last[keep], first[keep], first_score[keep]
                tokens, scores, steps, features = tokens[keep], scores[keep], steps[keep], features[keep]
                encoder_out = verifier.encoder.reorder_encoder_out(encoder_out, keep)
                if cache is not None:
                    cache.reorder(keep)
                self.reorder(keep)

            # the block [ŷ_{j+1}, drafts] (or ŷ_{j+1} alone: a greedy step); one call scores it and holds the states
            # for the next one
            width = self.block_width(last.size(0))
            self.may_reach_max_len = max_last + width >= max_len
            proposals = first.unsqueeze(1)
            if width > 1:
                drafts = self.propose(first, features, tokens[:, : max_last + 2], last, max_len)
                proposals = torch.cat([proposals, drafts], dim=1)
            block_offsets = offsets[:width]
            index = last.unsqueeze(1) + block_offsets
            if cache is not None:
                positions = index.clamp(max=max_len) if self.may_reach_max_len else index
                x = cache.step(proposals, positions, index, max_last + width + 1, encoder_out)
            else:
                x = self.recompute_block(tokens, proposals, index, encoder_out, max_len, max_last + width + 1)
            steps[:, 0] += 1
            steps[:, 1] += width > 1
            greedy, greedy_scores, logits, logsumexp = self.verify(x, index, max_len)
            # a first block's BOS (= EOS in fairseq) does not end it
            checked = proposals.masked_fill(block_offsets.eq(1), self.pad) if bos_block else proposals
            bos_block = False
            accepted, finished, draft_scores = accepted_lengths(
                checked, logits[:, :-1], self.top_m, self.min_block_size, self.eos, self.tolerance, greedy[:, :-1]
            )
            tokens.scatter_(1, index, proposals.masked_fill(block_offsets > accepted.unsqueeze(1), self.pad))
            scores.scatter_(1, index, torch.cat([first_score.unsqueeze(1), draft_scores - logsumexp[:, :-1]], 1))
            last = last + accepted
            # the next block starts after the last accepted token
            at = (accepted - 1).unsqueeze(1)
            first, first_score = greedy.gather(1, at).squeeze(1), greedy_scores.gather(1, at).squeeze(1)
            features = x.gather(1, at.unsqueeze(2).expand(-1, -1, x.size(-1))).squeeze(1)

        return self.hypotheses(out_tokens, out_scores, out_lengths, out_steps)

    def hypotheses(self, tokens, scores, lengths, steps):
        """fairseq's hypothesis format, one (best-only) list per sentence; ``steps`` (B, 2): calls, drafting calls."""
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
    ``SequenceGenerator`` with beam 1 token for token, up to floating-point near-ties (see the module), each step
    one static decoder step (:mod:`~nat_plugins.engine.static_cache`) and an argmax, no per-sentence Python work.
    ``TranslationNATTask.build_generator`` decodes a plain AR model at ``--beam 1`` with it where
    :func:`greedy_loop_refusal` finds nothing against it. ``--int8-decoder``: the greedy output of the model with an
    int8 copy of its decoder (:func:`~nat_plugins.engine.cpu_linear.int8_decoder_copy`)."""

    name = "greedy search (the plugin's loop)"

    def __init__(self, models, task, gen_args):
        verifier = models[0]
        if task.cfg.int8_decoder:
            verifier = int8_decoder_copy(verifier, "the decoder", "--int8-decoder")
        super().__init__(models, task, gen_args, verifier=verifier, block_size=1)


def greedy_loop_refusal(models, gen_args, **build_kwargs):
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
