"""fairseq's Transformer decoder over target positions that come in groups of K decoded together: the groups of the
Semi-Autoregressive Transformer (Wang et al., EMNLP 2018, §3) and the steps of RecoverSAT's K segments in its
step-major layout (Ran et al., ACL 2020, §3.1). Both attend under the relaxed causal mask (a query of group g sees
every position of groups 0..g, :func:`relaxed_causal_mask`) and, in incremental
decoding, add one whole group (the last K positions) to the key/value cache per call; they differ only in the
positional part of the input embedding (:meth:`GroupedTransformerDecoder.add_positions`).

Decoding keeps that cache in the engine's decoding cache (:meth:`GroupedTransformerDecoder.new_cache`,
:func:`~nat_plugins.engine.decoding_cache`): the static step's buffers where it runs the decoder, a group's K slots
written in place and seeing every slot written so far (the relaxed causal mask needs no mask in a step), padded inputs
(RecoverSAT's ended segments) hidden as fairseq's key padding mask hides them; else fairseq's ``incremental_state``,
which this decoder's own forward extends.
"""

from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase
from torch import nn

from ..engine import DecodingCache, IncrementalState, StaticCache, decoding_cache


def relaxed_causal_mask(size: int, group_size: int) -> torch.Tensor:
    """Additive (size, size) mask (0 = visible, -inf = hidden) for target positions grouped by ``group_size`` K.

    The query at position i belongs to group g = i // K and sees every key position j < (g + 1) * K: all of
    its own group and everything before it (the paper's relaxed causal mask). K = 1 is the causal mask of
    fairseq's Transformer decoder.
    """
    if group_size < 1:
        raise ValueError(f"group size K must be >= 1, got {group_size}")
    positions = torch.arange(size)
    group_end = (positions // group_size + 1) * group_size
    visible = positions.unsqueeze(0) < group_end.unsqueeze(1)
    return utils.fill_with_neg_inf(torch.zeros(size, size)).masked_fill_(visible, 0.0)


# what a forward decodes incrementally against (any non-None value): fairseq's incremental state, or the static cache
# whose step runs the layers (GroupedTransformerDecoder.group_features)
IncrementalInput = Union[IncrementalState, StaticCache]


class GroupedTransformerDecoder(TransformerDecoderBase):
    """``TransformerDecoderBase`` with groups of ``group_size`` positions (module docstring); subclasses implement
    :meth:`add_positions`."""

    def __init__(
        self,
        cfg: TransformerConfig,
        dictionary: Dictionary,
        embed_tokens: nn.Embedding,
        group_size: int,
        no_encoder_attn: bool = False,
    ) -> None:
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.group_size = group_size

    def add_positions(
        self, x: torch.Tensor, prev_output_tokens: torch.Tensor, incremental_state: Optional[IncrementalInput]
    ) -> torch.Tensor:
        """``x`` ((B, T, C): the scaled token embeddings of the new positions, the last K of
        ``prev_output_tokens`` with an ``incremental_state``, else all of them) plus their positional input."""
        raise NotImplementedError

    def layer_inputs(
        self, prev_output_tokens: torch.Tensor, incremental_state: Optional[IncrementalInput]
    ) -> torch.Tensor:
        """The first layer's input ((B, T, C), before dropout) of the new positions: all of ``prev_output_tokens``,
        or its last K with an ``incremental_state`` (any non-None value: a dict or a static cache)."""
        tokens = prev_output_tokens if incremental_state is None else prev_output_tokens[:, -self.group_size :]
        x = self.embed_scale * self.embed_tokens(tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        x = self.add_positions(x, prev_output_tokens, incremental_state)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return x

    def new_cache(self, encoder_out: Optional[Dict[str, List[torch.Tensor]]], length: int) -> DecodingCache:
        """The decoding cache of a batch (:func:`~nat_plugins.engine.decoding_cache`): the static step's buffers of
        ``length`` slots where it runs this decoder (in evaluation, fairseq's layers), else fairseq's
        ``incremental_state`` behind the same interface."""
        return decoding_cache(self, encoder_out, length)

    def group_features(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: Optional[Dict[str, List[torch.Tensor]]],
        cache: DecodingCache,
    ) -> torch.Tensor:
        """Features (B, K, C) of the last group of ``prev_output_tokens`` (whole groups), the earlier ones being in
        ``cache`` (:meth:`new_cache`), which this call extends by the group: the static step on its buffers, or this
        decoder's forward on fairseq's state (the cache's ``incremental_state``)."""
        state = cache.incremental_state
        if state is not None:
            return self.extract_features(prev_output_tokens, encoder_out=encoder_out, incremental_state=state)[0]
        bsz, used = prev_output_tokens.shape
        slots = torch.arange(used - self.group_size, used, device=prev_output_tokens.device).expand(bsz, -1)
        padded = prev_output_tokens.eq(self.padding_idx)
        hidden_slots = None
        if padded.any():  # padding (a finished sentence's) is never seen; the buffers' other slots are after `used`
            hidden_slots = F.pad(padded, (0, cache.slots - used))
        x = self.layer_inputs(prev_output_tokens, cache)
        return cache.run(x, slots, slots.new_full(slots.shape, used - 1), hidden_slots)

    def reorder_cache(self, cache: DecodingCache, keep: torch.Tensor) -> None:
        """Keep the sentences ``keep`` (indices into the batch) of ``cache`` (:meth:`new_cache`)."""
        cache.reorder(keep)

    def buffered_future_mask(self, tensor: torch.Tensor) -> torch.Tensor:
        """The relaxed causal mask (T, T) for ``tensor`` (T, B, C), built once for the longest T seen, then sliced."""
        dim = tensor.size(0)
        if self._future_mask.size(0) < dim or self._future_mask.device != tensor.device:
            self._future_mask = relaxed_causal_mask(dim, self.group_size)
        self._future_mask = self._future_mask.to(tensor)
        return self._future_mask[:dim, :dim]

    def extract_features_scriptable(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: Optional[Dict[str, List[torch.Tensor]]],
        incremental_state: Optional[IncrementalInput] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ) -> Tuple[torch.Tensor, Dict[str, List[Optional[torch.Tensor]]]]:
        """fairseq's decoder pass with :meth:`add_positions` for the positional input; with ``incremental_state``
        the last K positions of ``prev_output_tokens`` (one group) are new: they attend to the cached groups and
        to each other."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc = encoder_out["encoder_out"][0] if encoder_out is not None and encoder_out["encoder_out"] else None
        padding_mask = None
        if encoder_out is not None and encoder_out["encoder_padding_mask"]:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        tokens = prev_output_tokens if incremental_state is None else prev_output_tokens[:, -self.group_size :]
        x = self.layer_inputs(prev_output_tokens, incremental_state)
        x = self.dropout_module(x).transpose(0, 1)  # (B, T, C) -> (T, B, C)

        self_attn_padding_mask = None
        if self.cross_self_attention or tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = tokens.eq(self.padding_idx)
        self_attn_mask = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)

        attn = None
        inner_states = [x]
        for idx, layer in enumerate(self.layers):
            x, layer_attn, _ = layer(
                x,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=idx == alignment_layer,
                need_head_weights=idx == alignment_layer,
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)
        if attn is not None:
            attn = attn[:alignment_heads].mean(dim=0)  # average over (the first alignment_heads) heads

        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}
