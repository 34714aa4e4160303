"""Blockwise parallel decoding (Stern et al., NeurIPS 2018).

Its model, loss and decoding side by side; README.md maps the paper to the code."""

from . import loss, model  # noqa: F401  (registers the model and criterion with fairseq)
