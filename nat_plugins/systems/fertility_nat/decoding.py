"""Decoding of ``fertility_nat`` (Gu et al., ICLR 2018, §4.1 "Inference"): one batched decoder pass.

``--fertility-decoding`` (a ``translation_nat`` task option, :class:`FertilityNATDecodingConfig`, so it is not frozen
into the checkpoint):

* ``argmax``: f_j = argmax_f p_F(f | x, j) at every source position, then the argmax token at every target position;
* ``average``: f_j = Round(sum_f f * p_F(f | x, j)), the rounded expected fertility (§4.1 "average decoding");
* ``npd``: noisy parallel decoding: ``--npd-samples`` S fertility sequences per sentence, which ``--npd-candidates``
  chooses: ``argmax_and_samples`` (default) the argmax sequence first and S-1 sampled from p_F, so S counts the
  argmax and the output never scores below argmax decoding under the teacher; ``samples`` S sequences sampled from
  p_F and no argmax, the protocol of §4.1 (samples drawn from the fertility space, each translated, the one the
  teacher scores best kept), under which S = 1 is a single random sample. Duplicate sequences are dropped (after
  the length limits below, which can make samples equal) before any decoding, the distinct ones decoded in one
  batched decoder pass (the copied source inputs computed once per sentence), every candidate rescored by the AR
  teacher (``--npd-teacher``) in one teacher-forced parallel pass (its target logits minus their log-sum-exp, no
  log-softmax over the vocabulary), and the best candidate kept per sentence (ties: the earlier candidate, so S=1
  with the argmax is argmax decoding). ``--npd-ranking`` ranks the candidates by the teacher's log-probability of
  the tokens and the final EOS: ``mean`` (default) divided by (length + 1) ** ``--lenpen`` (1: per token), as the
  authors' released code ranks them (salesforce/nonauto-nmt, decode.py at its decode scripts' ``--alpha 1``: the
  teacher's mean loss per token), or ``sum``, the plain log-probability of eq. 8 of the paper, which prefers shorter
  candidates (on Multi30k it fell below argmax decoding: docs/design-notes.md, *Which candidate NPD should keep*).
  The sampled candidates depend on the random state (fairseq's ``--seed``), so with
  samples the output of a sentence depends on its batch; argmax and average decoding (and NPD with S = 1 and the
  argmax) do not.

Every sentence gets at least one token (a zero total fertility gives fertility 1 to the source subword least
likely to have fertility 0) and at most ``--max-len-a`` * source length + ``--max-len-b`` tokens (also capped by
the decoder's positions; fertilities are cut from the end of the source). Pad and EOS are never emitted inside a
hypothesis (the NAT's targets have no EOS, :func:`nat_output`); EOS is appended. ``positional_scores`` are the NAT's
log-probabilities of the tokens, 0 for the appended EOS, which the NAT does not model; ``score`` is their sum
normalised like fairseq's (``--unnormalized``, ``--lenpen``); NPD adds ``teacher_score``, the ranking score.
``hypo["steps"]`` = 1 (one decoder pass), 2 with NPD (+ the teacher pass).
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional

import torch
from fairseq.dataclass import ChoiceEnum
from torch import nn

from ...engine import bucketed, length_buckets_wanted, widened
from ...generators.base import DecodingConfig, Hypothesis, PluginGenerator
from ...modules.teacher import FrozenTeacher
from .fertility import average_fertility, cap_total, ensure_nonempty, nat_output, sample_fertilities
from .onnx_decoding import OnnxFertilityNAT

FERTILITY_DECODING_MODES = ChoiceEnum(["argmax", "average", "npd"])
NPD_CANDIDATES = ChoiceEnum(["argmax_and_samples", "samples"])
NPD_RANKINGS = ChoiceEnum(["mean", "sum"])
logger = logging.getLogger(__name__)


class FertilityDecoding(NamedTuple):
    """The decoding mode of :class:`FertilityNATDecodingConfig`, parsed: ``samples`` S candidates per sentence (1
    unless NPD), the first of them the argmax sequence when ``with_argmax``; NPD's ``teacher`` and ranking."""

    mode: str
    samples: int
    with_argmax: bool
    teacher: Optional[str]
    ranking: str


