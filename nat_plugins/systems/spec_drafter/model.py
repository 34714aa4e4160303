"""The drafter of speculative decoding (Xia et al., Findings of EMNLP 2023, "Speculative Decoding: Exploiting
Speculative Execution for Accelerating Seq2seq Generation", §3 Spec-Drafter): model ``spec_drafter``.

A non-autoregressive model that proposes the next k tokens y_{j+1..j+k} of a translation given the source and the
prefix y_{<=j} accepted so far, in one pass; the AR teacher verifies all k in one call
(:mod:`nat_plugins.systems.spec_drafter.decoding`), so the output is the teacher's whatever the drafter proposes
(up to near-ties: see :mod:`nat_plugins.generators.verify_accept_loop`).

* encoder: fairseq's Transformer encoder, initialised from the teacher (``--init-from-ar``; the paper's drafter
  is "deep encoder, shallow decoder");
* decoder: fairseq's Transformer decoder layers (shallow: the presets use 1 (CPU) or 2 (GPU); they start as the
  teacher's first layers) over the prefix y_0 = BOS .. y_j, read causally, followed by k query slots
  (``--draft-size k``), each a learned mask embedding + the positional embedding of its target position j+i. A
  query attends to the whole prefix and to every query (bidirectionally); the prefix never attends to the queries.
  The queries' outputs through the output projection (tied to the embeddings, shared with the teacher, under
  ``--share-all-embeddings``) are the k draft distributions;
* with ``--read-teacher-states`` (not in Xia et al. 2023; the feature-level drafting of Li et al. 2024, "EAGLE",
  §3.1): each prefix token's input adds a learned projection of the teacher's decoder output at the position before
  it, the state from which the teacher predicted that token. The verifier computes these states anyway (decoding:
  :class:`~.decoding.SpecDrafterGenerator`), so a one-layer drafter drafts from
  the teacher's full depth at the cost of one small projection; training reads them from the teacher teacher-forced
  on its own greedy outputs (``spec_drafter_loss``), what exact verification accepts, so the states are the ones
  decoding sees. The projection starts at zero: the drafter starts as the plain one.

Training (criterion ``spec_drafter_loss``) drafts after every prefix of a distilled target in one pass: the prefix is
read causally, so its states are the same for every cut point, and one group of k queries per cut point, each seeing
the prefix up to its cut, gives every cut's drafts, each what decoding drafts after that prefix
(:meth:`SpecDrafterDecoder.forward`).
"""

import argparse
from typing import Any, Dict, Optional, Tuple

import torch
from fairseq.data import Dictionary
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
)
from fairseq.tasks import FairseqTask
from torch import nn

from ...engine import StaticCache, decoder_stack_features, layer_inputs, with_cached_columns
from ...modules.plugin_model import EncoderOut, IncrementalState, NATPluginModel, logits_at_positions
from .decoding import SpecDrafterGenerator
from .masks import draft_attention_mask, every_cut_attention_mask, every_cut_slots


