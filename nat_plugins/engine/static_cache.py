"""A static-shape decoder step: fairseq ``TransformerDecoder`` weights run on new tokens against key/value buffers
allocated once per batch. Called by the verify-accept loop (nat_plugins/generators/verify_accept_loop.py) and by
:meth:`~nat_plugins.modules.grouped_decoder.GroupedTransformerDecoder.new_cache` (SAT, RecoverSAT); the layers are
those of :mod:`.lean_decoder`, so it runs the decoders :func:`~.lean_decoder.lean_unsupported` accepts, in evaluation.

Every layer's self-attention keys and values live in (B, heads, L, d) buffers, L the batch's longest output + the
block: a token at target position p is written into slot p in place, and a query at slot p attends to the slots <= p
of its own sentence. A rejected draft needs no rollback (its slot is overwritten when that position is decoded again,
and no query attends past its own slot meanwhile); a sentence leaving the batch is an index on the buffers' first
dimension; the encoder's keys, values and padding mask are computed once per batch. Features equal fairseq's up to
rounding (tests/test_static_cache.py). Against fairseq's growing cache: see docs/design-notes.md, *The static decoder
step against fairseq's incremental cache*.
"""

from typing import Dict, List, Optional

import torch
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from .block_call import layer_inputs, layer_outputs
from .lean_decoder import attend, feed_forward, lean_unsupported, padding_bias, project_qkv, residual_block, split_heads


def static_unsupported(
    decoder: TransformerDecoderBase, encoder_out: Optional[Dict[str, List[torch.Tensor]]]
) -> Optional[str]:
    """Why :class:`StaticCache` cannot run ``decoder`` on ``encoder_out`` (a string), or None when it can."""
    if decoder.training:
        return "the decoder is in training mode (dropout)"
    if encoder_out is None or not encoder_out["encoder_out"]:
        return "no encoder output"
    if getattr(decoder, "cross_self_attention", False):
        return "--cross-self-attention"
    return lean_unsupported(decoder)


def self_attention(
    layer: TransformerDecoderLayerBase,
    x: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    index: torch.Tensor,
    used: int,
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """``layer``'s self-attention for new slots ``x`` (B, T, C): their keys and values written into the ``keys`` and
    ``values`` buffers (B, heads, L, d) at ``index`` (their slots, expanded to (B, heads, T, d)), their queries
    attending to the first ``used`` slots under the additive ``bias`` (or None: every one of them visible)."""
    queries, new_keys, new_values = project_qkv(layer.self_attn, x)
    keys.scatter_(2, index, new_keys)
    values.scatter_(2, index, new_values)
    return attend(layer.self_attn, queries, keys[:, :, :used], values[:, :, :used], bias)


def encoder_attention(
    layer: TransformerDecoderLayerBase,
    x: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """``layer``'s encoder attention against the encoder's cached ``keys`` and ``values``."""
    attention = layer.encoder_attn
    return attend(attention, split_heads(attention.q_proj(x), attention), keys, values, bias)


class StaticCache:
    """Preallocated self-attention buffers of ``decoder`` for the batch of ``encoder_out`` (``length`` slots per
    sentence) and its encoder keys and values (see the module). :meth:`step` runs the decoder; :meth:`reorder` keeps
    some sentences."""

    def __init__(
        self, decoder: TransformerDecoderBase, encoder_out: Dict[str, List[torch.Tensor]], length: int
    ) -> None:
        reason = static_unsupported(decoder, encoder_out)
        if reason is not None:
            raise ValueError(f"the static decoder step cannot run this decoder: {reason}")
        self.decoder = decoder
        memory = encoder_out["encoder_out"][0].transpose(0, 1)  # (B, S, C)
        mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        self.encoder_bias = padding_bias(mask, memory) if mask is not None and mask.any() else None
        self.encoder_keys, self.encoder_values = [], []
        for layer in decoder.layers:
            attention = layer.encoder_attn
            self.encoder_keys.append(None if attention is None else split_heads(attention.k_proj(memory), attention))
            self.encoder_values.append(None if attention is None else split_heads(attention.v_proj(memory), attention))
        # zeros, not empty: a slot no query may see is still multiplied by its weight 0 (NaN * 0 = NaN)
        self.keys, self.values = [], []
        for layer in decoder.layers:
            shape = (memory.size(0), layer.self_attn.num_heads, length, layer.self_attn.head_dim)
            self.keys.append(memory.new_zeros(shape))
            self.values.append(memory.new_zeros(shape))

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        used: int,
        encoder_out: Optional[Dict[str, List[torch.Tensor]]] = None,
    ) -> torch.Tensor:
        """Decoder features (B, T, C; after the final layer norm and ``project_out_dim``) of the new ``tokens``
        (B, T) at target ``positions`` (B, T; their positional embeddings), written into cache ``slots`` (B, T),
        each seeing the slots <= its own among the first ``used`` (``used`` > every slot: the caller knows it on
        the host, so the step needs no device-to-host copy). ``encoder_out`` is not read: the encoder's keys and
        values were computed once."""
        decoder = self.decoder
        x = layer_inputs(decoder, decoder.embed_scale * decoder.embed_tokens(tokens), positions)
        bias = None
        # one sentence's single new slot is the last used one: it sees them all, no bias
        if tokens.size(0) > 1 or tokens.size(1) > 1:
            hidden = torch.arange(used, device=slots.device) > slots.unsqueeze(-1)  # (B, T, used)
            bias = torch.zeros(hidden.shape, dtype=x.dtype, device=x.device).masked_fill_(hidden, float("-inf"))
            bias = bias.unsqueeze(1)
        return self.run(x, slots, used, bias)

    def run(self, x: torch.Tensor, slots: torch.Tensor, used: int, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The decoder's layers and outputs on layer inputs ``x`` (B, T, C) of new slots ``slots`` (B, T), which
        attend to the first ``used`` slots under the additive ``bias`` (broadcast to (B, heads, T, used); None:
        every one of them visible). Returns features as :meth:`step`."""
        bsz, width = slots.shape
        index = slots[:, None, :, None].expand(bsz, self.keys[0].size(1), width, self.keys[0].size(3))
        for i, layer in enumerate(self.decoder.layers):
            x = residual_block(
                layer, layer.self_attn_layer_norm, x, self_attention, self.keys[i], self.values[i], index, used, bias
            )
            if self.encoder_keys[i] is not None:
                x = residual_block(
                    layer,
                    layer.encoder_attn_layer_norm,
                    x,
                    encoder_attention,
                    self.encoder_keys[i],
                    self.encoder_values[i],
                    self.encoder_bias,
                )
            x = residual_block(layer, layer.final_layer_norm, x, feed_forward)
        return layer_outputs(self.decoder, x)

    def accept(self, width: int, accepted: torch.Tensor, kept_length: int) -> None:
        """Nothing to roll back: a rejected slot is overwritten when its position is decoded again."""

    def reorder(self, keep: torch.Tensor) -> None:
        """Keep sentences ``keep`` (indices into the batch), in that order."""

        def select(tensors: List[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
            return [None if t is None else t.index_select(0, keep) for t in tensors]

        self.keys, self.values = select(self.keys), select(self.values)
        self.encoder_keys, self.encoder_values = select(self.encoder_keys), select(self.encoder_values)
        if self.encoder_bias is not None:
            self.encoder_bias = self.encoder_bias.index_select(0, keep)
