"""Encoder-NAD-AD (Zhou, Zhang & Zong 2020, "Improving Autoregressive NMT with Non-Autoregressive Model"):
model ``nad_ad_transformer``.

A fairseq Transformer (the autoregressive decoder, AD) whose decoder layers get one more sublayer, attending to
the top states of a non-autoregressive decoder (NAD) that runs once per sentence on the shared encoder (§3):

* shared encoder: fairseq's Transformer encoder;
* NAD (:class:`~nat_plugins.modules.nat_decoder.NonAutoregressiveDecoder`, ``--nad-layers``): unmasked self-attention ->
  positional attention -> encoder attention -> FFN; its inputs are the (scaled) source token embeddings copied
  uniformly over a target length (``--nad-input-copy uniform``: the gold length of the distilled target in
  training, the argmax of a :class:`~nat_plugins.modules.nat_decoder.LengthPredictor` at inference) or by fertilities
  (``--nad-input-copy fertility``: the gold fertilities of the ``{split}.fert.{src}`` side file in training, the
  argmax of a :class:`~nat_plugins.modules.nat_decoder.FertilityPredictor` at inference); its logits come from the
  AD's output layer (``--nad-output-projection ad``, the default: tied; with ``--share-all-embeddings`` the shared
  embeddings) or its own (``own``: ``decoder.nad_output_projection``), trained on the distilled target (criterion
  ``nad_ad_loss``, eq. of §3.3);
* AD layer (:class:`NADADDecoderLayer`): masked self-attention -> **NAD-AD attention** over the top NAD states ->
  encoder-AD attention -> FFN, each a residual sublayer with its own LayerNorm (pre- or post-norm as fairseq's
  ``--decoder-normalize-before``).

Where things live: the NAD runs inside the encoder module (:class:`NADADEncoder`), whose output is fairseq's
``encoder_out`` dict plus ``nad_out`` (T, B, C), ``nad_padding_mask`` (B, T) and ``nad_length_logits`` or
``nad_fertility_logits``; ``reorder_encoder_out`` reorders the NAD memory with the beam. So fairseq's
``SequenceGenerator`` runs the NAD exactly once per sentence (its ``forward_encoder``) and the NAD-AD attention
projects the NAD states to keys/values once per layer and keeps them in ``incremental_state`` (static key/value,
exactly like the encoder attention). Training passes the gold length (``nad_lengths``) or fertilities
(``nad_fertility``) to ``forward``; without them (inference) the predicted ones are used.

``--init-from-ar`` copies the AR teacher's encoder, embeddings, and the AD's self/encoder attention, FFN and
LayerNorms, and the NAD layers' self/encoder attention and FFN from the teacher's decoder layers; the NAD-AD
attention's output projection starts at zero (the AD starts as the teacher: exactly with pre-norm); the
positional attention, the length/fertility predictor and an own NAD output layer start random (all logged).
"""

import argparse
import logging
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
)
from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq.tasks import FairseqTask
from torch import nn

from ...engine import bucketed, widened
from ...modules.nat_decoder import (
    FertilityPredictor,
    LengthPredictor,
    NonAutoregressiveDecoder,
    ar_decoder_parameter_name,
    copy_source,
    fertility_copy_index,
    reject_normformer_options,
    residual_sublayer,
    uniform_fertility,
)
from ...modules.options import COPY_MODES, DEFAULT_MAX_FERTILITY
from ...modules.plugin_model import EncoderOut, IncrementalState, NATPluginModel, logits_at_positions
from .decoding import NADADGenerator

NAD_OUTPUT_CHOICES = ("ad", "own")  # --nad-output-projection

logger = logging.getLogger(__name__)


