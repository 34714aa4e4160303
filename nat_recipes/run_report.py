"""The report of a quickstart run (``run_scripts/quickstart.sh`` calls it last): the benchmark's tables, the teacher's
validation curve, each step's wall time and the preset's quality targets (:mod:`nat_recipes.catalogue`) checked
against the measured rows; a target whose row the benchmark lacks is an error. :func:`build_summary` is its short
form (the targets and one table of the numbers a user compares), which ``dev/results_section.py`` puts into
``docs/results.md``.

    python -m nat_recipes.run_report WORK --preset cpu-long

Writes ``WORK/report.md`` (and prints it).
"""

import argparse
import json
import os
import re
from typing import List, Optional

from nat_plugins.bench.report import MIN_LATENCY_SENTENCES, ratio_cell
from nat_plugins.bench.rows import CT2_GREEDY, TEACHER_GREEDY_PLUGIN

from . import catalogue


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


SIDE_BY_SIDE = "side by side"


def step_times(path: str) -> List[tuple]:
    """(step, seconds, phase) of each step the quickstart ran (``logs/steps.tsv``; the last run of a step counts):
    phase ``""`` for a step that ran alone, ``SIDE_BY_SIDE`` for one that ran beside other steps, ``"phase"`` for the
    wall time of such a group (the students trained ``STUDENT_JOBS`` at a time)."""
    if not os.path.exists(path):
        return []
    times = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, seconds, *phase = line.rstrip("\n").split("\t")
            times[name] = (int(seconds), phase[0] if phase else "")
    return [(name, seconds, phase) for name, (seconds, phase) in times.items()]


def wall_seconds(times: List[tuple]) -> int:
    """The run's wall time over its steps: the steps that ran alone and each side-by-side group once."""
    return sum(seconds for _, seconds, phase in times if phase != SIDE_BY_SIDE)


def step_label(name: str, phase: str) -> str:
    """A step's name in the report: ``benchmark`` without its options' key, a side-by-side step marked so."""
    if name.startswith("benchmark"):
        return "benchmark"
    return f"{name} ({phase})" if phase == SIDE_BY_SIDE else name


def load_results(work: str) -> dict:
    with open(os.path.join(work, "bench", "results.json"), encoding="utf-8") as f:
        return json.load(f)


def header(results: dict, preset: str, command: Optional[str]) -> str:
    meta = results["meta"]
    return (
        f"Command: `{command or f'PRESET={preset} bash run_scripts/quickstart.sh'}`; {meta['date']}; "
        f"{meta['device']}; torch {meta['torch']}, fairseq {meta['fairseq']}, nat_plugins {meta['nat_plugins']}; "
        f"{meta['precision']}."
    )


def reference_note(results: dict, work: str) -> List[str]:
    """A line when the BLEU reference holds ``<unk>``: the test targets read back from a data-bin (an own teacher's run
    without REFERENCE) lost the words their dictionary lacks, which lowers every row's BLEU against what the raw text
    would give; empty otherwise."""
    reference = results["meta"].get("reference")
    path = reference and os.path.join(work, reference)
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        unknown = f.read().count("<unk>")
    if not unknown:
        return []
    return [
        f"BLEU reference `{reference}`: the test targets as the data-bin holds them, with {unknown} "
        "`<unk>` where the dictionary lacks a word, so every BLEU here is lower than against the raw text; "
        "`REFERENCE=raw test targets` scores against those.",
        "",
    ]


def target_table(results: dict, preset: str, only: catalogue.Only = None) -> List[str]:
    """The preset's targets (the catalogue's, README claims included) checked against the run: markdown lines;
    ``only``: a run on your own teacher, checked for what its command promises
    (:func:`.catalogue.own_teacher_targets`)."""
    measured = catalogue.Measured(
        {r["name"]: r for r in results["rows"]}, results.get("paired_tests", []), catalogue.plugin_rows(preset)
    )
    budget = results["meta"].get("time_budget") or {}
    left_out = set(budget.get("rows_left_out", ()))
    left_out |= {row["name"] for row in budget.get("not_timed_at_batch1", ())}  # as the GPU run at 3a66eee wrote it
    checked = []
    device = results["meta"].get("device", "")
    claims_kind = catalogue.CLAIMS_CPU_KIND.get(preset)
    claims_speed = claims_kind is None or catalogue.cpu_kind(device) == claims_kind
    bars = catalogue.targets(preset) if only is None else catalogue.own_teacher_targets(preset, only, results["rows"])
    for target in bars:
        missing = [name for name in target.rows if name in left_out]
        if missing:  # the benchmark's --time-budget left the row out: not measured, said so
            checked.append((target.what, f"not measured: {missing[0]} left out by the time budget", None))
        elif isinstance(target, catalogue.Claim) and not claims_speed:
            text, met = target.check(measured, speed=False)
            checked.append(
                (
                    target.what,
                    f"{text}; speed-ups not checked: the README's are an {claims_kind}'s, this run's CPU is {device}",
                    met,
                )
            )
        else:
            checked.append((target.what, *target.check(measured)))
    if not checked:
        return []
    met_cell = {True: "yes", False: "**no**", None: "–"}
    return ["| target | measured | met |", "|---|---|---|"] + [
        f"| {what} | {text} | {met_cell[met]} |" for what, text, met in checked
    ]


