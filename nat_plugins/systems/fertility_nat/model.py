"""NAT with fertility (Gu, Bradbury, Xiong, Li & Socher, ICLR 2018, "Non-Autoregressive Neural Machine
Translation"): model ``fertility_nat``.

* encoder: fairseq's Transformer encoder;
* fertility predictor (§3.3): a softmax over fertilities 0..L-1 (``--max-fertility L``, default
  :data:`~nat_plugins.modules.options.DEFAULT_MAX_FERTILITY`) on the top encoder state of every source subword (EOS
  and padding always get fertility 0), after one ReLU hidden layer (``--fertility-hidden-layers 1``, the default) or
  directly, a one-layer softmax classifier (``--fertility-hidden-layers 0``);
* decoder inputs (§3.1, "copy source inputs"): the source token embedding *plus the source positional embedding*
  (as the released salesforce code does; the decoder then adds its own target positions) of source position j,
  copied f_j times (``--decoder-input-copy fertility``); or spread uniformly over the target length
  (``--decoder-input-copy uniform``, the paper's "Round(T't/T)" copy). With uniform copy the fertility predictor is
  still trained and the target length at inference is the sum of its argmax fertilities (the generator's
  ``--fertility-decoding`` choice), so both modes share one length rule;
* decoder: :class:`~nat_plugins.modules.nat_decoder.NonAutoregressiveDecoder` (self-attention masking each query's own
  position, ``--self-attn-mask-diagonal``, on by default as in §3.1; positional attention; encoder attention; FFN),
  then the output projection, tied to the target embeddings under ``--share-decoder-input-output-embed`` /
  ``--share-all-embeddings``.

Targets exclude EOS (the task's fertility convention: fertilities sum to the target length without EOS); the
generator appends EOS. Training: criterions ``fertility_nat_loss`` and ``nat_rkl_finetune``; decoding:
:mod:`.decoding` (``--fertility-decoding argmax|average|npd`` are *task* options, so they
are not frozen into the checkpoint).
"""

import argparse
import logging
from typing import Any, Dict, Optional, Tuple, Union

import torch
from fairseq.data import Dictionary
from fairseq.models import FairseqDecoder, register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
)
from fairseq.tasks import FairseqTask
from torch import nn

from ...engine import bucketed, widened
from ...modules.nat_decoder import (
    FertilityPredictor,
    NonAutoregressiveDecoder,
    ar_decoder_parameter_name,
    copy_source,
    fertility_copy_index,
    uniform_fertility,
)
from ...modules.options import COPY_MODES, DEFAULT_MAX_FERTILITY
from ...modules.plugin_model import EncoderOut, NATPluginModel
from .decoding import FertilityNATGenerator

NamedOutputs = Dict[str, Dict[str, torch.Tensor]]  # the nat_loss contract: {"word_ins": {"out", "mask"}, ...}

logger = logging.getLogger(__name__)


