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
    "modules": {"engine", "version"},  # the building blocks several systems share, the model mixin
    "generators": {"engine", "modules"},  # the generator base and the verify-accept loop
    "systems": {"engine", "generators", "modules", "version"},  # one folder per system (each on its own: below)
    "tasks": {"compat", "engine", "generators", "modules", "systems"},
    "hub": {"tasks"},
    # the pipeline's commands; nat-export-onnx checks and exports a model of the package (systems, its version)
    "cli": {"cli", "engine", "generators", "modules", "systems", "tasks", "version"},
    "bench": {"", "cli", "engine", "generators", "modules", "systems", "tasks", "version"},  # nat-benchmark
    "": {"compat", "systems", "tasks", "version"},
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


def imported_modules(path, relative_path):
    """(line, dotted module) of every ``nat_plugins`` import in ``path``, relative ones resolved; ``from P import x``
    counts as ``P.x`` when ``P.x`` is a module of the package, else as ``P``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = ["nat_plugins"] + relative_path.split(os.sep)[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("nat_plugins")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + (node.module.split(".") if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("nat_plugins"):
                continue
            for alias in node.names:
                submodule = os.path.join(REPO_ROOT, *f"{module}.{alias.name}".split("."))
                is_module = os.path.isdir(submodule) or os.path.isfile(submodule + ".py")
                found.append((node.lineno, f"{module}.{alias.name}" if is_module else module))
    return found


def package_modules():
    """(path, path relative to nat_plugins/) of every module of the package."""
    for directory, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                yield path, os.path.relpath(path, PACKAGE)


def test_a_system_imports_the_shared_floors_and_the_engine_entry_point_only():
    """A system's folder (nat_plugins/systems/<key>/) imports its own files, the shared floors (modules,
    generators, version) and the engine through its entry point (``nat_plugins.engine``) only: never another system,
    never an engine module; outside the engine nothing else reaches into engine modules either."""
    wrong = []
    for path, relative in package_modules():
        parts = relative.split(os.sep)
        for line, module in imported_modules(path, relative):
            names = module.split(".")
            where = f"nat_plugins/{relative}:{line} imports {module}"
            if names[1:2] == ["engine"] and len(names) > 2 and parts[0] != "engine":
                wrong.append(f"{where} (an engine module: import it from nat_plugins.engine)")
            if parts[0] == "systems" and len(parts) > 2 and names[1:2] == ["systems"]:
                if len(names) < 3 or names[2] != parts[1]:
                    wrong.append(f"{where} (another system)")
    assert not wrong, "\n".join(wrong)


def test_the_system_scan_sees_another_systems_import_and_an_engine_module(tmp_path):
    """The scan itself: a system importing a sibling system or an engine module is found."""
    source = tmp_path / "x.py"
    source.write_text("from ..sat.model import SATModel\nfrom ...engine.static_cache import StaticCache\n")
    found = imported_modules(str(source), os.path.join("systems", "recover_sat", "x.py"))
    assert found == [(1, "nat_plugins.systems.sat.model"), (2, "nat_plugins.engine.static_cache")]
