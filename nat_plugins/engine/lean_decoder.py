"""A lean evaluation forward of fairseq's ``TransformerDecoderLayer`` stack: the same parameters and the same
incremental cache (fairseq's ``incremental_state`` buffers, so :func:`~.block_call.rollback_cache` and
``reorder_incremental_state`` keep working), computed with fewer operations. Called by :mod:`.block_call` (the
verify-accept verifier, the speculative drafter) and :mod:`.static_cache` (whose layers these are).

It keeps (B, T, C) throughout instead of fairseq's (T, B, C) <-> (B·heads, T, d) reshapes and Python input checks,
projects q, k and v in one product (:func:`fused_projections`), attends with ``F.scaled_dot_product_attention``, keeps
the encoder's padding as an additive mask in the cache and computes no attention weights: at batch 1 on a CPU a call
pays per operation as much as for its arithmetic (docs/design-notes.md, *What a decoder call costs at batch 1*).
Features equal fairseq's up to rounding (tests/test_lean_decoder.py; near-ties: the module docstring of
nat_plugins/generators/verify_accept_loop.py).

Layers it does not implement (a layer class other than fairseq's, whose extra sublayers it would skip; NormFormer's
norms and scales, ``--cross-self-attention``, bias key/values, zero attention, xformers, a query scaling other than
head_dim ** -0.5) are reported by :func:`lean_unsupported`; callers then keep fairseq's forward, as in training.
"""

import contextlib
import functools
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayer, TransformerDecoderLayerBase
from torch import nn

from .cpu_linear import linear

# the layer classes this forward implements: fairseq's Transformer decoder layer (a subclass may add sublayers)
FAIRSEQ_DECODER_LAYERS = (TransformerDecoderLayerBase, TransformerDecoderLayer)
# fairseq's incremental cache: per attention module, its buffers (prev_key, prev_value, prev_key_padding_mask, ...)
IncrementalState = Dict[str, Dict[str, Optional[torch.Tensor]]]


def lean_unsupported(decoder: TransformerDecoderBase) -> Optional[str]:
    """Why the lean forward cannot run ``decoder``'s layers (a string), or None when it can."""
    for index, layer in enumerate(decoder.layers):
        if type(layer) not in FAIRSEQ_DECODER_LAYERS:
            return f"layer {index} is a {type(layer).__name__}, not fairseq's TransformerDecoderLayer"
        extras = [
            name for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid") if getattr(layer, name, None) is not None
        ]
        if extras:
            return f"layer {index} has {', '.join(extras)} (NormFormer options)"
        if layer.cross_self_attention:
            return "--cross-self-attention"
        for attention in (layer.self_attn, layer.encoder_attn):
            if attention is None:
                continue
            if attention.bias_k is not None or attention.add_zero_attn:
                return "attention with bias key/values or zero attention"
            if getattr(attention, "use_xformers", False):
                return "xformers attention"
            if attention.scaling != attention.head_dim**-0.5:
                return f"attention scaling {attention.scaling} (not head_dim ** -0.5)"
    return None


def split_heads(x: torch.Tensor, attention: MultiheadAttention) -> torch.Tensor:
    """(B, T, C) -> (B, heads, T, head_dim)."""
    return x.view(x.size(0), x.size(1), attention.num_heads, attention.head_dim).transpose(1, 2)


def attend(
    attention: MultiheadAttention,
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """``attention``'s output projection of softmax(q·kᵀ·scaling + bias)·v for (B, heads, T, d) ``queries`` and
    (B, heads, S, d) keys and values; ``bias``: an additive mask broadcast to (B, heads, T, S), or None. The scaling is
    ``F.scaled_dot_product_attention``'s default, d ** -0.5, which is fairseq's (:func:`lean_unsupported` checks it):
    torch 2.0, the oldest torch this package supports, has no ``scale=`` argument."""
    x = F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias)
    return attention.out_proj(x.transpose(1, 2).flatten(2))


def weights_version(module: nn.Module) -> tuple:
    """Where and at which in-place version each parameter of ``module`` is: a cache of tensors derived from the
    weights is stale once this changes (and after training mode: :func:`forget_when_trained`)."""
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