def minutes(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60:02d} s"


def build_report(
    work: str, preset: str, image_prefix: str = "", only: catalogue.Only = None, command: Optional[str] = None
) -> str:
    """The report's markdown; plots are referenced as ``image_prefix + file name``; ``only``: the run's systems (a run
    on your own teacher: the bars of what its command promises, not the Multi30k targets); ``command``: the run's
    command (default: the quickstart's for ``preset``). Raises :class:`~.catalogue.MissingRow` when a target's row is
    not among the benchmark's."""
    bench = os.path.join(work, "bench")
    results = load_results(work)
    with open(os.path.join(bench, "results.md"), encoding="utf-8") as f:
        tables = f.read().split("\n", 1)[1].strip()  # without its own title
    lines = [header(results, preset, command), ""] + reference_note(results, work)
    curve = teacher_curve(os.path.join(work, "logs", "teacher.log"))
    if curve:
        lines += [
            "Teacher's validation (the run's own log): "
            + ", ".join(f"{u} updates: loss {loss:.3f} / ppl {ppl:.2f}" for u, loss, _, ppl in curve)
            + ".",
            "",
        ]
    lines += target_table(results, preset, only)
    notes = catalogue.made_notes(preset, only)
    if notes:
        lines += ["", "How each row was made, where it departs from or chooses within its paper:", ""]
        lines += ["| row | made |", "|---|---|"] + [f"| {name} | {made} |" for name, made in notes]
    times = step_times(os.path.join(work, "logs", "steps.tsv"))
    if times:
        lines += ["", "| step | wall time |", "|---|---:|"]
        lines += [f"| {step_label(n, p)} | {minutes(s)} |" for n, s, p in times]
        lines += [f"| all steps | {minutes(wall_seconds(times))} |"]
    plots = sorted(p for p in os.listdir(bench) if p.endswith(".png"))
    lines += [""] + [f"![{p}]({image_prefix}{p})" for p in plots] + ["", tables]
    return "\n".join(lines) + "\n"


def solo_ratio_to(results: dict, row: dict, reference: str) -> Optional[List[float]]:
    """Per-round paired batch-1 ratios ``reference``'s seconds / ``row``'s on the solo pass's blocks (None when
    either was not timed alone)."""
    seconds = (results.get("solo") or {}).get("per_round_seconds", {})
    if row["name"] not in seconds or reference not in seconds:
        return None
    return [ref / own for ref, own in zip(seconds[reference]["1"], seconds[row["name"]]["1"])]


def fastest_ct2_alone(results: dict) -> Optional[str]:
    """The CTranslate2 greedy engine with the least batch-1 time alone (the baseline at its best setting)."""
    engines = [r for r in results["rows"] if r.get("role") == CT2_GREEDY and r.get("solo")]
    return min(engines, key=lambda r: r["solo"]["ms_per_sentence"])["name"] if engines else None


def plugin_greedy_row(results: dict) -> Optional[str]:
    """The name of the run's row of the teacher's greedy search by the plugin's loop, if it has one."""
    return next((r["name"] for r in results["rows"] if r.get("role") == TEACHER_GREEDY_PLUGIN), None)


def summary_row(results: dict, row: dict, ct2: Optional[str], plugin: Optional[str]) -> str:
    """One line of :func:`build_summary`'s table (``plugin``: :func:`plugin_greedy_row`)."""
    solo, rounds = row.get("solo"), row.get("speedup_rounds", {})
    if solo:
        ms, greedy, timed = solo["ms_per_sentence"], ratio_cell(solo["latency_ratio_rounds"]), "alone"
        to_ct2 = solo_ratio_to(results, row, ct2) if ct2 else None
        to_plugin = solo_ratio_to(results, row, plugin) if plugin else None
    else:
        ms, greedy, timed = row["latency_ms_median"], ratio_cell(row["latency_ratio_rounds"]), "round-robin"
        to_ct2 = rounds.get("latency_speedup_vs_ct2_greedy")
        to_plugin = rounds.get("latency_speedup_vs_ar_greedy_plugin")
    batched = row.get("throughput_ratio_rounds")
    checks = row.get("exact_check")
    differ = "–" if not checks else str(sum(check["differ"] for check in checks.values()))
    calls = row.get("decoder_calls_per_sentence")
    cells = [
        f"{row['bleu']:.2f}",
        differ,
        timed,
        f"{ms:.1f}",
        greedy,
        *([ratio_cell(to_plugin) if to_plugin else "–"] if plugin else []),
        ratio_cell(to_ct2) if to_ct2 else "–",
        ratio_cell(batched) if batched else "–",
        "–" if calls is None else f"{calls:.2f}",
        "–" if row.get("rep_ratio") is None else f"{row['rep_ratio']:.1f}",
    ]
    return f"| {row['name']} | " + " | ".join(cells) + " |"


