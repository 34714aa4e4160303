"""Noisy parallel decoding against its number of samples S (Gu et al., ICLR 2018, §4.1 NPD): batch-1 latency and
BLEU of one ``fertility_nat`` checkpoint for every S of ``--samples`` (default 1, 5, 10, 25, 100), with the AR
teacher (which also rescores the candidates) decoded by fairseq's ``SequenceGenerator`` (beam and greedy) as the
reference rows of the same run.

Every row decodes the first ``--sentences`` sentences of the split one at a time through fairseq-generate's path,
under the benchmark's batch-1 protocol (:func:`.measure.measure_batch1`, DESIGN.md §7: same seed before every row,
CUDA synchronised, the first ``--warmup`` sentences decoded but not timed; median, p90 and mean latency); BLEU is
sacreBLEU's over all the sentences decoded. Outputs in ``--out-dir``: ``npd_sweep.json``, ``npd_sweep.md``,
``npd_sweep.png`` (latency and BLEU against S, the teacher rows as horizontal lines) and ``hyp.<slug>.txt`` per
row. Example (Multi30k, CPU)::

    nat-npd-sweep DATA_BIN --path ckpt/fertility-nat/checkpoint_best.pt --teacher ckpt/teacher/checkpoint_best.pt \\
        --reference raw/test.de --out-dir bench-npd --cpu --generate-args '--max-len-a 1.2 --max-len-b 10'
"""

import argparse
import json
import os
import statistics
from typing import List, Optional

import torch

import nat_plugins

from .analysis import corpus_bleu
from .measure import generation_cfg, load_row, load_split, measure_batch1
from .report import pyplot, run_environment
from .rows import (
    SYSTEM,
    TEACHER_BEAM,
    TEACHER_GREEDY,
    BenchmarkError,
    RowSpec,
    percentile,
    run_cli,
    split_generate_args,
    teacher_specs,
)

JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "npd_sweep.json", "npd_sweep.md", "npd_sweep.png"


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nat-npd-sweep",
        description="Batch-1 latency and BLEU of noisy parallel decoding (fertility_nat) for several numbers of "
        "samples S, against the AR teacher decoded by fairseq (beam and greedy) in the same run; writes "
        f"{JSON_FILE}, {MARKDOWN_FILE} and {PLOT_FILE}.",
    )
    parser.add_argument("data_bin", help="fairseq data-bin directory (output of fairseq-preprocess)")
    parser.add_argument("--path", required=True, help="the fertility_nat checkpoint")
    parser.add_argument(
        "--teacher", required=True, help="AR teacher checkpoint: NPD's --npd-teacher and the reference rows"
    )
    parser.add_argument("--reference", required=True, help="raw reference file of the split, one line per sentence")
    parser.add_argument("--out-dir", required=True, help=f"directory for {JSON_FILE}, {PLOT_FILE}, the hypotheses")
    parser.add_argument(
        "--samples",
        default="1,5,10,25,100",
        metavar="S,S,...",
        help="numbers of NPD samples, one row each (default: 1,5,10,25,100)",
    )
    parser.add_argument(
        "--sentences",
        type=int,
        default=None,
        metavar="N",
        help="decode the first N sentences of the split, warm-up included (default: all)",
    )
    parser.add_argument("--warmup", type=int, default=10, help="leading sentences decoded but not timed (default: 10)")
    parser.add_argument("--teacher-beam", type=int, default=4, help="beam size of the teacher's beam row (default: 4)")
    parser.add_argument("--gen-subset", default="test", help="data-bin split to decode (default: test)")
    parser.add_argument("--source-lang", "-s", default=None, help="source language (default: from the data-bin)")
    parser.add_argument("--target-lang", "-t", default=None, help="target language (default: from the data-bin)")
    parser.add_argument("--cpu", action="store_true", help="decode on CPU even if CUDA is available")
    parser.add_argument("--fp16", action="store_true", help="decode in half precision (model.half())")
    parser.add_argument(
        "--post-process",
        default="sentencepiece",
        help="fairseq --post-process before scoring; 'none' for word-level data (default: sentencepiece)",
    )
    parser.add_argument(
        "--user-dir",
        default=os.path.dirname(os.path.abspath(nat_plugins.__file__)),
        help="fairseq --user-dir (default: the installed nat_plugins package)",
    )
    parser.add_argument(
        "--generate-args",
        default="",
        metavar="'ARGS'",
        help="fairseq-generate arguments of every row, teacher rows included (e.g. '--max-len-a 1.2 --max-len-b 10')",
    )
    parser.add_argument(
        "--npd-args",
        default="",
        metavar="'ARGS'",
        help="further fairseq-generate arguments of the NPD rows (e.g. '--npd-length-normalize')",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed set before every row (default: 1)")
    parser.add_argument(
        "--title",
        default="",
        help="what the sweep is of (e.g. the corpus), added to the plot's and the markdown's heading",
    )
    parser.set_defaults(batch_size=1)  # every row decodes one sentence at a time (generation_cfg reads it)
    return parser


def parse_samples(text: str) -> List[int]:
    """``--samples`` ``"1,5,10"`` -> [1, 5, 10] (distinct, >= 1, in the given order)."""
    try:
        samples = [int(part) for part in text.split(",")]
    except ValueError:
        samples = []
    if not samples or min(samples) < 1 or len(set(samples)) != len(samples):
        raise BenchmarkError(f"--samples {text!r}: expected distinct numbers >= 1, e.g. 1,5,10,25,100")
    return samples


def npd_specs(args, samples: List[int]) -> List[RowSpec]:
    """One row per number of samples: NPD of ``--path`` rescored by ``--teacher``."""
    extra = split_generate_args(args.npd_args, "--npd-args")
    return [
        RowSpec(
            f"NPD S={s}",
            args.path,
            ["--beam", "1", "--fertility-decoding", "npd", "--npd-samples", str(s), "--npd-teacher", args.teacher]
            + extra,
            SYSTEM,
        )
        for s in samples
    ]


def check_inputs(args) -> List[str]:
    """Fail fast on missing files and bad numbers; returns the reference lines."""
    if not os.path.isdir(args.data_bin):
        raise BenchmarkError(f"DATA_BIN {args.data_bin!r} is not a directory")
    for option, path in (("--path", args.path), ("--teacher", args.teacher), ("--reference", args.reference)):
        if not os.path.isfile(path):
            raise BenchmarkError(f"{option} {path!r} does not exist")
    if args.warmup < 0 or args.teacher_beam < 1:
        raise BenchmarkError("--warmup must be >= 0 and --teacher-beam >= 1")
    with open(args.reference, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main(args) -> dict:
    """Run the sweep for parsed ``args``; writes the outputs and returns the content of ``npd_sweep.json``."""
    use_cuda = torch.cuda.is_available() and not args.cpu
    samples = parse_samples(args.samples)
    references = check_inputs(args)
    specs = teacher_specs(args.teacher, args.teacher_beam) + npd_specs(args, samples)
    cfgs = [generation_cfg(args, spec, use_cuda) for spec in specs]
    _task, dataset = load_split(cfgs[0], specs[0].name)
    if len(dataset) != len(references):
        raise BenchmarkError(
            f"--reference {args.reference!r} has {len(references)} lines but split {args.gen_subset!r} of "
            f"{args.data_bin!r} has {len(dataset)} sentences"
        )
    num = len(dataset) if args.sentences is None else min(args.sentences, len(dataset))
    if num <= args.warmup:
        raise BenchmarkError(f"--warmup {args.warmup} leaves none of the {num} sentences to time")
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for spec, cfg in zip(specs, cfgs):
        decoder = load_row(cfg, spec)
        batch1 = measure_batch1(decoder, num, args.warmup, args.seed, spec.name)
        rows.append(sweep_row(spec, batch1, references[:num], args.out_dir))
        if use_cuda:
            del decoder
            torch.cuda.empty_cache()
    for row in rows:
        for role, key in (
            (TEACHER_GREEDY, "latency_speedup_vs_ar_greedy"),
            (TEACHER_BEAM, "latency_speedup_vs_ar_beam"),
        ):
            reference = next(r for r in rows if r["role"] == role)
            row[key] = reference["latency_ms_median"] / row["latency_ms_median"]
    meta = {
        **run_environment(args, use_cuda),
        "checkpoint": os.path.abspath(args.path),
        "teacher": os.path.abspath(args.teacher),
        "sentences": num,
        "warmup": args.warmup,
        "latency_sentences_timed": num - args.warmup,
        "generate_args": args.generate_args,
        "npd_args": args.npd_args,
        "seed": args.seed,
    }
    results = {"meta": meta, "rows": rows}
    with open(os.path.join(args.out_dir, JSON_FILE), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
    table = markdown(meta, rows)
    with open(os.path.join(args.out_dir, MARKDOWN_FILE), "w", encoding="utf-8") as f:
        f.write(table)
    plot(meta, rows, os.path.join(args.out_dir, PLOT_FILE))
    print(table)
    return results


def sweep_row(spec: RowSpec, batch1, references: List[str], out_dir: str) -> dict:
    """One row of ``npd_sweep.json`` (its hypotheses written to ``hyp.<slug>.txt``)."""
    with open(os.path.join(out_dir, f"hyp.{spec.slug}.txt"), "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in batch1.hyps)
    bleu, signature = corpus_bleu(batch1.hyps, references)
    return {
        "name": spec.name,
        "role": spec.role,
        "samples": int(spec.args[spec.args.index("--npd-samples") + 1]) if spec.role == SYSTEM else None,
        "args": spec.args,
        "bleu": bleu,
        "bleu_signature": signature,
        "latency_ms_median": statistics.median(batch1.latency_ms),
        "latency_ms_p90": percentile(batch1.latency_ms, 90),
        "latency_ms_mean": statistics.fmean(batch1.latency_ms),
        "timed_ids": batch1.ids,
        "timed_latency_ms": batch1.latency_ms,
        "decoder_calls_per_sentence": batch1.decoder_calls_per_sentence,
        "hyp_file": f"hyp.{spec.slug}.txt",
    }


def heading(meta: dict) -> str:
    """The plot's and the markdown's heading: what is plotted, then ``--title``."""
    return "Noisy parallel decoding: latency and BLEU against S" + (f" — {meta['title']}" if meta["title"] else "")


def markdown(meta: dict, rows: List[dict]) -> str:
    """The sweep as a markdown table with its header."""
    lines = [
        f"## {heading(meta)}",
        "",
        f"{meta['device']}, torch {meta['torch']}, {meta['precision']}; batch 1, {meta['sentences']} sentences "
        f"decoded (BLEU), the last {meta['latency_sentences_timed']} timed (after {meta['warmup']} of warm-up); "
        f"generate args {meta['generate_args']!r}.",
        "",
        "| row | S | BLEU | latency ms (median) | latency ms (p90) | latency ms (mean) | × vs greedy | decoder calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        calls = "–" if r["decoder_calls_per_sentence"] is None else f"{r['decoder_calls_per_sentence']:.2f}"
        lines.append(
            f"| {r['name']} | {r['samples'] or '–'} | {r['bleu']:.2f} | {r['latency_ms_median']:.1f} | "
            f"{r['latency_ms_p90']:.1f} | {r['latency_ms_mean']:.1f} | {r['latency_speedup_vs_ar_greedy']:.2f}× | "
            f"{calls} |"
        )
    return "\n".join(lines) + "\n"


def plot(meta: dict, rows: List[dict], path: str):
    """Median batch-1 latency (p90 shaded) and BLEU against S (log x), the teacher rows as horizontal lines."""
    plt = pyplot()
    npd = [r for r in rows if r["samples"] is not None]
    samples = [r["samples"] for r in npd]
    fig, (latency_ax, bleu_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    latency_ax.plot(samples, [r["latency_ms_median"] for r in npd], marker="o", label="NPD, median")
    latency_ax.fill_between(
        samples, [r["latency_ms_median"] for r in npd], [r["latency_ms_p90"] for r in npd], alpha=0.2, label="to p90"
    )
    bleu_ax.plot(samples, [r["bleu"] for r in npd], marker="o", label="NPD")
    for r, style in zip([r for r in rows if r["samples"] is None], ("--", ":")):
        latency_ax.axhline(r["latency_ms_median"], linestyle=style, color="0.4", label=r["name"])
        bleu_ax.axhline(r["bleu"], linestyle=style, color="0.4", label=r["name"])
    for ax, ylabel in ((latency_ax, "batch-1 latency (ms)"), (bleu_ax, "BLEU")):
        ax.set_xscale("log")
        ax.set_xticks(samples, [str(s) for s in samples])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("NPD samples S (log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    latency_ax.set_ylim(bottom=0)
    fig.suptitle(
        f"{heading(meta)}\n{meta['device']}, {meta['precision']}, batch 1, "
        f"{meta['latency_sentences_timed']} sentences timed",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def cli_main(argv: Optional[List[str]] = None):
    """Console entry point (``nat-npd-sweep``)."""
    run_cli(get_parser(), main, argv)


if __name__ == "__main__":
    cli_main()
