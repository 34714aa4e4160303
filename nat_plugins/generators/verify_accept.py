"""Verify-accept decoding of ``blockwise_transformer`` (Stern, Shazeer & Uszkoreit, NeurIPS 2018).

One decoder call per step (§4, "Combined Scoring and Proposal"): the k proposals ŷ_{j+1..j+k} made at the last
accepted position j go in as new tokens; at their positions the call yields head 1's distribution p1, which
verifies the next proposal, and at the last position that gets accepted the k heads make the next proposals.
Acceptance (§3, §5):

* ``--block-accept exact``: the longest prefix with ŷ_{j+i} = argmax p1(· | ŷ_{<j+i}) — at least ŷ_{j+1}, which is
  p1's own argmax — so the output is exactly greedy decoding of p1 (the paper's guarantee);
* ``--block-accept topk:M``: ŷ_{j+i} only has to be among the M best tokens of p1 (§5.1, top-k selection);
* ``--min-block-size l``: accept at least l proposals per step whatever the verification says (§5.3);
* a block ends after its first EOS.

Sentences of a batch accept different numbers of tokens per step. With the cache on, every call appends its k
slots to fairseq's incremental key/value cache; slots that no sentence accepted are cut off again and the others
are hidden per sentence through the cached key padding mask; finished sentences leave the batch
(``reorder_incremental_state``). With the cache off every call recomputes the whole prefix (reference path).

Length limits, minimum length, pad/unk rules and scores are those of fairseq's ``SequenceGenerator`` with beam 1
(the maximum length is ``max_len_a`` × the padded source length of the batch + ``max_len_b``, as there), so exact
acceptance prints the hypotheses ``fairseq-generate --beam 1`` prints for p1. Each hypothesis also carries
``steps`` (decoder calls for its sentence, the first call on BOS included) and ``mean_accepted_block`` (emitted
tokens, EOS included, per decoder call).
"""

import logging
import math

import torch
from fairseq import utils

from .base import UNSUPPORTED_OPTIONS, PluginGenerator

logger = logging.getLogger(__name__)


def parse_block_accept(spec):
    """``exact`` -> 1 and ``topk:M`` -> M: a proposal is accepted when it is among the M best tokens of p1."""
    if spec == "exact":
        return 1
    name, _, value = str(spec).partition(":")
    if name == "topk" and value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(f"--block-accept must be 'exact' or 'topk:M' with an integer M >= 1, got {spec!r}")


def accepted_lengths(proposals, verify_lprobs, top_m, min_block_size, eos):
    """How many of its k proposals each sentence accepts in one step (§3 verify/accept, §5 approximations).

    ``proposals`` (B, k) are ŷ_{j+1..j+k}; ``verify_lprobs`` (B, k-1, V) are p1's constrained log-probabilities of
    y_{j+2..j+k} given the proposals before them. ŷ_{j+1} (p1's argmax) is always accepted; ŷ_{j+i} needs
    ŷ_{j+2..j+i-1} accepted and a score among the ``top_m`` best of its row (``top_m`` = 1: the argmax); then at
    least ``min_block_size`` are accepted, and the block is cut after its first EOS.

    Returns ``(accepted (B,), finished (B,): the block holds EOS, scores (B, k-1): log p1 of ŷ_{j+2..j+k})``.
    """
    k = proposals.size(1)
    scores = verify_lprobs.gather(-1, proposals[:, 1:].unsqueeze(-1)).squeeze(-1)
    if top_m == 1:
        verified = proposals[:, 1:].eq(verify_lprobs.argmax(-1))
    else:
        threshold = verify_lprobs.topk(min(top_m, verify_lprobs.size(-1)), dim=-1).values[..., -1]
        verified = scores.ge(threshold) & scores.gt(-math.inf)  # never a token the length rules forbid
    accepted = (1 + verified.long().cumprod(dim=1).sum(dim=1)).clamp(min=min_block_size)
    is_eos = proposals.eq(eos)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1) + 1, k + 1)
    return torch.minimum(accepted, first_eos), first_eos.le(accepted), scores


