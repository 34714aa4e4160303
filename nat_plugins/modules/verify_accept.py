"""Verify-accept decoding with an autoregressive verifier: the machinery blockwise parallel decoding (Stern, Shazeer &
Uszkoreit, NeurIPS 2018, §3-§5) shares with speculative decoding (Xia et al. 2023).

Every step calls the verifier's decoder once on ``[ŷ_{j+1}, d_{j+2}, …, d_{j+k}]`` at positions j+1..j+k, where j is
the last accepted position, ŷ_{j+1} is the verifier's own argmax from the previous call (accepted whatever happens)
and the d are k-1 drafts. The call yields the verifier's distribution after each of them; the longest prefix of
drafts the verifier agrees with is accepted (:func:`accepted_lengths`), the key/value cache is rolled back to the
accepted tokens (:func:`rollback_cache`), and the verifier's argmax after the last accepted token is the next
ŷ_{j+1}. With exact acceptance the output is exactly the verifier's greedy output, whatever the drafts.

Usage:

* :func:`decoder_block_features` runs any fairseq ``TransformerDecoder`` (a plain ``transformer`` checkpoint
  included) on several new tokens at explicit positions against its incremental cache; :func:`rollback_cache` keeps
  the accepted slots per sentence; :func:`accepted_lengths` is the acceptance rule (exact, top-M, tolerance τ).
* :class:`VerifyAcceptLoop` is the batched loop (sentences accept different numbers of tokens and leave the batch
  when they end). A subclass passes ``verifier`` (a fairseq encoder-decoder) and ``block_size`` k (tokens per
  verifier call) to its ``__init__`` and implements :meth:`~VerifyAcceptLoop.propose` (the k-1 drafts); it may
  override :meth:`~VerifyAcceptLoop.verifier_logits` (default: the decoder's output projection),
  :meth:`~VerifyAcceptLoop.start` (per batch, e.g. a drafter's encoder) and :meth:`~VerifyAcceptLoop.reorder`
  (sentences leaving the batch). Drafts should obey fairseq's length rules (never pad; EOS only where allowed), as
  forced acceptance (``min_block_size`` > 1) emits them unverified: ``self.constrain`` applies the rules to logits.
  Blockwise parallel decoding
  (:class:`~nat_plugins.generators.verify_accept.VerifyAcceptGenerator`) drafts with its k-1 extra heads at the
  state that predicted ŷ_{j+1}; a speculative decoder drafts with a separate model given the accepted prefix.
"""

import logging
import math

import torch
import torch.nn.functional as F
from fairseq.modules import SinusoidalPositionalEmbedding

from ..generators.base import UNSUPPORTED_OPTIONS, PluginGenerator

logger = logging.getLogger(__name__)


def target_position_embeddings(decoder, positions):
    """Positional embeddings of explicit target ``positions`` (0 = BOS; fairseq numbers position p as
    padding_idx + 1 + p)."""
    index = positions + decoder.padding_idx + 1
    if isinstance(decoder.embed_positions, SinusoidalPositionalEmbedding):
        return F.embedding(index, decoder.embed_positions.weights)
    return F.embedding(index, decoder.embed_positions.weight)


def cached_length(decoder, incremental_state):
    """Number of slots in ``decoder``'s self-attention cache (0 without one)."""
    if incremental_state is None:
        return 0
    saved = decoder.layers[0].self_attn._get_input_buffer(incremental_state)
    return saved["prev_key"].size(2) if "prev_key" in saved else 0