def nad_memory(encoder_out: Optional[EncoderOut]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(NAD states (T, B, C), padding mask (B, T)) from an ``encoder_out`` dict of :class:`NADADEncoder`."""
    if encoder_out is None or not encoder_out.get("nad_out"):
        raise ValueError(
            "the nad_ad_transformer decoder attends to the NAD states, but encoder_out has no 'nad_out': "
            "it must come from the model's NADADEncoder (model.encoder)"
        )
    return encoder_out["nad_out"][0], encoder_out["nad_padding_mask"][0]


class NADADDecoderLayer(TransformerDecoderLayerBase):
    """An AD layer (§3.2): masked self-attention -> NAD-AD attention -> encoder-AD attention -> FFN.

    fairseq's decoder layer plus ``nad_attn`` (static key/value, cached in ``incremental_state`` like the encoder
    attention) and ``nad_attn_layer_norm``. The NAD memory is handed over by :class:`NADADDecoder` through
    ``self.nad_memory`` (set for the duration of one decoder call), so fairseq's decoder loop is reused unchanged.
    """

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        reject_normformer_options(self, "nad_ad_transformer")
        self.nad_attn = MultiheadAttention(
            self.embed_dim,
            cfg.decoder.attention_heads,
            kdim=self.embed_dim,
            vdim=self.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )
        self.nad_attn_layer_norm = LayerNorm(self.embed_dim, export=cfg.export)
        self.nad_memory = None

    def forward(
        self,
        x: torch.Tensor,
        encoder_out: Optional[torch.Tensor] = None,
        encoder_padding_mask: Optional[torch.Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        prev_self_attn_state: Optional[List[torch.Tensor]] = None,
        prev_attn_state: Optional[List[torch.Tensor]] = None,
        self_attn_mask: Optional[torch.Tensor] = None,
        self_attn_padding_mask: Optional[torch.Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor], None]:
        """fairseq's decoder-layer interface (``x``: (T, B, C)); returns (x, encoder attention, None)."""
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("nad_ad_transformer layers do not take prev_self_attn_state/prev_attn_state")
        if self.nad_memory is None:
            raise RuntimeError("NADADDecoderLayer called without NAD memory: call it through NADADDecoder")
        nad_out, nad_padding_mask = self.nad_memory
        need_attn = need_attn or need_head_weights

        def self_attention(h):
            return self.self_attn(
                query=h,
                key=h,
                value=h,
                key_padding_mask=self_attn_padding_mask,
                incremental_state=incremental_state,
                need_weights=False,
                attn_mask=self_attn_mask,
            )

        def nad_attention(h):  # §3.2: queries from the AD, keys/values = top NAD states (projected once, cached)
            return self.nad_attn(
                query=h,
                key=nad_out,
                value=nad_out,
                key_padding_mask=nad_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                need_weights=False,
            )

        def encoder_attention(h):
            return self.encoder_attn(
                query=h,
                key=encoder_out,
                value=encoder_out,
                key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )

        def feed_forward(h):
            h = self.activation_dropout_module(self.activation_fn(self.fc1(h)))
            return self.fc2(h), None

        x, _ = residual_sublayer(self, x, self.self_attn_layer_norm, self_attention)
        x, _ = residual_sublayer(self, x, self.nad_attn_layer_norm, nad_attention)
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            x, attn = residual_sublayer(self, x, self.encoder_attn_layer_norm, encoder_attention)
        x, _ = residual_sublayer(self, x, self.final_layer_norm, feed_forward)
        return x, attn, None


class NADADDecoder(TransformerDecoderBase):
    """The AD: fairseq's Transformer decoder built from :class:`NADADDecoderLayer` s, and the NAD's output layer
    (used by the criterion and for the ``--print-nad-draft`` drafts): the AD's own (``nad_output="ad"``: tied, with
    ``--share-all-embeddings`` the shared embeddings) or a separate ``nad_output_projection`` (``"own"``)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, nad_output="ad"):
        if cfg.cross_self_attention:
            raise ValueError("nad_ad_transformer does not support --cross-self-attention")
        if cfg.checkpoint_activations:
            raise ValueError("nad_ad_transformer does not support --checkpoint-activations")
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.nad_output_projection = None
        if nad_output == "own":
            self.nad_output_projection = nn.Linear(cfg.decoder.embed_dim, len(dictionary), bias=False)
            nn.init.normal_(self.nad_output_projection.weight, mean=0.0, std=cfg.decoder.embed_dim**-0.5)

    def build_decoder_layer(self, cfg: TransformerConfig, no_encoder_attn: bool = False) -> NADADDecoderLayer:
        return NADADDecoderLayer(cfg, no_encoder_attn=no_encoder_attn)

    def extract_features_scriptable(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: Optional[EncoderOut],
        incremental_state: Optional[IncrementalState] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ) -> Tuple[torch.Tensor, Dict[str, List[Optional[torch.Tensor]]]]:
        """fairseq's decoder pass, with the NAD memory of ``encoder_out`` made visible to every layer."""
        memory = nad_memory(encoder_out)
        for layer in self.layers:
            layer.nad_memory = memory
        try:
            return super().extract_features_scriptable(
                prev_output_tokens,
                encoder_out,
                incremental_state=incremental_state,
                full_context_alignment=full_context_alignment,
                alignment_layer=alignment_layer,
                alignment_heads=alignment_heads,
            )
        finally:
            for layer in self.layers:
                layer.nad_memory = None

    def nad_output_layer(self, nad_states: torch.Tensor) -> torch.Tensor:
        """NAD logits (..., V) of NAD states (..., C)."""
        return (self.nad_output_projection or self.output_projection)(nad_states)


class NADADEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder followed by the NAD (module docstring): its output dict also holds the NAD
    memory the AD attends to, so it is computed once per sentence and reordered with the beam."""

    def __init__(
        self, cfg, dictionary, embed_tokens, nad_layers, input_copy, max_length, max_fertility, length_buckets
    ):
        super().__init__(cfg, dictionary, embed_tokens)
        self.length_buckets = length_buckets  # training: the NAD's groups of similar NAD length (nad_by_length)
        if cfg.encoder.embed_dim != cfg.decoder.embed_dim:
            raise ValueError(
                "nad_ad_transformer copies source embeddings into the NAD: --encoder-embed-dim "
                f"({cfg.encoder.embed_dim}) must equal --decoder-embed-dim ({cfg.decoder.embed_dim})"
            )
        self.eos = dictionary.eos()
        self.input_copy = input_copy
        self.nad = NonAutoregressiveDecoder(cfg, nad_layers, dictionary.pad(), mask_self_diagonal=False)
        self.max_nad_length = min(max_length, self.nad.max_positions())
        if input_copy == "uniform":
            self.length_predictor = LengthPredictor(cfg.encoder.embed_dim, self.max_nad_length)
        else:
            self.fertility_predictor = FertilityPredictor(cfg.encoder.embed_dim, max_fertility, dropout=cfg.dropout)

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
        nad_lengths: Optional[torch.Tensor] = None,
        nad_fertility: Optional[torch.Tensor] = None,
        length_buckets: bool = False,
    ) -> EncoderOut:
        """fairseq's encoder output plus the NAD memory. ``nad_lengths`` ((B,): target lengths without EOS) or
        ``nad_fertility`` (B, S) are the gold ones in training; None at inference (predicted). ``length_buckets``
        (the generator's, on CUDA): the source is left-padded and the NAD length right-padded to buckets
        (:mod:`~nat_plugins.engine.length_buckets`: a cuDNN plan per new shape); the memory keeps the padded widths,
        masked, so the AD's attention over it meets bucketed shapes too."""
        if length_buckets:
            src_tokens = widened(src_tokens, bucketed(src_tokens.size(1)), self.padding_idx, on_the_left=True)
        encoder_out = super().forward(
            src_tokens,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            token_embeddings=token_embeddings,
        )
        encoder_out.update(self.forward_nad(src_tokens, encoder_out, nad_lengths, nad_fertility, length_buckets))
        return encoder_out

    def copyable(self, src_tokens: torch.Tensor) -> torch.Tensor:
        """Source positions the NAD copies from: neither padding nor EOS (all unpadded ones for an empty source)."""
        unpadded = src_tokens.ne(self.padding_idx)
        copyable = unpadded & src_tokens.ne(self.eos)
        return torch.where(copyable.any(dim=1, keepdim=True), copyable, unpadded)

    def nad_fertilities(
        self,
        src_tokens: torch.Tensor,
        encoder_out: EncoderOut,
        nad_lengths: Optional[torch.Tensor],
        nad_fertility: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, EncoderOut]:
        """Fertilities (B, S) the NAD inputs are copied by, and the predictor's logits."""
        states = encoder_out["encoder_out"][0].transpose(0, 1)
        copyable = self.copyable(src_tokens)
        if self.input_copy == "uniform":
            logits = self.length_predictor(states, encoder_out["encoder_padding_mask"][0])
            lengths = logits.argmax(dim=-1) if nad_lengths is None else nad_lengths.to(src_tokens.device)
            # at least one NAD position, so the AD's NAD-AD attention always sees a key
            return uniform_fertility(copyable, lengths.clamp(min=1)), {"nad_length_logits": [logits]}
        logits = self.fertility_predictor(states)
        fertility = logits.argmax(dim=-1) if nad_fertility is None else nad_fertility.to(src_tokens.device)
        fertility = fertility.masked_fill(~copyable, 0)
        first = copyable.long().argmax(dim=1, keepdim=True)  # empty totals -> one copy of the first position
        empty = fertility.sum(dim=1, keepdim=True).eq(0)
        fertility = fertility.scatter_add(1, first, empty.long())
        return fertility, {"nad_fertility_logits": [logits]}

    def forward_nad(
        self,
        src_tokens: torch.Tensor,
        encoder_out: EncoderOut,
        nad_lengths: Optional[torch.Tensor] = None,
        nad_fertility: Optional[torch.Tensor] = None,
        length_buckets: bool = False,
    ) -> EncoderOut:
        """The NAD pass (once per sentence): {"nad_out": [(T, B, C)], "nad_padding_mask": [(B, T)], logits}; with
        ``length_buckets`` T is rounded up to a bucket, the positions past every sentence's length masked."""
        fertility, predictor_out = self.nad_fertilities(src_tokens, encoder_out, nad_lengths, nad_fertility)
        length = min(max(int(fertility.sum(dim=1).max()), 1), self.nad.max_positions())
        if length_buckets:
            length = bucketed(length, self.nad.max_positions())
        index, padding = fertility_copy_index(fertility, max_length=length)
        inputs = copy_source(encoder_out["encoder_embedding"][0], index)  # scaled token embeddings
        states = self.nad_by_length(inputs, padding, encoder_out)
        return {"nad_out": [states.transpose(0, 1)], "nad_padding_mask": [padding], **predictor_out}

    def nad_by_length(self, inputs: torch.Tensor, padding: torch.Tensor, encoder_out: EncoderOut) -> torch.Tensor:
        """NAD states ((B, T, C), zero on padding) of the copied ``inputs``; in training the sentences run in up to
        ``length_buckets`` groups of similar NAD length, each padded to its own longest only (why: see
        docs/design-notes.md, *Encoder-NAD-AD: the NAD's length groups*). A sentence's states do not depend on its
        padding (masked keys), so the groups give the same states up to floating-point summation order; only
        dropout draws its masks in other shapes. Decoding (eval mode) runs the NAD once per batch."""
        batch_size = inputs.size(0)
        groups = min(self.length_buckets, batch_size) if self.training else 1
        if groups <= 1:
            return self.nad(inputs, padding, encoder_out)[0]
        lengths = (~padding).sum(dim=1)
        order = lengths.argsort(stable=True)
        rows = order.tensor_split(groups)
        widths = torch.stack([lengths[group].max() for group in rows]).tolist()  # one host sync
        enc, enc_padding = encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        states = []
        for group, width in zip(rows, widths):
            group_encoder_out = {
                "encoder_out": [enc.index_select(1, group)],
                "encoder_padding_mask": [enc_padding.index_select(0, group)],
            }
            group_states, _ = self.nad(inputs[group, :width], padding[group, :width], group_encoder_out)
            states.append(F.pad(group_states, (0, 0, 0, inputs.size(1) - width)))
        return torch.cat(states).index_select(0, order.argsort())

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: torch.Tensor) -> EncoderOut:
        """fairseq's reordering plus the NAD memory (the predictor logits are training-only and are dropped)."""
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if encoder_out.get("nad_out"):
            reordered["nad_out"] = [encoder_out["nad_out"][0].index_select(1, new_order)]
            reordered["nad_padding_mask"] = [encoder_out["nad_padding_mask"][0].index_select(0, new_order)]
        return reordered