class FertilityNATDecoder(FairseqDecoder):
    """The NAD of Gu et al. plus the output projection: ``forward(inputs, padding_mask, encoder_out)`` ->
    (logits (B, T, V), extra). ``embed_tokens`` is kept (and the projection tied to it) only when shared."""

    def __init__(self, cfg, dictionary, embed_tokens, mask_self_diagonal):
        super().__init__(dictionary)
        self.nad = NonAutoregressiveDecoder(cfg, cfg.decoder.layers, dictionary.pad(), mask_self_diagonal)
        embed_dim = cfg.decoder.embed_dim
        if embed_tokens.embedding_dim != embed_dim:
            raise ValueError(
                "fertility_nat copies source embeddings into the decoder: --encoder-embed-dim and "
                "--decoder-embed-dim must be equal"
            )
        if cfg.decoder.output_dim != embed_dim:
            raise ValueError("fertility_nat does not support --decoder-output-dim different from --decoder-embed-dim")
        self.output_projection = nn.Linear(embed_dim, len(dictionary), bias=False)
        if cfg.share_decoder_input_output_embed:
            self.embed_tokens = embed_tokens
            self.output_projection.weight = embed_tokens.weight
        else:  # an unused embedding would be an unused parameter under DDP
            nn.init.normal_(self.output_projection.weight, mean=0, std=embed_dim**-0.5)

    def max_positions(self) -> int:
        return self.nad.max_positions()

    def forward(
        self, inputs: torch.Tensor, padding_mask: torch.Tensor, encoder_out: EncoderOut, **kwargs: Any
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        states, extra = self.nad(inputs, padding_mask, encoder_out)
        extra["padding_mask"] = padding_mask
        return self.output_projection(states), extra


@register_model("fertility_nat")
class FertilityNATModel(NATPluginModel, TransformerModel):
    """Gu et al.'s NAT (module docstring). Training forward: ``forward(src_tokens, src_lengths, fertility)`` with
    gold fertilities ((B, S), aligned with ``src_tokens``) -> named outputs ``{"word_ins": {"out", "mask"},
    "fertility": {"out", "mask"}}`` (the ``nat_loss`` contract: the criterion adds the targets).

    ``--init-from-ar PATH`` copies the encoder, the embeddings, the output projection and, where names and shapes
    match, the decoder layers' self-attention, encoder attention, FFN and their LayerNorms (the positional
    attention and the fertility predictor start random)."""

    required_side_inputs = ("fertility",)
    generator_class = FertilityNATGenerator
    ar_init_paper_prefixes = ("encoder.",)
    ar_init_paper = "the encoder, its embeddings included (Gu et al. 2018 initialise the encoder from the teacher)"

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument(
            "--max-fertility",
            type=int,
            metavar="L",
            help=f"fertilities are predicted with a softmax over 0..L-1 (default {DEFAULT_MAX_FERTILITY}; "
            "Gu et al. §3.3); larger training fertilities are clamped to L-1 in the fertility loss",
        )
        parser.add_argument(
            "--fertility-hidden-layers",
            type=int,
            choices=(0, 1),
            help="hidden layers of the fertility predictor: 1 (default) = a ReLU layer of the encoder's width, then "
            "the softmax classifier; 0 = the softmax classifier alone on the top encoder states (Gu et al. §3.3's "
            "one-layer classifier)",
        )
        parser.add_argument(
            "--decoder-input-copy",
            choices=COPY_MODES,
            help="decoder inputs: source embeddings copied by fertility (default) or spread uniformly "
            "over the target length (length = gold length in training, sum of the decoded "
            "fertilities at inference)",
        )
        parser.add_argument(
            "--self-attn-mask-diagonal",
            dest="self_attn_mask_diagonal",
            action="store_true",
            default=None,
            help="decoder self-attention hides each query's own position (default on, §3.1)",
        )
        parser.add_argument(
            "--no-self-attn-mask-diagonal",
            dest="self_attn_mask_diagonal",
            action="store_false",
            help="plain (unmasked) decoder self-attention",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "FertilityNATModel":
        fertility_nat_base_architecture(args)
        model = super().build_model(args, task)
        model.fertility_predictor = FertilityPredictor(
            args.encoder_embed_dim, args.max_fertility, dropout=args.dropout, hidden_layers=args.fertility_hidden_layers
        )
        model.copy_mode = args.decoder_input_copy
        return model

    @classmethod
    def build_decoder(
        cls, cfg: argparse.Namespace, tgt_dict: Dictionary, embed_tokens: torch.nn.Embedding
    ) -> FertilityNATDecoder:
        cfg = TransformerConfig.from_namespace(cfg)
        return FertilityNATDecoder(cfg, tgt_dict, embed_tokens, cfg.self_attn_mask_diagonal)

    # ----- pieces used by the criterions and the generator ---------------------------------------------------
    @property
    def max_fertility(self) -> int:
        return self.fertility_predictor.max_fertility

    def copyable(self, src_tokens: torch.Tensor) -> torch.Tensor:
        """(B, S) bool: the source positions that may have a fertility (neither padding nor EOS)."""
        pad, eos = self.encoder.padding_idx, self.encoder.dictionary.eos()
        return src_tokens.ne(pad) & src_tokens.ne(eos)

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> EncoderOut:
        return self.encoder(src_tokens, src_lengths=src_lengths)

    def fertility_logits(self, encoder_out: EncoderOut) -> torch.Tensor:
        """(B, S, L) fertility logits on the top encoder states (§3.3)."""
        return self.fertility_predictor(encoder_out["encoder_out"][0].transpose(0, 1))

    def source_inputs(self, src_tokens: torch.Tensor, encoder_out: EncoderOut) -> torch.Tensor:
        """(B, S, C) vectors that are copied into the decoder: scaled token embedding + source position."""
        inputs = encoder_out["encoder_embedding"][0]
        if self.encoder.embed_positions is not None:
            inputs = inputs + self.encoder.embed_positions(src_tokens)
        return inputs

    def decode(
        self,
        src_tokens: torch.Tensor,
        encoder_out: EncoderOut,
        fertility: torch.Tensor,
        max_length: Optional[int] = None,
        order: Optional[torch.Tensor] = None,
        length_buckets: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Decoder logits (N, T, V) and the target padding mask (N, T) for ``fertility`` (N, S): the source
        inputs copied by fertility, or (uniform copy) spread evenly over sum(fertility) target positions.

        Row n decodes sentence ``order[n]`` of ``src_tokens`` / ``encoder_out`` (B sentences; NPD's candidates,
        several rows per sentence); ``order`` None: N = B, row n is sentence n. The source inputs are computed once
        per sentence and copied straight into the rows; the encoder states are reordered for the rows.
        ``length_buckets`` (the generator's, on CUDA): the decoder runs on T rounded up to a bucket
        (:mod:`~nat_plugins.engine.length_buckets`: a cuDNN plan per new shape), the positions past T masked as
        padding and their logits dropped."""
        if self.copy_mode == "uniform":
            copyable = self.copyable(src_tokens)
            fertility = uniform_fertility(copyable if order is None else copyable[order], fertility.sum(dim=1))
        index, padding = fertility_copy_index(fertility, max_length=max_length)
        length = padding.size(1)
        if length_buckets:
            width = bucketed(length, self.max_decoder_positions())
            index, padding = widened(index, width, 0), widened(padding, width, True)
        inputs = copy_source(self.source_inputs(src_tokens, encoder_out), index, order)
        if order is not None:
            encoder_out = self.encoder.reorder_encoder_out(encoder_out, order)
        logits, _extra = self.decoder(inputs, padding, encoder_out)
        return logits[:, :length], padding[:, :length]

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        fertility: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> NamedOutputs:
        if fertility is None:
            raise ValueError(
                "fertility_nat is trained on gold fertilities: pass sample['fertility'] "
                "(the task loads {split}.fert.{src}; make it with nat_plugins.cli.fertility)"
            )
        encoder_out = self.encode(src_tokens, src_lengths)
        logits, padding = self.decode(src_tokens, encoder_out, fertility)
        return {
            "word_ins": {"out": logits, "mask": ~padding},
            "fertility": {"out": self.fertility_logits(encoder_out), "mask": self.copyable(src_tokens)},
        }

    def get_normalized_probs(
        self,
        net_output: Union[NamedOutputs, Tuple[torch.Tensor, Optional[Dict[str, Any]]]],
        log_probs: bool,
        sample: Optional[Dict[str, Any]] = None,
    ) -> torch.Tensor:
        if isinstance(net_output, dict):  # the named training outputs: the word predictions
            net_output = (net_output["word_ins"]["out"], None)
        return super().get_normalized_probs(net_output, log_probs, sample)

    def max_decoder_positions(self) -> int:
        return self.decoder.max_positions()

    def ar_parameter_name(self, name: str) -> Optional[str]:
        """NAD layer ``decoder.nad.layers.i.X`` <- AR ``decoder.layers.i.X`` for the sublayers both have;
        ``decoder.nad.layer_norm`` <- ``decoder.layer_norm``; everything else by its own name."""
        return ar_decoder_parameter_name(name, "decoder.nad.")


@register_model_architecture("fertility_nat", "fertility_nat")
def fertility_nat_base_architecture(args: argparse.Namespace) -> None:
    if getattr(args, "max_fertility", None) is None:
        args.max_fertility = DEFAULT_MAX_FERTILITY
    if getattr(args, "fertility_hidden_layers", None) is None:
        args.fertility_hidden_layers = 1
    if getattr(args, "decoder_input_copy", None) is None:
        args.decoder_input_copy = "fertility"
    if getattr(args, "self_attn_mask_diagonal", None) is None:
        args.self_attn_mask_diagonal = True
    args.init_from_ar = getattr(args, "init_from_ar", None)
    base_architecture(args)


@register_model_architecture("fertility_nat", "fertility_nat_iwslt_de_en")
def fertility_nat_iwslt_de_en(args: argparse.Namespace) -> None:
    transformer_iwslt_de_en(args)
    fertility_nat_base_architecture(args)


@register_model_architecture("fertility_nat", "fertility_nat_wmt_en_de")
def fertility_nat_wmt_en_de(args: argparse.Namespace) -> None:
    transformer_wmt_en_de(args)
    fertility_nat_base_architecture(args)
