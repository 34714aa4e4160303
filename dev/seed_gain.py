"""A BLEU gain over several training seeds: each seed's BLEU and paired bootstrap, mean ± sample std, and sacreBLEU's
paired bootstrap (1,000 resamples) on the seeds' hypotheses pooled (seed i of the system paired with seed i of the
baseline, the references repeated once per seed), so that seed noise and test-set noise are judged together.

Reads a finished ``nat-benchmark`` out-dir (its results.json and hypothesis files); ``--baseline`` and ``--system``
name its rows, one per seed, in the same seed order:

    python dev/seed_gain.py OUT_DIR --reference raw/test.de \\
        --baseline "AR + same updates, seed 1" "AR + same updates, seed 2" ... \\
        --system "Encoder-NAD-AD, seed 1" "Encoder-NAD-AD, seed 2" ... [--json PATH]
"""

import argparse
import json
import os
import statistics
import sys

from nat_plugins.bench.analysis import paired_bootstrap


def read_rows(out_dir: str, names: list) -> list:
    """The benchmark rows called ``names`` (results.json), each with its hypotheses under "hyps"."""
    with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
        rows = {row["name"]: row for row in json.load(f)["rows"]}
    missing = [name for name in names if name not in rows]
    if missing:
        sys.exit(f"seed_gain.py: {out_dir}/results.json has no rows {missing} (it has {list(rows)})")
    found = []
    for name in names:
        with open(os.path.join(out_dir, rows[name]["hyp_file"]), encoding="utf-8") as f:
            found.append({**rows[name], "hyps": f.read().splitlines()})
    return found


def mean_std(values: list) -> tuple:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_gain(baselines: list, systems: list, references: list) -> dict:
    """Per-seed BLEU and gain, their mean ± std, and the paired bootstrap on the pooled hypotheses."""
    if len(baselines) != len(systems):
        raise ValueError(f"{len(baselines)} baseline rows but {len(systems)} system rows: give one of each per seed")
    pooled = {
        "baseline": [hyp for row in baselines for hyp in row["hyps"]],
        "system": [hyp for row in systems for hyp in row["hyps"]],
    }
    (test,) = paired_bootstrap([("baseline", "system")], pooled, references * len(systems))
    gains = [system["bleu"] - baseline["bleu"] for baseline, system in zip(baselines, systems)]
    per_seed = [
        paired_bootstrap([("baseline", "system")], {"baseline": b["hyps"], "system": s["hyps"]}, references)[0]
        for b, s in zip(baselines, systems)
    ]
    return {
        "seeds": [
            {
                "baseline": b["name"],
                "baseline_bleu": b["bleu"],
                "system": s["name"],
                "system_bleu": s["bleu"],
                "p_value": test["p_value"],
            }
            for b, s, test in zip(baselines, systems, per_seed)
        ],
        "baseline_bleu": mean_std([row["bleu"] for row in baselines]),
        "system_bleu": mean_std([row["bleu"] for row in systems]),
        "gain": mean_std(gains),
        "pooled": {key: test[key] for key in ("baseline_bleu", "system_bleu", "delta", "p_value", "signature")},
    }


def markdown(result: dict) -> str:
    lines = ["| seed | baseline BLEU | system BLEU | gain | paired p |", "|---:|---:|---:|---:|---:|"]
    for i, seed in enumerate(result["seeds"], 1):
        gain = seed["system_bleu"] - seed["baseline_bleu"]
        lines.append(
            f"| {i} | {seed['baseline_bleu']:.2f} | {seed['system_bleu']:.2f} | {gain:+.2f} | {seed['p_value']:.4f} |"
        )
    (bm, bs), (sm, ss), (gm, gs) = result["baseline_bleu"], result["system_bleu"], result["gain"]
    lines.append(f"| mean ± std | {bm:.2f} ± {bs:.2f} | {sm:.2f} ± {ss:.2f} | {gm:+.2f} ± {gs:.2f} | |")
    pooled = result["pooled"]
    lines += [
        "",
        f"Pooled ({len(result['seeds'])} seeds' hypotheses, one corpus BLEU each, not the seeds' mean): "
        f"{pooled['system_bleu']:.2f} vs "
        f"{pooled['baseline_bleu']:.2f} ({pooled['delta']:+.2f} BLEU), paired bootstrap p = {pooled['p_value']:.4f} "
        f"({pooled['signature']})",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="a finished nat-benchmark --out-dir")
    parser.add_argument("--reference", required=True, help="raw reference file of the benchmark's split")
    parser.add_argument("--baseline", nargs="+", required=True, help="the baseline's rows, one per seed")
    parser.add_argument("--system", nargs="+", required=True, help="the system's rows, one per seed, same order")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    with open(args.reference, encoding="utf-8") as f:
        references = f.read().splitlines()
    result = seed_gain(read_rows(args.out_dir, args.baseline), read_rows(args.out_dir, args.system), references)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))


if __name__ == "__main__":
    main()
