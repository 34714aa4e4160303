"""A static-shape decoder step: fairseq ``TransformerDecoder`` weights run on new tokens against key/value buffers
allocated once per batch. Called by the verify-accept loop (nat_plugins/generators/verify_accept_loop.py) and by
:meth:`~nat_plugins.modules.grouped_decoder.GroupedTransformerDecoder.new_cache` (SAT, RecoverSAT); the layers are
those of :mod:`.lean_decoder`, so it runs the decoders :func:`~.lean_decoder.lean_unsupported` accepts, in evaluation.

Every layer's self-attention keys and values live in (B, heads, L, d) buffers, L the batch's longest output + the
block: a token at target position p is written into slot p in place, and a query at slot p attends to the slots <= p
of its own sentence (every query runs over all L slots under an additive mask, so a call's shapes depend on the
batch size B and the new tokens T only). A rejected draft needs no rollback (its slot is overwritten when that
position is decoded again, and no query attends past its own slot meanwhile); a sentence leaving the batch is an
index on the buffers' first dimension; the encoder's keys, values and padding mask are computed once per batch.
Features equal fairseq's up to rounding (tests/test_static_cache.py). Against fairseq's growing cache: see
docs/design-notes.md, *The static decoder step against fairseq's incremental cache*.

For one sentence on the CPU (batch 1) the layers run as a TorchScript trace, one per (B, T) and decoder, made once
that width recurs (~70 ms; :data:`EAGER_CALLS_BEFORE_TRACING`): the same operations on the same tensors, bit for bit,
without Python's cost per operation, which at batch 1 is a third of the layers' time (docs/design-notes.md, *The
traced static step*).
``NAT_TRACED_STEP=0`` (:attr:`.config.EngineConfig.traced_step`) runs them eagerly; the traces are kept per decoder in
``STATE.traces`` (:mod:`.config`). On CUDA the buffers come from the decoder's bank of bucketed shapes and each
call shape is replayed as a CUDA graph (:mod:`.step_graphs`).
"""

import functools
import warnings
from typing import Callable, Dict, List, Optional

import torch
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import nn

from . import cpu_linear, step_graphs
from .block_call import layer_inputs, layer_outputs
from .config import STATE, engine_config
from .lean_decoder import (
    attend,
    feed_forward,
    forget_hooks_removed,
    forget_when_trained,
    lean_unsupported,
    padding_bias,
    project_qkv,
    residual_block,
    split_heads,
    weights_version,
)

# a width's first calls run eagerly: a trace costs ~70 ms to make and saves ~0.1 ms a call, so it pays for the widths
# a loop repeats (every step's), not for a call made once per batch (the drafter reading the prefix the batch's greedy
# steps emitted, of another width each time: one trace per batch made the first batched pass ~50% slower)
EAGER_CALLS_BEFORE_TRACING = 8


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
    bias: torch.Tensor,
) -> torch.Tensor:
    """``layer``'s self-attention for new slots ``x`` (B, T, C): their keys and values written into the ``keys`` and
    ``values`` buffers (B, heads, L, d) at ``index`` (their slots, expanded to (B, heads, T, d)), their queries
    attending to every slot under the additive ``bias`` (B, 1, T, L)."""
    queries, new_keys, new_values = project_qkv(layer.self_attn, x)
    keys.scatter_(2, index, new_keys)
    values.scatter_(2, index, new_values)
    return attend(layer.self_attn, queries, keys, values, bias)


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


