"""The static decoder step on a GPU as CUDA graphs: one graph per decoder, buffer shape and call shape, replayed with
one launch instead of the step's dozens of kernel launches and their Python (at batch 1 an eager step is mostly
launches: docs/design-notes.md, *CUDA graphs of the static step*).

A graph replays fixed kernels on fixed addresses, so on CUDA a :class:`~.static_cache.StaticCache` takes its
buffers from a per-decoder bank (:func:`checkout`) instead of allocating them per batch: :class:`StepBuffers`, the
self-attention keys and values, the encoder's keys, values and padding bias of one (dtype, rows, slots, source
positions), each rounded up (:func:`rows_bucket`, :data:`SLOTS_MULTIPLE`, :data:`SOURCE_MULTIPLE`), so that batches
of nearby shapes share them and the graphs captured on them. Rows past the batch's sentences, slots past its length
and source positions past its source are never seen by a real sentence's query (the encoder bias hides the source
positions; a sentence's queries see its own row and slots only), so every sentence's features are those of the same
step on its own shapes, up to rounding. On CUDA the bucketed buffers are used with or without graphs
(``NAT_CUDA_GRAPHS=0``, :attr:`.config.EngineConfig.cuda_graphs`: eagerly), so the two compute the same kernels on the
same shapes: the same tokens.

A call shape (new tokens per sentence, hidden slots or not) is captured once it has run eagerly
:data:`EAGER_CALLS_BEFORE_CAPTURE` times on those buffers; a capture that fails leaves that shape eager and is
counted in ``STATE.capture_failures`` (:mod:`.config`) by its reason (the benchmark reports them per row). The graphs
hold the weights' addresses and the fused q/k/v copies made from them: the bank (``STATE.banks``) is dropped when a
decoder's weights changed (another tensor or an in-place update) or it runs in training mode.
"""

import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from fairseq.models.transformer import TransformerDecoderBase

from .config import STATE, engine_config
from .lean_decoder import forget_when_trained, weights_version

# a call shape's first calls on a set of buffers run eagerly: a capture (a warm-up call and the capture) costs a few
# eager calls, and the drafter reads the prefix a batch's greedy steps emitted once, in a width of its own
EAGER_CALLS_BEFORE_CAPTURE = 2
SLOTS_MULTIPLE = 32  # self-attention slots rounded up to a multiple of this
SOURCE_MULTIPLE = 16  # encoder positions rounded up to a multiple of this
SETS_PER_SHAPE = 4  # buffer sets a bank keeps per shape (caches alive at once: a generator's next batch's and last)


def rows_bucket(rows: int) -> int:
    """Buffer rows for a batch of ``rows`` sentences: the next power of two (a batch shrinks as sentences end: the
    rows move to a smaller set at each power of two it passes)."""
    return 1 << max(rows - 1, 0).bit_length()


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def graphs_wanted(reference: torch.Tensor) -> bool:
    """Whether the static step of a batch on ``reference``'s device takes bucketed buffers from the bank (on CUDA,
    without gradients)."""
    return reference.is_cuda and not torch.is_grad_enabled()


def capture_enabled() -> bool:
    """Whether call shapes are captured as CUDA graphs (``NAT_CUDA_GRAPHS``)."""
    return engine_config().cuda_graphs


@dataclass
class StepGraph:
    """A captured call: its static inputs (rows of the buffer set: new inputs are copied in before each replay), the
    output its replays write and the replay itself."""

    inputs: List[torch.Tensor]
    output: torch.Tensor
    replay: Callable[[], None]


@dataclass
class StepBuffers:
    """One decoder's static-step tensors for ``rows`` sentences, ``slots`` self-attention slots and ``source``
    encoder positions (see the module), the graphs captured on them by call shape (None: the capture failed) and the
    eager calls of each shape so far. ``user``: the cache holding them (a weak reference; dead or None: free)."""

    keys: List[torch.Tensor]  # per layer (rows, heads, slots, d)
    values: List[torch.Tensor]
    encoder_keys: List[Optional[torch.Tensor]]  # per layer (rows, heads, source, d); None without encoder attention
    encoder_values: List[Optional[torch.Tensor]]
    encoder_bias: torch.Tensor  # (rows, 1, 1, source): -inf at padding and past the batch's source
    graphs: Dict[tuple, Optional[StepGraph]] = field(default_factory=dict)
    eager_calls: Dict[tuple, int] = field(default_factory=dict)
    user: Optional[weakref.ref] = None

    @property
    def rows(self) -> int:
        return self.keys[0].size(0)

    def tensors(self) -> List[torch.Tensor]:
        """Every tensor with a row per sentence."""
        cross = [t for t in self.encoder_keys + self.encoder_values if t is not None]
        return self.keys + self.values + cross + [self.encoder_bias]

    def free(self) -> bool:
        return self.user is None or self.user() is None


def forget_graphs(decoder: TransformerDecoderBase) -> None:
    """Drop ``decoder``'s buffer sets and graphs (called before its forwards in training mode)."""
    STATE.banks.pop(decoder, None)


