"""Speculative decoding (Xia et al. 2023): the decoder of ``spec_drafter`` checkpoints (built on the shared
verify-accept module, next commit)."""

from .base import PluginGenerator


class SpeculativeDecoder(PluginGenerator):
    name = "speculative decoding (spec_drafter)"
