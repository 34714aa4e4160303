"""Packaging: pyproject.toml is the one source of dependencies and extras; ``pip install -e .`` into an environment
that already has torch and fairseq installs this package alone and fairseq's CLIs find the plugin; checkpoints load
under NumPy 1.x and 2.x, whichever wrote them (nat_plugins/compat.py).

"An environment that already has torch and fairseq" is a throw-away venv whose ``.pth`` file puts the test
environment's site-packages on its path (what ``--system-site-packages`` does for a base Python): the project's
torch, fairseq and other dependencies are there, and this package is not (a path listed in a ``.pth`` file is not a
site directory, so the test environment's own editable install of nat_plugins is not loaded).
"""

import argparse
import json
import os
import re
import site
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tomllib
import torch

import nat_plugins  # noqa: F401  (the allow-list this module tests)

from .utils import REPO_ROOT

with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as _f:
    PYPROJECT = tomllib.load(_f)


def overlay_venv(path, *extra_paths):
    """A venv at ``path`` (no pip of its own) that sees this environment's site-packages, and ``extra_paths``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = os.path.join(str(path), "bin", "python")
    venv_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with open(os.path.join(venv_site, "base_environment.pth"), "w") as f:
        f.writelines(p + "\n" for p in [*extra_paths, *site.getsitepackages()])
    return python


def run(cmd, cwd, timeout=300):
    done = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_setup_script_takes_every_version_from_pyproject():
    """run_scripts/setup_env.sh names no version and no extra of its own; no requirements file repeats them."""
    with open(os.path.join(REPO_ROOT, "run_scripts", "setup_env.sh")) as f:
        script = f.read()
    assert not re.findall(r"[\w.-]+(?:==|>=|<=|~=|<|>)\d", script)
    assert not [name for name in os.listdir(REPO_ROOT) if name.startswith("requirements")]
    extras = PYPROJECT["project"]["optional-dependencies"]
    default_extras = re.search(r"NAT_SETUP_EXTRAS-(\w+)", script).group(1)
    assert default_extras in extras and set(PYPROJECT["tool"]["nat-plugins"]["setup-env"]["extras"]) <= set(extras)


def test_pip_install_into_an_existing_fairseq_environment(tmp_path):
    """The README's ``pip install -e .`` (here ``--no-index``, so nothing can be downloaded) next to an installed
    torch and fairseq: it installs nat-plugins and nothing else, its console scripts work, and fairseq's own
    ``fairseq-train --user-dir`` lists the plugin's task and model options."""
    python = overlay_venv(tmp_path / "venv")
    report = tmp_path / "report.json"
    run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-build-isolation",
            "--report",
            str(report),
            "-e",
            REPO_ROOT,
        ],
        cwd=str(tmp_path),
    )
    with open(report) as f:
        installed = [item["metadata"]["name"] for item in json.load(f)["install"]]
    assert installed == ["nat-plugins"]  # torch, fairseq and the rest were already there

    out = run(
        [
            python,
            "-c",
            "import importlib.metadata as m, os, nat_plugins, torch, fairseq; "
            "print(os.path.dirname(nat_plugins.__file__)); print(m.version('nat-plugins')); "
            "print(m.distribution('nat-plugins').locate_file('')); print(torch.__file__)",
        ],
        cwd=str(tmp_path),
    )
    user_dir, version, location, torch_file = out.split("\n")[:4]
    assert user_dir == os.path.join(REPO_ROOT, "nat_plugins") and version == nat_plugins.__version__
    assert location.startswith(str(tmp_path / "venv"))  # the metadata is the new environment's
    assert torch_file == torch.__file__  # the environment's own torch, untouched

    help_text = run(
        [
            python,
            "-m",
            "fairseq_cli.train",
            "--user-dir",
            user_dir,
            "--task",
            "translation_nat",
            "--arch",
            "sat_transformer",
            "--help",
        ],
        cwd=str(tmp_path),
    )
    assert "--group-size" in help_text and "--use-distilled" in help_text
    assert "nat-distill" in run([os.path.join(os.path.dirname(python), "nat-distill"), "--help"], cwd=str(tmp_path))


def numpy_globals_in(checkpoint):
    """The ``module.name`` globals of numpy that a torch checkpoint's pickle refers to."""
    with zipfile.ZipFile(checkpoint) as z:
        data = z.read(next(name for name in z.namelist() if name.endswith("data.pkl")))
    return set(re.findall(rb"numpy\._?core\.multiarray", data))


SAVE_AND_LOAD = """
import argparse, sys
import numpy as np, torch
import nat_plugins
state = torch.load(sys.argv[1])  # weights_only=True
assert state["best"] == np.float64(1.5) and state["counts"].tolist() == [3, 4] and state["args"].lr == [5e-4], state
torch.save({"best": np.float64(2.5), "counts": np.array([5, 6]), "args": argparse.Namespace(lr=[1e-3])}, sys.argv[2])
print(np.__version__)
"""


def local_package_sources():
    """pip options that reach only this machine's own package sources, as pip is configured here (its file://
    indexes and find-links directories), so that an install cannot wait on the network; None when it has none."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    indexes, links = [], []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        for location in value.strip("'\"").split():
            if option in ("index-url", "extra-index-url") and location.startswith("file://"):
                indexes.append(location)
            elif option == "find-links" and os.path.isdir(location):
                links.append(location)
    if not indexes and not links:
        return None
    options = ["--index-url", indexes[0]] if indexes else ["--no-index"]
    options += [arg for url in indexes[1:] for arg in ("--extra-index-url", url)]
    return options + [arg for path in dict.fromkeys(links) for arg in ("--find-links", path)]


def test_checkpoints_load_under_numpy_1_and_2(tmp_path):
    """fairseq leaves numpy scalars and arrays in a checkpoint's extra_state; NumPy 2 pickles them as
    ``numpy._core.multiarray.*``, NumPy 1.x as ``numpy.core.multiarray.*``. With the plugin imported, torch's
    ``weights_only`` loader reads both under both NumPy versions. NumPy 1.x comes from this machine's own package
    sources (``--isolated``: no configured network index, no constraints file); without one the test skips."""
    assert np.lib.NumpyVersion(np.__version__) >= "2.0.0", "this test runs under NumPy 2 and starts a NumPy 1 one"
    sources = local_package_sources()
    if sources is None:
        pytest.skip("pip has no local package source here (a file:// index or a find-links directory) for NumPy 1.x")
    python = overlay_venv(tmp_path / "numpy1", REPO_ROOT)
    pip = [python, "-m", "pip", "install", "-q", "--isolated", "--disable-pip-version-check", "--no-deps"]
    got = subprocess.run(pip + sources + ["numpy>=1.26,<2"], capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"no NumPy 1.x wheel in this machine's package sources {sources}: {got.stderr.strip()[-300:]}")

    from_numpy2, from_numpy1 = str(tmp_path / "numpy2.pt"), str(tmp_path / "numpy1.pt")
    torch.save(
        {"best": np.float64(1.5), "counts": np.array([3, 4]), "args": argparse.Namespace(lr=[5e-4])}, from_numpy2
    )
    assert numpy_globals_in(from_numpy2) == {b"numpy._core.multiarray"}
    assert run([python, "-c", SAVE_AND_LOAD, from_numpy2, from_numpy1], cwd=str(tmp_path)).strip().startswith("1.")
    assert numpy_globals_in(from_numpy1) == {b"numpy.core.multiarray"}
    state = torch.load(from_numpy1)  # weights_only=True
    assert state["best"] == np.float64(2.5) and state["counts"].tolist() == [5, 6] and state["args"].lr == [1e-3]
