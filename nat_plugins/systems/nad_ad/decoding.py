"""Decoding for Encoder-NAD-AD (Zhou, Zhang & Zong 2020, §3.4): the NAD once, then AD beam search.

fairseq's :class:`~fairseq.sequence_generator.SequenceGenerator` does all of it unchanged (beam search, ``--beam 1``
greedy, ``--lenpen``, ``--sampling``, ``--prefix-size``, ensembles, batching), because the model's encoder returns
fairseq's ``encoder_out`` dict extended with the NAD memory (``nad_out``, ``nad_padding_mask``):

* ``forward_encoder`` runs the encoder and the NAD (with its predicted length or fertilities) once per sentence;
* ``reorder_encoder_out`` expands/reorders the NAD memory with the beam, like the encoder states;
* the AD's NAD-AD attention projects the NAD states to keys/values at the first step and keeps them in the
  ``incremental_state`` (static key/value, reordered with the beam by fairseq), as the encoder attention does.

This module adds what fairseq's generator lacks: ``hypo["steps"]`` (decoder calls for the sentence: one NAD pass + one
AD call per output token, EOS included, of its longest returned hypothesis, the last to end; so ``--print-step`` and
the benchmark's calls-per-sentence work) and ``hypo["nad_draft"]``: the NAD's argmax translation of the first model
(tokens, EOS and padding excluded), which ``--print-nad-draft`` (task option, :class:`NADADDecodingConfig`) has the task
print as ``NAD-<id>`` lines (:meth:`~nat_plugins.tasks.translation_nat.TranslationNATTask.inference_step`).

Like every model the task decodes, it goes through the decoding engine's switch first
(:func:`~nat_plugins.engine.prepare_for_decoding`), so Encoder-NAD-AD is timed in the layout of its AR baseline.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List

import torch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from fairseq.tasks import FairseqTask
from torch import nn

from ...engine import length_buckets_wanted
from ...generators.base import DecodingConfig, EncoderOut, Hypothesis


@dataclass
class NADADDecodingConfig(DecodingConfig):
    """Encoder-NAD-AD's decoding option: print the NAD's argmax draft (§3.4: the NAD runs once, the AD attends to its
    states), to compare what the NAD alone would output with the AD's translation. Read by the task, not the
    generator, which always returns the draft."""

    owners = ("nad_ad_transformer",)

    print_nad_draft: bool = field(
        default=False,
        metadata={"help": "nad_ad_transformer: print the NAD's argmax draft of each sentence as a NAD-<id> line"},
    )


class NADADEnsembleModel(EnsembleModel):
    """fairseq's ensemble wrapper that keeps the encoder outputs (with the NAD memory) of the last batch."""

    def __init__(self, models: List[nn.Module]) -> None:
        super().__init__(models)
        self.last_encoder_outs = None

    def forward_encoder(self, net_input: Dict[str, Any]) -> List[EncoderOut]:
        """fairseq's ``forward_encoder``, its outputs kept in ``last_encoder_outs``; on CUDA the source and the NAD
        lengths padded to buckets (:mod:`~nat_plugins.engine.length_buckets`: a cuDNN plan per new shape) inside
        the encoder, so that fairseq's search still sees the batch's own source width (``--max-len-a``)."""
        if length_buckets_wanted(net_input["src_tokens"]):
            net_input = {**net_input, "length_buckets": True}  # fairseq passes net_input's keys to encoder.forward
        self.last_encoder_outs = super().forward_encoder(net_input)
        return self.last_encoder_outs


class NADADGenerator(SequenceGenerator):
    """fairseq's beam search over the AD with the NAD memory cached like the encoder's (module docstring), built as
    every plugin generator is, ``NADADGenerator(models, task, gen_args)``: fairseq's ``build_generator``
    turns ``gen_args`` into the search strategy and ``SequenceGenerator``'s options."""

    def __init__(self, models: List[nn.Module], task: Any, gen_args: Any) -> None:
        if getattr(gen_args, "print_alignment", None):
            raise ValueError("--print-alignment is not supported by nad_ad_transformer decoding")
        options = FairseqTask.build_generator(
            task, models, gen_args, seq_gen_cls=lambda _models, _tgt_dict, **options: options
        )
        super().__init__(NADADEnsembleModel(models), task.target_dictionary, **options)

    @torch.no_grad()
    def generate(self, models: List[nn.Module], sample: Dict[str, Any], **kwargs: Any) -> List[List[Hypothesis]]:
        """fairseq's ``generate``; adds ``hypo["steps"]`` and ``hypo["nad_draft"]``."""
        finalized = super().generate(models, sample, **kwargs)
        encoder_outs = self.model.last_encoder_outs
        self.model.last_encoder_outs = None  # do not keep a batch's states alive until the next one
        drafts = self.model.single_model.nad_draft(encoder_outs[0])
        width = sample["net_input"]["src_tokens"].size(1)  # the encoder's may be wider (length_buckets)
        for hypos, draft in zip(finalized, drafts):
            draft = draft[draft.ne(self.pad) & draft.ne(self.eos)]
            # the sentence leaves the batch at the step its last finished hypothesis ends (beam search goes on
            # after the best one until --beam hypotheses have ended)
            steps = 1 + max(hypo["tokens"].numel() for hypo in hypos)
            for hypo in hypos:
                hypo["steps"] = steps
                hypo["nad_draft"] = draft
                if hypo["attention"].dim() == 2:  # (source, target): a bucketed source's pad columns dropped
                    hypo["attention"] = hypo["attention"][-width:]
        return finalized
