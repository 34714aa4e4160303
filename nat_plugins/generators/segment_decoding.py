"""Segment decoding for RecoverSAT (Ran et al., ACL 2020, §3.1 and §3.4).

All K segments of a sentence advance one token per decoder call (greedy, the argmax of each segment's
distribution), against the decoder's incremental key/value cache (fairseq's ``incremental_state``), which grows by
K positions per call. A segment stops when it emits EOS or DEL, or is forced to EOS at its maximum length:
fairseq's length rule applied to the segment's even share of the source, int(``--max-len-a`` * ceil(|x| / K) +
``--max-len-b``) tokens (also capped by the decoder's positions). With K = 1 that is the AR model's limit
a * |x| + b, so K = 1 is fairseq's greedy search for outputs of any length; the paper's cap, ceil(|x| / K) + 10,
is ``--max-len-a 1 --max-len-b 10`` (fairseq's defaults, 0 and 200, let every segment run to 200 tokens).
The first segment never emits DEL (it has no predecessor to repeat; its distribution is renormalised without DEL,
so with K = 1 the scores are the AR model's) and not EOS before ``--min-len`` steps (fairseq's rule), so it is
never empty. Ended segments are fed padding, which the key padding mask hides.
A sentence leaves the batch when all its segments have ended, so batch size > 1 costs no extra steps; maximum
lengths are per sentence, so a sentence decodes the same in any batch. ``hypo["steps"]`` = decoder calls.

Output (§3.4): the segments that end with DEL are deleted, the others are concatenated without their EOS, and
one EOS ends the hypothesis. ``positional_scores`` are the kept tokens' log-probabilities; the final EOS carries
the log-probabilities of every other decision (segment ends, deleted segments), so the sum is the model's
log-probability of the whole segment output. With K = 1 this is fairseq's greedy search, token for token.

Every hypothesis carries ``hypo["segments"]``: the K segments' tokens (EOS and padding removed, a deleted
segment keeps its DEL). ``--print-segments`` has the task print them as ``SEG-<id>`` lines, `` | `` between
segments (the paper's Table 5; :meth:`~nat_plugins.tasks.translation_nat.TranslationNATTask.inference_step`).
"""

import math

import torch

from ..modules.segments import DEL_SYMBOL
from .base import PluginGenerator


