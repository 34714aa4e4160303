"""The decoding engine: fairseq ``TransformerDecoder`` weights run faster than fairseq's own forward, with the same
features up to rounding. None of it is in the papers; the methods (``modules``, ``generators``, ``systems``) call it
to decode, and it imports nothing of theirs.

* :mod:`.config`: the engine's settings, one per environment variable (:class:`EngineConfig`, read by
  :func:`engine_config`: ``NAT_LINEAR_LAYOUT``, ``NAT_TRACED_STEP``, ``NAT_CUDA_GRAPHS``, ``NAT_ATTENTION_BACKENDS``),
  and its process-wide state (:data:`STATE`: layout choices, traces, CUDA graph banks, pass observers, capture
  failures);
* :mod:`.cpu_linear`: linear layers in the layout a CPU multiplies few rows fastest (``NAT_LINEAR_LAYOUT``; the
  choice is measured once per machine and cached under ``~/.cache/nat_plugins``), and the int8 copies of
  ``--int8-drafts``/``--int8-decoder``;
* :mod:`.lean_decoder`: a decoder layer's evaluation forward without fairseq's per-call bookkeeping;
* :mod:`.static_cache`: a static-shape decoder step over key/value buffers allocated once per batch (on CUDA taken
  from a bank of bucketed shapes and replayed as CUDA graphs: :mod:`.step_graphs`, ``NAT_CUDA_GRAPHS``);
* :mod:`.length_buckets`: on CUDA the single passes (the fertility NAT's decoder, Encoder-NAD-AD's NAD, NPD's teacher
  rescoring) pad their source and target lengths to buckets, masked, so that cuDNN plans a bounded set of shapes;
* :mod:`.attention`: the kernels ``F.scaled_dot_product_attention`` may use while the task decodes and trains
  (``NAT_ATTENTION_BACKENDS``; by default none that builds a plan per new shape, as cuDNN's does on sm90);
* :mod:`.block_call`: several new tokens per sentence in one decoder call against fairseq's incremental cache, and
  that cache rolled back to the accepted tokens (verify-accept decoding on decoders the static step does not run).

The one switch from fairseq's forward to the engine is :func:`prepare_for_decoding`, called by
``TranslationNATTask.build_generator`` on every model it builds a generator for and by the frozen teachers of
speculative decoding and NPD; the lean and static paths then run wherever ``lean_unsupported``/``static_unsupported``
accept the decoder (in evaluation), else fairseq's own layer forward runs. A decoder's key/value cache for a batch
comes from :func:`decoding_cache` only.

This package is the engine's one entry point: code outside ``nat_plugins/engine/`` imports the names below from
``nat_plugins.engine``, never from its modules (tests/test_floors.py checks it). ``__all__``, by group:

* the switch: :func:`prepare_for_decoding`;
* settings and state (:mod:`.config`): :class:`EngineConfig`, :func:`engine_config`, :data:`STATE`;
* decoding caches: :func:`decoding_cache` and what it returns, :data:`DecodingCache` (a :class:`StaticCache` or an
  :class:`IncrementalCache`: ``step``, ``accept``, ``reorder``; ``incremental_state``, fairseq's state where its
  forward runs, None where the static step does; ``holds_encoder_out``); :data:`IncrementalState` (fairseq's cache);
  why the fast paths do not run a decoder: :func:`static_unsupported`, :func:`lean_unsupported`;
* decoder calls on several new tokens (:mod:`.block_call`): :func:`decoder_block_features`,
  :func:`decoder_stack_features`, :func:`layer_inputs`, :func:`with_cached_columns`, :func:`rollback_cache`,
  :func:`inexact_verifier`;
* CPU linear layers and int8 copies (:mod:`.cpu_linear`): :func:`int8_copy`, :func:`int8_decoder_copy`,
  :class:`WeightFirstLinear`, :func:`linear_layout_choice` (``cpu_linear.choice``: this process's layout),
  :data:`WEIGHT_FIRST` (a layout's name), :data:`MAX_LAYOUT_SPREAD` (``cpu_linear.MAX_SPREAD``: a measurement noisier
  than this is not cached), :func:`cpu_model`;
* length buckets (:mod:`.length_buckets`): :func:`length_buckets_wanted`, :func:`bucketed`, :func:`widened`;
* attention kernels (:mod:`.attention`): :func:`attention_backends`, :func:`describe_attention_backends`
  (``attention.describe``: the choice in words, for reports).
"""