class SpecDrafterDecoder(TransformerDecoder):
    """A fairseq Transformer decoder whose forward reads a prefix causally and predicts k query slots."""

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        cfg = TransformerConfig.from_namespace(args)
        if self.adaptive_softmax is not None:
            raise ValueError("spec_drafter does not support --adaptive-softmax-cutoff")
        if cfg.cross_self_attention:
            raise ValueError("spec_drafter does not support --cross-self-attention")
        if args.draft_size < 1:
            raise ValueError(f"--draft-size must be at least 1, got {args.draft_size}")
        self.draft_size = args.draft_size
        self.mask_embedding = nn.Parameter(torch.empty(embed_tokens.embedding_dim))
        nn.init.normal_(self.mask_embedding, mean=0, std=embed_tokens.embedding_dim**-0.5)
        self.state_projection = None  # --read-teacher-states: the teacher's states into the prefix inputs
        if args.read_teacher_states:
            self.state_projection = nn.Linear(self.output_embed_dim, embed_tokens.embedding_dim, bias=False)
            nn.init.zeros_(self.state_projection.weight)

    @property
    def reads_teacher_states(self) -> bool:
        return self.state_projection is not None

    def prefix_inputs(self, tokens: torch.Tensor, states: Optional[torch.Tensor]) -> torch.Tensor:
        """The scaled embeddings (B, P, C) of prefix ``tokens`` (B, P); with ``--read-teacher-states`` plus the
        projected ``states`` (B, P, d): the teacher's decoder output at each token's previous position (zero
        before BOS; :func:`states_before`)."""
        x = self.embed_scale * self.embed_tokens(tokens)
        if self.state_projection is None:
            return x
        if states is None or states.shape[:2] != tokens.shape or states.size(-1) != self.output_embed_dim:
            got = None if states is None else tuple(states.shape)
            raise ValueError(
                f"this drafter reads the teacher's decoder states (--read-teacher-states): each prefix token needs "
                f"the teacher's {self.output_embed_dim}-dimensional state before it, got {got} for tokens "
                f"{tuple(tokens.shape)}; verify it with the teacher it was trained with (--spec-drafter-teacher)"
            )
        return x + self.state_projection(states.to(x))

    def forward(
        self,
        prefix_tokens: torch.Tensor,
        encoder_out: Optional[EncoderOut] = None,
        prefix_lengths: Optional[torch.Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        prefix_start: Optional[torch.Tensor] = None,
        every_cut: bool = False,
        features_only: bool = False,
        logits_at: Optional[torch.Tensor] = None,
        teacher_states: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """Draft logits (B, k, V) of y_{j+1..j+k} for the right-padded ``prefix_tokens`` ((B, P): BOS, y_1..y_j,
        then padding) of ``prefix_lengths`` ((B,), = j+1; default: the non-pad tokens of each row); ``encoder_out``
        has B sentences. With ``logits_at`` ((B, k) bool) only those logits, packed (N, V)
        (:func:`~nat_plugins.modules.plugin_model.logits_at_positions`); with ``features_only`` the queries' states
        (B, k, C); ``teacher_states`` (B, P, d): with ``--read-teacher-states``, the teacher's state before each
        prefix token (:meth:`prefix_inputs`). Returns (output, extra) as fairseq decoders.

        With ``every_cut`` (training) the drafts after every prefix y_0..y_c, c = 0..P-1, in one pass: (B, P·k)
        slots, those of cut c at c·k..c·k+k-1, each what the call on ``prefix_tokens[:, :c+1]`` alone drafts
        (:func:`every_cut_attention_mask`; the prefix is read causally, so all cuts share its states).

        With fairseq's ``incremental_state`` (decoding), the cache holds the prefix read by earlier calls and
        ``prefix_tokens`` are the new prefix tokens only, the first at position ``prefix_start`` (B,), padded after
        ``prefix_lengths``; the call appends P + k slots, of which the caller keeps the new prefix tokens
        (:func:`~nat_plugins.engine.block_call.rollback_cache` with ``prefix_lengths - prefix_start``)."""
        if prefix_lengths is None:
            prefix_lengths = prefix_tokens.ne(self.padding_idx).long().sum(dim=1)
        k, (bsz, width), device = self.draft_size, prefix_tokens.shape, prefix_tokens.device
        prefix_positions = torch.arange(width, device=device).expand_as(prefix_tokens)
        if prefix_start is not None:
            prefix_positions = prefix_positions + prefix_start.unsqueeze(1)
        prefix = self.prefix_inputs(prefix_tokens, teacher_states)
        if every_cut:
            if incremental_state is not None:
                raise ValueError("every_cut drafts are a training forward: no incremental_state")
            query_positions = (every_cut_slots(width, k, device) + 1).expand(bsz, -1)
            self_attn_mask = every_cut_attention_mask(width, k, prefix)
        else:
            query_positions = prefix_lengths.unsqueeze(1) + torch.arange(k, device=device)
            self_attn_mask = with_cached_columns(self, incremental_state, draft_attention_mask(width, k, prefix))
        positions = torch.cat([prefix_positions, query_positions], dim=1).clamp(max=self.max_positions() - 1)
        queries = self.mask_embedding.to(prefix).expand(bsz, query_positions.size(1), -1)
        padding = prefix_positions >= prefix_lengths.unsqueeze(1)
        self_attn_padding_mask = torch.cat([padding, padding.new_zeros(query_positions.shape)], dim=1)
        x = decoder_stack_features(
            self,
            torch.cat([prefix, queries], dim=1),
            positions,
            encoder_out,
            incremental_state,
            self_attn_mask,
            self_attn_padding_mask,
        )[:, width:]
        extra = {"attn": [None], "inner_states": None}
        return (x, extra) if features_only else (logits_at_positions(self.output_layer, x, logits_at), extra)

    def draft_on_static_cache(
        self,
        cache: StaticCache,
        new_tokens: torch.Tensor,
        prefix_start: torch.Tensor,
        prefix_lengths: torch.Tensor,
        teacher_states: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Draft logits (B, k, V), as :meth:`forward` drafts with fairseq's incremental state, on the buffers of a
        :class:`~nat_plugins.engine.static_cache.StaticCache` of this decoder (fewer operations a call, no rollback).

        ``new_tokens`` (B, P): the prefix tokens read since the last call, the first at position ``prefix_start``
        (B,), right-padded after ``prefix_lengths`` (B,), with their ``teacher_states`` (B, P, d) where the drafter
        reads them. A prefix token goes to the slot of its position, where
        later calls read it; the k queries to the slots after their row's prefix, which the next call's prefix
        tokens and queries overwrite (nothing to roll back: a query sees the slots up to its row's last query
        only); padding to the buffers' last slot, which no query sees (the buffers hold at least the longest prefix
        + k + 1 slots)."""
        k, (bsz, width), device = self.draft_size, new_tokens.shape, new_tokens.device
        new = torch.arange(width, device=device)
        prefix_positions = prefix_start.unsqueeze(1) + new
        query_positions = prefix_lengths.unsqueeze(1) + torch.arange(k, device=device)
        trash = cache.slots - 1
        prefix_slots = prefix_positions.masked_fill(prefix_positions >= prefix_lengths.unsqueeze(1), trash)
        slots = torch.cat([prefix_slots, query_positions], dim=1)
        # a prefix token sees the slots up to its own, a query every slot up to its row's last query
        last_seen = torch.cat([prefix_slots, (prefix_lengths + k - 1).unsqueeze(1).expand(-1, k)], dim=1)
        prefix = self.prefix_inputs(new_tokens, teacher_states)
        queries = self.mask_embedding.to(prefix).expand(bsz, k, -1)
        positions = torch.cat([prefix_positions, query_positions], dim=1).clamp(max=self.max_positions() - 1)
        x = layer_inputs(self, torch.cat([prefix, queries], dim=1), positions)
        return self.output_layer(cache.run(x, slots, last_seen)[:, width:])


def states_before(features: torch.Tensor) -> torch.Tensor:
    """The teacher's state before each token, (B, T, d), from its decoder outputs ``features`` (B, T, d) on the same
    tokens (column t: the output at position t - 1, which predicted token t; zeros at t = 0, BOS)."""
    return torch.cat([features.new_zeros(features[:, :1].shape), features[:, :-1]], dim=1)


@register_model("spec_drafter")
class SpecDrafterModel(NATPluginModel, TransformerModel):
    """The drafter of speculative decoding (module docstring). ``forward(src_tokens, src_lengths, prefix_tokens,
    prefix_lengths, logits_at)`` -> draft logits ((B, k, V); see :meth:`SpecDrafterDecoder.forward`).

    ``--init-from-ar PATH`` copies the encoder, the embeddings, the output projection and the decoder layers whose
    names and shapes match (the teacher's first ``--decoder-layers``); the mask embedding starts random."""

    generator_class = SpecDrafterGenerator
    ar_init_paper = (
        "the encoder, the embeddings and the output projection (Xia et al. 2023 describe no initialisation from the "
        "teacher: this is the SAT and RecoverSAT papers' scope)"
    )

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument(
            "--draft-size",
            type=int,
            metavar="K",
            help="tokens the drafter proposes per call (query slots after the prefix); default 4",
        )
        parser.add_argument(
            "--freeze-encoder",
            action="store_true",
            help="train the decoder only: the encoder and the embeddings (the output projection too, under "
            "--share-all-embeddings) stay the teacher's (--init-from-ar), so speculative decoding runs one encoder "
            "for both models and keeps one vocabulary matrix in memory",
        )
        parser.add_argument(
            "--read-teacher-states",
            action="store_true",
            help="each prefix token's input adds a learned projection of the teacher's decoder output before it "
            "(feature-level drafting, Li et al. 2024): training reads the states from --spec-drafter-teacher, "
            "decoding from the verifier, which must be that teacher",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "SpecDrafterModel":
        spec_drafter_base_architecture(args)
        if args.freeze_encoder and not args.init_from_ar:
            raise ValueError("--freeze-encoder keeps the teacher's encoder: it needs --init-from-ar TEACHER")
        model = super().build_model(args, task)
        if args.freeze_encoder:
            for parameter in model.encoder.parameters():  # the embeddings included (shared with the encoder)
                parameter.requires_grad_(False)
        return model

    @classmethod
    def build_decoder(
        cls, args: argparse.Namespace, tgt_dict: Dictionary, embed_tokens: nn.Embedding
    ) -> SpecDrafterDecoder:
        return SpecDrafterDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )

    @property
    def draft_size(self) -> int:
        return self.decoder.draft_size

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        prev_output_tokens: torch.Tensor,
        logits_at: Optional[torch.Tensor] = None,
        teacher_states: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """Training: the draft logits after every prefix y_0..y_c of ``prev_output_tokens`` ((B, T): BOS y_1 ..
        y_{n-1}), (B, T·k, V) (``every_cut`` of :meth:`SpecDrafterDecoder.forward`), or packed at ``logits_at``;
        ``teacher_states`` (B, T, d) with ``--read-teacher-states`` (:func:`states_before`)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        return self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            every_cut=True,
            logits_at=logits_at,
            teacher_states=teacher_states,
        )


@register_model_architecture("spec_drafter", "spec_drafter")
def spec_drafter_base_architecture(args: argparse.Namespace) -> None:
    if getattr(args, "draft_size", None) is None:
        args.draft_size = 4
    args.init_from_ar = getattr(args, "init_from_ar", None)
    args.freeze_encoder = getattr(args, "freeze_encoder", False)
    args.read_teacher_states = getattr(args, "read_teacher_states", False)
    base_architecture(args)


@register_model_architecture("spec_drafter", "spec_drafter_iwslt_de_en")
def spec_drafter_iwslt_de_en(args: argparse.Namespace) -> None:
    """``transformer_iwslt_de_en``'s encoder (the teacher's, 6 layers) and a 2-layer decoder."""
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    transformer_iwslt_de_en(args)
    spec_drafter_base_architecture(args)


@register_model_architecture("spec_drafter", "spec_drafter_wmt_en_de")
def spec_drafter_wmt_en_de(args: argparse.Namespace) -> None:
    """``transformer_wmt_en_de``'s encoder and a 2-layer decoder."""
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    transformer_wmt_en_de(args)
    spec_drafter_base_architecture(args)
