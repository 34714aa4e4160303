"""nat-plugins: fairseq plugins for fast (non-/semi-autoregressive) NMT decoding.

Importing the package (or ``--user-dir nat_plugins``) registers its task and every system's models and criterions with
fairseq and lets torch >= 2.6 load fairseq checkpoints (see :mod:`nat_plugins.compat`). Nothing is printed.
"""

from . import (  # noqa: F401  (registration)
    compat,  # noqa: F401  (must come before anything loads a checkpoint)
    systems,
    tasks,
)
from .version import __version__  # noqa: F401