class VerifyAcceptGenerator(PluginGenerator):
    """Blockwise parallel decoding with combined scoring and proposal, batched, with a rolled-back cache;
    ``--block-accept`` and ``--min-block-size`` are task options."""

    name = "verify-accept decoding (blockwise_transformer)"
    unsupported_options = {**UNSUPPORTED_OPTIONS, "nbest": 1, "temperature": 1.0}

    def __init__(self, models, task, gen_args, use_cache=True):
        super().__init__(models, task, gen_args)
        if not hasattr(self.model.decoder, "block_heads"):
            raise ValueError(f"verify-accept decoding needs a blockwise_transformer, got {type(self.model).__name__}")
        if self.beam_size != 1:
            logger.warning(
                f"--beam {self.beam_size} is ignored: verify-accept decoding extends greedy decoding of "
                "head 1 (pass --beam 1)"
            )
        self.block_size = self.model.decoder.block_size
        self.top_m = parse_block_accept(task.cfg.block_accept)
        self.min_block_size = task.cfg.min_block_size
        if not 1 <= self.min_block_size <= self.block_size:
            raise ValueError(
                f"--min-block-size must be between 1 and the model's --block-size ({self.block_size}), "
                f"got {self.min_block_size}"
            )
        self.use_cache = use_cache
        self.max_positions = self.model.max_decoder_positions()

    def head1_lprobs(self, features, position, max_len):
        """p1's constrained log-probabilities (float32, as SequenceGenerator) at decoder output ``features`` of the
        0-based output ``position``."""
        logits = self.model.decoder.head_logits(features, range(1)).squeeze(-2)
        return self.constrain(utils.log_softmax(logits, dim=-1), position, max_len)

    def propose(self, features, lprobs, last, max_len):
        """Proposals ŷ_{j+1..j+k} at the last accepted position j: p1's argmax, taken from the log-probs the
        verification already computed (so it is exactly the greedy token), and the argmax of heads 2..k.
        Returns (proposals (A, k), log p1 of ŷ_{j+1} (A,))."""
        first = lprobs.argmax(dim=-1, keepdim=True)
        first_score = lprobs.gather(-1, first).squeeze(-1)
        if self.block_size == 1:
            return first, first_score
        logits = self.model.decoder.head_logits(features, range(1, self.block_size))
        position = last.unsqueeze(1) + torch.arange(1, self.block_size, device=last.device)
        rest = self.constrain(logits, position, max_len).argmax(dim=-1)
        return torch.cat([first, rest], dim=1), first_score

    def recompute_block(self, tokens, proposals, last, encoder_out, max_len):
        """Cache-off step: run the decoder on the whole prefix + proposals, return the states of the proposals."""
        index = last.unsqueeze(1) + torch.arange(1, self.block_size + 1, device=last.device)
        width = int(last.max()) + self.block_size + 1
        sequence = tokens[:, :width].scatter(1, index, proposals)
        positions = torch.arange(width, device=last.device).expand_as(sequence).clamp(max=max_len)
        x, _ = self.model.decoder(sequence, encoder_out, None, features_only=True, positions=positions)
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(-1)))

    @torch.no_grad()
    def generate(self, models, sample, bos_token=None, **kwargs):
        """fairseq's generator interface: for each sentence of ``sample`` a one-element list of hypotheses."""
        model, decoder, k = self.model, self.model.decoder, self.block_size
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.shape[:2]
        device = src_tokens.device
        # one limit for the batch, from its padded source length, as SequenceGenerator's
        max_len = self.max_lengths(src_tokens.new_full((1,), src_len), self.max_positions - 1)
        self.check_min_len(max_len)
        max_len = int(max_len)

        encoder_out = model.encoder.forward_torchscript(net_input)
        incremental_state = {} if self.use_cache else None
        offsets = torch.arange(1, k + 1, device=device)
        # rows of the sentences still decoding: tokens[:, t] = y_t (t = 0: BOS), scores[:, t] = log p1(y_t | y_<t)
        tokens = src_tokens.new_full((bsz, max_len + k + 2), self.pad)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        scores = torch.zeros(bsz, max_len + k + 2, device=device)
        active = torch.arange(bsz, device=device)
        last = torch.zeros(bsz, dtype=torch.long, device=device)  # position of the last accepted token
        steps = torch.ones(bsz, dtype=torch.long, device=device)
        out_tokens, out_scores = tokens.clone(), scores.clone()
        out_lengths, out_steps = torch.zeros_like(last), torch.zeros_like(last)

        # first call: BOS -> p1 of y_1 and the first proposals
        x, _ = decoder(tokens[:, :1], encoder_out, incremental_state, features_only=True, positions=last.unsqueeze(1))
        lprobs = self.head1_lprobs(x[:, 0], last, max_len)
        proposals, first_score = self.propose(x[:, 0], lprobs, last, max_len)
        finished = torch.zeros(bsz, dtype=torch.bool, device=device)
        while True:
            # ŷ_{j+1} is accepted whatever happens: write it now, and end sentences whose next token is EOS
            tokens.scatter_(1, (last + 1).unsqueeze(1), proposals[:, :1])
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
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, keep)
                if self.use_cache:
                    decoder.reorder_incremental_state_scripting(incremental_state, keep)

            # one call scores the proposals (p1 at their positions) and holds the states for the next proposals
            if self.use_cache:
                positions = (last.unsqueeze(1) + offsets).clamp(max=max_len)
                x, _ = decoder(proposals, encoder_out, incremental_state, features_only=True, positions=positions)
            else:
                x = self.recompute_block(tokens, proposals, last, encoder_out, max_len)
            steps += 1
            verify = self.head1_lprobs(x, last.unsqueeze(1) + offsets, max_len)
            accepted, finished, proposal_scores = accepted_lengths(
                proposals, verify[:, :-1], self.top_m, self.min_block_size, self.eos
            )
            index = last.unsqueeze(1) + offsets
            take = offsets.unsqueeze(0) <= accepted.unsqueeze(1)
            block_scores = torch.cat([first_score.unsqueeze(1), proposal_scores], dim=1)
            tokens.scatter_(1, index, torch.where(take, proposals, tokens.gather(1, index)))
            scores.scatter_(1, index, torch.where(take, block_scores, scores.gather(1, index)))
            if self.use_cache:
                decoder.rollback_incremental_state(incremental_state, k, accepted)
            last = last + accepted
            # the next proposals come from the last accepted position
            rows = torch.arange(last.size(0), device=device)
            proposals, first_score = self.propose(x[rows, accepted - 1], verify[rows, accepted - 1], last, max_len)

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