def build_summary(
    work: str,
    preset: str,
    image_prefix: str = "",
    full_report: str = "",
    command: Optional[str] = None,
    only: catalogue.Only = None,
) -> str:
    """The run in short, for ``docs/results.md``: its command and device, the wall time of its steps, the preset's
    targets checked, one table (BLEU, whether a row prints the teacher's greedy output, batch-1 speed alone where the
    run timed the engine alone, against fairseq's greedy search and CTranslate2's fastest greedy engine, batch-64
    speed, decoder calls, repeated tokens) and the speed-quality plot; ``full_report``: where :func:`build_report`'s
    page is; ``command``, ``only``: as :func:`build_report`'s."""
    results = load_results(work)
    meta = results["meta"]
    batch = meta["batch_size"]
    lines = [header(results, preset, command), ""] + reference_note(results, work)
    times = step_times(os.path.join(work, "logs", "steps.tsv"))
    if times:
        not_training = sum(s for n, s, _ in times if n.startswith("benchmark") or n == "data")
        lines += [
            f"Wall time: {minutes(wall_seconds(times))} over the steps (set-up not counted): "
            + ", ".join(f"{step_label(n, p)} {minutes(s)}" for n, s, p in times)
            + f"; training {minutes(wall_seconds(times) - not_training)}.",
            "",
        ]
    targets = target_table(results, preset, only)
    lines += targets + ([""] if targets else [])
    ct2 = fastest_ct2_alone(results) or (meta.get("ctranslate2_fastest_greedy") or {}).get("latency")
    plugin = plugin_greedy_row(results)
    to_plugin = f"× plugin greedy: against *{plugin}* (the teacher's greedy search by the plugin's loop); "
    if not meta.get("latency_is_result", True):
        lines += [
            f"**Batch-1 speeds are not a result**: {meta['latency_sentences_timed']} sentences timed, fewer than "
            f"{MIN_LATENCY_SENTENCES}.",
            "",
        ]
    lines += [
        f"{meta['num_sentences']} test sentences; batch 1: median ms per sentence over "
        f"{meta['latency_sentences_timed']} sentences and the median (range) of the paired per-round ratios, each "
        "engine alone at its best setting where the run timed it so, else round-robin with every row; "
        + (to_plugin if plugin else "")
        + f"× CTranslate2: against *{ct2 or 'none'}*, its fastest greedy engine; batch {batch}: round-robin; "
        "≠ greedy: timed sentences whose output differs from the teacher's greedy search (– not checked); Rep %: "
        "repeated tokens (Ran et al. eq. 8).",
        "",
        "| system | BLEU | ≠ greedy | batch 1 timed | ms / sent | × fairseq greedy | "
        + ("× plugin greedy | " if plugin else "")
        + f"× CTranslate2 | batch {batch}: × fairseq greedy | decoder calls / sent | Rep % |",
        "|---|---:|---:|---|---:|---:|" + ("---:|" if plugin else "") + "---:|---:|---:|---:|",
    ]
    lines += [summary_row(results, row, ct2, plugin) for row in results["rows"]]
    pareto = os.path.join(work, "bench", "pareto.png")
    if os.path.exists(pareto):
        lines += ["", f"![BLEU against batch-1 speed-up]({image_prefix}pareto.png)"]
    if full_report:
        lines += [
            "",
            f"Every column, the by-length and by-batch-size tables, how each row was made: [{full_report}]"
            f"({full_report}).",
        ]
    return "\n".join(lines) + "\n"


def add_run_options(parser: argparse.ArgumentParser):
    """The options that say which run a report is of (this module's command and dev/results_section.py)."""
    parser.add_argument("work", help="the quickstart's WORK folder (with bench/ and logs/)")
    parser.add_argument(
        "--preset", required=True, choices=list(catalogue.PRESETS), help="the run's preset: its targets are checked"
    )
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        metavar="SYSTEM[,SYSTEM...]",
        help="the systems the run trained (a run on your own teacher): its exact rows checked, no Multi30k target",
    )
    parser.add_argument("--command", help="the run's command, as the report states it (default: the quickstart's)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser)
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.work, "bench", "results.json")):
        parser.error(f"{args.work}/bench/results.json does not exist: run the benchmark step first")
    try:
        report = build_report(args.work, args.preset, only=args.only, command=args.command)
    except (catalogue.MissingRow, catalogue.CatalogueError) as err:
        parser.error(str(err))
    with open(os.path.join(args.work, "report.md"), "w", encoding="utf-8") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