class RecoverSATGenerator(PluginGenerator):
    """Greedy segment decoding of one RecoverSAT model (see the module docstring)."""

    name = "RecoverSAT segment decoding"

    def __init__(self, models, task, gen_args):
        super().__init__(models, task, gen_args)
        self.require_greedy("is greedy (the paper's decoding)")
        self.num_segments = self.model.decoder.num_segments
        self.del_index = self.tgt_dict.index(DEL_SYMBOL)
        if self.del_index == self.unk:
            raise ValueError(f"the target dictionary has no {DEL_SYMBOL} symbol: is this a recover_sat model?")

    def segment_max_lengths(self, src_lengths):
        """Tokens a segment may emit before it is forced to EOS, per sentence: ``--max-len-a/-b`` applied to the
        segment's even share of the source, ceil(|x| / K) (:meth:`max_lengths`; K = 1: the AR model's limit)."""
        even_share = (src_lengths + self.num_segments - 1) // self.num_segments
        return self.max_lengths(even_share, self.model.max_decoder_positions() - 1).clamp_(min=0)

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        """fairseq's generator interface: for each sentence of ``sample`` a one-element list of hypotheses."""
        net_input = sample["net_input"]
        max_len = self.segment_max_lengths(self.source_lengths(net_input))
        encoder_out = self.model.encoder.forward_torchscript(net_input)
        return self._decode(encoder_out, max_len)

    def _step_lprobs(self, tokens, encoder_out, incremental_state, step, max_len, first_segment):
        """One decoder call: log-probabilities (rows x K x V) of every segment's next token, under fairseq's rules
        except that only the first segment (``first_segment``: K bools) is held to ``--min-len``."""
        logits, extra = self.model.decoder(tokens, encoder_out=encoder_out, incremental_state=incremental_state)
        logits = logits / self.temperature if self.temperature != 1.0 else logits
        logits[:, 0, self.del_index] = -math.inf  # the first segment has no predecessor to repeat
        lprobs = self.model.get_normalized_probs((logits, extra), log_probs=True)
        return self.constrain(lprobs, step, max_len.unsqueeze(1), eos_too_early=first_segment & (step < self.min_len))

    def _decode(self, encoder_out, max_len):
        K, device = self.num_segments, max_len.device
        bsz = max_len.numel()
        num_steps = int(max_len.max()) + 1
        tokens = torch.full((bsz, (num_steps + 1) * K), self.pad, dtype=torch.long, device=device)
        tokens[:, :K] = self.eos  # start symbol of every segment
        outputs = torch.full((bsz, num_steps, K), self.pad, dtype=torch.long, device=device)
        scores = torch.zeros(bsz, num_steps, K, device=device)
        out_outputs, out_scores = outputs.clone(), scores.clone()
        steps = torch.zeros(bsz, dtype=torch.long, device=device)
        alive = torch.ones(bsz, K, dtype=torch.bool, device=device)
        sentence = torch.arange(bsz, device=device)  # sentence of each active row
        first_segment = torch.arange(K, device=device).eq(0)
        incremental_state = {}
        for step in range(num_steps):
            lprobs = self._step_lprobs(
                tokens[:, : (step + 1) * K], encoder_out, incremental_state, step, max_len, first_segment
            )
            step_scores, predictions = lprobs.max(dim=2)
            predictions.masked_fill_(~alive, self.pad)
            outputs[:, step] = predictions
            scores[:, step] = step_scores.masked_fill(~alive, 0.0)
            alive &= predictions.ne(self.eos) & predictions.ne(self.del_index)
            tokens[:, (step + 1) * K : (step + 2) * K] = predictions.masked_fill(~alive, self.pad)
            done = ~alive.any(dim=1)
            if not done.any():
                continue
            finished = done.nonzero().squeeze(1)
            ids = sentence[finished]
            out_outputs[ids], out_scores[ids], steps[ids] = outputs[finished], scores[finished], step + 1
            if finished.numel() == sentence.numel():
                break
            keep = (~done).nonzero().squeeze(1)
            sentence, tokens, outputs, scores = sentence[keep], tokens[keep], outputs[keep], scores[keep]
            alive, max_len = alive[keep], max_len[keep]
            self.model.decoder.reorder_incremental_state_scripting(incremental_state, keep)
            encoder_out = self.model.encoder.reorder_encoder_out(encoder_out, keep)
        return [
            [self._postprocess(out_outputs[i, : steps[i]], out_scores[i, : steps[i]], int(steps[i]))]
            for i in range(bsz)
        ]

    def _postprocess(self, segment_tokens, segment_scores, steps):
        """Post-processing (§3.4) of one sentence's ``steps x K`` segment outputs (padding after each end)."""
        deleted = segment_tokens.eq(self.del_index).any(dim=0)
        kept = (
            segment_tokens.ne(self.pad)
            & segment_tokens.ne(self.eos)
            & segment_tokens.ne(self.del_index)
            & ~deleted.unsqueeze(0)
        ).t()
        tokens = segment_tokens.t()[kept]
        kept_scores = segment_scores.t()[kept]
        rest = segment_scores.sum() - kept_scores.sum()
        tokens = torch.cat([tokens, tokens.new_full((1,), self.eos)])
        pos_scores = torch.cat([kept_scores, rest.view(1)])
        segments = [column[column.ne(self.pad) & column.ne(self.eos)] for column in segment_tokens.t()]
        return self.hypothesis(
            tokens, pos_scores, steps, segments=segments, segment_tokens=segment_tokens, segment_scores=segment_scores
        )