def static_layers(
    decoder: TransformerDecoderBase,
    x: torch.Tensor,
    slots: torch.Tensor,
    last_visible: torch.Tensor,
    hidden_slots: Optional[torch.Tensor],
    keys: List[torch.Tensor],
    values: List[torch.Tensor],
    encoder_keys: List[Optional[torch.Tensor]],
    encoder_values: List[Optional[torch.Tensor]],
    encoder_bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """``decoder``'s layers and outputs on layer inputs ``x`` (B, T, C) of new slots ``slots`` (B, T) against the
    buffers of :class:`StaticCache`: a query sees the slots up to ``last_visible`` (B, T) but ``hidden_slots``
    ((B, L) bool, or None). Every query attends over all L slots, so the operations and their shapes depend on
    (B, T) only, not on how far decoding got (what lets :class:`StaticCache` run one trace per (B, T))."""
    bsz, width = slots.shape
    hidden = torch.arange(keys[0].size(2), device=slots.device) > last_visible.unsqueeze(-1)  # (B, T, L)
    if hidden_slots is not None:
        hidden = hidden | hidden_slots.unsqueeze(1)
    bias = torch.zeros(hidden.shape, dtype=x.dtype, device=x.device).masked_fill_(hidden, float("-inf")).unsqueeze(1)
    index = slots[:, None, :, None].expand(bsz, keys[0].size(1), width, keys[0].size(3))
    for i, layer in enumerate(decoder.layers):
        x = residual_block(layer, layer.self_attn_layer_norm, x, self_attention, keys[i], values[i], index, bias)
        if encoder_keys[i] is not None:
            x = residual_block(
                layer,
                layer.encoder_attn_layer_norm,
                x,
                encoder_attention,
                encoder_keys[i],
                encoder_values[i],
                encoder_bias,
            )
        x = residual_block(layer, layer.final_layer_norm, x, feed_forward)
    return layer_outputs(decoder, x)


def banked_layers(
    decoder: TransformerDecoderBase,
    buffers: "step_graphs.StepBuffers",
    x: torch.Tensor,
    slots: torch.Tensor,
    last_visible: torch.Tensor,
    hidden_slots: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """:func:`static_layers` on a buffer set of the decoder's bank (:mod:`.step_graphs`), inputs padded to its rows."""
    cross = (buffers.encoder_keys, buffers.encoder_values, buffers.encoder_bias)
    return static_layers(decoder, x, slots, last_visible, hidden_slots, buffers.keys, buffers.values, *cross)


def tracing_wanted(x: torch.Tensor) -> bool:
    """Whether :meth:`StaticCache.run` runs its trace for ``x`` (B, T, C): one sentence (B = 1) on the CPU without
    gradients, unless ``NAT_TRACED_STEP=0``. A trace costs ~70 ms to make and saves ~0.1-0.15 ms a call: at batch 1
    it pays within a few sentences; a batch's calls are longer and its size changes as sentences end, one trace
    each."""
    return x.size(0) == 1 and x.is_cpu and not torch.is_grad_enabled() and engine_config().traced_step


class StaticCache:
    """Preallocated self-attention buffers of ``decoder`` for the batch of ``encoder_out`` (``length`` slots per
    sentence) and its encoder keys and values (see the module). :meth:`step` runs the decoder (:meth:`run` its layers
    on given inputs); :meth:`accept` and :meth:`reorder` as :class:`~.block_call.IncrementalCache`'s, whose interface
    this shares (:func:`~nat_plugins.engine.decoding_cache` returns either)."""

    # no fairseq incremental state: the static step runs the layers (IncrementalCache: fairseq's forward on its dict)
    incremental_state = None
    # the encoder's keys and values are computed once, here: a caller keeps no encoder output for this cache
    holds_encoder_out = True

    def __init__(
        self, decoder: TransformerDecoderBase, encoder_out: Dict[str, List[torch.Tensor]], length: int
    ) -> None:
        reason = static_unsupported(decoder, encoder_out)
        if reason is not None:
            raise ValueError(f"the static decoder step cannot run this decoder: {reason}")
        self.decoder = decoder
        memory = encoder_out["encoder_out"][0].transpose(0, 1)  # (B, S, C)
        mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        encoder_keys, encoder_values = [], []
        for layer in decoder.layers:
            attention = layer.encoder_attn
            encoder_keys.append(None if attention is None else split_heads(attention.k_proj(memory), attention))
            encoder_values.append(None if attention is None else split_heads(attention.v_proj(memory), attention))
        # the decoder's traces and eager calls by key, found at the first call that wants a trace
        self.traces: Optional[Dict[tuple, Optional[Callable]]] = None
        self.eager_calls: Dict[tuple, int] = {}
        # on CUDA: buffers of bucketed shapes from the decoder's bank, which its CUDA graphs replay on (step_graphs)
        self.buffers: Optional[step_graphs.StepBuffers] = None
        if step_graphs.graphs_wanted(memory):
            bsz, source = memory.shape[:2]
            self.use(step_graphs.checkout(decoder, self, bsz, length, source, memory))
            bias = self.encoder_bias[:bsz, :, :, :source]
            bias.fill_(0.0)
            self.encoder_bias[:bsz, :, :, source:] = float("-inf")
            if mask is not None:
                bias.masked_fill_(mask.bool()[:, None, None, :], float("-inf"))
            for buffer, new in zip(self.encoder_keys + self.encoder_values, encoder_keys + encoder_values):
                if new is not None:
                    buffer[:bsz, :, :source].copy_(new)
            return
        self.encoder_bias = padding_bias(mask, memory) if mask is not None and mask.any() else None
        self.encoder_keys, self.encoder_values = encoder_keys, encoder_values
        # zeros, not empty: a slot no query may see is still multiplied by its weight 0 (NaN * 0 = NaN)
        self.keys, self.values = [], []
        for layer in decoder.layers:
            shape = (memory.size(0), layer.self_attn.num_heads, length, layer.self_attn.head_dim)
            self.keys.append(memory.new_zeros(shape))
            self.values.append(memory.new_zeros(shape))

    @property
    def slots(self) -> int:
        """Slots per sentence in the buffers (at least the ``length`` asked for; on CUDA rounded up)."""
        return self.keys[0].size(2)

    def use(self, buffers: "step_graphs.StepBuffers") -> None:
        """Run on a buffer set of the decoder's bank (on CUDA: :mod:`.step_graphs`)."""
        self.buffers = buffers
        self.keys, self.values = buffers.keys, buffers.values
        self.encoder_keys, self.encoder_values = buffers.encoder_keys, buffers.encoder_values
        self.encoder_bias = buffers.encoder_bias

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        encoder_out: Optional[Dict[str, List[torch.Tensor]]] = None,
    ) -> torch.Tensor:
        """Decoder features (B, T, C; after the final layer norm and ``project_out_dim``) of the new ``tokens``
        (B, T) at target ``positions`` (B, T; their positional embeddings), written into cache ``slots`` (B, T),
        each seeing the slots <= its own. ``encoder_out`` is not read: the encoder's keys and values were computed
        once."""
        decoder = self.decoder
        x = layer_inputs(decoder, decoder.embed_scale * decoder.embed_tokens(tokens), positions)
        return self.run(x, slots, slots)

    def run(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        last_visible: torch.Tensor,
        hidden_slots: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The decoder's layers and outputs on layer inputs ``x`` (B, T, C) of new slots ``slots`` (B, T), each query
        seeing the slots up to its ``last_visible`` (B, T) but ``hidden_slots`` ((B, L) bool; None: none hidden).
        Returns features as :meth:`step`. For one sentence on the CPU without gradients (:func:`tracing_wanted`) it
        runs a TorchScript trace of :func:`static_layers`, made once a (B, T) has run eagerly
        :data:`EAGER_CALLS_BEFORE_TRACING` times (see the module): the same operations on the same tensors, without
        Python's per-operation cost."""
        inputs = [x, slots, last_visible] + ([] if hidden_slots is None else [hidden_slots])
        if self.buffers is not None:
            return self.run_banked(inputs)
        if tracing_wanted(x):
            inputs += self.keys + self.values + [t for t in self.encoder_keys + self.encoder_values if t is not None]
            inputs += [] if self.encoder_bias is None else [self.encoder_bias]
            trace = self.trace(inputs, hidden_slots is not None)
            if trace is not None:
                self.observe_pass()
                with torch.jit.optimized_execution(False):  # run the graph as traced: no profiling runs, no fusing
                    return trace(*inputs)
        buffers = (self.keys, self.values, self.encoder_keys, self.encoder_values, self.encoder_bias)
        return static_layers(self.decoder, x, slots, last_visible, hidden_slots, *buffers)

    def run_banked(self, inputs: List[torch.Tensor]) -> torch.Tensor:
        """:meth:`run` on the bank's buffers (CUDA): ``inputs`` (x, slots, last_visible, [hidden_slots]) of the
        batch's sentences, padded to the buffers' rows, through the call shape's CUDA graph once it has one
        (:func:`~.step_graphs.graph_for`), else eagerly: the same kernels on the same shapes."""
        layers = functools.partial(banked_layers, self.decoder, self.buffers)  # no reference to this cache
        graph = step_graphs.graph_for(self.buffers, inputs, len(inputs) == 4, layers)
        if graph is not None:
            self.observe_pass()
            return step_graphs.replay(graph, inputs)
        return layers(*(step_graphs.padded_rows(t, self.buffers.rows) for t in inputs))[: inputs[0].size(0)]

    def observe_pass(self) -> None:
        """Tell ``STATE.pass_observers`` of a call that runs no module hooks (a trace, a graph's replay)."""
        for observe in STATE.pass_observers:
            observe(self.decoder)

    def trace(self, inputs: List[torch.Tensor], has_hidden_slots: bool) -> Optional[Callable[..., torch.Tensor]]:
        """The decoder's trace for :meth:`run`'s ``inputs``, made at the first call of their shapes after
        :data:`EAGER_CALLS_BEFORE_TRACING` eager ones (:func:`trace_layers`; None before, or where it could not be
        made). The decoder's traces are dropped when its weights changed since they were made: a trace holds the
        tensors it was made with (fused q/k/v projections included)."""
        if self.traces is None:  # once per batch: the weights as this batch finds them
            version = weights_version(self.decoder)
            made_with, self.traces, self.eager_calls = STATE.traces.get(self.decoder, (None, {}, {}))
            if made_with != version:
                self.traces, self.eager_calls = {}, {}
                STATE.traces[self.decoder] = (version, self.traces, self.eager_calls)
                forget_when_trained(self.decoder, forget_traces)
        key = (inputs[0].dtype, *inputs[1].shape, has_hidden_slots, self.encoder_bias is not None)
        if key not in self.traces:
            calls = self.eager_calls.get(key, 0)
            if calls < EAGER_CALLS_BEFORE_TRACING:
                self.eager_calls[key] = calls + 1
                return None
            self.traces[key] = trace_layers(self.decoder, inputs, has_hidden_slots, self.encoder_bias is not None)
        return self.traces[key]

    def accept(self, width: int, accepted: torch.Tensor, kept_length: int) -> None:
        """Nothing to roll back: a rejected slot is overwritten when its position is decoded again."""

    def reorder(self, keep: torch.Tensor) -> None:
        """Keep sentences ``keep`` (indices into the batch), in that order (on the bank's buffers: their first rows,
        moved to a set of fewer rows once the batch passes a power of two)."""
        if self.buffers is not None:
            old = self.buffers
            sentences = keep.numel()
            new = old
            if step_graphs.rows_bucket(sentences) < old.rows:
                slots, source = old.keys[0].size(2), old.encoder_bias.size(-1)
                new = step_graphs.checkout(self.decoder, self, sentences, slots, source, old.keys[0])
            for before, after in zip(old.tensors(), new.tensors()):
                after[:sentences] = before.index_select(0, keep)
            if new is not old:
                old.user = None
                self.use(new)
            return

        def select(tensors: List[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
            return [None if t is None else t.index_select(0, keep) for t in tensors]

        self.keys, self.values = select(self.keys), select(self.values)
        self.encoder_keys, self.encoder_values = select(self.encoder_keys), select(self.encoder_values)
        if self.encoder_bias is not None:
            self.encoder_bias = self.encoder_bias.index_select(0, keep)


class StaticLayers(nn.Module):
    """:func:`static_layers` of ``decoder`` on the flat tensor list :meth:`StaticCache.run` builds: x, slots,
    last_visible, [hidden_slots], the keys, values, encoder keys and values of the layers that have encoder
    attention, [the encoder's padding bias] (what :func:`trace_layers` traces)."""

    def __init__(self, decoder: TransformerDecoderBase, has_hidden_slots: bool, has_encoder_bias: bool) -> None:
        super().__init__()
        self.decoder = decoder
        self.has_hidden_slots, self.has_encoder_bias = has_hidden_slots, has_encoder_bias
        self.cross = [layer.encoder_attn is not None for layer in decoder.layers]

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        x, slots, last_visible, *rest = tensors
        hidden_slots = rest.pop(0) if self.has_hidden_slots else None
        num_layers = len(self.cross)
        keys, values, rest = rest[:num_layers], rest[num_layers : 2 * num_layers], rest[2 * num_layers :]
        encoder_keys = [rest.pop(0) if has else None for has in self.cross]
        encoder_values = [rest.pop(0) if has else None for has in self.cross]
        encoder_bias = rest.pop(0) if self.has_encoder_bias else None
        return static_layers(
            self.decoder, x, slots, last_visible, hidden_slots, keys, values, encoder_keys, encoder_values, encoder_bias
        )


def forget_traces(decoder: TransformerDecoderBase) -> None:
    """Drop ``decoder``'s traces: called before its forwards in training mode (:func:`~.lean_decoder.
    forget_when_trained`), since fairseq's optimizers update the weights without the version counters the traces' key
    reads."""
    STATE.traces.pop(decoder, None)


def trace_layers(
    decoder: TransformerDecoderBase, inputs: List[torch.Tensor], has_hidden_slots: bool, has_encoder_bias: bool
) -> Optional[Callable[..., torch.Tensor]]:
    """A frozen TorchScript trace of :class:`StaticLayers` of ``decoder`` on ``inputs`` (~70 ms to make), or None
    where tracing fails (a torch without TorchScript, a layer it cannot trace): the step then runs eagerly, the same
    operations. Frozen, the weights are the graph's constants and what depends on them alone is computed once: read
    as module attributes at every call they would cost what the trace saves, and a trace of the layers as a function
    of the tensors (10-20 ms to make) keeps those operations and cannot hold int8 copies' packed weights
    (docs/design-notes.md, *The traced static step*)."""
    examples = tuple(t.clone() for t in inputs)  # the trace runs the layers once: not on the cache's buffers
    with warnings.catch_warnings():
        # the trace fixes the Python branches on shapes (cpu_linear's layout by row count): one trace per (B, T);
        # torch >= 2.10 calls TorchScript deprecated, and still runs it
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        cpu_linear.choice(examples[0].new_zeros(1, 1))  # the layout, chosen outside the trace (it times products)
        try:
            layers = StaticLayers(decoder, has_hidden_slots, has_encoder_bias)
            with forget_hooks_removed(decoder):
                return torch.jit.freeze(torch.jit.trace(layers, examples, check_trace=False).eval())
        except Exception:  # noqa: BLE001 - any failure to trace leaves the eager step, which computes the same
            return None
