"""RecoverSAT (Ran, Lin, Li & Zhou, ACL 2020, "Learning to Recover from Multi-Modality Errors for
Non-Autoregressive Neural Machine Translation"): model ``recover_sat``.

The translation is generated as K segments in parallel, each left to right (§3.1):

* the target dictionary gets a DEL symbol (:func:`~.segments.add_segment_symbols`), added when
  the model is built, so training, ``fairseq-generate`` and ``fairseq-interactive`` see the same dictionary; every
  segment starts with fairseq's start symbol (EOS) and ends with EOS, or with DEL when it repeats its predecessor;
* decoder input embedding = token embedding + sinusoid(position inside the segment) + learned segment embedding.
  Segment embeddings are parameterised like fairseq's token embeddings: initialised N(0, 1/d) and multiplied by
  the same scale sqrt(d) (``embed_scale``), so at initialisation a segment's embedding is as large as a token's
  (unscaled, it would be sqrt(d) times weaker and every segment would see almost the same input at a step).
  Segment 0's starts at zero, so a model initialised from the AR teacher starts as the teacher on the first
  segment and K = 1 is exactly the teacher;
* decoder inputs are laid out step-major (position t*K + k = step t of segment k); a query at step t attends to
  the keys at steps <= t of every segment, plus fairseq's key padding mask (ended segments are padding).

With K = 1 this is fairseq's Transformer (plus the DEL row). Training: criterion ``recover_sat_loss`` (it builds
the segmented inputs and targets from fairseq's batches); decoding: :mod:`.decoding`.
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
    transformer_wmt_en_de,
)
from fairseq.tasks import FairseqTask
from torch import nn

from ...modules.grouped_decoder import GroupedTransformerDecoder
from ...modules.plugin_model import IncrementalState, NATPluginModel, logits_at_positions
from .decoding import RecoverSATGenerator
from .segments import DEL_SYMBOL, add_segment_symbols, segment_ids

DEFAULT_NUM_SEGMENTS = 2


class RecoverSATDecoder(GroupedTransformerDecoder):
    """fairseq's Transformer decoder on the step-major segment layout (module docstring): groups of K = the number
    of segments; with an ``incremental_state`` each call adds one step of all K segments to the cache."""

    def __init__(self, cfg, dictionary, embed_tokens, num_segments, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, num_segments, no_encoder_attn=no_encoder_attn)
        self.embed_segments = nn.Embedding(num_segments, embed_tokens.embedding_dim)  # scaled by embed_scale
        nn.init.normal_(self.embed_segments.weight, mean=0.0, std=embed_tokens.embedding_dim**-0.5)
        nn.init.zeros_(self.embed_segments.weight[0])

    @property
    def num_segments(self) -> int:
        return self.group_size

    def step_positions(self, num_steps: int, reference: torch.Tensor) -> torch.Tensor:
        """Positional embeddings of steps 0..num_steps-1 inside a segment (num_steps, C), from the decoder's own
        positional module (sinusoidal by default), numbered as fairseq numbers positions of unpadded tokens."""
        steps = reference.new_full((1, num_steps), self.padding_idx + 1)
        return self.embed_positions(steps)[0]

    def add_positions(
        self, x: torch.Tensor, prev_output_tokens: torch.Tensor, incremental_state: Optional[IncrementalState]
    ) -> torch.Tensor:
        """+ the position inside the segment + the segment embedding (§3.1) of step-major inputs (B, T*K)."""
        K = self.num_segments
        if prev_output_tokens.size(1) % K != 0:
            raise ValueError(
                f"recover_sat decoder inputs must hold whole steps of --num-segments {K} positions, "
                f"got {prev_output_tokens.size(1)} positions"
            )
        if self.embed_positions is not None:
            positions = self.step_positions(prev_output_tokens.size(1) // K, prev_output_tokens)
            if incremental_state is not None:
                positions = positions[-1:]
            x = x + positions.repeat_interleave(K, dim=0)
        return x + self.embed_scale * self.embed_segments(segment_ids(x.size(1), K, device=x.device))


@register_model("recover_sat")
class RecoverSATModel(NATPluginModel, TransformerModel):
    """RecoverSAT with ``--num-segments K`` (module docstring). ``forward(src_tokens, src_lengths,
    prev_output_tokens)`` takes step-major segment inputs (B, T*K), as built by ``recover_sat_loss``.

    ``--init-from-ar PATH`` copies every parameter of an AR Transformer checkpoint with the same name and shape,
    and the teacher's rows of the embeddings and output projection (the DEL row and the segment embeddings are
    new)."""

    generator_class = RecoverSATGenerator
    num_updates = 0
    ar_init_paper = "the encoder, the embeddings and the output projection (Ran et al. 2020, §4.1)"
    ar_added_symbols = (DEL_SYMBOL,)  # the DEL row starts random, the others are the teacher's

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument(
            "--num-segments",
            type=int,
            metavar="K",
            help=f"segments decoded in parallel (RecoverSAT's K; default {DEFAULT_NUM_SEGMENTS}); "
            "K=1 is the AR Transformer. Decoding caps each segment at int(a * ceil(|x| / K) + min(b, ceil(b / K) + "
            "10)) tokens for --max-len-a a, --max-len-b b and the batch's padded source length |x| (the paper's "
            "ceil(|x| / K) + 10: --max-len-a 1 --max-len-b 10)",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> "RecoverSATModel":
        recover_sat_base_architecture(args)
        if args.num_segments < 1:
            raise ValueError(f"--num-segments must be >= 1, got {args.num_segments}")
        add_segment_symbols(task.target_dictionary)
        if args.share_all_embeddings and task.source_dictionary is not task.target_dictionary:
            add_segment_symbols(task.source_dictionary)  # joined dictionaries must stay equal
        model = super().build_model(args, task)
        if args.num_segments > model.max_decoder_positions():
            raise ValueError(
                f"--num-segments {args.num_segments} is larger than the decoder's "
                f"{model.max_decoder_positions()} positions (--max-target-positions)"
            )
        return model

    @classmethod
    def build_decoder(
        cls, cfg: argparse.Namespace, tgt_dict: Dictionary, embed_tokens: nn.Embedding
    ) -> RecoverSATDecoder:
        num_segments = cfg.num_segments
        cfg = TransformerConfig.from_namespace(cfg)
        return RecoverSATDecoder(cfg, tgt_dict, embed_tokens, num_segments, no_encoder_attn=cfg.no_cross_attention)

    @property
    def num_segments(self) -> int:
        return self.decoder.num_segments

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        prev_output_tokens: torch.Tensor,
        logits_at: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        """fairseq's forward; ``logits_at`` (B, T) bool: the logits of those positions only, packed (N, V)
        (:func:`~nat_plugins.modules.plugin_model.logits_at_positions`; ``recover_sat_loss`` passes its non-pad
        targets)."""
        if logits_at is None:
            return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)
        features, extra = super().forward(src_tokens, src_lengths, prev_output_tokens, features_only=True, **kwargs)
        return logits_at_positions(self.decoder.output_layer, features, logits_at), extra

    def set_num_updates(self, num_updates: int) -> None:
        """Remember the update count (``recover_sat_loss`` anneals p and seeds its draws with it)."""
        super().set_num_updates(num_updates)
        self.num_updates = num_updates


@register_model_architecture("recover_sat", "recover_sat")
def recover_sat_base_architecture(args: argparse.Namespace) -> None:
    if getattr(args, "num_segments", None) is None:
        args.num_segments = DEFAULT_NUM_SEGMENTS
    args.init_from_ar = getattr(args, "init_from_ar", None)
    base_architecture(args)


@register_model_architecture("recover_sat", "recover_sat_iwslt_de_en")
def recover_sat_iwslt_de_en(args: argparse.Namespace) -> None:
    transformer_iwslt_de_en(args)
    recover_sat_base_architecture(args)


@register_model_architecture("recover_sat", "recover_sat_wmt_en_de")
def recover_sat_wmt_en_de(args: argparse.Namespace) -> None:
    transformer_wmt_en_de(args)
    recover_sat_base_architecture(args)
