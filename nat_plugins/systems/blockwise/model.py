"""Blockwise parallel decoding (Stern, Shazeer & Uszkoreit, NeurIPS 2018): model ``blockwise_transformer``.

A fairseq Transformer whose decoder output feeds k proposal heads (:class:`~.heads.
BlockHeads`, §6); head i is trained to predict y_{t+i} (criterion ``blockwise_loss``) and decoding is
verify-accept (:mod:`nat_plugins.systems.blockwise.decoding`). Recipes train on the teacher's distilled outputs
(the heads must predict what p1 will emit) in two stages: the heads on the AR teacher (``--init-from-ar``
``--freeze-base``; with ``--identity-first-head`` p1 stays exactly the teacher, so exact acceptance reproduces its
greedy output, up to near-ties: see :mod:`nat_plugins.generators.verify_accept_loop`), then optionally everything
(``--finetune-from-model`` the first stage's checkpoint), with head 1 in every update (see ``blockwise_loss``).

The decoder's ``forward`` keeps fairseq's contract (logits of head 1, so fairseq's tools treat the model as the AR
model p1) and adds ``heads=`` (0-based head indices) for the logits of several heads and ``positions=`` for decoding
several new tokens per call against the incremental key/value cache.
"""

import argparse
import logging
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from fairseq.data import Dictionary
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de_big,
)
from fairseq.tasks import FairseqTask
from torch import nn

from ...engine import decoder_block_features
from ...modules.plugin_model import EncoderOut, IncrementalState, NATPluginModel, logits_at_positions
from .decoding import BlockwiseGenerator
from .heads import BlockHeads

logger = logging.getLogger(__name__)


