"""The package's floors: every import inside ``nat_plugins`` goes to a floor its module may use (no import runs back
up), the decoding engine and the papers' building blocks stay apart, and the installed package never imports the
repository's experiment catalogue (``nat_recipes``)."""

import ast
import os

from .utils import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "nat_plugins")

# the floors of nat_plugins a floor may import (besides itself); "" is the package root (nat_plugins/__init__.py)
ALLOWED = {
    "version": set(),
    "compat": {"version"},
    "engine": set(),  # the decoder-call machinery: fairseq and torch only
    "modules": {"engine"},  # the papers' building blocks
    "generators": {"engine", "modules"},
    "tasks": {"compat", "engine", "generators", "modules"},
    "models": {"engine", "generators", "modules", "tasks", "version"},
    "criterions": {"generators", "models", "modules"},
    "hub": {"tasks"},
    # the pipeline's commands; nat-export-onnx checks and exports a model of the package (models, its version)
    "cli": {"cli", "engine", "generators", "models", "modules", "tasks", "version"},
    "bench": {"", "cli", "engine", "generators", "modules", "tasks", "version"},  # nat-benchmark: the top floor
    "": {"compat", "criterions", "models", "tasks", "version"},
}


def floor_of(relative_path):
    """The floor of a module path relative to nat_plugins/ (``engine/cpu_linear.py`` -> ``engine``)."""
    parts = relative_path[: -len(".py")].split(os.sep)
    return "" if parts == ["__init__"] else parts[0]


def imported_floors(path, relative_path):
    """(line, floor) of every import of a nat_plugins module in ``path``, absolute or relative; and every import of
    ``nat_recipes`` as the floor ``nat_recipes``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = relative_path.split(os.sep)[:-1]  # the module's package below nat_plugins
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = base + (node.module.split(".") if node.module else [])
                if node.module is None:  # from . import x / from .. import x: x is a module of that package
                    names = [".".join(["nat_plugins"] + module + [alias.name]) for alias in node.names]
                else:
                    names = [".".join(["nat_plugins"] + module)]
            else:
                names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "nat_recipes":
                found.append((node.lineno, "nat_recipes"))
            elif parts[0] == "nat_plugins":
                floor = parts[1] if len(parts) > 1 else ""
                if floor == "__version__":
                    floor = ""
                found.append((node.lineno, floor))
    return found


def test_no_import_runs_back_up_a_floor():
    wrong = []
    for directory, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, PACKAGE)
            floor = floor_of(relative)
            assert floor in ALLOWED, f"{relative}: a floor this test does not know ({floor!r}): add it to ALLOWED"
            for line, target in imported_floors(path, relative):
                if target != floor and target not in ALLOWED[floor]:
                    wrong.append(f"nat_plugins/{relative}:{line} ({floor or 'root'}) imports {target or 'the root'}")
    assert not wrong, "imports that run up a floor:\n" + "\n".join(wrong)


def test_the_scan_sees_relative_and_absolute_imports(tmp_path):
    """The scan itself: a relative import two levels up, ``from . import x`` and an absolute one are all resolved."""
    source = tmp_path / "x.py"
    source.write_text(
        "from ..engine.cpu_linear import linear\nfrom .. import __version__\nfrom . import nad\n"
        "import nat_plugins.bench.report\nfrom nat_recipes import catalogue\n"
    )
    found = imported_floors(str(source), os.path.join("modules", "x.py"))
    assert found == [(1, "engine"), (2, ""), (3, "modules"), (4, "bench"), (5, "nat_recipes")]