def forget_when_trained(module: nn.Module, forget: Callable[[nn.Module], None]) -> None:
    """Call ``forget(module)`` before every forward of ``module`` in training mode, from now on (registered once per
    module and ``forget``). For caches of tensors derived from its weights: fairseq's optimizers update ``p.data``,
    which leaves the version counter that would tell a cache the weights changed, and a model trained with
    ``--eval-bleu`` is decoded between updates."""
    registered = module.__dict__.setdefault("lean_forgets", {})  # forget -> the hook's handle
    if forget not in registered:
        registered[forget] = module.register_forward_pre_hook(functools.partial(forget_if_training, forget))


@contextlib.contextmanager
def forget_hooks_removed(root: nn.Module) -> Iterator[None]:
    """:func:`forget_when_trained`'s hooks of ``root`` and its submodules removed for the block, then registered
    again: TorchScript cannot compile them into a trace of ``root``'s modules (whose calls they do not watch)."""
    removed = []
    for module in root.modules():
        registered = module.__dict__.get("lean_forgets", {})
        for forget, handle in list(registered.items()):
            handle.remove()
            del registered[forget]
            removed.append((module, forget))
    try:
        yield
    finally:
        for module, forget in removed:
            forget_when_trained(module, forget)


def forget_if_training(forget: Callable[[nn.Module], None], module: nn.Module, _inputs: Any) -> None:
    """The forward pre-hook of :func:`forget_when_trained`."""
    if module.training:
        forget(module)


def forget_fused_projections(attention: nn.Module) -> None:
    """Drop ``attention``'s fused q/k/v projections (:func:`fused_projections` makes them again)."""
    attention.__dict__.pop("lean_fused_projections", None)


def fused_projections(attention: MultiheadAttention) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The q, k and v projections of ``attention`` as one (3C, C) weight and bias, concatenated once and again when
    one of them changes (another tensor or an in-place update, or a forward in training mode:
    :func:`forget_when_trained`); None unless all three are plain ``nn.Linear`` layers with biases (int8 copies are
    not)."""
    layers = (attention.q_proj, attention.k_proj, attention.v_proj)
    if not all(isinstance(layer, nn.Linear) and layer.bias is not None for layer in layers):
        return None
    tensors = [t for layer in layers for t in (layer.weight, layer.bias)]
    key = tuple((t.data_ptr(), t._version) for t in tensors)
    cached = getattr(attention, "lean_fused_projections", None)
    if cached is None or cached[0] != key:
        weight = torch.cat([layer.weight.detach() for layer in layers])
        bias = torch.cat([layer.bias.detach() for layer in layers])
        cached = (key, weight, bias)
        attention.lean_fused_projections = cached  # a tuple: not a parameter, buffer or state-dict entry
        forget_when_trained(attention, forget_fused_projections)
    return cached[1:]


def project_qkv(attention: MultiheadAttention, x: torch.Tensor) -> List[torch.Tensor]:
    """q, k and v of ``x`` (B, T, C), each (B, heads, T, d); one product where :func:`fused_projections` allows."""
    fused = fused_projections(attention)
    if fused is None:
        projected = (attention.q_proj(x), attention.k_proj(x), attention.v_proj(x))
    else:
        projected = linear(x, *fused).split(attention.embed_dim, dim=-1)
    return [split_heads(part, attention) for part in projected]


def padding_bias(mask: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """A key padding ``mask`` (B, S; nonzero = hidden) as an additive (B, 1, 1, S) mask."""
    return torch.zeros(mask.shape, dtype=reference.dtype, device=reference.device).masked_fill_(
        mask.bool(), float("-inf")
    )[:, None, None, :]


def self_attention(
    layer: TransformerDecoderLayerBase,
    x: torch.Tensor,
    incremental_state: Optional[IncrementalState],
    attn_mask: Optional[torch.Tensor],
    padding_mask: Optional[torch.Tensor],
) -> torch.Tensor:
    """``layer``'s self-attention on the new slots ``x`` (B, T, C), appended to its cache (fairseq's layout:
    keys/values (B, heads, S, d), key padding mask (B, S) float or absent)."""
    attention = layer.self_attn
    queries, keys, values = project_qkv(attention, x)
    saved = attention._get_input_buffer(incremental_state) if incremental_state is not None else {}
    if "prev_key" in saved:
        keys = torch.cat([saved["prev_key"], keys], dim=2)
        values = torch.cat([saved["prev_value"], values], dim=2)
        previous = saved.get("prev_key_padding_mask")
        if previous is not None or padding_mask is not None:  # as fairseq's _append_prev_key_padding_mask
            previous = previous if previous is not None else x.new_zeros(x.size(0), keys.size(2) - x.size(1))
            current = padding_mask if padding_mask is not None else x.new_zeros(x.shape[:2])
            padding_mask = torch.cat([previous.float(), current.float()], dim=1)
    if incremental_state is not None:
        saved.update(prev_key=keys, prev_value=values, prev_key_padding_mask=padding_mask)
        attention._set_input_buffer(incremental_state, saved)
    bias = None if attn_mask is None else attn_mask.to(x.dtype)
    if padding_mask is not None:
        hidden = padding_bias(padding_mask, x)
        bias = hidden if bias is None else bias + hidden
    return attend(attention, queries, keys, values, bias)


def encoder_attention(
    layer: TransformerDecoderLayerBase,
    x: torch.Tensor,
    enc: torch.Tensor,
    enc_padding_mask: Optional[torch.Tensor],
    incremental_state: Optional[IncrementalState],
) -> torch.Tensor:
    """``layer``'s encoder attention; the encoder's keys and values are computed once and kept in the cache."""
    attention = layer.encoder_attn
    saved = attention._get_input_buffer(incremental_state) if incremental_state is not None else {}
    if "lean_padding_bias" not in saved:  # once per cache (one fairseq's attention filled too)
        if "prev_key" not in saved:
            memory = enc.transpose(0, 1)
            saved.update(
                prev_key=split_heads(attention.k_proj(memory), attention),
                prev_value=split_heads(attention.v_proj(memory), attention),
                prev_key_padding_mask=enc_padding_mask,
            )
        # kept beside fairseq's entries (and reordered with them); None when no sentence of the batch is padded
        mask = saved.get("prev_key_padding_mask")
        saved["lean_padding_bias"] = padding_bias(mask, x) if mask is not None and mask.any() else None
        if incremental_state is not None:
            attention._set_input_buffer(incremental_state, saved)
    queries = split_heads(attention.q_proj(x), attention)
    return attend(attention, queries, saved["prev_key"], saved["prev_value"], saved.get("lean_padding_bias"))


def feed_forward(layer: TransformerDecoderLayerBase, x: torch.Tensor) -> torch.Tensor:
    """``layer``'s feed-forward block (no dropout)."""
    return layer.fc2(layer.activation_fn(layer.fc1(x)))