def decoder_block_features(decoder, tokens, positions, encoder_out, incremental_state):
    """Output of a fairseq ``TransformerDecoder`` for new ``tokens`` (B, T) at target ``positions`` (B, T), one call.

    fairseq's incremental path feeds one token per call (the last of ``prev_output_tokens``); verify-accept feeds
    several at once, and different sentences of a batch sit at different positions. The new tokens see each other
    causally and every cached slot the cache's key padding mask does not hide (:func:`rollback_cache` hides
    rejected ones), and are appended to the cache. Without a cache (``incremental_state`` None), ``tokens`` is the
    whole right-padded prefix. Returns (B, T, d) features (before the output projection), as ``features_only``.
    """
    if getattr(decoder, "cross_self_attention", False):
        raise ValueError("verify-accept decoding does not support --cross-self-attention")
    enc = encoder_out["encoder_out"][0] if encoder_out is not None and encoder_out["encoder_out"] else None
    enc_padding_mask = None
    if encoder_out is not None and encoder_out["encoder_padding_mask"]:
        enc_padding_mask = encoder_out["encoder_padding_mask"][0]
    x = decoder.embed_scale * decoder.embed_tokens(tokens)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        x = x + target_position_embeddings(decoder, positions).to(x)
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    x = decoder.dropout_module(x).transpose(0, 1)

    causal = decoder.buffered_future_mask(x)
    cached = cached_length(decoder, incremental_state)
    self_attn_mask = torch.cat([causal.new_zeros(causal.size(0), cached), causal], 1)
    # always a tensor, so the cache stores a per-sentence key padding mask that rollback can edit
    self_attn_padding_mask = tokens.eq(decoder.padding_idx)
    for layer in decoder.layers:
        x, _, _ = layer(
            x,
            enc,
            enc_padding_mask,
            incremental_state,
            self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask,
        )
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x


def rollback_cache(decoder, incremental_state, num_new, accepted):
    """Keep the first ``accepted[b]`` of the ``num_new`` slots the last call appended to ``decoder``'s cache for
    sentence b (``accepted`` (B,) long).

    Slots that no sentence accepted are cut off the cache; the others are hidden per sentence through the cached
    key padding mask (so a batch needs no per-sentence copy). With batch size 1 the cache holds exactly the
    accepted prefix.
    """
    keep = int(accepted.max())
    rejected = torch.arange(keep, device=accepted.device).unsqueeze(0) >= accepted.unsqueeze(1)
    for layer in decoder.layers:
        saved = layer.self_attn._get_input_buffer(incremental_state)
        length = saved["prev_key"].size(2) - (num_new - keep)
        saved["prev_key"] = saved["prev_key"][:, :, :length]
        saved["prev_value"] = saved["prev_value"][:, :, :length]
        mask = saved["prev_key_padding_mask"][:, :length].clone()
        mask[:, length - keep :] = mask[:, length - keep :].masked_fill(rejected, 1)
        saved["prev_key_padding_mask"] = mask
        layer.self_attn._set_input_buffer(incremental_state, saved)


def accepted_lengths(proposals, verify_scores, top_m, min_block_size, eos, tolerance=math.inf):
    """How many of its k proposals each sentence accepts in one step (Stern et al. §3 verify/accept, §5
    approximations; Xia et al. 2023's top-β with tolerance τ).

    ``proposals`` (B, k) are ŷ_{j+1..j+k}; ``verify_scores`` (B, k-1, V) are the verifier's constrained scores of
    y_{j+2..j+k} given the proposals before them: log-probabilities or anything that differs from them by a constant
    per row (logits). ŷ_{j+1} (the verifier's argmax) is always accepted; ŷ_{j+i} needs ŷ_{j+2..j+i-1} accepted, a
    score among the ``top_m`` best of its row (``top_m`` = 1: the argmax) and, with a finite ``tolerance`` τ, a score
    at most τ below the row's best; then at least ``min_block_size`` are accepted, and the block is cut after its
    first EOS.

    Returns ``(accepted (B,), finished (B,): the block holds EOS, scores (B, k-1): the scores of ŷ_{j+2..j+k})``.
    """
    k = proposals.size(1)
    scores = verify_scores.gather(-1, proposals[:, 1:].unsqueeze(-1)).squeeze(-1)
    if top_m == 1:
        verified = proposals[:, 1:].eq(verify_scores.argmax(-1))
    else:
        best = verify_scores.topk(min(top_m, verify_scores.size(-1)), dim=-1).values
        verified = scores.ge(best[..., -1]) & scores.gt(-math.inf)  # never a token the length rules forbid
        if tolerance < math.inf:
            verified &= scores.ge(best[..., 0] - tolerance)
    accepted = (1 + verified.long().cumprod(dim=1).sum(dim=1)).clamp(min=min_block_size)
    is_eos = proposals.eq(eos)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1) + 1, k + 1)
    return torch.minimum(accepted, first_eos), first_eos.le(accepted), scores