from typing import Dict, List, Optional, Union

import torch
from fairseq.models.transformer import TransformerDecoderBase
from torch import nn

from .attention import attention_backends
from .attention import describe as describe_attention_backends
from .block_call import (
    IncrementalCache,
    decoder_block_features,
    decoder_stack_features,
    inexact_verifier,
    layer_inputs,
    rollback_cache,
    with_cached_columns,
)
from .config import STATE, WEIGHT_FIRST, EngineConfig, engine_config
from .cpu_linear import MAX_SPREAD as MAX_LAYOUT_SPREAD
from .cpu_linear import WeightFirstLinear, cpu_model, int8_copy, int8_decoder_copy, use_weight_first_linears
from .cpu_linear import choice as linear_layout_choice
from .lean_decoder import IncrementalState, lean_unsupported
from .length_buckets import bucketed, length_buckets_wanted, widened
from .static_cache import StaticCache, static_unsupported

__all__ = [
    # the switch
    "prepare_for_decoding",
    # settings and state
    "EngineConfig",
    "engine_config",
    "STATE",
    # decoding caches
    "decoding_cache",
    "DecodingCache",
    "StaticCache",
    "IncrementalCache",
    "IncrementalState",
    "static_unsupported",
    "lean_unsupported",
    # decoder calls on several new tokens
    "decoder_block_features",
    "decoder_stack_features",
    "layer_inputs",
    "with_cached_columns",
    "rollback_cache",
    "inexact_verifier",
    # CPU linear layers and int8 copies
    "int8_copy",
    "int8_decoder_copy",
    "WeightFirstLinear",
    "linear_layout_choice",
    "WEIGHT_FIRST",
    "MAX_LAYOUT_SPREAD",
    "cpu_model",
    # length buckets
    "length_buckets_wanted",
    "bucketed",
    "widened",
    # attention kernels
    "attention_backends",
    "describe_attention_backends",
]

# a batch's key/value cache of a decoder (decoding_cache): one interface, two implementations
DecodingCache = Union[StaticCache, IncrementalCache]


def prepare_for_decoding(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.Linear`` computed in this machine's faster layout for few-row products on the CPU
    (:func:`~.cpu_linear.use_weight_first_linears`: in place, same parameters and state dict; training and other
    devices keep ``F.linear``); returns ``model``."""
    return use_weight_first_linears(model)


def decoding_cache(
    decoder: TransformerDecoderBase, encoder_out: Optional[Dict[str, List[torch.Tensor]]], length: int
) -> DecodingCache:
    """``decoder``'s key/value cache for the batch of ``encoder_out``: a :class:`StaticCache` of ``length`` slots per
    sentence where the static step runs the decoder (:func:`static_unsupported` is None: in evaluation, fairseq's
    layers, an encoder output), else fairseq's incremental state behind the same interface
    (:class:`IncrementalCache`). Either runs the decoder on new tokens (``step``), keeps the accepted ones
    (``accept``) and some sentences (``reorder``); ``incremental_state`` is None where the static step runs and
    fairseq's state where fairseq's forward does, ``holds_encoder_out`` whether the cache holds the encoder's keys
    and values (the encoder output is then no longer read)."""
    if static_unsupported(decoder, encoder_out) is None:
        return StaticCache(decoder, encoder_out, length)
    return IncrementalCache(decoder)