@register_model("nad_ad_transformer")
class NADADTransformerModel(NATPluginModel, TransformerModel):
    """Encoder-NAD-AD (Zhou, Zhang & Zong 2020): see the module docstring. Train with ``--criterion nad_ad_loss
    --use-distilled side``; decode with ``fairseq-generate --task translation_nat`` (AD beam search, the NAD run
    once per sentence; ``--print-nad-draft`` prints the NAD's argmax drafts)."""

    # the side inputs of training (distilled targets; gold fertilities with --nad-input-copy fertility) are
    # checked by the criterion (nad_ad_loss), so a model can be built on any split for inference
    required_side_inputs = ()
    generator_class = NADADGenerator
    scored_by_fairseq = True  # --score-reference: fairseq's scorer (the AD's scores)
    # the encoder without the NAD (encoder.nad.*: decoder layers), the embeddings and the output projection
    ar_init_paper_prefixes = (
        "encoder.embed_tokens.",
        "encoder.embed_positions.",
        "encoder.layernorm_embedding.",
        "encoder.layers.",
        "encoder.layer_norm.",
        "decoder.embed_tokens.",
        "decoder.embed_positions.",
        "decoder.layernorm_embedding.",
        "decoder.output_projection.",
    )
    ar_init_paper = (
        "the encoder (not the NAD), the embeddings and the output projection (Zhou et al. 2020 describe no "
        "initialisation from an AR model: this is the SAT and RecoverSAT papers' scope)"
    )

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument(
            "--nad-layers",
            type=int,
            metavar="N",
            help="layers of the non-autoregressive decoder (default: --decoder-layers)",
        )
        parser.add_argument(
            "--nad-input-copy",
            choices=COPY_MODES,
            help="NAD inputs: source embeddings copied uniformly over a (gold / predicted) length, "
            "or by (gold from {split}.fert.{src} / predicted) fertilities; default uniform",
        )
        parser.add_argument(
            "--nad-max-length",
            type=int,
            metavar="N",
            help="NAD length classes 0..N-1 of the length predictor (uniform copy; default 256)",
        )
        parser.add_argument(
            "--max-fertility",
            type=int,
            metavar="L",
            help="fertility classes 0..L-1 of the fertility predictor (fertility copy; default "
            f"{DEFAULT_MAX_FERTILITY})",
        )
        parser.add_argument(
            "--nad-length-buckets",
            type=int,
            metavar="N",
            help="in training, run the NAD in up to N groups of sentences of similar NAD length, each padded to its "
            "own longest (fewer padded positions: the CPU's choice); 1 runs it once per batch (fewer kernel "
            "launches: a GPU's); default 4",
        )
        parser.add_argument(
            "--nad-output-projection",
            choices=NAD_OUTPUT_CHOICES,
            default="ad",
            help="the NAD's output layer: the AD's (ad: tied; with --share-all-embeddings the shared embeddings, so "
            "a NAD added to a trained teacher starts with its trained output layer) or its own, randomly initialised "
            "(own: what checkpoints saved before this option have)",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "NADADTransformerModel":
        nad_ad_base_architecture(args)
        if args.nad_length_buckets < 1:
            raise ValueError(f"--nad-length-buckets must be at least 1, got {args.nad_length_buckets}")
        if args.nad_layers < 1:
            raise ValueError(f"--nad-layers must be at least 1, got {args.nad_layers}")
        if args.nad_max_length < 2:
            raise ValueError(f"--nad-max-length must be at least 2, got {args.nad_max_length}")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg: argparse.Namespace, src_dict: Dictionary, embed_tokens: nn.Embedding) -> NADADEncoder:
        nad_layers, input_copy = cfg.nad_layers, cfg.nad_input_copy
        max_length, max_fertility, buckets = cfg.nad_max_length, cfg.max_fertility, cfg.nad_length_buckets
        cfg = TransformerConfig.from_namespace(cfg)
        return NADADEncoder(cfg, src_dict, embed_tokens, nad_layers, input_copy, max_length, max_fertility, buckets)

    @classmethod
    def build_decoder(cls, cfg: argparse.Namespace, tgt_dict: Dictionary, embed_tokens: nn.Embedding) -> NADADDecoder:
        nad_output = cfg.nad_output_projection
        cfg = TransformerConfig.from_namespace(cfg)
        return NADADDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention, nad_output=nad_output)

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        prev_output_tokens: torch.Tensor,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        nad_lengths: Optional[torch.Tensor] = None,
        nad_fertility: Optional[torch.Tensor] = None,
        logits_at: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """fairseq's forward (AD logits and extras); the extras also hold the NAD's ``nad_logits`` (B, T, V),
        ``nad_padding_mask`` and the length or fertility predictor's logits. ``nad_lengths`` / ``nad_fertility``:
        the gold NAD length ((B,), EOS excluded) or fertilities (B, S) in training. ``logits_at`` ((B, T) bool, the
        AD's scored positions): the AD logits of those positions only and the NAD logits of its unpadded
        positions only, each packed (N, V) (:func:`~nat_plugins.modules.plugin_model.logits_at_positions`)."""
        encoder_out = self.encoder(
            src_tokens,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            nad_lengths=nad_lengths,
            nad_fertility=nad_fertility,
        )
        x, extra = self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only or logits_at is not None,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )
        nad_padding = encoder_out["nad_padding_mask"][0]
        nad_positions = None
        if logits_at is not None:
            x = logits_at_positions(self.decoder.output_layer, x, logits_at)
            nad_positions = ~nad_padding
        nad_states = encoder_out["nad_out"][0].transpose(0, 1)
        extra["nad_logits"] = logits_at_positions(self.decoder.nad_output_layer, nad_states, nad_positions)
        extra["nad_padding_mask"] = nad_padding
        for key in ("nad_length_logits", "nad_fertility_logits"):
            if encoder_out.get(key):
                extra[key] = encoder_out[key][0]
        return x, extra

    def nad_draft(self, encoder_out: EncoderOut) -> torch.Tensor:
        """The NAD's argmax tokens ((B, T), padding = pad) for an ``encoder_out`` of the model's encoder."""
        states, padding = nad_memory(encoder_out)
        tokens = self.decoder.nad_output_layer(states.transpose(0, 1)).argmax(dim=-1)
        return tokens.masked_fill(padding, self.decoder.padding_idx)

    def ar_parameter_name(self, name: str) -> Optional[str]:
        """The NAD's layers start as the AR decoder's where they share sublayers (``encoder.nad.layers.i.X`` <-
        ``decoder.layers.i.X``); the AD and the encoder load their own names."""
        return ar_decoder_parameter_name(name, "encoder.nad.")

    def init_from_ar(self, path: str) -> List[str]:
        """The teacher's matching parameters, then the NAD-AD attention's output projection set to zero: the new
        sublayer starts as a no-op, so the AD starts as the teacher (exactly with pre-norm; with post-norm up to
        the new LayerNorm) and a short fine-tuning budget is not spent recovering from a random sublayer."""
        loaded = super().init_from_ar(path)
        if not any(name.startswith("decoder.layers.") for name in loaded):  # --init-from-ar-scope paper
            return loaded
        for layer in self.decoder.layers:
            nn.init.zeros_(layer.nad_attn.out_proj.weight)
            nn.init.zeros_(layer.nad_attn.out_proj.bias)
        logger.info("NAD-AD attention output projections set to zero (the AD starts as the AR teacher)")
        return loaded


