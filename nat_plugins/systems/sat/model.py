"""Semi-Autoregressive Transformer (SAT; Wang, Zhang & Chen, EMNLP 2018, "Semi-Autoregressive Neural Machine
Translation").

The decoder emits a group of K consecutive tokens per step (the paper's group-level chain rule, §3):

* long-distance prediction (§3.1): the decoder input at target position t is y_{t-K}, the first K inputs are
  K start symbols (fairseq's start symbol, EOS, repeated);
* relaxed causal mask (§3.2, Figure 4): a query in group g sees every position of groups 0..g;
* the last group may end early: positions after EOS are padding (not trained), but a query of the last group
  sees the inputs of its whole group, exactly as group decoding does.

Two options beyond the paper, off by default (``--arch sat_transformer`` is the paper's model;
examples/multi30k/sat.sh turns both on), against the stutter of a group's K positions, which see the same inputs
under the relaxed mask, predicting the same word ("Zwei Zwei Männer Männer"):

* ``--group-slot-embedding``: a learned embedding of the slot (0..K-1, the position inside the group) added to
  the decoder input, so that a position knows which word of its group it predicts;
* ``--group-repeat-bias``: slot k >= 1's logit of the word emitted at slot k-1 gets a learned bias (one scalar per
  slot); training feeds the reference word (teacher forcing), group decoding the word the search chose. Still one
  decoder call per group.

Both start at zero (the model starts as the paper's) and are scaled by ``embed_scale`` like the token embeddings.
Why and what they gain: see docs/design-notes.md, *SAT: the two options beyond the paper*.

With K = 1 (options off) this is fairseq's Transformer: same parameter names, same outputs. Training uses fairseq's
criteria (``label_smoothed_cross_entropy``) on ordinary batches: :meth:`SATTransformerModel.forward` turns fairseq's
``prev_output_tokens`` (targets shifted by one) into SAT's inputs. Decoding: :mod:`.decoding`.
"""

import argparse
from typing import Any, Dict, Optional, Tuple

import torch
from fairseq.data import Dictionary
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)
from fairseq.tasks import FairseqTask
from torch import nn

from ...modules.grouped_decoder import GroupedTransformerDecoder
from ...modules.plugin_model import EncoderOut, IncrementalState, NATPluginModel
from .decoding import SATGenerator

DEFAULT_GROUP_SIZE = 2


