"""A fairseq ``TransformerDecoder`` run on several new tokens per sentence, at explicit positions, against its
incremental key/value cache in one call, and that cache rolled back per sentence to the tokens it accepted. Called by
the verify-accept loop (nat_plugins/generators/verify_accept_loop.py: blockwise parallel and speculative decoding, on
the decoders :mod:`.static_cache` does not run) and by the blockwise and spec_drafter models' decoders.

* :func:`decoder_block_features` runs any fairseq ``TransformerDecoder`` (a plain ``transformer`` checkpoint
  included) on the new tokens (:func:`decoder_stack_features`: the layers on given embeddings, through
  :mod:`.lean_decoder` where it supports them);
* :func:`rollback_cache` keeps the accepted slots per sentence: the cache stays compact (each row's accepted prefix
  first, as long as the longest prefix, one shared key padding mask; batch 1: exactly the prefix, no mask);
* :func:`inexact_verifier` says why these functions would not compute a decoder's own features (a decoder or layer
  class other than fairseq's, which may add sublayers), so that such a verifier is refused, not silently approximated.
"""

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerDecoder, TransformerDecoderBase
from fairseq.modules import SinusoidalPositionalEmbedding

from .lean_decoder import FAIRSEQ_DECODER_LAYERS, IncrementalState, lean_layer_stack, lean_unsupported

# the decoder classes whose forward decoder_stack_features recomputes: fairseq's Transformer decoder (not a subclass)
FAIRSEQ_DECODERS = (TransformerDecoderBase, TransformerDecoder)


def target_position_embeddings(decoder: TransformerDecoderBase, positions: torch.Tensor) -> torch.Tensor:
    """Positional embeddings of explicit target ``positions`` (0 = BOS; fairseq numbers position p as
    padding_idx + 1 + p)."""
    index = positions + decoder.padding_idx + 1
    embed = decoder.embed_positions
    if isinstance(embed, SinusoidalPositionalEmbedding):
        if embed.weights.device != index.device:
            # upstream fairseq 0.12 keeps the table in a plain attribute, on the CPU until its own forward moves it
            # there (fairseq-fixed registers a buffer, which the model's .to() moves): do as that forward does
            embed.weights = embed.weights.to(index.device)
        return F.embedding(index, embed.weights)
    return F.embedding(index, embed.weight)


def inexact_verifier(decoder: TransformerDecoderBase) -> Optional[str]:
    """Why :func:`decoder_block_features` would not compute ``decoder``'s own features (a string naming the class or
    option), or None when it computes what fairseq's forward computes (up to rounding): for fairseq's
    ``TransformerDecoder`` with fairseq's ``TransformerDecoderLayer`` layers, not subclasses, without
    ``--cross-self-attention`` and with an output projection (no ``--adaptive-softmax-cutoff``)."""
    if type(decoder) not in FAIRSEQ_DECODERS:
        return f"its decoder is a {type(decoder).__name__}, not fairseq's TransformerDecoder"
    others = sorted({type(layer).__name__ for layer in decoder.layers if type(layer) not in FAIRSEQ_DECODER_LAYERS})
    if others:
        return f"its decoder layers are {', '.join(others)}, not fairseq's TransformerDecoderLayer"
    if decoder.cross_self_attention:
        return "it was trained with --cross-self-attention"
    if decoder.adaptive_softmax is not None:
        return "its output layer is an adaptive softmax (--adaptive-softmax-cutoff)"
    return None


def self_attention_buffers(
    decoder: TransformerDecoderBase, incremental_state: IncrementalState
) -> List[Dict[str, Optional[torch.Tensor]]]:
    """The self-attention cache of every layer of ``decoder`` (fairseq's dicts, edited in place)."""
    return [layer.self_attn._get_input_buffer(incremental_state) for layer in decoder.layers]


def cached_length(decoder: TransformerDecoderBase, incremental_state: Optional[IncrementalState]) -> int:
    """Number of slots in ``decoder``'s self-attention cache (0 without one)."""
    if incremental_state is None:
        return 0
    saved = decoder.layers[0].self_attn._get_input_buffer(incremental_state)
    return saved["prev_key"].size(2) if "prev_key" in saved else 0


def cached_padding_mask(decoder: TransformerDecoderBase, incremental_state: IncrementalState) -> Optional[torch.Tensor]:
    """The key padding mask of ``decoder``'s self-attention cache ((B, slots), 1 = hidden), None when none is stored."""
    return decoder.layers[0].self_attn._get_input_buffer(incremental_state).get("prev_key_padding_mask")


