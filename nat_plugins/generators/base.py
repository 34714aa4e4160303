"""What the plugin decoders share: one construction signature, fairseq's generation options parsed once, and the
rules of fairseq's ``SequenceGenerator`` for lengths, pad, unk and scores, so that ``--max-len-a/-b``, ``--min-len``,
``--lenpen``, ``--unkpen``, ``--unnormalized`` and ``--temperature`` mean for every plugin model what they mean
for an AR Transformer in ``fairseq-generate``."""

import math
from typing import Any, Dict, List, Optional

import torch
from fairseq.dataclass.configs import GenerationConfig
from torch import nn

from ..engine.static_cache import StaticCache

# fairseq generation options no plugin decoder implements, with their "off" values
UNSUPPORTED_OPTIONS = {
    "sampling": False,
    "match_source_len": False,
    "no_repeat_ngram_size": 0,
    "diverse_beam_groups": -1,
    "diversity_rate": -1.0,
    "prefix_size": 0,
    "constraints": None,
    "lm_path": None,
    "print_alignment": None,
    "score_reference": False,
}


class PluginGenerator:
    """Base of the plugin decoders, built by ``TranslationNATTask.build_generator`` as
    ``generator_class(models, task, gen_args)``: ``gen_args`` is fairseq's generation config (``cfg.generation``;
    options it lacks take fairseq's defaults), the decoder's own options are the task's (``task.cfg``).

    Subclasses set ``name`` (error messages), may extend ``unsupported_options`` and implement :meth:`decode`, which
    :meth:`generate` (fairseq's generator interface) calls. ``--prefix-size`` and ``--constraints`` are refused here;
    prefix tokens, constraints and another start symbol passed to :meth:`generate` (fairseq-generate's
    ``inference_step``, the hub's ``inference_step_args``, a direct call) by :meth:`refuse_search_inputs`."""

    name = "plugin decoding"
    unsupported_options = UNSUPPORTED_OPTIONS
    default_beam = 1  # --beam of a config that has none (``--eval-bleu-args '{}'``): greedy

    def __init__(self, models, task, gen_args):
        if len(models) != 1:
            raise ValueError(f"{self.name} decodes one model, got an ensemble of {len(models)} (--path)")
        for name, off in self.unsupported_options.items():
            value = getattr(gen_args, name, off)
            if value not in (off, None):
                raise ValueError(f"--{name.replace('_', '-')} {value} is not supported by {self.name}")

        def option(name):
            return getattr(gen_args, name, getattr(GenerationConfig, name))

        self.model = models[0]
        self.tgt_dict = task.target_dictionary
        self.pad, self.eos, self.unk = self.tgt_dict.pad(), self.tgt_dict.eos(), self.tgt_dict.unk()
        self.beam_size = getattr(gen_args, "beam", self.default_beam)
        self.max_len_a, self.max_len_b, self.min_len = option("max_len_a"), option("max_len_b"), option("min_len")
        self.normalize_scores = not option("unnormalized")
        self.len_penalty, self.unk_penalty = option("lenpen"), option("unkpen")
        self.temperature = option("temperature")
        if self.temperature <= 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")

    @torch.no_grad()
    def generate(
        self,
        models: List[nn.Module],
        sample: Dict[str, Any],
        prefix_tokens: Optional[torch.Tensor] = None,
        constraints: Optional[torch.Tensor] = None,
        bos_token: Optional[int] = None,
    ) -> List[List[Dict[str, Any]]]:
        """fairseq's generator interface (the arguments of ``SequenceGenerator.generate``).

        Args:
            models: the model (one: no ensembles), as fairseq passes it.
            sample: a batch of fairseq's collater: ``net_input`` with ``src_tokens`` (B, S) and ``src_lengths`` (B,).
            prefix_tokens, constraints, bos_token: refused (:meth:`refuse_search_inputs`) rather than dropped.

        Returns:
            For each sentence a list of hypotheses, best first (:meth:`decode`), each a dict with ``tokens`` (T,),
            ``positional_scores`` (T,), ``score``, ``attention`` (None), ``alignment`` (None) and ``steps``."""
        self.refuse_search_inputs(prefix_tokens, constraints, bos_token)
        return self.decode(sample)

    def decode(self, sample: Dict[str, Any]) -> List[List[Dict[str, Any]]]:
        """The hypotheses of ``sample`` (fairseq's format, one list per sentence): the subclass's decoding."""
        raise NotImplementedError

    def refuse_search_inputs(self, prefix_tokens=None, constraints=None, bos_token=None):
        """Refuse what fairseq's beam search takes besides the source: the plugin decoders start from BOS and search
        without lexical constraints, so they would drop them (a decoder that implements one does not pass it)."""
        for value, what in (
            (prefix_tokens, "prefix_tokens (fairseq-generate's --prefix-size, the hub's inference_step_args) are"),
            (constraints, "constraints (fairseq-generate's --constraints, the hub's inference_step_args) are"),
            (bos_token, "a bos_token (another start symbol than EOS) is"),
        ):
            if value is not None:
                raise ValueError(f"{what} not supported by {self.name}: decode without it")

    def require_greedy(self, why):
        if self.beam_size != 1:
            raise ValueError(f"{self.name} {why}: pass --beam 1 (got {self.beam_size})")

    def batch_max_len(self, src_tokens, cap):
        """fairseq ``SequenceGenerator``'s maximum output length (EOS excluded) of a batch: ``--max-len-a`` × the
        batch's padded source length (``src_tokens.size(1)``, EOS and padding included) + ``--max-len-b``, at most
        ``cap`` (what the decoder's positions allow); refused below ``--min-len``. One limit for every sentence of the
        batch, as fairseq's: with ``--max-len-a`` > 0 a sentence's limit depends on the longest source of its batch,
        and the decoders equal to fairseq's search (SAT with K = 1, RecoverSAT with K = 1, exact verify-accept) stay
        equal to it in every batch."""
        max_len = int(self.max_lengths(src_tokens.new_full((1,), src_tokens.size(1)), cap))
        self.check_min_len(max_len)
        return max_len

    def source_lengths(self, net_input):
        """Source lengths (EOS included) of a batch, on the device of its tokens."""
        src_tokens = net_input["src_tokens"]
        lengths = net_input.get("src_lengths")
        if lengths is None:
            lengths = src_tokens.ne(self.pad).long().sum(dim=1)
        return lengths.to(src_tokens.device)

    def max_lengths(self, src_lengths, cap):
        """Output tokens (EOS excluded) allowed per sentence: max_len_a * source length + max_len_b, at most
        ``cap`` (what the decoder's positions allow)."""
        return (src_lengths.double() * self.max_len_a + self.max_len_b).long().clamp(max=cap)

    def check_min_len(self, max_len):
        """Refuse a ``--min-len`` above the maximum length ``max_len`` (a number, or a tensor of them)."""
        shortest = int(torch.as_tensor(max_len).min())
        if self.min_len > shortest:
            raise ValueError(
                f"--min-len {self.min_len} is larger than the maximum length {shortest} that "
                "--max-len-a/--max-len-b allow"
            )

    def constrain(self, scores, position, max_len, eos_too_early=None):
        """``SequenceGenerator``'s rules, in place, on ``scores`` (... x V) of the 0-based output ``position``
        (``position`` and ``max_len`` broadcast to ``scores.shape[:-1]``): never pad; ``--unkpen`` subtracted from
        unk; no EOS where ``eos_too_early`` (default: position < ``--min-len``); only EOS, with its own score, from
        ``max_len`` on."""
        scores[..., self.pad] = -math.inf
        scores[..., self.unk] -= self.unk_penalty
        eos_scores = scores[..., self.eos].clone()
        if eos_too_early is None:
            eos_too_early = position < self.min_len
        scores[..., self.eos].masked_fill_(eos_too_early, -math.inf)
        return self.force_eos(scores, position >= max_len, eos_scores)

    def force_eos(self, scores, forced, eos_scores=None):
        """Only EOS where ``forced`` (``scores.shape[:-1]``), in place; EOS keeps ``eos_scores`` (default: its
        score in ``scores``)."""
        if eos_scores is None:
            eos_scores = scores[..., self.eos].clone()
        scores.masked_fill_(forced.unsqueeze(-1), -math.inf)
        scores[..., self.eos] = torch.where(forced, eos_scores, scores[..., self.eos])
        return scores

    def normalized(self, total, length):
        """fairseq's length normalisation of a score: ``total / length ** --lenpen`` (length with EOS)."""
        return total / length**self.len_penalty

    def keep_grouped(self, cache, encoder_out, keep):
        """Keep the sentences ``keep`` (indices into the batch) of a grouped decoder's ``cache``
        (:meth:`~nat_plugins.modules.grouped_decoder.GroupedTransformerDecoder.new_cache`) and return their
        ``encoder_out`` (unchanged where the static cache holds the encoder's keys and values: no longer read)."""
        self.model.decoder.reorder_cache(cache, keep)
        if isinstance(cache, StaticCache):
            return encoder_out
        return self.model.encoder.reorder_encoder_out(encoder_out, keep)

    def hypothesis(self, tokens, positional_scores, steps, score=None, **extra):
        """One hypothesis in fairseq's format; ``tokens`` end with EOS, ``score`` defaults to the sum of
        ``positional_scores``, length-normalised unless ``--unnormalized``; ``steps`` = decoder calls."""
        if score is None:
            score = positional_scores.sum()
            if self.normalize_scores:
                score = self.normalized(score, tokens.numel())
        return {
            "tokens": tokens,
            "score": score,
            "attention": None,
            "alignment": None,
            "positional_scores": positional_scores,
            "steps": steps,
            **extra,
        }