@register_model_architecture("nad_ad_transformer", "nad_ad_transformer")
def nad_ad_base_architecture(args: argparse.Namespace) -> None:
    base_architecture(args)
    if getattr(args, "nad_layers", None) is None:
        args.nad_layers = args.decoder_layers
    if getattr(args, "nad_input_copy", None) is None:
        args.nad_input_copy = "uniform"
    if getattr(args, "nad_max_length", None) is None:
        args.nad_max_length = 256
    if getattr(args, "max_fertility", None) is None:
        args.max_fertility = DEFAULT_MAX_FERTILITY
    if getattr(args, "nad_length_buckets", None) is None:
        args.nad_length_buckets = 4
    # new models get the parser's default, "ad"; a checkpoint saved before --nad-output-projection has its own layer
    if getattr(args, "nad_output_projection", None) is None:
        args.nad_output_projection = "own"
    args.init_from_ar = getattr(args, "init_from_ar", None)


@register_model_architecture("nad_ad_transformer", "nad_ad_transformer_iwslt_de_en")
def nad_ad_transformer_iwslt_de_en(args: argparse.Namespace) -> None:
    transformer_iwslt_de_en(args)
    nad_ad_base_architecture(args)


@register_model_architecture("nad_ad_transformer", "nad_ad_transformer_wmt_en_de")
def nad_ad_transformer_wmt_en_de(args: argparse.Namespace) -> None:
    transformer_wmt_en_de(args)
    nad_ad_base_architecture(args)
