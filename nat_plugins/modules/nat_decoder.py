"""Building blocks of a non-autoregressive decoder (NAD), shared by ``fertility_nat`` (Gu et al., ICLR 2018, §3)
and the NAD of ``nad_ad_transformer`` (Zhou, Zhang & Zong 2020, §3).

* decoder inputs are copies of source-side vectors (§3.1 of Gu et al.): :func:`fertility_copy_index` maps target
  position t to the source position whose fertility span covers t; uniform copy is the same with
  :func:`uniform_fertility` (target length spread evenly over the source tokens, Gu et al.'s
  "Round(T't/T)"), so both modes go through one gather, :func:`copy_source`;
* :class:`FertilityPredictor` (§3.3: a softmax over 0..L-1 on the top encoder states, after 0 or 1 hidden layer) and
  :class:`LengthPredictor` (mean-pooled encoder states -> softmax over target lengths, for uniform copy);
* :class:`NADLayer`: self-attention (optionally masking each query's own position, §3.1 "we mask out each query
  position only from attending to itself") -> positional attention (positional encodings as query and key,
  hidden states as value) -> encoder attention -> FFN, pre- or post-norm as fairseq's ``--decoder-normalize-before``;
* :class:`NonAutoregressiveDecoder`: target positional embeddings + a stack of :class:`NADLayer` -> states.

Conventions: source tensors are as fairseq batches them (either padding side, EOS last); fertilities are (B, S)
integers aligned with ``src_tokens`` with 0 on padding and EOS (``translation_nat`` batches them so); NAD
targets exclude EOS; the copied inputs are right-padded (``True`` in the padding mask = padding).
"""

import re
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import FairseqDropout, LayerNorm, MultiheadAttention, PositionalEmbedding
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import nn

# an additive mask value that hides a key but, unlike -inf, leaves a query that sees no other key (a one-token
# target with its own position masked) a defined softmax; exp(-1e4) underflows to 0 in fp16, bf16 and fp32
HIDDEN = -1e4


# NAD parameters that exist under the same name and shape in a fairseq Transformer decoder: layer i's self/encoder
# attention, FFN and their LayerNorms (``<prefix>layers.i.X`` <- ``decoder.layers.i.X``), and the final LayerNorm
AR_DECODER_SUBLAYER = re.compile(
    r"^layers\.(\d+)\.((self_attn|encoder_attn|fc1|fc2|self_attn_layer_norm|encoder_attn_layer_norm|final_layer_norm)"
    r"\..*)$"
)


def ar_decoder_parameter_name(name: str, nad_prefix: str) -> Optional[str]:
    """The AR checkpoint's name of the NAD parameter ``name`` (a NAD held at ``nad_prefix``, e.g. ``"decoder.nad."``),
    for ``--init-from-ar``: the NAD layers start as the teacher's decoder layers where they share sublayers (the
    positional attention stays random). ``None`` for other names under the prefix; names elsewhere are returned
    unchanged."""
    if not name.startswith(nad_prefix):
        return name
    local = name[len(nad_prefix) :]
    match = AR_DECODER_SUBLAYER.match(local)
    if match:
        return f"decoder.layers.{match[1]}.{match[2]}"
    if local.startswith("layer_norm."):
        return "decoder." + local
    return None


