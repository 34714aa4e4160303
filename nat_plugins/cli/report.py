"""The report of a quickstart run (``run_scripts/quickstart.sh`` calls it last): the benchmark's tables, the teacher's
validation curve, each step's wall time and the preset's quality targets checked against the measured rows.

    python -m nat_plugins.cli.report WORK --preset cpu-long [--docs docs/results.md]

Writes ``WORK/report.md``; with ``--docs`` it also replaces the section between ``<!-- report:PRESET -->`` and
``<!-- /report:PRESET -->`` of that file (appended if absent) and copies the plots next to it into ``img/``.
"""

import argparse
import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

TEACHER_BEAM, TEACHER_GREEDY = "AR teacher, beam 4", "AR teacher, greedy"
NAD_AD, NAD_AD_BASELINE = "Encoder-NAD-AD, beam 4", "AR teacher + same updates, beam 4"
FAIRSEQ_ROWS = ("fairseq NAT (nonautoregressive_transformer)", "fairseq CMLM, 10 iterations")


@dataclass
class Target:
    """One quality bar: ``check(rows)`` returns (measured text, met) or None when its rows are missing."""

    what: str
    check: Callable[[Dict[str, dict]], Optional[tuple]]


def share_of_teacher(name: str, minimum: float, min_speedup: float = 0.0) -> Target:
    """BLEU >= ``minimum`` of the teacher's beam BLEU (and batch-1 latency >= ``min_speedup`` x the teacher beam)."""

    def check(rows):
        if name not in rows or TEACHER_BEAM not in rows:
            return None
        row = rows[name]
        share = row["bleu"] / rows[TEACHER_BEAM]["bleu"]
        speedup = row.get("latency_speedup_vs_ar_beam") or 0.0
        return f"{100 * share:.1f}% at {speedup:.2f}x", share >= minimum and speedup >= min_speedup

    at = f" at >= {min_speedup}x vs the teacher's beam" if min_speedup else ""
    return Target(f"{name}: BLEU >= {100 * minimum:.0f}% of the teacher's beam{at}", check)


def exact_blockwise(
    name: str, min_block: float, max_bleu_loss: Optional[float] = None, min_speedup: float = 0.0, hyp_dir: str = ""
) -> Target:
    """Exact acceptance: the teacher's greedy output (or, fine-tuned, its BLEU minus ``max_bleu_loss``), a mean
    accepted block >= ``min_block`` and a batch-1 speedup over greedy >= ``min_speedup``."""

    def check(rows):
        if name not in rows or TEACHER_GREEDY not in rows:
            return None
        row, greedy = rows[name], rows[TEACHER_GREEDY]
        block, speedup = row.get("tokens_per_call") or 0.0, row.get("latency_speedup_vs_ar_greedy") or 0.0
        if max_bleu_loss is None:
            with (
                open(os.path.join(hyp_dir, row["hyp_file"]), encoding="utf-8") as a,
                open(os.path.join(hyp_dir, greedy["hyp_file"]), encoding="utf-8") as b,
            ):
                identical = a.read() == b.read()
            quality, ok = ("identical to greedy" if identical else "differs from greedy"), identical
        else:
            loss = greedy["bleu"] - row["bleu"]
            quality, ok = f"BLEU {row['bleu']:.2f} (greedy {greedy['bleu']:.2f})", loss <= max_bleu_loss
        return (
            f"{quality}, block {block:.2f}, {speedup:.2f}x vs greedy",
            ok and block >= min_block and speedup >= min_speedup,
        )

    quality = "= the teacher's greedy output" if max_bleu_loss is None else f"BLEU >= greedy - {max_bleu_loss}"
    at = f", >= {min_speedup}x vs greedy" if min_speedup else ""
    return Target(f"{name}: {quality}, mean accepted block >= {min_block}{at}", check)


