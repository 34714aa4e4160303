"""Group decoding for the Semi-Autoregressive Transformer (Wang et al., EMNLP 2018, §3 and §4.1).

One decoder call per group of K target positions: the call feeds the K inputs of the group (the previous
group's outputs; K start symbols first) and returns K distributions, one per position of the group. The
decoder's key/value cache grows by K positions per call (greedy: the static step's buffers, beam search: fairseq's
``incremental_state``; :mod:`~nat_plugins.modules.grouped_decoder`).

* greedy (``--beam 1``): the argmax of each of the K distributions; a sentence stops at the first group that
  contains EOS and is cut after it (positions after EOS are padding, as in training).
* beam search (``--beam B``): fairseq's ``SequenceGenerator`` with ``search.BeamSearch``, which extends and prunes
  the hypotheses position by position. :class:`GroupEnsembleModel` calls the decoder at the first position of each
  group; at the other positions of the group each hypothesis reads the distribution of the row it grew from at
  the group's start, as the paper's released code prunes token by token over the cached per-position
  distributions. fairseq reorders the beam at every position; the reorders are composed and applied to the
  key/value cache and the encoder states once per group. Hypotheses ending in EOS are finalised by fairseq
  (``--lenpen``, ``--unnormalized``).

With ``--group-repeat-bias`` (beyond the paper: slot k >= 1 of a group reads the token emitted at slot k-1,
:class:`~.model.SATTransformerDecoder`) the decoder call returns the group's features and
the K distributions are computed slot by slot from them: greedy feeds each slot the argmax of the slot before it
(after the length and ``--min-len`` rules), beam search feeds each hypothesis its own token. Still one decoder call
per group; the scores are those of the training-time forward on the chosen tokens.

With K = 1 both are fairseq's greedy/beam search token for token, in any batch: the maximum output length is
fairseq's, ``--max-len-a`` × the batch's padded source length + ``--max-len-b`` for every sentence of the batch
(:meth:`~nat_plugins.generators.base.PluginGenerator.batch_max_len`; with ``--max-len-a`` > 0 a sentence's limit
depends on the longest source of its batch, as in fairseq-generate). Sentences that finish leave the batch, so
batch size > 1 costs no extra steps. ``hypo["steps"]`` is the number of decoder calls made for the sentence.
"""

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from fairseq import search
from fairseq.dataclass.configs import GenerationConfig
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from torch import nn

from ...engine import IncrementalCache
from ...generators.base import EncoderOut, Hypothesis, PluginGenerator


class GroupEnsembleModel(EnsembleModel):
    """fairseq's model wrapper, serving ``SequenceGenerator`` one decoder call per group of K positions (module
    docstring); ``SequenceGenerator`` applies the length rules to what it returns."""

    def __init__(self, generator: "SATGenerator") -> None:
        super().__init__([generator.model])
        self.generator = generator
        self.encoder_out = self.rows = self.lprobs = self.features = None

    def forward_encoder(self, net_input: Dict[str, Any]) -> List[EncoderOut]:
        """fairseq's ``forward_encoder``; the output is kept for the group's decoder call, no reorder composed yet."""
        encoder_outs = super().forward_encoder(net_input)
        self.encoder_out, self.rows = encoder_outs[0], None
        return encoder_outs

    def reorder_encoder_out(self, encoder_outs: List[EncoderOut], new_order: torch.Tensor) -> List[EncoderOut]:
        """Compose the reorder (fairseq calls this with every reorder of the beam): ``rows[h]`` is the row of the
        last decoder call (or of the encoder output) that hypothesis h grew from."""
        self.rows = new_order if self.rows is None else self.rows.index_select(0, new_order)
        return encoder_outs

    def reorder_incremental_state(self, incremental_states: List[Dict[str, Any]], new_order: torch.Tensor) -> None:
        """Nothing: the cache is reordered with ``rows`` at the next decoder call (:meth:`reorder_encoder_out` gets
        the same orders)."""

    def forward_decoder(
        self,
        tokens: torch.Tensor,
        encoder_outs: List[EncoderOut],
        incremental_states: List[Dict[str, Any]],
        temperature: float = 1.0,
    ) -> Tuple[torch.Tensor, None]:
        """Log-probabilities (N, V) of position ``tokens.size(1) - 1`` (``tokens`` (N, t): start symbol + outputs so
        far)."""
        K, step = self.generator.group_size, tokens.size(1) - 1
        generator = self.generator
        if step % K == 0:
            decoder = self.single_model.decoder
            self.encoder_out = self.single_model.encoder.reorder_encoder_out(self.encoder_out, self.rows)
            cache = IncrementalCache(decoder, incremental_states[0])  # fairseq's state, in the engine's interface
            cache.reorder(self.rows)
            inputs = decoder.group_inputs(tokens)
            if generator.repeat_bias:
                self.features = decoder.group_features(inputs, self.encoder_out, cache)
            else:
                self.lprobs = generator.group_lprobs(inputs, self.encoder_out, cache, temperature)
            self.rows = torch.arange(tokens.size(0), device=tokens.device)
        if not generator.repeat_bias:
            return self.lprobs[self.rows, step % K], None
        # the slot's distribution given the token this hypothesis chose at the slot before it
        slot = step % K
        previous = tokens[:, -1] if slot > 0 else None
        return generator.slot_lprobs(self.features[self.rows, slot], slot, previous, temperature), None


