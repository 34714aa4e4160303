"""Segment decoding for RecoverSAT (Ran et al., ACL 2020, §3.1 and §3.4).

All K segments of a sentence advance one token per decoder call (greedy, the argmax of each segment's
distribution), against the decoder's key/value cache, which grows by K positions per call (the static step's buffers
where it runs the decoder, :mod:`~nat_plugins.modules.grouped_decoder`).
A segment stops when it emits EOS or DEL, or is forced to EOS at its maximum length
(:meth:`RecoverSATGenerator.segment_max_len`): fairseq's length rule on the segment's even share,
int(a * ceil(|x| / K) + min(b, ceil(b / K) + 10)) tokens for ``--max-len-a`` a and ``--max-len-b`` b, where |x| is
the batch's padded source length as in fairseq's ``SequenceGenerator`` (one limit for the batch), also capped by the
decoder's positions. ``--max-len-b`` is shared out over the K segments with a margin of
:data:`SEGMENT_MARGIN` = 10 tokens each (the paper's margin), never more than b: the K caps add up to at least
fairseq's a * |x| + b, and each stays near its share (docs/design-notes.md, "Decoding options and generators"). With
K = 1 the cap is the AR model's limit a * |x| + b, so K = 1 is fairseq's greedy search for outputs of any length and
in any batch; the paper's cap, ceil(|x| / K) + 10 (its own |x|: decode at batch 1, or batches of one source length),
is ``--max-len-a 1 --max-len-b 10``.
The first segment never emits DEL (it has no predecessor to repeat; its distribution is renormalised without DEL,
so with K = 1 the scores are the AR model's) and not EOS before ``--min-len`` steps (fairseq's rule), so it is
never empty. Ended segments are fed padding, which the key padding mask hides.
A sentence leaves the batch when all its segments have ended, so batch size > 1 costs no extra steps.
``hypo["steps"]`` = decoder calls.

Output (§3.4): the segments that end with DEL are deleted, the others are concatenated without their EOS, and
one EOS ends the hypothesis. ``positional_scores`` are the kept tokens' log-probabilities; the final EOS carries
the log-probabilities of every other decision (segment ends, deleted segments), so the sum is the model's
log-probability of the whole segment output. With K = 1 this is fairseq's greedy search, token for token.

Every hypothesis carries ``hypo["segments"]``: the K segments' tokens (EOS and padding removed, a deleted
segment keeps its DEL). ``--print-segments`` (:class:`RecoverSATDecodingConfig`) has the task print them as
``SEG-<id>`` lines, `` | `` between segments (the paper's Table 5;
:meth:`~nat_plugins.tasks.translation_nat.TranslationNATTask.inference_step`).
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List

import torch
from torch import nn

from ...generators.base import DecodingConfig, EncoderOut, Hypothesis, PluginGenerator
from .segments import DEL_SYMBOL

# tokens a segment may emit beyond its share of --max-len-b (Ran et al. 2020's cap: ceil(|x| / K) + 10)
SEGMENT_MARGIN = 10


@dataclass
class RecoverSATDecodingConfig(DecodingConfig):
    """RecoverSAT's decoding option: print each hypothesis's segments (``hypo["segments"]``), as the paper's Table 5
    shows them, to see which segments were deleted (DEL, §3.3) and where they split the sentence. Read by the task
    (:meth:`~nat_plugins.tasks.translation_nat.TranslationNATTask.inference_step`), not the generator, which always
    returns the segments."""

    owners = ("recover_sat",)

    print_segments: bool = field(
        default=False, metadata={"help": "recover_sat: print each hypothesis's segments as SEG-<id> lines (' | ')"}
    )


class RecoverSATGenerator(PluginGenerator):
    """Greedy segment decoding of one RecoverSAT model (see the module docstring)."""

    name = "RecoverSAT segment decoding"

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        super().__init__(models, task, gen_args)
        self.require_greedy("is greedy (the paper's decoding)")
        self.num_segments = self.model.decoder.num_segments
        self.del_index = self.tgt_dict.index(DEL_SYMBOL)
        if self.del_index == self.unk:
            raise ValueError(f"the target dictionary has no {DEL_SYMBOL} symbol: is this a recover_sat model?")

    def segment_max_len(self, src_len: int) -> int:
        """Tokens a segment may emit before it is forced to EOS, for a batch of padded source length ``src_len``
        (fairseq's |x|): int(a * ceil(|x| / K) + min(b, ceil(b / K) + :data:`SEGMENT_MARGIN`)) for ``--max-len-a``
        a and ``--max-len-b`` b, at most the decoder's positions - 1, refused below ``--min-len`` (module
        docstring; K = 1: fairseq's a * |x| + b, :meth:`batch_max_len`)."""
        K = self.num_segments
        share_b = min(self.max_len_b, -(-self.max_len_b // K) + SEGMENT_MARGIN)
        max_len = int(self.max_len_a * -(-src_len // K) + share_b)
        max_len = max(0, min(max_len, self.model.max_decoder_positions() - 1))
        self.check_min_len(max_len)
        return max_len

    def decode(self, sample: Dict[str, Any]) -> List[List[Hypothesis]]:
        """For each sentence of ``sample`` a one-element list of hypotheses."""
        net_input = sample["net_input"]
        max_len = self.segment_max_len(net_input["src_tokens"].size(1))
        encoder_out = self.model.encoder.forward_torchscript(net_input)
        return self._decode(encoder_out, net_input["src_tokens"], max_len)

    def _step_lprobs(
        self,
        tokens: torch.Tensor,
        encoder_out: EncoderOut,
        cache: Any,
        step: int,
        max_len: int,
        first_segment: torch.Tensor,
    ) -> torch.Tensor:
        """One decoder call: log-probabilities (B, K, V) of every segment's next token, under fairseq's rules
        except that only the first segment (``first_segment``: K bools) is held to ``--min-len``; ``cache``: the
        decoder's (:meth:`~nat_plugins.modules.grouped_decoder.GroupedTransformerDecoder.new_cache`)."""
        decoder = self.model.decoder
        logits = decoder.output_layer(decoder.group_features(tokens, encoder_out, cache))
        logits = logits / self.temperature if self.temperature != 1.0 else logits
        logits[:, 0, self.del_index] = -math.inf  # the first segment has no predecessor to repeat
        lprobs = self.model.get_normalized_probs((logits, None), log_probs=True)
        position = torch.tensor(step, device=lprobs.device)
        return self.constrain(lprobs, position, max_len, eos_too_early=first_segment & (step < self.min_len))

    def _decode(self, encoder_out: EncoderOut, src_tokens: torch.Tensor, max_len: int) -> List[List[Hypothesis]]:
        K, device = self.num_segments, src_tokens.device
        bsz = src_tokens.size(0)
        num_steps = max_len + 1
        tokens = torch.full((bsz, (num_steps + 1) * K), self.pad, dtype=torch.long, device=device)
        tokens[:, :K] = self.eos  # start symbol of every segment
        outputs = torch.full((bsz, num_steps, K), self.pad, dtype=torch.long, device=device)
        scores = torch.zeros(bsz, num_steps, K, device=device)
        out_outputs, out_scores = outputs.clone(), scores.clone()
        steps = torch.zeros(bsz, dtype=torch.long, device=device)
        alive = torch.ones(bsz, K, dtype=torch.bool, device=device)
        sentence = torch.arange(bsz, device=device)  # sentence of each active row
        first_segment = torch.arange(K, device=device).eq(0)
        cache = self.model.decoder.new_cache(encoder_out, tokens.size(1))
        for step in range(num_steps):
            lprobs = self._step_lprobs(tokens[:, : (step + 1) * K], encoder_out, cache, step, max_len, first_segment)
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
            alive = alive[keep]
            encoder_out = self.keep_grouped(cache, encoder_out, keep)
        return [
            [self._postprocess(out_outputs[i, : steps[i]], out_scores[i, : steps[i]], int(steps[i]))]
            for i in range(bsz)
        ]

    def _postprocess(self, segment_tokens: torch.Tensor, segment_scores: torch.Tensor, steps: int) -> Hypothesis:
        """Post-processing (§3.4) of one sentence's segment outputs (T, K) (T = ``steps``; padding after each end)."""
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