def residual_block(
    layer: TransformerDecoderLayerBase,
    norm: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    block: Callable[..., torch.Tensor],
    *args: Any,
) -> torch.Tensor:
    """``x`` + ``block(layer, ·, *args)`` with ``layer``'s pre-norm (normalised input) or post-norm (normalised sum)."""
    if layer.normalize_before:
        return x + block(layer, norm(x), *args)
    return norm(x + block(layer, x, *args))


def lean_layer_stack(
    decoder: TransformerDecoderBase,
    x: torch.Tensor,
    enc: Optional[torch.Tensor],
    enc_padding_mask: Optional[torch.Tensor],
    incremental_state: Optional[IncrementalState],
    attn_mask: Optional[torch.Tensor],
    padding_mask: Optional[torch.Tensor],
) -> torch.Tensor:
    """``decoder``'s layers on ``x`` (B, T, C), in evaluation (no dropout): the encoder states ``enc`` (S, B, C) and
    their ``enc_padding_mask`` (B, S), an additive ``attn_mask`` (T, cached + T) and a key ``padding_mask`` (B, T)
    of the new slots, both optional, as fairseq's layer takes them. Returns (B, T, C)."""
    for layer in decoder.layers:
        x = residual_block(
            layer, layer.self_attn_layer_norm, x, self_attention, incremental_state, attn_mask, padding_mask
        )
        if layer.encoder_attn is not None and enc is not None:
            x = residual_block(
                layer, layer.encoder_attn_layer_norm, x, encoder_attention, enc, enc_padding_mask, incremental_state
            )
        x = residual_block(layer, layer.final_layer_norm, x, feed_forward)
    return x