class SATTransformerDecoder(GroupedTransformerDecoder):
    """fairseq's Transformer decoder fed y_{t-K} under the relaxed causal mask; in incremental decoding each
    call adds one whole group (K positions) to the key/value cache. K is saved with the parameters
    (``trained_group_size``), so a checkpoint cannot be decoded with another K.

    ``slot_embedding`` / ``repeat_bias``: ``--group-slot-embedding`` / ``--group-repeat-bias`` (module docstring;
    beyond the paper). Their parameters exist only when the option is on, so checkpoints of the paper's model have
    the same parameters as before."""

    def __init__(
        self, cfg, dictionary, embed_tokens, group_size, no_encoder_attn=False, slot_embedding=False, repeat_bias=False
    ):
        super().__init__(cfg, dictionary, embed_tokens, group_size, no_encoder_attn=no_encoder_attn)
        self.register_buffer("trained_group_size", torch.tensor(group_size))
        self.embed_group_slots = None
        if slot_embedding:
            self.embed_group_slots = nn.Embedding(group_size, cfg.decoder.embed_dim)
            nn.init.zeros_(self.embed_group_slots.weight)
        self.group_repeat_bias = None
        if repeat_bias and group_size > 1:
            if self.adaptive_softmax is not None:
                raise ValueError("--group-repeat-bias needs the decoder's logits: drop --adaptive-softmax-cutoff")
            self.group_repeat_bias = nn.Parameter(torch.zeros(group_size - 1))

    def upgrade_state_dict_named(self, state_dict: Dict[str, torch.Tensor], name: str) -> Dict[str, torch.Tensor]:
        """Refuse a checkpoint trained with another K (e.g. ``--model-overrides "{'group_size': 4}"``: the model
        would decode without an error and print wrong translations); checkpoints written before K was saved load
        as they are."""
        state_dict = super().upgrade_state_dict_named(state_dict, name)
        key = f"{name}.trained_group_size" if name else "trained_group_size"
        trained = int(state_dict.setdefault(key, self.trained_group_size.clone()))
        if trained != self.group_size:
            raise ValueError(
                f"this sat_transformer checkpoint was trained with --group-size {trained} and cannot decode with "
                f"--group-size {self.group_size}: drop group_size from --model-overrides (or from_pretrained's "
                "keyword arguments)"
            )
        return state_dict

    def group_inputs(self, prev_output_tokens: torch.Tensor) -> torch.Tensor:
        """SAT decoder inputs from fairseq's ``prev_output_tokens`` (start symbol, y_0, y_1, ...; right-padded):
        K start symbols, then y_{t-K} at position t (§3.1). The length is rounded up to a multiple of K so that
        the last group of the longest target sees its whole group, as in decoding."""
        tgt_len = prev_output_tokens.size(1)
        padded_len = -(-tgt_len // self.group_size) * self.group_size
        extra_starts = prev_output_tokens[:, :1].expand(-1, self.group_size - 1)
        return torch.cat([extra_starts, prev_output_tokens], dim=1)[:, :padded_len]

    def add_positions(
        self, x: torch.Tensor, prev_output_tokens: torch.Tensor, incremental_state: Optional[IncrementalState]
    ) -> torch.Tensor:
        """fairseq's target positions (numbered over all of ``prev_output_tokens``), plus the slot embedding with
        ``--group-slot-embedding``."""
        if self.embed_group_slots is not None:
            # full forward: whole groups from position 0 (group_inputs); incremental: the K positions of one group
            slots = torch.arange(x.size(1), device=x.device) % self.group_size
            x = x + self.embed_scale * self.embed_group_slots(slots)
        if self.embed_positions is None:
            return x
        positions = self.embed_positions(prev_output_tokens)
        return x + (positions if incremental_state is None else positions[:, -self.group_size :])

    @property
    def has_repeat_bias(self) -> bool:
        """Whether slot k >= 1 reads the token of slot k-1 (``--group-repeat-bias``, K > 1)."""
        return self.group_repeat_bias is not None

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
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """fairseq's decoder forward; with ``--group-repeat-bias`` the output layer also gets the tokens of the
        groups: without an ``incremental_state`` they are in the inputs (:meth:`emitted_tokens`); in incremental
        decoding they are not known yet and each slot reads the argmax of the slot before it (group decoding passes
        the tokens it chose instead: :meth:`slot_logits`)."""
        x, extra = self.extract_features(
            prev_output_tokens,
            encoder_out=encoder_out,
            incremental_state=incremental_state,
            full_context_alignment=full_context_alignment,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
        )
        if features_only:
            return x, extra
        if not self.has_repeat_bias:
            return self.output_layer(x), extra
        return self.output_layer(
            x, None if incremental_state is not None else self.emitted_tokens(prev_output_tokens)
        ), extra

    def emitted_tokens(self, group_inputs: torch.Tensor) -> torch.Tensor:
        """For every output position p, the token y_{p-1} emitted at the position before it (B, T): the group inputs
        (K start symbols, then y_{t-K} at t) shifted by K-1; padding at the end."""
        tail = group_inputs.new_full((group_inputs.size(0), self.group_size - 1), self.padding_idx)
        return torch.cat([group_inputs[:, self.group_size - 1 :], tail], dim=1)

    def output_layer(self, features: torch.Tensor, emitted_tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """fairseq's output projection, plus with ``--group-repeat-bias`` the bias of slot k >= 1 on the token of
        slot k-1: ``emitted_tokens[:, p]`` (:meth:`emitted_tokens`) or, when None, the argmax of slot k-1.
        ``features`` (B, T, C) hold whole groups."""
        logits = super().output_layer(features)
        if not self.has_repeat_bias:
            return logits
        K = self.group_size
        bsz, length = features.shape[:2]
        if length % K != 0:
            raise ValueError(
                f"sat_transformer with --group-repeat-bias scores whole groups of {K}, got {length} positions"
            )
        groups = logits.view(bsz, length // K, K, -1)
        emitted = None if emitted_tokens is None else emitted_tokens.view(bsz, length // K, K)
        slots = []
        for slot in range(K):
            previous = None
            if slot > 0:
                previous = slots[-1].argmax(dim=-1) if emitted is None else emitted[:, :, slot]
            slots.append(self.add_repeat_bias(groups[:, :, slot], slot, previous))
        return torch.stack(slots, dim=2).view(bsz, length, -1)

    def add_repeat_bias(self, logits: torch.Tensor, slot: int, previous: Optional[torch.Tensor]) -> torch.Tensor:
        """``logits`` (..., V) of slot ``slot`` with ``--group-repeat-bias``: + the slot's bias on ``previous`` (...),
        the token emitted at slot - 1 (nothing for slot 0)."""
        if slot == 0 or not self.has_repeat_bias:
            return logits
        bias = (self.embed_scale * self.group_repeat_bias[slot - 1]).to(logits).expand(previous.shape)
        return logits.scatter_add(-1, previous.unsqueeze(-1), bias.unsqueeze(-1))

    def slot_logits(self, features: torch.Tensor, slot: int, previous: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits (..., V) of the group's slot ``slot`` from its features (..., C) and, for slot >= 1 with
        ``--group-repeat-bias``, the tokens ``previous`` (...) emitted at slot - 1."""
        return self.add_repeat_bias(super().output_layer(features), slot, previous)


@register_model("sat_transformer")
class SATTransformerModel(NATPluginModel, TransformerModel):
    """Transformer with SAT's decoder (``--group-size K``) and group decoding (greedy, ``--beam B``).

    ``--init-from-ar PATH`` initialises it from an AR Transformer checkpoint of the same sizes and dictionaries.
    ``--init-from-ar-scope all`` (default) copies every parameter with the same name and shape, decoder layers
    included; ``paper`` copies the encoder, the embeddings and the output projection only, as the paper (§4) and its
    released code do (the decoder layers start random). Why ``all`` is the default: see docs/design-notes.md,
    *SAT: why --init-from-ar-scope all is the default*.
    """

    generator_class = SATGenerator
    scored_by_fairseq = True  # --score-reference: fairseq's scorer, through :meth:`forward`
    ar_init_paper = "the encoder, the embeddings and the output projection (Wang et al. 2018, §4)"

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument(
            "--group-size",
            type=int,
            metavar="K",
            help=f"tokens per decoding step (SAT's K; default {DEFAULT_GROUP_SIZE}); K=1 is the AR Transformer",
        )
        parser.add_argument(
            "--group-slot-embedding",
            action="store_true",
            help="beyond the paper: add a learned embedding of the position inside the group (0..K-1; zero at "
            "initialisation) to the decoder input, so that the K positions of a group, which see the same inputs, "
            "know which word they predict (against a group's positions repeating each other)",
        )
        parser.add_argument(
            "--group-repeat-bias",
            action="store_true",
            help="beyond the paper: position k >= 1 of a group adds a learned bias (zero at initialisation) to "
            "its logit of the word emitted at position k-1 (training: the reference word; decoding: the word "
            "chosen), so the model learns how rarely a group repeats a word (one decoder call per group still)",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "SATTransformerModel":
        sat_base_architecture(args)
        if args.group_size < 1:
            raise ValueError(f"--group-size must be >= 1, got {args.group_size}")
        model = super().build_model(args, task)
        if args.group_size > model.max_decoder_positions():
            raise ValueError(
                f"--group-size {args.group_size} is larger than the decoder's "
                f"{model.max_decoder_positions()} positions (--max-target-positions)"
            )
        return model

    @classmethod
    def build_decoder(
        cls, cfg: argparse.Namespace, tgt_dict: Dictionary, embed_tokens: nn.Embedding
    ) -> SATTransformerDecoder:
        group_size = cfg.group_size
        slot_embedding, repeat_bias = cfg.group_slot_embedding, cfg.group_repeat_bias
        cfg = TransformerConfig.from_namespace(cfg)
        return SATTransformerDecoder(
            cfg,
            tgt_dict,
            embed_tokens,
            group_size,
            no_encoder_attn=cfg.no_cross_attention,
            slot_embedding=slot_embedding,
            repeat_bias=repeat_bias,
        )

    def forward(
        self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, prev_output_tokens: torch.Tensor, **kwargs: Any
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """fairseq's forward on fairseq's batches: ``prev_output_tokens`` (shifted by one) become SAT's inputs
        (shifted by K) and the output is cut back to the target length."""
        tgt_len = prev_output_tokens.size(1)
        x, extra = super().forward(src_tokens, src_lengths, self.decoder.group_inputs(prev_output_tokens), **kwargs)
        return x[:, :tgt_len], extra


@register_model_architecture("sat_transformer", "sat_transformer")
def sat_base_architecture(args: argparse.Namespace) -> None:
    if getattr(args, "group_size", None) is None:
        args.group_size = DEFAULT_GROUP_SIZE
    args.init_from_ar = getattr(args, "init_from_ar", None)
    # off (the paper's model) unless asked for; checkpoints written before these options existed have neither
    args.group_slot_embedding = getattr(args, "group_slot_embedding", False)
    args.group_repeat_bias = getattr(args, "group_repeat_bias", False)
    base_architecture(args)


@register_model_architecture("sat_transformer", "sat_transformer_iwslt_de_en")
def sat_transformer_iwslt_de_en(args: argparse.Namespace) -> None:
    transformer_iwslt_de_en(args)
    sat_base_architecture(args)


@register_model_architecture("sat_transformer", "sat_transformer_wmt_en_de")
def sat_transformer_wmt_en_de(args: argparse.Namespace) -> None:
    transformer_wmt_en_de(args)
    sat_base_architecture(args)


@register_model_architecture("sat_transformer", "sat_transformer_vaswani_wmt_en_de_big")
def sat_transformer_vaswani_wmt_en_de_big(args: argparse.Namespace) -> None:
    transformer_vaswani_wmt_en_de_big(args)
    sat_base_architecture(args)
