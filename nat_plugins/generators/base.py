"""What the plugin decoders share: one construction signature, fairseq's generation options parsed once, and the
rules of fairseq's ``SequenceGenerator`` for lengths, pad, unk and scores, so that ``--max-len-a/-b``, ``--min-len``,
``--lenpen``, ``--unkpen``, ``--unnormalized`` and ``--temperature`` mean for every plugin model what they mean
for an AR Transformer in ``fairseq-generate``; and the base of every generator's own decoding options,
:class:`DecodingConfig`."""

import dataclasses
import math
from typing import Any, Dict, Iterable, List, Optional, Tuple, Type, TypeVar, Union

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.configs import GenerationConfig
from torch import nn

# fairseq's encoder output (``encoder_out``, ``encoder_padding_mask``, ...: lists of tensors)
EncoderOut = Dict[str, List[torch.Tensor]]
# one hypothesis in fairseq's format (``tokens``, ``score``, ``positional_scores``, ...) plus the plugin's ``steps``
Hypothesis = Dict[str, Any]

Config = TypeVar("Config", bound="DecodingConfig")


@dataclasses.dataclass
class DecodingConfig(FairseqDataclass):
    """A generator's own decoding options, declared in its file beside it. They are options of the task
    ``translation_nat``, whose config (:class:`~nat_plugins.tasks.translation_nat.TranslationNATConfig`) is composed
    from these classes: so they reach ``fairseq-generate``/``-interactive`` and the hub with their help text and stay
    out of the checkpoint's model options, which would freeze them.

    ``owners``: the registered model architectures whose decoder reads every option of the class; the task refuses a
    value other than the default for any other model (its table
    :data:`~nat_plugins.tasks.translation_nat.DECODING_OPTIONS`, derived by :func:`option_owners`). Options read by
    other systems than the class's go in a class of their own. A class parses and checks its options once (its
    ``parsed`` method, where they need it), and its generator reads them through it."""

    # a class attribute, not annotated: dataclasses keep a ClassVar among ``__dataclass_fields__``, which fairseq
    # would turn into an option --owners
    owners = ()  # type: Tuple[str, ...]

    @classmethod
    def option_names(cls) -> Tuple[str, ...]:
        """The options the class declares (fairseq's private ``_name`` excluded)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in FairseqDataclass.__dataclass_fields__)

    @classmethod
    def of(cls: Type[Config], cfg: Any) -> Config:
        """The class's options as ``cfg`` sets them (the task's config: its dataclass, fairseq's omegaconf
        ``DictConfig`` or a namespace), defaults where it has none: fairseq's ``from_namespace``, which returns
        ``cfg`` itself when it is an instance of the class."""
        return cls.from_namespace(cfg)


def option_owners(configs: Iterable[Type[DecodingConfig]]) -> Dict[str, Tuple[str, ...]]:
    """``{option: owners}`` over the :class:`DecodingConfig` classes ``configs``, in their order of declaration. An
    option declared twice, or a class without owners, is a ``TypeError``."""
    table: Dict[str, Tuple[str, ...]] = {}
    for config in configs:
        if not config.owners:
            raise TypeError(f"{config.__name__} names no owners (the model architectures whose decoder reads it)")
        for name in config.option_names():
            if name in table:
                raise TypeError(f"the decoding option {name} is declared twice (again by {config.__name__})")
            table[name] = config.owners
    return table


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
    options it lacks take fairseq's defaults); the decoder's own options are the task's (``task.cfg``), declared
    by the generator's :class:`DecodingConfig`.

    Subclasses set ``name`` (error messages), may extend ``unsupported_options`` and implement :meth:`decode`, which
    :meth:`generate` (fairseq's generator interface) calls. ``--prefix-size`` and ``--constraints`` are refused here;
    prefix tokens, constraints and another start symbol passed to :meth:`generate` (fairseq-generate's
    ``inference_step``, the hub's ``inference_step_args``, a direct call) by :meth:`refuse_search_inputs`."""

    name = "plugin decoding"
    unsupported_options = UNSUPPORTED_OPTIONS
    default_beam = 1  # --beam of a config that has none (``--eval-bleu-args '{}'``): greedy

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        if len(models) != 1:
            raise ValueError(f"{self.name} decodes one model, got an ensemble of {len(models)} (--path)")
        for name, off in self.unsupported_options.items():
            value = getattr(gen_args, name, off)
            if value not in (off, None):
                raise ValueError(f"--{name.replace('_', '-')} {value} is not supported by {self.name}")

        def option(name: str) -> Any:
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
    ) -> List[List[Hypothesis]]:
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

    def decode(self, sample: Dict[str, Any]) -> List[List[Hypothesis]]:
        """The hypotheses of ``sample`` (fairseq's format, one list per sentence): the subclass's decoding."""
        raise NotImplementedError

    def refuse_search_inputs(
        self,
        prefix_tokens: Optional[torch.Tensor] = None,
        constraints: Optional[torch.Tensor] = None,
        bos_token: Optional[int] = None,
    ) -> None:
        """Refuse what fairseq's beam search takes besides the source: the plugin decoders start from BOS and search
        without lexical constraints, so they would drop them (a decoder that implements one does not pass it)."""
        for value, what in (
            (prefix_tokens, "prefix_tokens (fairseq-generate's --prefix-size, the hub's inference_step_args) are"),
            (constraints, "constraints (fairseq-generate's --constraints, the hub's inference_step_args) are"),
            (bos_token, "a bos_token (another start symbol than EOS) is"),
        ):
            if value is not None:
                raise ValueError(f"{what} not supported by {self.name}: decode without it")

    def require_greedy(self, why: str) -> None:
        """Refuse ``--beam`` other than 1: the decoder ``why`` (part of the message) is greedy."""
        if self.beam_size != 1:
            raise ValueError(f"{self.name} {why}: pass --beam 1 (got {self.beam_size})")

    def batch_max_len(self, src_tokens: torch.Tensor, cap: int) -> int:
        """fairseq ``SequenceGenerator``'s maximum output length (EOS excluded) of a batch: ``--max-len-a`` × the
        batch's padded source length (``src_tokens.size(1)``, EOS and padding included) + ``--max-len-b``, at most
        ``cap`` (what the decoder's positions allow); refused below ``--min-len``. One limit for every sentence of the
        batch, as fairseq's: with ``--max-len-a`` > 0 a sentence's limit depends on the longest source of its batch,
        and the decoders equal to fairseq's search (SAT with K = 1, RecoverSAT with K = 1, exact verify-accept) stay
        equal to it in every batch."""
        max_len = int(self.max_lengths(src_tokens.new_full((1,), src_tokens.size(1)), cap))
        self.check_min_len(max_len)
        return max_len

    def source_lengths(self, net_input: Dict[str, Any]) -> torch.Tensor:
        """Source lengths (B,) (EOS included) of a batch, on the device of its tokens."""
        src_tokens = net_input["src_tokens"]
        lengths = net_input.get("src_lengths")
        if lengths is None:
            lengths = src_tokens.ne(self.pad).long().sum(dim=1)
        return lengths.to(src_tokens.device)

    def max_lengths(self, src_lengths: torch.Tensor, cap: int) -> torch.Tensor:
        """Output tokens (EOS excluded) allowed per sentence (B,) for ``src_lengths`` (B,): max_len_a * source length +
        max_len_b, at most ``cap`` (what the decoder's positions allow)."""
        return (src_lengths.double() * self.max_len_a + self.max_len_b).long().clamp(max=cap)

    def check_min_len(self, max_len: Union[int, torch.Tensor]) -> None:
        """Refuse a ``--min-len`` above the maximum length ``max_len`` (a number, or a tensor of them)."""
        shortest = int(torch.as_tensor(max_len).min())
        if self.min_len > shortest:
            raise ValueError(
                f"--min-len {self.min_len} is larger than the maximum length {shortest} that "
                "--max-len-a/--max-len-b allow"
            )

    def constrain(
        self,
        scores: torch.Tensor,
        position: torch.Tensor,
        max_len: int,
        eos_too_early: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``SequenceGenerator``'s rules, in place, on ``scores`` (..., V) of the 0-based output ``position``
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

    def force_eos(
        self, scores: torch.Tensor, forced: torch.Tensor, eos_scores: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Only EOS where ``forced`` (``scores.shape[:-1]``), in place; EOS keeps ``eos_scores`` (default: its
        score in ``scores``)."""
        if eos_scores is None:
            eos_scores = scores[..., self.eos].clone()
        scores.masked_fill_(forced.unsqueeze(-1), -math.inf)
        scores[..., self.eos] = torch.where(forced, eos_scores, scores[..., self.eos])
        return scores

    def normalized(self, total: torch.Tensor, length: Union[int, torch.Tensor]) -> torch.Tensor:
        """fairseq's length normalisation of a score: ``total / length ** --lenpen`` (length with EOS)."""
        return total / length**self.len_penalty

    def keep_grouped(self, cache: Any, encoder_out: EncoderOut, keep: torch.Tensor) -> EncoderOut:
        """Keep the sentences ``keep`` (indices into the batch) of a grouped decoder's ``cache``
        (:meth:`~nat_plugins.modules.grouped_decoder.GroupedTransformerDecoder.new_cache`) and return their
        ``encoder_out`` (unchanged where the cache holds the encoder's keys and values: no longer read)."""
        self.model.decoder.reorder_cache(cache, keep)
        if cache.holds_encoder_out:
            return encoder_out
        return self.model.encoder.reorder_encoder_out(encoder_out, keep)

    def hypothesis(
        self,
        tokens: torch.Tensor,
        positional_scores: torch.Tensor,
        steps: int,
        score: Optional[torch.Tensor] = None,
        **extra: Any,
    ) -> Hypothesis:
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
