"""The README's map of the systems, generated from the tree: one row per folder of ``nat_plugins/systems/``, with its
files, the shared files it imports (read from its import statements) and its Multi30k recipes. The README holds it
between ``<!-- layout:systems -->`` and ``<!-- /layout:systems -->``; tests/test_readme_map.py fails when the two
differ.

    python dev/readme_map.py            # print the map
    python dev/readme_map.py --write    # put it into README.md
"""

import argparse
import ast
import os
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "nat_plugins")
SYSTEMS = os.path.join(PACKAGE, "systems")
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- layout:systems -->", "<!-- /layout:systems -->"
# what every system imports, left out of the map's shared column (its header names them)
PLUMBING = {"generators/base.py", "modules/loss_metrics.py", "modules/options.py", "modules/plugin_model.py"}


def shared_imports(folder: str) -> List[str]:
    """The package files outside ``folder`` that its modules import (paths relative to ``nat_plugins/``; the engine
    by its entry point, ``engine/__init__.py``)."""
    found = set()
    relative_folder = os.path.relpath(folder, PACKAGE).split(os.sep)
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = relative_folder[: len(relative_folder) - (node.level - 1)]
            module = base + (node.module.split(".") if node.module else [])
            if module[: len(relative_folder)] == relative_folder:
                continue  # the system's own files
            candidates = [module + [alias.name] for alias in node.names] if node.module is None else [module]
            for parts in candidates:
                path = os.path.join(PACKAGE, *parts)
                if os.path.isdir(path):
                    found.add("/".join(parts) + "/__init__.py")
                elif os.path.isfile(path + ".py"):
                    found.add("/".join(parts) + ".py")
    return sorted(found)


def system_rows() -> List[Dict[str, str]]:
    """One row per system folder: key, folder, own files, shared files, recipes."""
    rows = []
    for name in sorted(os.listdir(SYSTEMS)):
        folder = os.path.join(SYSTEMS, name)
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            continue
        own = [f for f in sorted(os.listdir(folder)) if f.endswith(".py") and f != "__init__.py"]
        order = {"model.py": 0, "loss.py": 1, "decoding.py": 2}
        own.sort(key=lambda f: (order.get(f, 3), f))
        recipes = sorted(
            f"examples/multi30k/{f}"
            for f in os.listdir(os.path.join(ROOT, "examples", "multi30k"))
            if f == f"{name}.sh" or f.startswith(f"{name}_")
        )
        shared = [path for path in shared_imports(folder) if path not in PLUMBING and not path.startswith("engine")]
        rows.append(
            {
                "key": name.replace("_", "-"),
                "folder": f"nat_plugins/systems/{name}/",
                "files": ", ".join(f"`{f}`" for f in own + ["README.md"]),
                "shared": ", ".join(f"`{path}`" for path in shared),
                "recipes": ", ".join(f"`{r}`" for r in recipes) or "–",
            }
        )
    return rows


def render() -> str:
    """The map as a Markdown table."""
    lines = [
        "| key | folder | its files (its README maps the paper's equations to them) | shared blocks and loop it "
        "imports (`nat_plugins/`; besides the model mixin, the generator base and the engine) | recipe |",
        "|---|---|---|---|---|",
    ]
    for row in system_rows():
        lines.append(f"| `{row['key']}` | `{row['folder']}` | {row['files']} | {row['shared']} | {row['recipes']} |")
    return "\n".join(lines)


def readme_block(text: str) -> str:
    """What the README holds between the markers."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block: run python dev/readme_map.py --write")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the README's block with the generated map")
    args = parser.parse_args(argv)
    table = render()
    if not args.write:
        print(table)
        return 0
    with open(README, encoding="utf-8") as f:
        text = f.read()
    readme_block(text)
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    with open(README, "w", encoding="utf-8") as f:
        f.write(text[:start] + "\n" + table + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
