"""The decoding engine: fairseq ``TransformerDecoder`` weights run faster than fairseq's own forward, with the same
features up to rounding. None of it is in the papers; the methods (``modules``, ``models``, ``generators``) call it
to decode, and it imports nothing of theirs.

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
accept the decoder (in evaluation), else fairseq's own layer forward runs.
"""

from torch import nn

from .cpu_linear import use_weight_first_linears


def prepare_for_decoding(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.Linear`` computed in this machine's faster layout for few-row products on the CPU
    (:func:`~.cpu_linear.use_weight_first_linears`: in place, same parameters and state dict; training and other
    devices keep ``F.linear``); returns ``model``."""
    return use_weight_first_linears(model)