def speculative(name: str, min_speedup: float, exact: bool = True, hyp_dir: str = "") -> Target:
    """Speculative decoding: exact verification prints the teacher's greedy output, relaxed keeps at least its BLEU;
    both at a batch-1 speedup over greedy >= ``min_speedup`` (shown: mean accepted tokens per teacher call and the
    speedup over greedy decoding in CTranslate2)."""

    def check(rows):
        if name not in rows or TEACHER_GREEDY not in rows:
            return None
        row, greedy = rows[name], rows[TEACHER_GREEDY]
        speedup = row.get("latency_speedup_vs_ar_greedy") or 0.0
        if exact:
            with (
                open(os.path.join(hyp_dir, row["hyp_file"]), encoding="utf-8") as a,
                open(os.path.join(hyp_dir, greedy["hyp_file"]), encoding="utf-8") as b,
            ):
                ok = a.read() == b.read()
            quality = "identical to greedy" if ok else "differs from greedy"
        else:
            ok = row["bleu"] >= greedy["bleu"]
            quality = f"BLEU {row['bleu']:.2f} (greedy {greedy['bleu']:.2f})"
        ct2 = row.get("latency_speedup_vs_ct2_greedy")
        text = (
            f"{quality}, {row.get('tokens_per_step') or 0.0:.2f} tokens per teacher call, {speedup:.2f}x vs greedy"
            + (f" ({ct2:.2f}x vs CTranslate2 greedy)" if ct2 is not None else "")
        )
        return text, ok and speedup >= min_speedup

    quality = "= the teacher's greedy output" if exact else "BLEU >= the teacher's greedy"
    return Target(f"{name}: {quality}, >= {min_speedup}x vs greedy", check)


def nad_ad_gain(minimum: float, paired: List[dict], max_slowdown: Optional[float] = None) -> Target:
    """Encoder-NAD-AD's BLEU gain over its same-updates AR baseline (paired bootstrap p-value shown)."""

    def check(rows):
        if NAD_AD not in rows or NAD_AD_BASELINE not in rows:
            return None
        delta = rows[NAD_AD]["bleu"] - rows[NAD_AD_BASELINE]["bleu"]
        test = next((t for t in paired if t["system"] == NAD_AD), None)
        slower = rows[NAD_AD]["latency_ms_median"] / rows[NAD_AD_BASELINE]["latency_ms_median"] - 1
        text = f"{delta:+.2f} BLEU" + (f" (p = {test['p_value']:.3f})" if test else "") + f", {100 * slower:+.0f}% time"
        return text, delta >= minimum and (max_slowdown is None or slower <= max_slowdown)

    limit = f" at <= {100 * max_slowdown:.0f}% slower" if max_slowdown is not None else ""
    return Target(f"{NAD_AD} vs {NAD_AD_BASELINE}: >= {minimum:+} BLEU{limit}", check)


def above_fairseq(both: bool) -> Target:
    """Every plugin row above fairseq's own NAT and CMLM on BLEU or on batch-1 speed (``both``: on both, vs NAT)."""

    def check(rows):
        theirs = [rows[n] for n in FAIRSEQ_ROWS if n in rows]
        if not theirs:
            return None
        if both:
            theirs = theirs[:1]
        ours = [r for n, r in rows.items() if n not in FAIRSEQ_ROWS and not n.startswith("AR teacher")]
        verdicts, ok = [], True
        for row in ours:
            better_bleu = all(row["bleu"] > t["bleu"] for t in theirs)
            faster = all(row["latency_ms_median"] < t["latency_ms_median"] for t in theirs)
            ok &= (better_bleu and faster) if both else (better_bleu or faster)
            verdicts.append(
                f"{row['name']}: "
                + (
                    "BLEU and speed"
                    if better_bleu and faster
                    else "BLEU"
                    if better_bleu
                    else "speed"
                    if faster
                    else "neither"
                )
            )
        return "; ".join(verdicts), ok

    return Target(
        "every plugin row above fairseq's NAT/CMLM "
        + ("on BLEU and speed (vs NAT)" if both else "on BLEU or on speed"),
        check,
    )


