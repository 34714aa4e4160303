"""Group decoding for the Semi-Autoregressive Transformer (Wang et al., EMNLP 2018, §3 and §4.1).

One decoder call per group of K target positions: the call feeds the K inputs of the group (the previous
group's outputs; K start symbols first) and returns K distributions, one per position of the group. The
decoder's incremental key/value cache (fairseq's ``incremental_state``) grows by K positions per call.

* greedy (``--beam 1``): the argmax of each of the K distributions; a sentence stops at the first group that
  contains EOS and is cut after it (positions after EOS are padding, as in training).
* beam search (``--beam B``): fairseq's beam search (``SequenceGenerator`` + ``BeamSearch``), run position by
  position, where the distributions of the positions inside a group come from that group's single decoder
  call (as in the paper's released code): each hypothesis reads the distribution of the beam it grew from at
  the group's start. Hypotheses ending in EOS are finalised with fairseq's length penalty (``--lenpen``);
  the cache is reordered with the beam once per group.

With K = 1 both are fairseq's greedy/beam search token for token. Sentences that finish leave the batch, so
batch size > 1 costs no extra steps; maximum lengths (``--max-len-a/b``) are per sentence, so a sentence
decodes the same in any batch. ``hypo["steps"]`` is the number of decoder calls made for the sentence.
"""

import math

import torch

from fairseq.dataclass.configs import GenerationConfig

from .base import PluginGenerator


