"""The README's layout cannot drift from the tree: its map of the systems is the one dev/readme_map.py generates from
the package's folders and imports, and its list of folders names every folder of the package."""

import os
import re
import subprocess
import sys

from .utils import REPO_ROOT

README = os.path.join(REPO_ROOT, "README.md")
SCRIPT = os.path.join(REPO_ROOT, "dev", "readme_map.py")


def generated_map():
    return subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, check=True).stdout.strip()


def test_the_readmes_map_of_the_systems_is_the_trees():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    begin, end = "<!-- layout:systems -->", "<!-- /layout:systems -->"
    assert begin in text and end in text, "README.md lost its map markers"
    in_readme = text[text.index(begin) + len(begin) : text.index(end)].strip()
    assert in_readme == generated_map(), "README.md's map of the systems is stale: run python dev/readme_map.py --write"


def test_the_map_has_every_system_folder_and_its_files():
    """The generator itself: a row per folder of nat_plugins/systems/, naming every module there."""
    table = generated_map()
    systems = os.path.join(REPO_ROOT, "nat_plugins", "systems")
    folders = [f for f in os.listdir(systems) if os.path.isfile(os.path.join(systems, f, "__init__.py"))]
    assert len(folders) == 6
    for folder in folders:
        row = next(line for line in table.splitlines() if f"`nat_plugins/systems/{folder}/`" in line)
        for name in os.listdir(os.path.join(systems, folder)):
            if name.endswith(".py") and name != "__init__.py":
                assert f"`{name}`" in row, (folder, name)
        assert os.path.isfile(os.path.join(systems, folder, "README.md")), f"{folder} has no README.md"


def test_the_readmes_folder_list_names_every_folder_of_the_package():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    layout = text[text.index("## Layout") :]
    block = layout[layout.index("```") + 3 :]
    block = block[: block.index("```")]
    named = set(re.findall(r"^(nat_plugins/[a-z_]+/)", block, flags=re.M))
    package = os.path.join(REPO_ROOT, "nat_plugins")
    folders = {
        f"nat_plugins/{name}/"
        for name in os.listdir(package)
        if os.path.isfile(os.path.join(package, name, "__init__.py"))
    }
    assert named == folders


def test_the_results_page_stays_a_page():
    """docs/results.md holds each run's generated section and what it adds; one-off studies and earlier runs go to
    docs/design-notes.md, so the page stays readable (at most 300 lines)."""
    with open(os.path.join(REPO_ROOT, "docs", "results.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 300, f"docs/results.md has {len(lines)} lines: move one-off studies to docs/design-notes.md"
