"""What the plugin decoders share: one construction signature, fairseq's generation options parsed once, and the
rules of fairseq's ``SequenceGenerator`` for lengths, pad, unk and scores, so that ``--max-len-a/-b``, ``--min-len``,
``--lenpen``, ``--unkpen``, ``--unnormalized`` and ``--temperature`` mean for every plugin model what they mean
for an AR Transformer in ``fairseq-generate``."""

import math

import torch
from fairseq.dataclass.configs import GenerationConfig

from ..modules.cpu_linear import use_weight_first_linears

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

    Subclasses set ``name`` (error messages), may extend ``unsupported_options`` and implement
    ``generate(models, sample, **kwargs)`` (fairseq's generator interface). ``--prefix-size`` and ``--constraints``
    are refused here; prefix tokens and constraints given otherwise (the hub's ``inference_step_args``) are refused by
    :meth:`refuse_search_inputs`, which the task's ``inference_step`` calls."""

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

        self.model = use_weight_first_linears(models[0])  # CPU: faster few-row products (modules/cpu_linear.py)
        self.tgt_dict = task.target_dictionary
        self.pad, self.eos, self.unk = self.tgt_dict.pad(), self.tgt_dict.eos(), self.tgt_dict.unk()
        self.beam_size = getattr(gen_args, "beam", self.default_beam)
        self.max_len_a, self.max_len_b, self.min_len = option("max_len_a"), option("max_len_b"), option("min_len")
        self.normalize_scores = not option("unnormalized")
        self.len_penalty, self.unk_penalty = option("lenpen"), option("unkpen")
        self.temperature = option("temperature")
        if self.temperature <= 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")

    def refuse_search_inputs(self, prefix_tokens=None, constraints=None):
        """Refuse what fairseq's beam search takes besides the source: the plugin decoders start from BOS and search
        without lexical constraints, so they would drop them."""
        for value, name, flag in (
            (prefix_tokens, "prefix_tokens", "--prefix-size"),
            (constraints, "constraints", "--constraints"),
        ):
            if value is not None:
                raise ValueError(
                    f"{name} (fairseq-generate's {flag}, the hub's inference_step_args) are not supported by "
                    f"{self.name}: decode without them"
                )

    def require_greedy(self, why):
        if self.beam_size != 1:
            raise ValueError(f"{self.name} {why}: pass --beam 1 (got {self.beam_size})")

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
        shortest = int(max_len.min())
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
