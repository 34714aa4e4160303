"""Semi-Autoregressive Transformer (SAT; Wang, Zhang & Chen, EMNLP 2018, "Semi-Autoregressive Neural Machine
Translation").

The decoder emits a group of K consecutive tokens per step (the paper's group-level chain rule, §3):

* long-distance prediction (§3.1): the decoder input at target position t is y_{t-K}, the first K inputs are
  K start symbols (fairseq's start symbol, EOS, repeated);
* relaxed causal mask (§3.2, Figure 4): a query in group g sees every position of groups 0..g;
* the last group may end early: positions after EOS are padding (not trained), but a query of the last group
  sees the inputs of its whole group, exactly as group decoding does.

With K = 1 this is fairseq's Transformer: same parameter names, same outputs. Training uses fairseq's criteria
(``label_smoothed_cross_entropy``) on ordinary batches: :meth:`SATTransformerModel.forward` turns fairseq's
``prev_output_tokens`` (targets shifted by one) into SAT's inputs. Decoding: :mod:`..generators.group_decoding`.
"""

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

from ..generators.group_decoding import GroupDecoder
from ..modules.grouped_decoder import GroupedTransformerDecoder
from .plugin_model import NATPluginModel

DEFAULT_GROUP_SIZE = 2


class SATTransformerDecoder(GroupedTransformerDecoder):
    """fairseq's Transformer decoder fed y_{t-K} under the relaxed causal mask; in incremental decoding each
    call adds one whole group (K positions) to the key/value cache. K is saved with the parameters
    (``trained_group_size``), so a checkpoint cannot be decoded with another K."""

    def __init__(self, cfg, dictionary, embed_tokens, group_size, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, group_size, no_encoder_attn=no_encoder_attn)
        self.register_buffer("trained_group_size", torch.tensor(group_size))

    def upgrade_state_dict_named(self, state_dict, name):
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

    def group_inputs(self, prev_output_tokens):
        """SAT decoder inputs from fairseq's ``prev_output_tokens`` (start symbol, y_0, y_1, ...; right-padded):
        K start symbols, then y_{t-K} at position t (§3.1). The length is rounded up to a multiple of K so that
        the last group of the longest target sees its whole group, as in decoding."""
        tgt_len = prev_output_tokens.size(1)
        padded_len = -(-tgt_len // self.group_size) * self.group_size
        extra_starts = prev_output_tokens[:, :1].expand(-1, self.group_size - 1)
        return torch.cat([extra_starts, prev_output_tokens], dim=1)[:, :padded_len]

    def add_positions(self, x, prev_output_tokens, incremental_state):
        """fairseq's target positions (numbered over all of ``prev_output_tokens``)."""
        if self.embed_positions is None:
            return x
        positions = self.embed_positions(prev_output_tokens)
        return x + (positions if incremental_state is None else positions[:, -self.group_size :])


@register_model("sat_transformer")
class SATTransformerModel(NATPluginModel, TransformerModel):
    """Transformer with SAT's decoder (``--group-size K``) and group decoding (greedy, ``--beam B``).

    ``--init-from-ar PATH`` initialises it from an AR Transformer checkpoint of the same sizes and dictionaries.
    ``--init-from-ar-scope all`` (default) copies every parameter with the same name and shape, decoder layers
    included; ``paper`` copies the encoder, the embeddings and the output projection only, as the paper (§4) and its
    released code do (the decoder layers start random).

    Why ``all`` is the default although a copied AR decoder layer predicts the successor of its input (y_{t-K+1}
    at position t, so the untrained SAT K=2 emits each token twice: 0.94 of its groups are one token repeated):
    measured on the learning tests' synthetic task (tests/test_sat.py; K=2 from a 81-BLEU greedy teacher,
    distilled targets, 600 updates, lr 3e-3 linearly decayed, 500 tokens per batch), ``all`` reaches 77.7 greedy
    BLEU with 0.19 of its groups repeated, ``paper`` 41.5 BLEU with 0.55 repeated; ``all`` was ahead at every
    checkpoint of every schedule tried (100 to 800 updates): relearning the decoder from random costs more than
    unlearning the one-position shift.
    """

    generator_class = GroupDecoder
    scored_by_fairseq = True  # --score-reference: fairseq's scorer, through :meth:`forward`
    ar_init_paper = "the encoder, the embeddings and the output projection (Wang et al. 2018, §4)"

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--group-size",
            type=int,
            metavar="K",
            help=f"tokens per decoding step (SAT's K; default {DEFAULT_GROUP_SIZE}); K=1 is the AR Transformer",
        )
        cls.add_init_from_ar_args(parser)

    @classmethod
    def build_model(cls, args, task):
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
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        group_size = cfg.group_size
        cfg = TransformerConfig.from_namespace(cfg)
        return SATTransformerDecoder(cfg, tgt_dict, embed_tokens, group_size, no_encoder_attn=cfg.no_cross_attention)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        """fairseq's forward on fairseq's batches: ``prev_output_tokens`` (shifted by one) become SAT's inputs
        (shifted by K) and the output is cut back to the target length."""
        tgt_len = prev_output_tokens.size(1)
        x, extra = super().forward(src_tokens, src_lengths, self.decoder.group_inputs(prev_output_tokens), **kwargs)
        return x[:, :tgt_len], extra


@register_model_architecture("sat_transformer", "sat_transformer")
def sat_base_architecture(args):
    if getattr(args, "group_size", None) is None:
        args.group_size = DEFAULT_GROUP_SIZE
    args.init_from_ar = getattr(args, "init_from_ar", None)
    base_architecture(args)


@register_model_architecture("sat_transformer", "sat_transformer_iwslt_de_en")
def sat_transformer_iwslt_de_en(args):
    transformer_iwslt_de_en(args)
    sat_base_architecture(args)


@register_model_architecture("sat_transformer", "sat_transformer_wmt_en_de")
def sat_transformer_wmt_en_de(args):
    transformer_wmt_en_de(args)
    sat_base_architecture(args)


@register_model_architecture("sat_transformer", "sat_transformer_vaswani_wmt_en_de_big")
def sat_transformer_vaswani_wmt_en_de_big(args):
    transformer_vaswani_wmt_en_de_big(args)
    sat_base_architecture(args)