def decoder_block_features(
    decoder: TransformerDecoderBase,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    encoder_out: Optional[Dict[str, List[torch.Tensor]]],
    incremental_state: Optional[IncrementalState],
) -> torch.Tensor:
    """Output of a fairseq ``TransformerDecoder`` for new ``tokens`` (B, T) at target ``positions`` (B, T), one call.

    fairseq's incremental path feeds one token per call (the last of ``prev_output_tokens``); verify-accept feeds
    several at once, and different sentences of a batch sit at different positions. The new tokens see each other
    causally and every cached slot the cache's key padding mask does not hide (:func:`rollback_cache` hides the
    slots a sentence does not use), and are appended to the cache; with a cache they must not be padding. Without a
    cache (``incremental_state`` None), ``tokens`` is the whole prefix, right-padded (a pad is seen only by the
    positions after it). Returns (B, T, d) features (before the output projection), as ``features_only``.
    """
    embedded = decoder.embed_scale * decoder.embed_tokens(tokens)
    self_attn_mask = self_attn_padding_mask = None
    if tokens.size(1) > 1:  # causal among the new tokens; every cached slot visible (its mask hides rejected ones)
        causal = decoder.buffered_future_mask(embedded.transpose(0, 1))  # (T, T), in the embeddings' dtype
        self_attn_mask = with_cached_columns(decoder, incremental_state, causal)
    if incremental_state is not None and cached_padding_mask(decoder, incremental_state) is not None:
        # the new slots are never padding: fairseq appends this to the cached mask (float, as it stores it)
        self_attn_padding_mask = torch.zeros(tokens.shape, device=tokens.device)
    return decoder_stack_features(
        decoder, embedded, positions, encoder_out, incremental_state, self_attn_mask, self_attn_padding_mask
    )


def with_cached_columns(
    decoder: TransformerDecoderBase, incremental_state: Optional[IncrementalState], self_attn_mask: torch.Tensor
) -> torch.Tensor:
    """An additive self-attention mask (T, T) among T new slots, widened to (T, cached + T): every cached slot
    visible (the cache's key padding mask hides those a sentence does not use)."""
    cached = cached_length(decoder, incremental_state)
    if not cached:
        return self_attn_mask
    return torch.cat([self_attn_mask.new_zeros(self_attn_mask.size(0), cached), self_attn_mask], dim=1)


def decoder_stack_features(
    decoder: TransformerDecoderBase,
    embedded: torch.Tensor,
    positions: torch.Tensor,
    encoder_out: Optional[Dict[str, List[torch.Tensor]]],
    incremental_state: Optional[IncrementalState],
    self_attn_mask: Optional[torch.Tensor],
    self_attn_padding_mask: Optional[torch.Tensor],
    lean: bool = True,
) -> torch.Tensor:
    """The layers of a fairseq ``TransformerDecoder`` on ``embedded`` inputs ((B, T, C): scaled embeddings, before
    ``project_in_dim``) at target ``positions`` (B, T), with an additive ``self_attn_mask`` (T, cached + T) and a key
    ``self_attn_padding_mask`` (B, T; appended to the cache's) or None; the new slots are appended to the cache when
    ``incremental_state`` is given. Returns (B, T, d) features (after the final layer norm and ``project_out_dim``).
    In evaluation the layers run their lean forward (:mod:`~nat_plugins.engine.lean_decoder`) where it supports
    them; ``lean=False``: fairseq's layer forward (the reference the tests compare with)."""
    if getattr(decoder, "cross_self_attention", False):
        raise ValueError("verify-accept decoding does not support --cross-self-attention")
    enc = encoder_out["encoder_out"][0] if encoder_out is not None and encoder_out["encoder_out"] else None
    enc_padding_mask = None
    if encoder_out is not None and encoder_out["encoder_padding_mask"]:
        enc_padding_mask = encoder_out["encoder_padding_mask"][0]
    x = decoder.dropout_module(layer_inputs(decoder, embedded, positions))
    if lean and not decoder.training and lean_unsupported(decoder) is None:
        x = lean_layer_stack(
            decoder, x, enc, enc_padding_mask, incremental_state, self_attn_mask, self_attn_padding_mask
        )
    else:
        x = x.transpose(0, 1)
        for layer in decoder.layers:
            x, _, _ = layer(
                x,
                enc,
                enc_padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
            )
        x = x.transpose(0, 1)
    return layer_outputs(decoder, x)


