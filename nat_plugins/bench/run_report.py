"""The report of a quickstart run (``run_scripts/quickstart.sh`` calls it last): the benchmark's tables, the teacher's
validation curve, each step's wall time and the preset's quality targets (:mod:`nat_plugins.bench.recipes`) checked
against the measured rows; a target whose row the benchmark lacks is an error.

    python -m nat_plugins.bench.run_report WORK --preset cpu-long

Writes ``WORK/report.md`` (and prints it).
"""

import argparse
import json
import os
import re
from typing import List, Optional

from . import recipes


def teacher_curve(log_path: str) -> List[tuple]:
    """(updates, validation loss, nll, ppl) at each validation of the teacher's training log."""
    pattern = re.compile(
        r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \| ppl ([\d.]+).*"
        r"num_updates (\d+)"
    )
    if not os.path.exists(log_path):
        return []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [
            (int(m.group(4)), float(m.group(1)), float(m.group(2)), float(m.group(3)))
            for m in map(pattern.search, f)
            if m
        ]


def step_times(path: str) -> List[tuple]:
    """(step, seconds) of each step the quickstart ran (``logs/steps.tsv``; the last run of a step counts)."""
    if not os.path.exists(path):
        return []
    times = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, seconds = line.rstrip("\n").split("\t")[:2]
            times[name] = int(seconds)
    return list(times.items())


def build_report(
    work: str, preset: str, image_prefix: str = "", only: recipes.Only = None, command: Optional[str] = None
) -> str:
    """The report's markdown; plots are referenced as ``image_prefix + file name``; ``only``: the run's systems (its
    targets only, no README claims: a run on your own teacher); ``command``: the run's command (default: the
    quickstart's for ``preset``). Raises :class:`~.recipes.MissingRow` when a target's row is not among the
    benchmark's."""
    bench = os.path.join(work, "bench")
    with open(os.path.join(bench, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    with open(os.path.join(bench, "results.md"), encoding="utf-8") as f:
        tables = f.read().split("\n", 1)[1].strip()  # without its own title
    meta = results["meta"]
    measured = recipes.Measured(
        {r["name"]: r for r in results["rows"]}, results.get("paired_tests", []), recipes.plugin_rows(preset)
    )
    lines = [
        f"Command: `{command or f'PRESET={preset} bash run_scripts/quickstart.sh'}`; {meta['date']}; "
        f"{meta['device']}; torch {meta['torch']}, fairseq {meta['fairseq']}, nat_plugins {meta['nat_plugins']}; "
        f"{meta['precision']}.",
        "",
    ]
    curve = teacher_curve(os.path.join(work, "logs", "teacher.log"))
    if curve:
        lines += [
            "Teacher's validation (the run's own log): "
            + ", ".join(f"{u} updates: loss {loss:.3f} / ppl {ppl:.2f}" for u, loss, _, ppl in curve)
            + ".",
            "",
        ]
    checked = [(target.what, *target.check(measured)) for target in recipes.targets(preset, only)]
    if checked:
        lines += ["| target | measured | met |", "|---|---|---|"]
        lines += [f"| {what} | {text} | {'yes' if met else '**no**'} |" for what, text, met in checked]
    notes = recipes.made_notes(preset, only)
    if notes:
        lines += ["", "How each row was made, where it departs from or chooses within its paper:", ""]
        lines += ["| row | made |", "|---|---|"] + [f"| {name} | {made} |" for name, made in notes]
    times = step_times(os.path.join(work, "logs", "steps.tsv"))
    if times:
        lines += ["", "| step | wall time |", "|---|---:|"] + [
            f"| {n} | {s // 60} min {s % 60:02d} s |" for n, s in times
        ]
        total = sum(s for _, s in times)
        lines += [f"| all steps | {total // 60} min {total % 60:02d} s |"]
    plots = sorted(p for p in os.listdir(bench) if p.endswith(".png"))
    lines += [""] + [f"![{p}]({image_prefix}{p})" for p in plots] + ["", tables]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", help="the quickstart's WORK folder (with bench/ and logs/)")
    parser.add_argument(
        "--preset", required=True, choices=list(recipes.PRESETS), help="the run's preset: its targets are checked"
    )
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        metavar="SYSTEM[,SYSTEM...]",
        help="the systems the run trained (a run on your own teacher): their targets, not the README's claims",
    )
    parser.add_argument("--command", help="the run's command, as the report states it (default: the quickstart's)")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.work, "bench", "results.json")):
        parser.error(f"{args.work}/bench/results.json does not exist: run the benchmark step first")
    try:
        report = build_report(args.work, args.preset, only=args.only, command=args.command)
    except (recipes.MissingRow, recipes.CatalogueError) as err:
        parser.error(str(err))
    with open(os.path.join(args.work, "report.md"), "w", encoding="utf-8") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
