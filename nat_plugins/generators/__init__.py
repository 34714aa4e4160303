"""Decoding algorithms, one file per system's generator, on the shared base :class:`.base.PluginGenerator`."""
