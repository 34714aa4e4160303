"""NAT with fertility and noisy parallel decoding (Gu et al., ICLR 2018).

Its model, loss and decoding side by side; README.md maps the paper to the code."""

from . import finetune_loss, loss, model  # noqa: F401  (registers the model and criterion with fairseq)