class BlockwiseTransformerDecoder(TransformerDecoder):
    """Transformer decoder + k proposal heads sharing the output projection."""

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        cfg = TransformerConfig.from_namespace(args)
        if self.adaptive_softmax is not None:
            raise ValueError(
                "blockwise_transformer does not support --adaptive-softmax-cutoff: its k heads share "
                "one output projection"
            )
        if cfg.cross_self_attention:
            raise ValueError("blockwise_transformer does not support --cross-self-attention")
        self.block_heads = BlockHeads(
            self.output_embed_dim,
            cfg.decoder.ffn_embed_dim,
            block_size=args.block_size,
            identity_first_head=args.identity_first_head,
            dropout=cfg.dropout,
            activation_dropout=cfg.activation_dropout or cfg.relu_dropout or 0.0,
            activation_fn=cfg.activation_fn,
        )

    @property
    def block_size(self) -> int:
        return self.block_heads.block_size

    def forward(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: Optional[EncoderOut] = None,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        heads: Optional[Sequence[int]] = None,
        positions: Optional[torch.Tensor] = None,
        logits_at: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """fairseq's decoder forward with three additions.

        * ``heads``: distinct 0-based head indices (a ``range`` or a list); the logits come back as
          (B, T, len(heads), V) in that order. ``None`` (fairseq's callers) gives the logits of head 1 as (B, T, V).
        * ``logits_at`` ((B, T, len(heads)) bool, with ``heads``): only those logits, packed (N, V)
          (:func:`~nat_plugins.modules.plugin_model.logits_at_positions`; ``blockwise_loss`` passes its non-pad
          targets).
        * ``positions`` (B, T): decode ``prev_output_tokens`` as new tokens at these target positions (0 = BOS),
          attending causally among themselves and to every unmasked slot of ``incremental_state``
          (:func:`~nat_plugins.engine.block_call.decoder_block_features`); ``None`` is fairseq's behaviour.
        """
        if positions is None:
            x, extra = self.extract_features(
                prev_output_tokens,
                encoder_out=encoder_out,
                incremental_state=incremental_state,
                full_context_alignment=full_context_alignment,
                alignment_layer=alignment_layer,
                alignment_heads=alignment_heads,
            )
        else:
            x = decoder_block_features(self, prev_output_tokens, positions, encoder_out, incremental_state)
            extra = {"attn": [None], "inner_states": None}
        if features_only:
            return x, extra
        if heads is None:
            return self.head_logits(x, range(1)).squeeze(-2), extra
        return self.head_logits(x, heads, logits_at), extra

    def head_logits(
        self, features: torch.Tensor, heads: Sequence[int], logits_at: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Logits of the heads in ``heads`` for decoder output ``features`` (..., C) -> (..., len(heads), V); with
        ``logits_at`` ((..., len(heads)) bool) those logits only, packed (N, V)."""
        if list(heads) == [0] and self.block_heads.identity_first_head:  # bit for bit the base model's logits
            if logits_at is None:
                return self.output_layer(features).unsqueeze(-2)
            return logits_at_positions(self.output_layer, features, logits_at[..., 0])
        return logits_at_positions(self.output_layer, self.block_heads(features, heads), logits_at)


@register_model("blockwise_transformer")
class BlockwiseTransformerModel(NATPluginModel, TransformerModel):
    """Transformer with k proposal heads for blockwise parallel decoding (Stern et al. 2018)."""

    generator_class = BlockwiseGenerator
    ar_init_paper_prefixes = ("",)
    ar_init_paper = (
        "the whole base model, as Stern et al. 2018 train the heads on a trained base model (the same as 'all')"
    )
    base_frozen = False
    num_updates = 0

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument(
            "--block-size",
            type=int,
            metavar="K",
            help="number of proposal heads k; head i predicts y_{t+i} (k=1: the base model)",
        )
        parser.add_argument(
            "--identity-first-head",
            action="store_true",
            help="head 1 bypasses the new feed-forward layer, so p1 is exactly the base Transformer",
        )
        parser.add_argument(
            "--freeze-base",
            action="store_true",
            help="train only the new feed-forward layer (the base stays as initialised, e.g. by --init-from-ar)",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "BlockwiseTransformerModel":
        blockwise_base_architecture(args)
        if args.block_size < 1:
            raise ValueError(f"--block-size must be at least 1, got {args.block_size}")
        if args.freeze_base and args.identity_first_head and args.block_size == 1:
            raise ValueError("--freeze-base with --identity-first-head and --block-size 1 leaves nothing to train")
        if args.freeze_base and not args.init_from_ar:
            logger.warning("--freeze-base without --init-from-ar: the frozen base keeps its random initialisation")
        model = super().build_model(args, task)
        model.base_frozen = bool(args.freeze_base)
        if model.base_frozen:
            for name, parameter in model.named_parameters():
                if not name.startswith("decoder.block_heads."):
                    parameter.requires_grad_(False)
        return model

    @classmethod
    def build_decoder(
        cls, args: argparse.Namespace, tgt_dict: Dictionary, embed_tokens: nn.Embedding
    ) -> BlockwiseTransformerDecoder:
        return BlockwiseTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        prev_output_tokens: torch.Tensor,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        heads: Optional[Sequence[int]] = None,
        logits_at: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """fairseq's forward; ``heads`` (0-based head indices) returns those heads' logits, (B, T, len(heads), V),
        and ``logits_at`` ((B, T, len(heads)) bool) only those of them, packed (N, V)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        return self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            heads=heads,
            logits_at=logits_at,
        )

    @property
    def trainable_heads(self) -> range:
        """Heads whose loss reaches a trainable parameter (head 1 is frozen with --freeze-base
        --identity-first-head)."""
        first = int(self.base_frozen and self.decoder.block_heads.identity_first_head)
        return range(first, self.decoder.block_size)

    def set_num_updates(self, num_updates: int) -> None:
        """Remember the update count (``blockwise_loss`` draws its heads from it, identically on every rank)."""
        super().set_num_updates(num_updates)
        self.num_updates = num_updates


@register_model_architecture("blockwise_transformer", "blockwise_transformer")
def blockwise_base_architecture(args: argparse.Namespace) -> None:
    args.block_size = getattr(args, "block_size", 4)
    args.identity_first_head = getattr(args, "identity_first_head", False)
    args.freeze_base = getattr(args, "freeze_base", False)
    args.init_from_ar = getattr(args, "init_from_ar", None)
    base_architecture(args)


@register_model_architecture("blockwise_transformer", "blockwise_transformer_iwslt_de_en")
def blockwise_transformer_iwslt_de_en(args: argparse.Namespace) -> None:
    transformer_iwslt_de_en(args)
    blockwise_base_architecture(args)


@register_model_architecture("blockwise_transformer", "blockwise_transformer_wmt_en_de_big")
def blockwise_transformer_wmt_en_de_big(args: argparse.Namespace) -> None:
    transformer_wmt_en_de_big(args)
    blockwise_base_architecture(args)