def fertility_copy_index(
    fertility: torch.Tensor, max_length: Optional[int] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Source position copied to every target position, and the target padding mask.

    ``fertility``: (B, S) non-negative integers. Returns ``index`` ((B, T), long) with ``index[b, t] = j`` for
    ``sum(fertility[b, :j]) <= t < sum(fertility[b, :j + 1])`` and ``padding`` ((B, T), bool), where
    T = max(1, longest total) (or ``max_length`` when given; longer totals are cut). Padding positions point at
    source position 0 (any valid index: they are masked).
    """
    if fertility.dim() != 2:
        raise ValueError(f"fertility must be (B, S), got shape {tuple(fertility.shape)}")
    ends = fertility.long().cumsum(dim=1)  # (B, S): end (exclusive) of each source position's span
    lengths = ends[:, -1]
    if max_length is None:  # one host-device synchronisation for the check and the length
        smallest, longest = torch.stack([fertility.min().long(), lengths.max()]).tolist()
        length = max(longest, 1)
    else:
        smallest, length = int(fertility.min()), max_length
    if smallest < 0:
        raise ValueError("fertilities must be >= 0")
    positions = torch.arange(length, device=fertility.device).unsqueeze(0).expand(fertility.size(0), -1)
    index = torch.searchsorted(ends, positions.contiguous(), right=True)
    padding = positions >= lengths.unsqueeze(1)
    return index.masked_fill(padding, 0), padding


def uniform_fertility(copyable: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Fertilities that spread ``target_lengths`` (B,) evenly over the copyable source positions (``copyable``:
    (B, S) bool, e.g. neither padding nor EOS), in order: target position t copies the floor(t * n / T)-th
    copyable position (n copyable, T target positions). Sentences with no copyable position get fertility 0."""
    n = copyable.long().sum(dim=1, keepdim=True)  # (B, 1)
    rank = copyable.long().cumsum(dim=1) - 1  # rank of each copyable position among them
    target_lengths = target_lengths.long().unsqueeze(1)
    # target positions t with floor(t * n / T) == r are those in [ceil(r * T / n), ceil((r + 1) * T / n))
    n_safe = n.clamp(min=1)
    start = (rank * target_lengths + n_safe - 1) // n_safe
    end = ((rank + 1) * target_lengths + n_safe - 1) // n_safe
    return (end - start).masked_fill(~copyable, 0)


def copy_source(source: torch.Tensor, index: torch.Tensor, order: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``source`` (B, S, C) gathered at ``index`` (N, T) -> (N, T, C), row n from sentence ``order[n]`` (N rows;
    ``order`` None: N = B, row n from sentence n), so several rows of a sentence copy one computation of its
    vectors."""
    if order is None:
        return source.gather(1, index.unsqueeze(-1).expand(-1, -1, source.size(-1)))
    return source.flatten(0, 1)[order.unsqueeze(1) * source.size(1) + index]


def self_attention_mask(length: int, mask_diagonal: bool, reference: torch.Tensor) -> Optional[torch.Tensor]:
    """Additive (T, T) self-attention mask of the NAD: None (all visible) or each query's own key hidden."""
    if not mask_diagonal:
        return None
    return torch.zeros(length, length, dtype=reference.dtype, device=reference.device).fill_diagonal_(HIDDEN)


class FertilityPredictor(nn.Module):
    """Gu et al. §3.3: a softmax classifier over fertilities 0..L-1 on each top encoder state.

    ``hidden_layers`` 0: the classifier alone, a single linear layer before the softmax (reading §3.3's "one-layer
    neural network with a softmax classifier" as that one layer); 1 (default, as before the option existed): a ReLU
    hidden layer of the encoder's width, with dropout, before it (parameters ``hidden`` and ``out``)."""

    def __init__(self, embed_dim: int, max_fertility: int, dropout: float = 0.0, hidden_layers: int = 1) -> None:
        super().__init__()
        if max_fertility < 2:
            raise ValueError(f"--max-fertility must be at least 2, got {max_fertility}")
        if hidden_layers not in (0, 1):
            raise ValueError(f"--fertility-hidden-layers must be 0 or 1, got {hidden_layers}")
        self.max_fertility = max_fertility
        if hidden_layers:
            self.hidden = nn.Linear(embed_dim, embed_dim)
            self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        else:
            self.hidden = None
        self.out = nn.Linear(embed_dim, max_fertility)

    def forward(self, encoder_states: torch.Tensor) -> torch.Tensor:
        """Logits (B, S, L) of the fertility of every source position (``encoder_states``: (B, S, C))."""
        if self.hidden is not None:
            encoder_states = self.dropout_module(F.relu(self.hidden(encoder_states)))
        return self.out(encoder_states)


class LengthPredictor(nn.Module):
    """Target length (EOS excluded) from the mean of the unpadded top encoder states, a softmax over 0..max-1."""

    def __init__(self, embed_dim: int, max_length: int) -> None:
        super().__init__()
        self.max_length = max_length
        self.out = nn.Linear(embed_dim, max_length)

    def forward(self, encoder_states: torch.Tensor, encoder_padding_mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, max_length); ``encoder_states`` (B, S, C), ``encoder_padding_mask`` (B, S) (True = pad)."""
        keep = (~encoder_padding_mask).unsqueeze(-1).float()  # pooled in fp32: an fp16 sum over S overflows
        pooled = (encoder_states.float() * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)
        return self.out(pooled.to(encoder_states.dtype))


def reject_normformer_options(layer: nn.Module, who: str) -> None:
    """Fail on fairseq's NormFormer/scale sublayers (``--scale-attn`` etc.), which these layers' forward skips."""
    for extra in ("attn_ln", "c_attn", "ffn_layernorm", "w_resid"):
        if getattr(layer, extra, None) is not None:
            raise ValueError(
                f"{who} does not support fairseq's '{extra}' (NormFormer/scale options): leave "
                "--scale-attn/--scale-heads/--scale-fc/--scale-resids off"
            )


def residual_sublayer(
    layer: TransformerDecoderLayerBase,
    x: torch.Tensor,
    layer_norm: Callable[[torch.Tensor], torch.Tensor],
    fn: Callable[[torch.Tensor], Tuple[torch.Tensor, Optional[torch.Tensor]]],
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One residual sublayer of a fairseq decoder layer ``layer``, with its pre-/post-norm placement
    (``layer.normalize_before``) and dropout: ``fn(x)`` returns (output, extra); returns (new x, extra)."""
    residual = x
    if layer.normalize_before:
        x = layer_norm(x)
    x, extra = fn(x)
    x = layer.residual_connection(layer.dropout_module(x), residual)
    if not layer.normalize_before:
        x = layer_norm(x)
    return x, extra


class NADLayer(TransformerDecoderLayerBase):
    """A NAD layer: self-attention -> positional attention -> encoder attention -> FFN, each a residual sublayer
    (fairseq's pre-/post-norm choice). Reuses fairseq's decoder layer for the self/encoder attention and FFN."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg)
        reject_normformer_options(self, "the non-autoregressive decoder layer")
        self.pos_attn = self.build_positional_attention(self.embed_dim, cfg)
        self.pos_attn_layer_norm = LayerNorm(self.embed_dim, export=cfg.export)

    def build_positional_attention(self, embed_dim: int, cfg: TransformerConfig) -> MultiheadAttention:
        """Gu et al. §3.1 positional attention: positional encodings as query and key, the decoder states as value.

        fairseq's ``MultiheadAttention`` with neither ``self_attention`` nor ``encoder_decoder_attention`` set, whose
        general branch projects query, key and value each from its own input on every path; parameter names and
        shapes are an encoder attention's, so checkpoints load unchanged (see docs/design-notes.md, *The NAD's
        positional attention: fairseq's general attention branch*)."""
        return MultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=embed_dim,
            vdim=embed_dim,
            dropout=cfg.attention_dropout,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        encoder_out: Optional[torch.Tensor],
        encoder_padding_mask: Optional[torch.Tensor],
        self_attn_mask: Optional[torch.Tensor] = None,
        padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The layer's output (T, B, C) for ``x`` and ``positions`` (T, B, C), ``encoder_out`` (S, B, C) or None;
        masks as fairseq's (True = padding)."""

        def self_attention(h: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
            return self.self_attn(
                query=h, key=h, value=h, key_padding_mask=padding_mask, attn_mask=self_attn_mask, need_weights=False
            )

        def positional_attention(h: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
            return self.pos_attn(
                query=positions, key=positions, value=h, key_padding_mask=padding_mask, need_weights=False
            )

        def encoder_attention(h: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
            return self.encoder_attn(
                query=h, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask, need_weights=False
            )

        def feed_forward(h: torch.Tensor) -> Tuple[torch.Tensor, None]:
            h = self.activation_dropout_module(self.activation_fn(self.fc1(h)))
            return self.fc2(h), None

        x, _ = residual_sublayer(self, x, self.self_attn_layer_norm, self_attention)
        x, _ = residual_sublayer(self, x, self.pos_attn_layer_norm, positional_attention)
        if encoder_out is not None:
            x, _ = residual_sublayer(self, x, self.encoder_attn_layer_norm, encoder_attention)
        return residual_sublayer(self, x, self.final_layer_norm, feed_forward)[0]


class NonAutoregressiveDecoder(nn.Module):
    """Target positional embeddings + ``num_layers`` :class:`NADLayer` s (+ a final LayerNorm when pre-norm).

    ``cfg`` is fairseq's ``TransformerConfig`` (its decoder sizes, dropout, normalize_before, learned_pos are used);
    ``mask_self_diagonal`` hides each query's own position in self-attention (Gu et al. §3.1)."""

    def __init__(self, cfg: TransformerConfig, num_layers: int, padding_idx: int, mask_self_diagonal: bool) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"the non-autoregressive decoder needs at least one layer, got {num_layers}")
        embed_dim = cfg.decoder.embed_dim
        self.padding_idx = padding_idx
        self.mask_self_diagonal = mask_self_diagonal
        self.embed_positions = PositionalEmbedding(
            cfg.max_target_positions, embed_dim, padding_idx, learned=cfg.decoder.learned_pos
        )
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=type(self).__name__)
        self.layers = nn.ModuleList([NADLayer(cfg) for _ in range(num_layers)])
        self.layer_norm = LayerNorm(embed_dim, export=cfg.export) if cfg.decoder.normalize_before else None

    def max_positions(self) -> int:
        """The most target positions the positional embeddings cover (``--max-target-positions``)."""
        return self.embed_positions.max_positions

    def positions(self, padding_mask: torch.Tensor) -> torch.Tensor:
        """Positional embeddings (B, T, C) of right-padded target positions (zero vectors on padding for
        sinusoids, as fairseq's)."""
        pseudo_tokens = padding_mask.long().mul(self.padding_idx) + (~padding_mask).long().mul(self.padding_idx + 1)
        return self.embed_positions(pseudo_tokens)

    def forward(
        self, inputs: torch.Tensor, padding_mask: torch.Tensor, encoder_out: Dict[str, List[torch.Tensor]]
    ) -> Tuple[torch.Tensor, Dict[str, List[torch.Tensor]]]:
        """States (B, T, C) of the NAD for copied ``inputs`` ((B, T, C), right-padded), ``padding_mask`` (B, T)
        and fairseq's ``encoder_out`` dict; also a dict with the per-layer ``inner_states`` (T, B, C)."""
        if inputs.size(1) > self.max_positions():
            raise ValueError(
                f"the non-autoregressive decoder got {inputs.size(1)} target positions, more than its "
                f"{self.max_positions()} (--max-target-positions)"
            )
        positions = self.positions(padding_mask)
        x = self.dropout_module(inputs + positions).transpose(0, 1)
        positions = positions.transpose(0, 1)
        enc = encoder_out["encoder_out"][0] if encoder_out.get("encoder_out") else None
        enc_padding = encoder_out["encoder_padding_mask"][0] if encoder_out.get("encoder_padding_mask") else None
        attn_mask = self_attention_mask(x.size(0), self.mask_self_diagonal, x)
        key_padding = padding_mask if padding_mask.any() else None
        inner_states = [x]
        for layer in self.layers:
            x = layer(x, positions, enc, enc_padding, self_attn_mask=attn_mask, padding_mask=key_padding)
            inner_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x.transpose(0, 1), {"inner_states": inner_states}