def new_buffers(
    decoder: TransformerDecoderBase, rows: int, slots: int, source: int, reference: torch.Tensor
) -> StepBuffers:
    """Zero buffers (a slot no query sees is still multiplied by its weight 0: never NaN) of that shape."""

    def zeros(attention, length):
        return reference.new_zeros(rows, attention.num_heads, length, attention.head_dim)

    layers = decoder.layers
    return StepBuffers(
        keys=[zeros(layer.self_attn, slots) for layer in layers],
        values=[zeros(layer.self_attn, slots) for layer in layers],
        encoder_keys=[None if layer.encoder_attn is None else zeros(layer.encoder_attn, source) for layer in layers],
        encoder_values=[None if layer.encoder_attn is None else zeros(layer.encoder_attn, source) for layer in layers],
        encoder_bias=reference.new_zeros(rows, 1, 1, source),
    )


def checkout(
    decoder: TransformerDecoderBase, user: object, sentences: int, slots: int, source: int, reference: torch.Tensor
) -> StepBuffers:
    """A free buffer set of ``decoder`` for ``sentences`` rows, ``slots`` slots and ``source`` encoder positions,
    each rounded up (see the module), of ``reference``'s dtype and device, now held by ``user``; the bank's sets are
    dropped first if the decoder's weights changed since its graphs were made, or if the device has no memory left
    for a new set (every shape ever seen keeps its sets: a long run over many shapes on a small GPU would fill it)."""
    version = weights_version(decoder)
    made_with, sets = STATE.banks.get(decoder, (None, {}))
    if made_with != version:
        sets = {}
        STATE.banks[decoder] = (version, sets)
        forget_when_trained(decoder, forget_graphs)
    shape = (
        reference.dtype,
        reference.device,
        rows_bucket(sentences),
        round_up(slots, SLOTS_MULTIPLE),
        round_up(source, SOURCE_MULTIPLE),
    )
    candidates = sets.setdefault(shape, [])
    buffers = next((b for b in candidates if b.free()), None)
    if buffers is None:
        try:
            buffers = new_buffers(decoder, *shape[2:], reference)
        except torch.cuda.OutOfMemoryError:
            sets.clear()  # the bank's other sets and their graphs go (a set in use stays its cache's)
            candidates = sets.setdefault(shape, [])
            torch.cuda.empty_cache()
            buffers = new_buffers(decoder, *shape[2:], reference)
        if len(candidates) < SETS_PER_SHAPE:  # else a set of this batch only
            candidates.append(buffers)
    buffers.user = weakref.ref(user)
    return buffers


def padded_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (a row past the batch's sentences: slot 0, nothing hidden)."""
    if tensor.size(0) == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.size(0), *tensor.shape[1:])])


def capture(run: Callable[[], torch.Tensor]) -> Tuple[Callable[[], None], torch.Tensor]:
    """A CUDA graph of ``run`` (which reads and writes only tensors that outlive it) after one warm-up call on a side
    stream (torch's recipe for capture): its replay and the output tensor every replay writes. The warm-up writes
    what the call writes (the same keys and values at the same slots), so it changes nothing the replay does not."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    return graph.replay, output


def graph_for(
    buffers: StepBuffers, inputs: List[torch.Tensor], has_hidden_slots: bool, run: Callable[..., torch.Tensor]
) -> Optional[StepGraph]:
    """The graph of ``run`` (the step on its input tensors, rows padded to the set's) for ``inputs``' call shape on
    ``buffers``: None while that shape has run eagerly fewer than :data:`EAGER_CALLS_BEFORE_CAPTURE` times, with
    ``NAT_CUDA_GRAPHS=0``, or where its capture failed (counted in ``STATE.capture_failures``)."""
    if not capture_enabled():
        return None
    key = (inputs[0].size(1), has_hidden_slots)
    if key not in buffers.graphs:
        calls = buffers.eager_calls.get(key, 0)
        if calls < EAGER_CALLS_BEFORE_CAPTURE:
            buffers.eager_calls[key] = calls + 1
            return None
        static = [padded_rows(t, buffers.rows).clone() for t in inputs]
        try:
            replay, output = capture(lambda: run(*static))
            buffers.graphs[key] = StepGraph(static, output, replay)
        except Exception as error:  # noqa: BLE001 - the shape runs eagerly: the same kernels, the same output
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            failures = STATE.capture_failures
            failures[reason] = failures.get(reason, 0) + 1
            buffers.graphs[key] = None
    return buffers.graphs[key]


def replay(graph: StepGraph, inputs: List[torch.Tensor]) -> torch.Tensor:
    """``graph`` on new ``inputs`` (the batch's rows; the others keep what they held): its output rows, copied out
    (the next replay overwrites them)."""
    for static, new in zip(graph.inputs, inputs):
        static[: new.size(0)].copy_(new)
    graph.replay()
    return graph.output[: inputs[0].size(0)].clone()
