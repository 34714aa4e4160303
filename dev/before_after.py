"""The tables of dev/before_after.sh: every row's batch-1 latency before and after (and whether its hypotheses are
the same), every recipe's updates/s before and after, each as a ratio to its reference in the same run.

    python dev/before_after.py OUT BEFORE_REVISION AFTER_REVISION > OUT/before_after.md
"""

import json
import os
import sys

SIDES = ("before", "after")


def speedup(row):
    value = row.get("latency_speedup_vs_ar_greedy")
    return "-" if value is None else f"{value:.2f}"


def table(title, columns, cells, text_columns=(0,)):
    """A titled markdown table, numbers right-aligned (the columns ``text_columns`` left-aligned)."""
    align = ["---" if i in text_columns else "---:" for i in range(len(columns))]
    return [title, "", "| " + " | ".join(columns) + " |", "|" + "|".join(align) + "|"] + [
        "| " + " | ".join(row) + " |" for row in cells
    ]


def decoding(out):
    """The decoding table (rows both benchmarks have)."""
    rows, hyps = {}, {}
    for side in SIDES:
        with open(os.path.join(out, f"bench-{side}", "results.json"), encoding="utf-8") as f:
            rows[side] = {row["name"]: row for row in json.load(f)["rows"]}
        for name, row in rows[side].items():
            with open(os.path.join(out, f"bench-{side}", row["hyp_file"]), encoding="utf-8") as f:
                hyps[side, name] = f.read()
    cells = []
    for name, after in rows["after"].items():
        before = rows["before"].get(name)
        if before is None:
            continue
        ratio = after["latency_ms_median"] / before["latency_ms_median"]
        same = "yes" if hyps["before", name] == hyps["after", name] else "**no**"
        cells.append(
            [name, f"{before['latency_ms_median']:.1f}", speedup(before), f"{after['latency_ms_median']:.1f}"]
            + [speedup(after), f"{ratio:.2f}", same]
        )
    return table(
        "Decoding, batch 1 (median ms per sentence; x = speed-up over the teacher's greedy search in the same run)",
        ["row", "before ms", "before x greedy", "after ms", "after x greedy", "after/before time", "same hypotheses"],
        cells,
        text_columns=(0, 6),
    )


def training(out):
    """The training table (recipes both sides timed), each recipe against the one the after side compares it with
    (train_speed's ``compared_with``)."""
    speed, compared_with = {}, {}
    for side in SIDES:
        with open(os.path.join(out, f"speed-{side}.jsonl"), encoding="utf-8") as f:
            runs = [json.loads(line) for line in f]
        speed[side] = {run["label"]: run["updates_per_s"] for run in runs}
        compared_with.update({run["label"]: run["compared_with"] for run in runs if run.get("compared_with")})
    cells = []
    for label, after in speed["after"].items():
        before, base = speed["before"].get(label), compared_with.get(label)
        if before is None or base not in speed["before"]:
            continue
        cells.append(
            [label, f"{before:.3f}", f"{before / speed['before'][base]:.2f}", f"{after:.3f}"]
            + [f"{after / speed['after'][base]:.2f}"]
        )
    return table(
        "Training (updates/s; x = ratio to the AR recipe on the same batches in the same run)",
        ["recipe", "before upd/s", "before x AR", "after upd/s", "after x AR"],
        cells,
    )


def main():
    out, before_rev, after_rev = sys.argv[1:]
    lines = [f"before: {before_rev}  ", f"after: {after_rev} (working tree)", ""] + decoding(out)
    if os.path.exists(os.path.join(out, "speed-after.jsonl")):  # UPDATES=0: decoding only
        lines += [""] + training(out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