@dataclass
class FertilityNATDecodingConfig(DecodingConfig):
    """The fertilities ``fertility_nat`` decodes with (Gu et al. 2018, §4.1 "Inference": argmax, average, noisy
    parallel decoding) and NPD's candidates, teacher and ranking (eq. 8); see the module docstring."""

    owners = ("fertility_nat",)

    fertility_decoding: FERTILITY_DECODING_MODES = field(
        default="argmax",
        metadata={
            "help": "fertility_nat: 'argmax' fertilities, 'average' (rounded expected fertility) or 'npd' "
            "(noisy parallel decoding: --npd-samples candidates rescored by --npd-teacher)"
        },
    )
    npd_samples: int = field(
        default=10,
        metadata={
            "help": "fertility_nat NPD: S, the candidate fertility sequences per sentence; with --npd-candidates "
            "argmax_and_samples (the default) S counts the argmax sequence: it is the argmax plus S-1 samples"
        },
    )
    npd_candidates: NPD_CANDIDATES = field(
        default="argmax_and_samples",
        metadata={
            "help": "fertility_nat NPD: 'argmax_and_samples' (default): the argmax fertility sequence and S-1 samples "
            "from the fertility predictor, so the output never scores below argmax decoding under the teacher; "
            "'samples': S samples and no argmax (Gu et al. 2018 §4.1's protocol)"
        },
    )
    npd_teacher: Optional[str] = field(
        default=None, metadata={"help": "fertility_nat NPD: the AR teacher checkpoint that rescores the candidates"}
    )
    npd_ranking: NPD_RANKINGS = field(
        default="mean",
        metadata={
            "help": "fertility_nat NPD: rank the candidates by the teacher's log-probability 'mean' (default: "
            "divided by (length + 1) ** --lenpen, as the authors' released code ranks them) or 'sum' (Gu et al. "
            "eq. 8, which prefers shorter candidates)"
        },
    )
    npd_length_normalize: bool = field(
        default=False,
        metadata={"help": "fertility_nat NPD: deprecated, the default ranking now (--npd-ranking mean)"},
    )
    onnx_model: Optional[str] = field(
        default=None,
        metadata={
            "help": "fertility_nat: DIR of the graphs `nat-export-onnx CHECKPOINT DIR [--int8]` wrote for this "
            "checkpoint: its pass (encoder + fertility predictor, then the decoder) runs in ONNX Runtime on the CPU "
            "(--cpu; --fertility-decoding argmax or average); graphs of another checkpoint are refused"
        },
    )

    @classmethod
    def parsed(cls, cfg: Any) -> FertilityDecoding:
        """``cfg``'s mode and NPD options, checked: S >= 1, NPD needs a teacher, the NPD options only with NPD."""
        options = cls.of(cfg)
        if options.npd_samples < 1:
            raise ValueError(f"--npd-samples must be >= 1, got {options.npd_samples}")
        mode = options.fertility_decoding
        if mode == "npd":
            if not options.npd_teacher:
                raise ValueError(
                    "--fertility-decoding npd needs --npd-teacher PATH (the AR teacher checkpoint that "
                    "rescores the candidates)"
                )
        elif (
            options.npd_teacher
            or options.npd_length_normalize
            or options.npd_candidates != "argmax_and_samples"
            or options.npd_ranking != "mean"
        ):
            raise ValueError(
                "--npd-teacher, --npd-ranking and --npd-candidates are only used by --fertility-decoding npd "
                f"(got {mode})"
            )
        if options.npd_length_normalize:
            if options.npd_ranking != "mean":
                raise ValueError("--npd-length-normalize (deprecated) is --npd-ranking mean: drop one of them")
            logger.warning("--npd-length-normalize is deprecated: it is the default ranking (--npd-ranking mean)")
        return FertilityDecoding(
            mode=mode,
            samples=options.npd_samples if mode == "npd" else 1,
            with_argmax=mode != "npd" or options.npd_candidates == "argmax_and_samples",
            teacher=options.npd_teacher if mode == "npd" else None,
            ranking=options.npd_ranking,
        )


def first_occurrences(candidates: torch.Tensor) -> torch.Tensor:
    """``candidates`` (B, S, S_src) (S fertility sequences per sentence) -> (B, S) bool: True where the sequence
    differs from every earlier one of its sentence (NPD decodes each distinct sequence once)."""
    same = candidates.unsqueeze(2).eq(candidates.unsqueeze(1)).all(dim=-1)  # (B, S, S): [b, i, k] = f_i == f_k
    earlier = torch.ones_like(same[0]).tril(diagonal=-1)  # k < i
    return ~(same & earlier).any(dim=-1)


