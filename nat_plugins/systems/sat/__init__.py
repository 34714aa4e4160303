"""Semi-Autoregressive Transformer (Wang et al., EMNLP 2018).

Its model, loss and decoding side by side; README.md maps the paper to the code."""

from . import model  # noqa: F401  (registers the model and criterion with fairseq)
