"""Compatibility fixes applied when the plugin is imported: checkpoint loading and ``--help``.

**Checkpoint loading under torch >= 2.6.**

torch >= 2.6 unpickles ``torch.load`` files with ``weights_only=True`` by default, which refuses every
fairseq checkpoint because fairseq stores its configuration as ``argparse.Namespace`` objects. On import
this module adds the handful of plain-data classes fairseq pickles to torch's allow-list, so that
``fairseq-train --restore-file``, ``fairseq-generate`` and ``fairseq-interactive`` load checkpoints with
the plugin loaded and no environment variable. Nothing else becomes loadable: a checkpoint that pickles
any other class still fails with torch's error naming that class. NumPy 2 renamed ``numpy.core`` to
``numpy._core`` and a pickle names the module of the NumPy that wrote it, so NumPy's scalar and array
constructors are allowed under both names: checkpoints load under NumPy 1.x and 2.x, whichever wrote them.

Checkpoints are pickles all the same: load only files you trust.

**``--help`` lists the task's and model's options.** fairseq's ``parse_args_and_arch`` answers ``--help``
before it adds the options of ``--task``/``--arch``/``--criterion``, so ``fairseq-generate --help --user-dir
nat_plugins --task translation_nat`` would not show the task's options. :func:`help_with_component_options`
wraps it so that help is printed after those options were added.

**A truncated or corrupt checkpoint file is named.** torch reports an unreadable file without its name (an empty
file: ``EOFError``; other bytes: a ``KeyError`` from its unpickler; a cut zip archive: a ``RuntimeError``).
:func:`name_unreadable_checkpoints` wraps fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` (which
``fairseq-generate``, ``fairseq-interactive``, ``--restore-file``, the hub and the plugin's teachers all load through)
so that a failure on a file that is not an intact zip archive says which file and what to do.
"""

import argparse
import contextlib
import functools
import importlib
import io
import os
import sys
import zipfile

import numpy as np
import torch
from fairseq import checkpoint_utils
from fairseq import options as fairseq_options

from .version import __version__


def numpy_reconstructors():
    """NumPy's ``scalar`` and ``_reconstruct`` (what a pickled numpy scalar or array calls), each under the
    ``numpy.core`` name NumPy 1.x pickles and the ``numpy._core`` name NumPy 2.x pickles."""
    numpy2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"
    multiarray = importlib.import_module("numpy._core.multiarray" if numpy2 else "numpy.core.multiarray")
    return [
        (getattr(multiarray, name), f"{package}.multiarray.{name}")
        for name in ("scalar", "_reconstruct")
        for package in ("numpy.core", "numpy._core")
    ]


FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,  # cfg.model / cfg.task of argparse-style fairseq models
    # numpy scalars and arrays that fairseq's metrics leave in extra_state (best score, --eval-bleu counts)
    np.dtype,
    np.ndarray,
    *[cls for cls in vars(np.dtypes).values() if isinstance(cls, type) and issubclass(cls, np.dtype)],
    *numpy_reconstructors(),
]


def allow_fairseq_checkpoints():
    """Add fairseq's pickled plain-data classes to torch's ``weights_only`` allow-list. Only torch >= 2.6 loads
    with ``weights_only=True`` by default (and only it takes the ``(object, name)`` entries above)."""
    if torch.__version__ >= (2, 6):
        torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


def help_with_component_options(parse_args_and_arch):
    """Wrap fairseq's ``options.parse_args_and_arch`` so ``-h/--help`` shows task/model/criterion options."""

    @functools.wraps(parse_args_and_arch)
    def wrapper(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        argv = sys.argv[1:] if input_args is None else list(input_args)
        if "-h" not in argv and "--help" not in argv:
            return parse_args_and_arch(parser, input_args, parse_known, suppress_defaults, modify_parser)
        rest = [a for a in argv if a not in ("-h", "--help")]
        # this adds every component's options to `parser`, then stops at missing required ones (e.g. DATA)
        with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            parse_args_and_arch(parser, rest, parse_known=True, modify_parser=modify_parser)
        parser.print_help()
        parser.exit()

    wrapper.nat_plugins_wrapped = True
    return wrapper


class CheckpointFileError(OSError):
    """A checkpoint file that cannot be read (truncated or corrupt)."""


def intact_zip_archive(path):
    """True when ``path`` is a zip archive (torch's checkpoint format) whose members all pass their CRC check."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def name_unreadable_checkpoints(load_checkpoint_to_cpu):
    """Wrap fairseq's ``load_checkpoint_to_cpu``: an error on an existing file that is not an intact zip archive
    becomes a :class:`CheckpointFileError` naming the file (torch's own error is chained)."""

    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(path, *args, **kwargs):
        try:
            return load_checkpoint_to_cpu(path, *args, **kwargs)
        except Exception as err:
            if not os.path.isfile(path) or intact_zip_archive(path):
                raise
            raise CheckpointFileError(
                f"checkpoint {path} ({os.path.getsize(path)} bytes) is truncated or corrupt ({type(err).__name__}: "
                f"{str(err)[:200]}): copy it again, or use another checkpoint of the run (checkpoint_last.pt, "
                "checkpoint_best.pt, an epoch checkpoint)"
            ) from err

    wrapper.nat_plugins_wrapped = True
    return wrapper


def plugin_checkpoint_loaded(version):
    """Called when a checkpoint written under ``translation_nat`` is unpickled.

    Unpickling it imports ``nat_plugins``, which registers the plugin's models, so a plugin model loaded
    by a fairseq command run without ``--user-dir nat_plugins`` reaches its own check (see
    :class:`nat_plugins.modules.plugin_model.NATPluginModel`) and fails with a message saying what to add,
    rather than an opaque registry error — or a silent decode with the wrong generator.
    """
    return {"version": version}


class PluginCheckpointMarker:
    """Stored in the task state of every ``translation_nat`` checkpoint (see :func:`plugin_checkpoint_loaded`)."""

    def __reduce__(self):
        return plugin_checkpoint_loaded, (__version__,)


FAIRSEQ_CHECKPOINT_GLOBALS.append(plugin_checkpoint_loaded)
allow_fairseq_checkpoints()
if not getattr(fairseq_options.parse_args_and_arch, "nat_plugins_wrapped", False):
    fairseq_options.parse_args_and_arch = help_with_component_options(fairseq_options.parse_args_and_arch)
if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "nat_plugins_wrapped", False):
    checkpoint_utils.load_checkpoint_to_cpu = name_unreadable_checkpoints(checkpoint_utils.load_checkpoint_to_cpu)