class VerifyAcceptLoop(PluginGenerator):
    """Batched verify-accept decoding against an AR ``verifier`` with a rolled-back cache (see the module).

    Length limits, minimum length, pad/unk rules and scores are those of fairseq's ``SequenceGenerator`` with beam 1
    for the verifier (the maximum length is ``max_len_a`` × the padded source length of the batch + ``max_len_b``,
    as there), so exact acceptance gives the hypotheses ``fairseq-generate --beam 1`` gives for the verifier. Each
    hypothesis also carries ``steps`` (verifier calls for its sentence, the first call on BOS included) and
    ``mean_accepted_block`` (emitted tokens, EOS included, per verifier call). With ``use_cache=False`` every call
    recomputes the whole prefix (the reference path).
    """

    name = "verify-accept decoding"
    unsupported_options = {**UNSUPPORTED_OPTIONS, "nbest": 1, "temperature": 1.0}

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
    ):
        super().__init__(models, task, gen_args)
        if self.beam_size != 1:
            logger.warning(f"--beam {self.beam_size} is ignored: {self.name} extends greedy decoding (pass --beam 1)")
        if not 1 <= min_block_size <= block_size:
            raise ValueError(f"the minimum block size must be between 1 and {block_size}, got {min_block_size}")
        self.verifier = verifier
        self.block_size = block_size
        self.top_m, self.min_block_size, self.tolerance = top_m, min_block_size, tolerance
        self.use_cache = use_cache
        self.max_positions = verifier.max_decoder_positions()

    # ----- hooks ---------------------------------------------------------------------------------------------------

    def verifier_logits(self, features):
        """The verifier's logits (..., V) for its decoder output ``features`` (..., d)."""
        return self.verifier.decoder.output_layer(features)

    def propose(self, first, features, tokens, last, max_len):
        """The k-1 drafts d_{j+2..j+k} (B, k-1) after ``first`` ŷ_{j+1} (B,), the verifier's argmax at j+1.

        ``features`` (B, d): the verifier's decoder output at the last accepted position j (``last`` (B,)), the one
        that predicted ``first``; ``tokens`` (B, W): BOS, the accepted tokens and ``first`` at j+1, then pad;
        ``max_len``: the batch's length limit (output position ``max_len`` may only be EOS)."""
        raise NotImplementedError

    def start(self, sample, encoder_out):
        """Called once per batch before the first call (``encoder_out``: the verifier's)."""

    def reorder(self, keep):
        """Sentences ``keep`` (indices into the current batch) stay in the batch, the others have ended."""

    # ----- the loop ------------------------------------------------------------------------------------------------

    def verifier_lprobs(self, features, position, max_len):
        """The verifier's constrained log-probabilities (float32, as SequenceGenerator) at decoder output
        ``features`` of the 0-based output ``position``."""
        return self.constrain(F.log_softmax(self.verifier_logits(features).float(), dim=-1), position, max_len)

    def next_block(self, features, lprobs, tokens, last, max_len):
        """[ŷ_{j+1}, drafts] (B, k) and log p(ŷ_{j+1}) (B,); writes ŷ_{j+1} into ``tokens`` at ``last`` + 1."""
        first = lprobs.argmax(dim=-1, keepdim=True)
        first_score = lprobs.gather(-1, first).squeeze(-1)
        tokens.scatter_(1, (last + 1).unsqueeze(1), first)
        if self.block_size == 1:
            return first, first_score
        drafts = self.propose(first.squeeze(1), features, tokens, last, max_len)
        return torch.cat([first, drafts], dim=1), first_score

    def recompute_block(self, tokens, proposals, last, encoder_out, max_len):
        """Cache-off step: run the decoder on the whole prefix + proposals, return the states of the proposals."""
        index = last.unsqueeze(1) + torch.arange(1, self.block_size + 1, device=last.device)
        width = int(last.max()) + self.block_size + 1
        sequence = tokens[:, :width].scatter(1, index, proposals)
        positions = torch.arange(width, device=last.device).expand_as(sequence).clamp(max=max_len)
        x = decoder_block_features(self.verifier.decoder, sequence, positions, encoder_out, None)
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(-1)))

    @torch.no_grad()
    def generate(self, models, sample, bos_token=None, **kwargs):
        """fairseq's generator interface: for each sentence of ``sample`` a one-element list of hypotheses."""
        verifier, decoder, k = self.verifier, self.verifier.decoder, self.block_size
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.shape[:2]
        device = src_tokens.device
        # one limit for the batch, from its padded source length, as SequenceGenerator's
        max_len = self.max_lengths(src_tokens.new_full((1,), src_len), self.max_positions - 1)
        self.check_min_len(max_len)
        max_len = int(max_len)

        encoder_out = verifier.encoder.forward_torchscript(net_input)
        self.start(sample, encoder_out)
        incremental_state = {} if self.use_cache else None
        offsets = torch.arange(1, k + 1, device=device)
        # rows of the sentences still decoding: tokens[:, t] = y_t (t = 0: BOS), scores[:, t] = log p(y_t | y_<t)
        tokens = src_tokens.new_full((bsz, max_len + k + 2), self.pad)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        scores = torch.zeros(bsz, max_len + k + 2, device=device)
        active = torch.arange(bsz, device=device)
        last = torch.zeros(bsz, dtype=torch.long, device=device)  # position of the last accepted token
        steps = torch.ones(bsz, dtype=torch.long, device=device)
        out_tokens, out_scores = tokens.clone(), scores.clone()
        out_lengths, out_steps = torch.zeros_like(last), torch.zeros_like(last)

        # first call: BOS -> the verifier's y_1 and the first drafts
        x = decoder_block_features(decoder, tokens[:, :1], last.unsqueeze(1), encoder_out, incremental_state)
        lprobs = self.verifier_lprobs(x[:, 0], last, max_len)
        proposals, first_score = self.next_block(x[:, 0], lprobs, tokens, last, max_len)
        finished = torch.zeros(bsz, dtype=torch.bool, device=device)
        while True:
            # ŷ_{j+1} is accepted whatever happens: end sentences whose next token is EOS
            scores.scatter_(1, (last + 1).unsqueeze(1), first_score.unsqueeze(1))
            ends_now = proposals[:, 0].eq(self.eos) & ~finished
            done = finished | ends_now
            if done.any():
                rows = active[done]
                out_tokens[rows], out_scores[rows], out_steps[rows] = tokens[done], scores[done], steps[done]
                out_lengths[rows] = torch.where(ends_now[done], last[done] + 1, last[done])
                keep = (~done).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                active, last, proposals, first_score = active[keep], last[keep], proposals[keep], first_score[keep]
                tokens, scores, steps = tokens[keep], scores[keep], steps[keep]
                encoder_out = verifier.encoder.reorder_encoder_out(encoder_out, keep)
                if self.use_cache:
                    decoder.reorder_incremental_state_scripting(incremental_state, keep)
                self.reorder(keep)

            # one call scores the proposals (the verifier at their positions) and holds the states for the next ones
            index = last.unsqueeze(1) + offsets
            if self.use_cache:
                positions = index.clamp(max=max_len)
                x = decoder_block_features(decoder, proposals, positions, encoder_out, incremental_state)
            else:
                x = self.recompute_block(tokens, proposals, last, encoder_out, max_len)
            steps += 1
            verify = self.verifier_lprobs(x, index, max_len)
            accepted, finished, proposal_scores = accepted_lengths(
                proposals, verify[:, :-1], self.top_m, self.min_block_size, self.eos, self.tolerance
            )
            take = offsets.unsqueeze(0) <= accepted.unsqueeze(1)
            block_scores = torch.cat([first_score.unsqueeze(1), proposal_scores], dim=1)
            tokens.scatter_(1, index, torch.where(take, proposals, tokens.gather(1, index)))
            scores.scatter_(1, index, torch.where(take, block_scores, scores.gather(1, index)))
            if self.use_cache:
                rollback_cache(decoder, incremental_state, k, accepted)
            last = last + accepted
            # the next block starts at the last accepted position
            rows = torch.arange(last.size(0), device=device)
            proposals, first_score = self.next_block(
                x[rows, accepted - 1], verify[rows, accepted - 1], tokens, last, max_len
            )

        return self.hypotheses(out_tokens, out_scores, out_lengths, out_steps)

    def hypotheses(self, tokens, scores, lengths, steps):
        """fairseq's hypothesis format, one (best-only) list per sentence."""
        return [
            [
                self.hypothesis(
                    tokens[row, 1 : length + 1],
                    scores[row, 1 : length + 1],
                    num_steps,
                    mean_accepted_block=length / num_steps,
                )
            ]
            for row, (length, num_steps) in enumerate(zip(lengths.tolist(), steps.tolist()))
        ]