class GroupDecoder(PluginGenerator):
    """Greedy (``--beam 1``) or beam search group decoding of one SAT model (see the module docstring)."""

    name = "SAT group decoding"
    default_beam = GenerationConfig.beam

    def __init__(self, models, task, gen_args):
        super().__init__(models, task, gen_args)
        if self.beam_size < 1:
            raise ValueError(f"--beam must be >= 1, got {self.beam_size}")
        self.vocab_size = len(self.tgt_dict)
        self.beam_size = min(self.beam_size, self.vocab_size - 1)
        self.group_size = self.model.decoder.group_size
        # the inputs of the group holding the last position (EOS) must fit the decoder's positions
        self.max_len_cap = self.model.max_decoder_positions() // self.group_size * self.group_size - 1

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        """fairseq's generator interface: for each sentence of ``sample`` a list of hypotheses, best first."""
        net_input = sample["net_input"]
        max_len = self.max_lengths(self.source_lengths(net_input), self.max_len_cap)
        self.check_min_len(max_len)
        encoder_out = self.model.encoder.forward_torchscript(net_input)
        if self.beam_size == 1:
            return self._greedy(encoder_out, max_len)
        return self._beam_search(encoder_out, max_len)

    def _group_lprobs(self, tokens, encoder_out, incremental_state, start, max_len):
        """Log-probabilities (N x K x V) of the group at positions ``start``..``start+K-1``, given the inputs
        ``tokens`` (N x (start+K)) of every group so far, with fairseq's constraints applied: never pad, the
        unk penalty, no EOS before ``--min-len``, only EOS at ``max_len`` (per row) and beyond."""
        logits, _ = self.model.decoder(tokens, encoder_out=encoder_out, incremental_state=incremental_state)
        if self.temperature != 1.0:
            logits = logits.div_(self.temperature)
        lprobs = self.model.get_normalized_probs((logits, None), log_probs=True)
        torch.nan_to_num_(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        positions = torch.arange(start, start + self.group_size, device=tokens.device)
        return self.constrain(lprobs, positions, max_len.unsqueeze(1))

    def _start_tokens(self, rows, max_len):
        """Token buffer for ``rows`` hypotheses: column c < K holds a start symbol, column K + p will hold output
        position p, for positions 0..max(max_len) rounded up to whole groups."""
        width = -(-(int(max_len.max()) + 1) // self.group_size) * self.group_size
        tokens = torch.full((rows, self.group_size + width), self.pad, dtype=torch.long, device=max_len.device)
        tokens[:, : self.group_size] = self.eos
        return tokens

    def _reorder(self, incremental_state, encoder_out, order):
        self.model.decoder.reorder_incremental_state_scripting(incremental_state, order)
        return self.model.encoder.reorder_encoder_out(encoder_out, order)

    def _greedy(self, encoder_out, max_len):
        K = self.group_size
        bsz = max_len.numel()
        tokens = self._start_tokens(bsz, max_len)
        pos_scores = torch.zeros(tokens[:, K:].shape, device=tokens.device)
        out_tokens, out_scores = tokens[:, K:].clone(), pos_scores.clone()
        lengths = torch.zeros(bsz, dtype=torch.long, device=tokens.device)
        steps = torch.zeros_like(lengths)
        sentence = torch.arange(bsz, device=tokens.device)  # sentence of each active row
        incremental_state = {}
        for group in range(pos_scores.size(1) // K):
            start = group * K
            lprobs = self._group_lprobs(tokens[:, : start + K], encoder_out, incremental_state, start, max_len)
            scores, predictions = lprobs.max(dim=2)
            tokens[:, K + start: 2 * K + start] = predictions
            pos_scores[:, start: start + K] = scores
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
            sentence, tokens, pos_scores, max_len = sentence[keep], tokens[keep], pos_scores[keep], max_len[keep]
            encoder_out = self._reorder(incremental_state, encoder_out, keep)
        return [
            [self.hypothesis(out_tokens[i, :length], out_scores[i, :length], step)]
            for i, (length, step) in enumerate(zip(lengths.tolist(), steps.tolist()))
        ]

    def _beam_search(self, encoder_out, max_len):
        """fairseq's beam search over positions (``SequenceGenerator._generate`` with ``BeamSearch.step``),
        calling the decoder at the first position of each group; ``cache_rows[r]`` is the row of the group's
        call (distributions, key/value cache) that the hypothesis in row ``r`` grew from."""
        K, beam, vocab = self.group_size, self.beam_size, self.vocab_size
        bsz, device = max_len.numel(), max_len.device
        encoder_out = self.model.encoder.reorder_encoder_out(
            encoder_out, torch.arange(bsz, device=device).repeat_interleave(beam))
        tokens = self._start_tokens(bsz * beam, max_len)
        width = tokens.size(1) - K
        scores = torch.zeros(bsz * beam, width, device=device)  # cumulative log-probability per position
        cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
        cand_offsets = torch.arange(2 * beam, device=device)
        bbsz_offsets = torch.arange(bsz, device=device).unsqueeze(1) * beam
        # finalised hypotheses: ``beam`` slots per sentence
        fin_tokens = torch.full((bsz, beam, width), self.pad, dtype=torch.long, device=device)
        fin_pos_scores = torch.zeros(bsz, beam, width, device=device)
        fin_scores = torch.full((bsz, beam), -math.inf, device=device)
        fin_lengths = torch.zeros(bsz, beam, dtype=torch.long, device=device)
        fin_count = torch.zeros(bsz, dtype=torch.long, device=device)
        steps = torch.zeros(bsz, dtype=torch.long, device=device)
        sentence = torch.arange(bsz, device=device)  # sentence of each active sentence row
        incremental_state, cache_rows = {}, None
        for step in range(int(max_len.max()) + 1):
            num_active = sentence.numel()
            if step % K == 0:
                if cache_rows is not None:
                    encoder_out = self._reorder(incremental_state, encoder_out, cache_rows)
                group_lprobs = self._group_lprobs(tokens[:, : step + K], encoder_out, incremental_state, step,
                                                  max_len.repeat_interleave(beam))
                cache_rows = torch.arange(num_active * beam, device=device)
            lprobs = group_lprobs[cache_rows, step % K].view(num_active, beam, vocab)

            # BeamSearch.step: the best 2*beam extensions of the sentence's beams
            if step == 0:
                lprobs = lprobs[:, :1]  # all beams are the same start
            else:
                lprobs = lprobs + scores[:, step - 1].view(num_active, beam, 1)
            lprobs = lprobs.reshape(num_active, -1)
            cand_scores, cand_indices = lprobs.topk(min(2 * beam, lprobs.size(1) - 1))
            cand_beams, cand_tokens = cand_indices // vocab, cand_indices % vocab
            cand_bbsz = cand_beams + bbsz_offsets

            eos_mask = cand_tokens.eq(self.eos) & cand_scores.ne(-math.inf)
            eos_mask[:, :beam][cands_to_ignore] = False
            finalize = eos_mask[:, :beam]
            if finalize.any():
                rank = finalize.long().cumsum(dim=1) - 1
                slot = fin_count[sentence].unsqueeze(1) + rank
                rows, cols = (finalize & (slot < beam)).nonzero(as_tuple=True)
                ids, slots, source = sentence[rows], slot[rows, cols], cand_bbsz[rows, cols]
                eos_scores = cand_scores[rows, cols]
                hyp_tokens = tokens[source, K: K + step + 1]
                hyp_tokens[:, step] = self.eos
                pos_scores = scores[source, : step + 1]
                pos_scores[:, step] = eos_scores
                pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
                fin_tokens[ids, slots, : step + 1] = hyp_tokens
                fin_pos_scores[ids, slots, : step + 1] = pos_scores
                if self.normalize_scores:
                    eos_scores = self.normalized(eos_scores, step + 1)
                fin_scores[ids, slots] = eos_scores
                fin_lengths[ids, slots] = step + 1
                fin_count.index_add_(0, ids, torch.ones_like(ids))

                done = (fin_count[sentence] >= beam) | (max_len <= step)
                if done.any():
                    steps[sentence[done]] = step // K + 1
                    if done.all():
                        break
                    keep = (~done).nonzero().squeeze(1)
                    num_active = keep.numel()
                    sentence, max_len, cands_to_ignore = sentence[keep], max_len[keep], cands_to_ignore[keep]
                    eos_mask, cand_scores, cand_tokens = eos_mask[keep], cand_scores[keep], cand_tokens[keep]
                    bbsz_offsets = bbsz_offsets[:num_active]
                    cand_bbsz = cand_beams[keep] + bbsz_offsets
                    keep_rows = (keep.unsqueeze(1) * beam + torch.arange(beam, device=device)).view(-1)
                    tokens, scores, cache_rows = tokens[keep_rows], scores[keep_rows], cache_rows[keep_rows]

            # the first ``beam`` candidates that do not end in EOS (nor are to be ignored) go on
            eos_mask[:, :beam] |= cands_to_ignore
            active_mask = eos_mask.long() * (2 * beam) + cand_offsets[: eos_mask.size(1)]
            new_cands_to_ignore, active_hypos = active_mask.topk(beam, dim=1, largest=False)
            cands_to_ignore = new_cands_to_ignore.ge(2 * beam)
            active_rows = cand_bbsz.gather(1, active_hypos).view(-1)
            tokens[:, : K + step] = tokens[active_rows, : K + step]
            tokens[:, K + step] = cand_tokens.gather(1, active_hypos).view(-1)
            if step > 0:
                scores[:, :step] = scores[active_rows, :step]
            scores[:, step] = cand_scores.gather(1, active_hypos).view(-1)
            cache_rows = cache_rows[active_rows]

        order = fin_scores.sort(dim=1, descending=True, stable=True).indices.tolist()
        counts, lengths, steps = fin_count.tolist(), fin_lengths.tolist(), steps.tolist()
        return [
            [
                self.hypothesis(fin_tokens[i, s, : lengths[i][s]], fin_pos_scores[i, s, : lengths[i][s]], steps[i],
                                score=fin_scores[i, s])
                for s in order[i][: counts[i]]
            ]
            for i in range(bsz)
        ]