def layer_inputs(decoder: TransformerDecoderBase, embedded: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A fairseq ``TransformerDecoder``'s layer input (before dropout) from scaled token embeddings (B, T, C) at
    target ``positions`` (B, T): ``project_in_dim``, positional embeddings, ``layernorm_embedding``."""
    x = embedded
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        x = x + target_position_embeddings(decoder, positions).to(x)
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    return x


def layer_outputs(decoder: TransformerDecoderBase, x: torch.Tensor) -> torch.Tensor:
    """A fairseq ``TransformerDecoder``'s features from its last layer's output ``x``: the final layer norm and
    ``project_out_dim``."""
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x


def rollback_cache(
    decoder: TransformerDecoderBase,
    incremental_state: IncrementalState,
    num_new: int,
    accepted: torch.Tensor,
    kept_length: Optional[int] = None,
) -> None:
    """Keep the first ``accepted[b]`` of the ``num_new`` slots the last call appended to ``decoder``'s cache for
    sentence b (``accepted``: (B,), long).

    The cache stays compact: sentence b's slots are the first ones of its row (its accepted prefix, BOS included),
    the row is as long as the longest sentence's prefix, and the stored key padding mask (one tensor for every
    layer) hides the rest of shorter rows; with batch size 1 it holds exactly the accepted prefix and no mask.
    ``kept_length``: that longest prefix (slots kept) when the caller knows it, which saves a device-to-host copy.
    """
    buffers = self_attention_buffers(decoder, incremental_state)
    total = buffers[0]["prev_key"].size(2)
    cached = total - num_new
    bsz = accepted.size(0)
    mask = buffers[0].get("prev_key_padding_mask")
    if mask is None:  # every row holds ``cached`` slots, and its new ones follow them
        lengths = cached
        new_lengths = cached + accepted
    else:
        lengths = cached - mask[:, :cached].sum(dim=1).long()
        new_lengths = lengths + accepted
    kept = int(new_lengths.max()) if kept_length is None else kept_length
    slots = torch.arange(kept, device=accepted.device).unsqueeze(0)
    new_mask = (slots >= new_lengths.unsqueeze(1)).float() if bsz > 1 else None
    index = None
    if mask is not None:  # row b: its first lengths[b] slots, then the new ones
        lengths = lengths.unsqueeze(1)
        source = torch.where(slots < lengths, slots, slots - lengths + cached).clamp(max=total - 1)
        heads, _, head_dim = buffers[0]["prev_key"].shape[1:]
        index = source[:, None, :, None].expand(bsz, heads, kept, head_dim)
    for saved in buffers:
        if index is None:
            saved["prev_key"] = saved["prev_key"][:, :, :kept]
            saved["prev_value"] = saved["prev_value"][:, :, :kept]
        else:
            saved["prev_key"] = saved["prev_key"].gather(2, index)
            saved["prev_value"] = saved["prev_value"].gather(2, index)
        saved["prev_key_padding_mask"] = new_mask


class IncrementalCache:
    """fairseq's ``incremental_state`` behind the interface of :class:`~nat_plugins.engine.static_cache.StaticCache`
    (for the decoders the static step does not run): :func:`decoder_block_features` calls, :func:`rollback_cache`
    after a call on several tokens, and fairseq's reorder. ``incremental_state``: the state to keep (a fresh one by
    default; e.g. the one fairseq's ``SequenceGenerator`` keeps for a model)."""

    # fairseq's forward reads the encoder output at every call (its padding mask; its keys and values at the first):
    # a caller keeps that output, in the order of the cache's sentences
    holds_encoder_out = False

    def __init__(self, decoder: TransformerDecoderBase, incremental_state: Optional[IncrementalState] = None) -> None:
        self.decoder = decoder
        # fairseq's cache, which fairseq's forward reads and extends (StaticCache: None, its static step runs)
        self.incremental_state: IncrementalState = {} if incremental_state is None else incremental_state

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        encoder_out: Optional[Dict[str, List[torch.Tensor]]],
    ) -> torch.Tensor:
        """:func:`decoder_block_features` (the cache is compact: ``slots`` are not needed)."""
        return decoder_block_features(self.decoder, tokens, positions, encoder_out, self.incremental_state)

    def accept(self, width: int, accepted: torch.Tensor, kept_length: int) -> None:
        """After a call on ``width`` tokens per sentence, keep ``accepted`` (B,) of them (``kept_length``: the
        longest kept prefix)."""
        if width > 1:  # a one-token call accepts its token
            rollback_cache(self.decoder, self.incremental_state, width, accepted, kept_length=kept_length)

    def reorder(self, keep: torch.Tensor) -> None:
        """Keep sentences ``keep`` (indices into the batch), in that order (fairseq's reorder)."""
        self.decoder.reorder_incremental_state_scripting(self.incremental_state, keep)