def targets(preset: str, paired: List[dict], hyp_dir: str) -> List[Target]:
    """The quality bars of the quality runs: ``cpu-long`` on 2-layer models, ``gpu`` on
    ``transformer_iwslt_de_en``-sized
    ones (the smoke-sized ``cpu`` quickstart has none)."""
    if preset == "cpu":
        return []
    if preset == "gpu":
        return [
            share_of_teacher("SAT K=2, beam 4", 0.97, 1.5),
            share_of_teacher("SAT K=6, greedy", 0.85, 4.0),
            share_of_teacher("RecoverSAT K=2", 0.98, 1.8),
            share_of_teacher("RecoverSAT K=6", 0.93, 3.0),
            exact_blockwise("Blockwise k=8 frozen, exact", 1.0, min_speedup=1.4, hyp_dir=hyp_dir),
            exact_blockwise("Blockwise k=8 fine-tuned, exact", 3.5, 1.0, min_speedup=2.5, hyp_dir=hyp_dir),
            speculative("Speculative k=8, exact", 3.0, hyp_dir=hyp_dir),
            speculative("Speculative k=8, relaxed", 4.0, exact=False, hyp_dir=hyp_dir),
            share_of_teacher("NAT, argmax fertility", 0.80, 8.0),
            share_of_teacher("NAT, NPD S=10", 0.88, 3.0),
            nad_ad_gain(0.5, paired, max_slowdown=0.10),
            above_fairseq(both=True),
        ]
    return [
        share_of_teacher("SAT K=2, beam 4", 0.95),
        share_of_teacher("SAT K=4, greedy", 0.80),
        share_of_teacher("RecoverSAT K=2", 0.93),
        exact_blockwise("Blockwise k=4 frozen, exact", 1.5, hyp_dir=hyp_dir),
        exact_blockwise("Blockwise k=4 fine-tuned, exact", 2.0, 1.0, hyp_dir=hyp_dir),
        speculative("Speculative k=4, exact", 1.5, hyp_dir=hyp_dir),
        share_of_teacher("NAT, argmax fertility", 0.70),
        share_of_teacher("NAT, NPD S=10", 0.78),
        nad_ad_gain(0.3, paired),
        above_fairseq(both=False),
    ]


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


def build_report(work: str, preset: str, image_prefix: str = "") -> str:
    """The report's markdown; plots are referenced as ``image_prefix + file name``."""
    bench = os.path.join(work, "bench")
    with open(os.path.join(bench, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    with open(os.path.join(bench, "results.md"), encoding="utf-8") as f:
        tables = f.read().split("\n", 1)[1].strip()  # without its own title
    meta, rows = results["meta"], {r["name"]: r for r in results["rows"]}
    lines = [
        f"Command: `PRESET={preset} bash run_scripts/quickstart.sh` (WORK `{work}`); {meta['date']}; "
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
    checked = [(t.what, t.check(rows)) for t in targets(preset, results.get("paired_tests", []), bench)]
    if any(result for _, result in checked):
        lines += ["| target | measured | met |", "|---|---|---|"]
        lines += [
            f"| {what} | {result[0]} | {'yes' if result[1] else '**no**'} |" for what, result in checked if result
        ]
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


def replace_section(doc_path: str, preset: str, body: str):
    """Put ``body`` between the preset's markers in ``doc_path`` (appended with a heading if they are absent)."""
    begin, end = f"<!-- report:{preset} -->", f"<!-- /report:{preset} -->"
    text = open(doc_path, encoding="utf-8").read() if os.path.exists(doc_path) else "# Results\n"
    block = f"{begin}\n{body}{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + f"\n\n## Quickstart `PRESET={preset}` (generated by the run)\n\n{block}\n"
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", help="the quickstart's WORK folder (with bench/ and logs/)")
    parser.add_argument("--preset", required=True, choices=["cpu", "cpu-long", "gpu"])
    parser.add_argument(
        "--docs",
        help="also replace this preset's section of this markdown file (e.g. "
        "docs/results.md) and copy the plots into img/ beside it",
    )
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.work, "bench", "results.json")):
        parser.error(f"{args.work}/bench/results.json does not exist: run the benchmark step first")
    report = build_report(args.work, args.preset)
    with open(os.path.join(args.work, "report.md"), "w", encoding="utf-8") as f:
        f.write(report)
    print(report)
    if args.docs:
        img_dir = os.path.join(os.path.dirname(os.path.abspath(args.docs)), "img")
        os.makedirs(img_dir, exist_ok=True)
        for plot in (p for p in os.listdir(os.path.join(args.work, "bench")) if p.endswith(".png")):
            shutil.copy(os.path.join(args.work, "bench", plot), os.path.join(img_dir, f"{args.preset}-{plot}"))
        replace_section(args.docs, args.preset, build_report(args.work, args.preset, f"img/{args.preset}-"))


if __name__ == "__main__":
    main()