class FertilityNATGenerator(PluginGenerator):
    """Argmax / average / noisy parallel decoding of one ``fertility_nat`` model (see the module docstring); the
    mode and the NPD options are the task's."""

    name = "fertility_nat decoding"

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        super().__init__(models, task, gen_args)
        self.require_greedy(
            "is one parallel pass (for several candidates use --fertility-decoding npd --npd-samples S)"
        )
        decoding = FertilityNATDecodingConfig.parsed(task.cfg)
        self.mode = decoding.mode
        self.npd_samples = decoding.samples
        self.npd_with_argmax = decoding.with_argmax
        self.npd_ranking = decoding.ranking
        self.teacher = None
        if decoding.teacher is not None:
            self.teacher = FrozenTeacher(decoding.teacher, task, "--npd-teacher")
        onnx_model = FertilityNATDecodingConfig.of(task.cfg).onnx_model
        self.onnx = OnnxFertilityNAT(onnx_model, self) if onnx_model else None  # --onnx-model

    def output_max_lengths(self, src_lengths: torch.Tensor) -> torch.Tensor:
        """Target tokens (EOS excluded) allowed per sentence (B,): max_len_a * |x| + max_len_b, capped by positions."""
        limit = self.model.max_decoder_positions()
        if self.teacher is not None:
            limit = min(limit, self.teacher.model.max_decoder_positions() - 1)
        return self.max_lengths(src_lengths, limit).clamp(min=1)

    def fertilities(self, fertility_lprobs: torch.Tensor, copyable: torch.Tensor) -> torch.Tensor:
        """Fertilities (B*S, S_src) (S candidates per sentence, adjacent rows) for the decoding mode, from
        ``fertility_lprobs`` (B, S_src, L) and ``copyable`` (B, S_src): the argmax or average ones (§4.1); with NPD
        the argmax one then S-1 samples, or S samples (``--npd-candidates``)."""
        if self.mode == "average":
            fertility = average_fertility(fertility_lprobs)
        elif self.npd_with_argmax and self.npd_samples == 1:  # argmax decoding, or NPD of the argmax alone
            fertility = fertility_lprobs.argmax(dim=-1)
        else:  # NPD: (S, B, S_src) candidates
            candidates = [fertility_lprobs.argmax(dim=-1).unsqueeze(0)] if self.npd_with_argmax else []
            candidates.append(sample_fertilities(fertility_lprobs, self.npd_samples - len(candidates)))
            fertility = torch.cat(candidates).transpose(0, 1).flatten(0, 1)
            copyable = copyable.repeat_interleave(self.npd_samples, dim=0)
        return fertility.masked_fill(~copyable, 0)

    def decode(self, sample: Dict[str, Any]) -> List[List[Hypothesis]]:
        """For each sentence of ``sample`` a one-element list of hypotheses."""
        if self.onnx is not None:  # the pass in ONNX Runtime, the same rules (onnx_decoding.py)
            return self.onnx.decode(sample)
        model, S = self.model, self.npd_samples
        src_tokens = sample["net_input"]["src_tokens"]
        src_lengths = self.source_lengths(sample["net_input"])
        bsz, width = src_tokens.shape
        # on CUDA the NAT reads the source left-padded to a bucket (engine.length_buckets: a cuDNN plan per new
        # shape); the fertilities are chosen on its real columns, so NPD draws its samples as without buckets
        buckets = length_buckets_wanted(src_tokens)
        source = src_tokens
        if buckets:
            source = widened(src_tokens, bucketed(width), self.pad, on_the_left=True)

        encoder_out = model.encode(source, src_lengths)
        fertility_logits = model.fertility_logits(encoder_out)[:, -width:]
        fertility_lprobs = model.get_normalized_probs((fertility_logits, None), log_probs=True)
        copyable = model.copyable(src_tokens)
        fertility = self.fertilities(fertility_lprobs.float(), copyable)
        order = torch.arange(bsz, device=src_tokens.device).repeat_interleave(S)  # sentence of every candidate
        fertility = ensure_nonempty(fertility, fertility_lprobs[order], copyable[order], src_tokens.ne(self.pad)[order])
        fertility = cap_total(fertility, self.output_max_lengths(src_lengths)[order])
        if S > 1:  # only the distinct candidates are decoded and rescored
            distinct = first_occurrences(fertility.view(bsz, S, -1)).view(-1)
            kept = distinct.nonzero().squeeze(1)
            order, fertility = order[kept], fertility[kept]
        else:  # row n is sentence n
            order = None

        fertility = widened(fertility, source.size(1), 0, on_the_left=True)
        logits, padding = model.decode(source, encoder_out, fertility, order=order, length_buckets=buckets)
        tokens, scores, lengths = nat_output(logits, padding, self.pad, self.eos, self.unk, self.unk_penalty)

        steps, teacher_scores = 1, None
        if self.teacher is not None:
            teacher_scores = self.teacher_scores(src_tokens, src_lengths, tokens, lengths, order)
            if S > 1:  # the best distinct candidate of every sentence (dropped duplicates: -inf)
                ranked = teacher_scores.new_full((bsz * S,), -math.inf).index_copy_(0, kept, teacher_scores)
                slot = ranked.view(bsz, S).argmax(dim=1) + torch.arange(bsz, device=tokens.device) * S
                best = (distinct.long().cumsum(dim=0) - 1)[slot]  # row of that candidate among the kept ones
                tokens, scores, lengths = tokens[best], scores[best], lengths[best]
                teacher_scores = teacher_scores[best]
            steps = 2
        return self.hypotheses(tokens, scores, lengths, steps, teacher_scores)

    @torch.no_grad()
    def choice_margin(self, src_tokens: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor) -> float:
        """How close this generator's PyTorch pass on one sentence (``src_tokens`` (1, S), no padding; argmax or
        average fertilities) came to emitting ``theirs`` (another engine's tokens, ONNX Runtime's) instead of
        ``ours`` (its own): where the lengths differ, the smallest margin of a fertility choice (argmax: the top-2 gap
        of the fertility log-probabilities; average: the expected fertility's distance to a rounding boundary); else
        the top-2 gap of the decoder's log-probabilities (pad and EOS excluded) at the first position where the
        outputs part, or a fertility's margin if smaller. Below the benchmark's near-tie tolerance: a floating-point
        near-tie."""
        if self.mode == "npd":
            raise ValueError("choice_margin compares argmax or average decoding (NPD samples its candidates)")
        model = self.model
        src_lengths = src_tokens.new_full((1,), src_tokens.size(1))
        encoder_out = model.encode(src_tokens, src_lengths)
        lprobs = model.get_normalized_probs((model.fertility_logits(encoder_out), None), log_probs=True).float()
        copyable = model.copyable(src_tokens)
        if self.mode == "average":
            expected = (lprobs.exp() * torch.arange(lprobs.size(-1), dtype=lprobs.dtype)).sum(-1)
            margin = (expected - expected.floor() - 0.5).abs()
        else:
            top = lprobs.topk(2, dim=-1).values
            margin = top[..., 0] - top[..., 1]
        fertility_margin = float(margin[copyable].min())
        if len(ours) != len(theirs):
            return fertility_margin
        fertility = ensure_nonempty(self.fertilities(lprobs, copyable), lprobs, copyable, src_tokens.ne(self.pad))
        fertility = cap_total(fertility, self.output_max_lengths(src_lengths))
        logits, _ = model.decode(src_tokens, encoder_out, fertility)
        token_lprobs = torch.log_softmax(logits[0].float(), dim=-1)
        token_lprobs[:, [self.pad, self.eos]] = -math.inf  # never emitted
        position = int((ours != theirs).nonzero()[0])
        top = token_lprobs[position].topk(2).values
        return min(fertility_margin, float(top[0] - top[1]))

    def teacher_scores(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        order: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Ranking score (N,) of every candidate (row n translates sentence ``order[n]``; ``order`` None: sentence
        n): the teacher's log-probability of its tokens and EOS (Gu et al. eq. 8), divided by (length + 1) **
        ``--lenpen`` with ``--npd-ranking mean``; one teacher-forced pass over all rows, no log-softmax over the
        vocabulary."""
        self.teacher.to(next(self.model.parameters()))
        total = self.teacher.token_scores(src_tokens, src_lengths, tokens, lengths, order=order).sum(dim=1)
        return self.normalized(total, lengths.to(total.dtype) + 1) if self.npd_ranking == "mean" else total

    def hypotheses(
        self,
        tokens: torch.Tensor,
        scores: torch.Tensor,
        lengths: torch.Tensor,
        steps: int,
        teacher_scores: Optional[torch.Tensor],
    ) -> List[List[Hypothesis]]:
        """fairseq's hypotheses, one per sentence, from the NAT's ``tokens`` and ``scores`` (B, T) of ``lengths`` (B,)
        (EOS appended, scored 0); ``teacher_scores`` (B,): NPD's ranking score of each."""
        eos_column = tokens.new_full((tokens.size(0), 1), self.pad)
        tokens = torch.cat([tokens, eos_column], dim=1).scatter_(1, lengths.view(-1, 1), self.eos)
        scores = torch.cat([scores, scores.new_zeros(scores.size(0), 1)], dim=1)
        totals = scores.sum(dim=1)
        if self.normalize_scores:
            totals = self.normalized(totals, lengths.to(totals.dtype) + 1)
        hypos = []
        for i, length in enumerate((lengths + 1).tolist()):
            extra = {} if teacher_scores is None else {"teacher_score": teacher_scores[i]}
            hypos.append([self.hypothesis(tokens[i, :length], scores[i, :length], steps, score=totals[i], **extra)])
        return hypos