class SATGenerator(PluginGenerator):
    """Greedy (``--beam 1``) or beam search group decoding of one SAT model (see the module docstring)."""

    name = "SAT group decoding"
    default_beam = GenerationConfig.beam

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        super().__init__(models, task, gen_args)
        if self.beam_size < 1:
            raise ValueError(f"--beam must be >= 1, got {self.beam_size}")
        self.group_size = self.model.decoder.group_size
        self.repeat_bias = getattr(self.model.decoder, "has_repeat_bias", False)
        # the inputs of the group holding the last position (EOS) must fit the decoder's positions
        self.max_len_cap = self.model.max_decoder_positions() // self.group_size * self.group_size - 1
        self.beam_search = None
        if self.beam_size > 1:
            self.beam_search = SequenceGenerator(
                GroupEnsembleModel(self),
                self.tgt_dict,
                beam_size=self.beam_size,
                max_len_a=self.max_len_a,
                max_len_b=self.max_len_b,
                max_len=self.max_len_cap + 1,
                min_len=self.min_len,
                normalize_scores=self.normalize_scores,
                len_penalty=self.len_penalty,
                unk_penalty=self.unk_penalty,
                temperature=self.temperature,
                search_strategy=search.BeamSearch(self.tgt_dict),
            )

    def decode(self, sample: Dict[str, Any]) -> List[List[Hypothesis]]:
        """For each sentence of ``sample`` a list of hypotheses, best first; beam search is ``SequenceGenerator``'s,
        which applies the batch's maximum length (:meth:`batch_max_len`) itself."""
        net_input = sample["net_input"]
        max_len = self.batch_max_len(net_input["src_tokens"], self.max_len_cap)
        if self.beam_search is None:
            return self._greedy(self.model.encoder.forward_torchscript(net_input), net_input["src_tokens"], max_len)
        ensemble = self.beam_search.model
        hypos = self.beam_search.generate([self.model], sample)
        # do not keep the batch's states alive until the next one
        ensemble.encoder_out = ensemble.lprobs = ensemble.features = None
        for hyps in hypos:  # a sentence leaves the batch at the position where its last hypothesis ends
            steps = -(-max(len(h["tokens"]) for h in hyps) // self.group_size)
            for h in hyps:
                h["steps"] = steps
        return hypos

    def group_lprobs(
        self, inputs: torch.Tensor, encoder_out: EncoderOut, cache: Any, temperature: float
    ) -> torch.Tensor:
        """One decoder call: log-probabilities (N, K, V) of the group whose K inputs end ``inputs`` (the SAT
        decoder inputs so far: K start symbols, then the outputs of every earlier group); ``cache``: the decoder's
        (:meth:`~nat_plugins.modules.grouped_decoder.GroupedTransformerDecoder.new_cache`)."""
        decoder = self.model.decoder
        logits = decoder.output_layer(decoder.group_features(inputs, encoder_out, cache))
        if temperature != 1.0:
            logits = logits.div_(temperature)
        lprobs = self.model.get_normalized_probs((logits, None), log_probs=True)
        return torch.nan_to_num_(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)

    def slot_lprobs(
        self, features: torch.Tensor, slot: int, previous: Optional[torch.Tensor], temperature: float
    ) -> torch.Tensor:
        """Log-probabilities (N, V) of slot ``slot`` of a group from its features (N, C) and, for slot >= 1, the
        tokens ``previous`` (N,) emitted at the slot before it."""
        logits = self.model.decoder.slot_logits(features, slot, previous)
        if temperature != 1.0:
            logits = logits.div_(temperature)
        lprobs = self.model.get_normalized_probs((logits, None), log_probs=True)
        return torch.nan_to_num_(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)

    def greedy_group(
        self, inputs: torch.Tensor, start: int, encoder_out: EncoderOut, cache: Any, max_len: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(scores, tokens)`` (N, K) of the group at output positions ``start``..: the argmax tokens and their
        scores, under the length and ``--min-len`` rules (:meth:`constrain`, ``max_len``: the batch's); one decoder
        call."""
        K, device = self.group_size, inputs.device
        if not self.repeat_bias:
            lprobs = self.group_lprobs(inputs, encoder_out, cache, self.temperature)
            self.constrain(lprobs, torch.arange(start, start + K, device=device), max_len)
            return lprobs.max(dim=2)
        features = self.model.decoder.group_features(inputs, encoder_out, cache)
        scores, predictions = [], []
        for slot in range(K):
            previous = predictions[-1] if predictions else None
            lprobs = self.slot_lprobs(features[:, slot], slot, previous, self.temperature)
            self.constrain(lprobs, torch.tensor(start + slot, device=device), max_len)
            score, prediction = lprobs.max(dim=1)
            scores.append(score)
            predictions.append(prediction)
        return torch.stack(scores, dim=1), torch.stack(predictions, dim=1)

    def _greedy(self, encoder_out: EncoderOut, src_tokens: torch.Tensor, max_len: int) -> List[List[Hypothesis]]:
        K = self.group_size
        bsz, device = src_tokens.size(0), src_tokens.device
        # column c < K holds a start symbol, column K + p output position p (whole groups up to max_len)
        width = -(-(max_len + 1) // K) * K
        tokens = torch.full((bsz, K + width), self.pad, dtype=torch.long, device=device)
        tokens[:, :K] = self.eos
        pos_scores = torch.zeros(bsz, width, device=device)
        out_tokens, out_scores = tokens[:, K:].clone(), pos_scores.clone()
        lengths = torch.zeros(bsz, dtype=torch.long, device=device)
        steps = torch.zeros_like(lengths)
        sentence = torch.arange(bsz, device=device)  # sentence of each active row
        cache = self.model.decoder.new_cache(encoder_out, K + width)
        for group in range(width // K):
            start = group * K
            scores, predictions = self.greedy_group(tokens[:, : start + K], start, encoder_out, cache, max_len)
            tokens[:, K + start : 2 * K + start] = predictions
            pos_scores[:, start : start + K] = scores
            is_eos = predictions.eq(self.eos)
            done = is_eos.any(dim=1)
            if not done.any():
                continue
            finished = done.nonzero().squeeze(1)
            ids = sentence[finished]
            out_tokens[ids] = tokens[finished, K:]
            out_scores[ids] = pos_scores[finished]
            lengths[ids] = start + is_eos[finished].int().argmax(dim=1) + 1  # cut after the group's first EOS
            steps[ids] = group + 1
            if finished.numel() == sentence.numel():
                break
            keep = (~done).nonzero().squeeze(1)
            sentence, tokens, pos_scores = sentence[keep], tokens[keep], pos_scores[keep]
            encoder_out = self.keep_grouped(cache, encoder_out, keep)
        return [
            [self.hypothesis(out_tokens[i, :length], out_scores[i, :length], step)]
            for i, (length, step) in enumerate(zip(lengths.tolist(), steps.tolist()))
        ]
