"""The benchmark's outputs: ``results.json``, ``results.md`` and the plots, from the rows and the run's header. Files
are named relative to the run's work directory (``--work-dir``); the plots import matplotlib when drawn."""

import argparse
import datetime
import json
import os
import shlex
import statistics
from collections import Counter, defaultdict
from typing import Callable, Dict, List, Optional

import fairseq
import torch

from ..cli.rep_mis import DEFAULT_WINDOW, repeated_ratio
from ..engine import (
    MAX_LAYOUT_SPREAD,
    STATE,
    WEIGHT_FIRST,
    cpu_model,
    describe_attention_backends,
    linear_layout_choice,
)
from ..version import __version__
from .analysis import ctranslate2_agreement, fastest_ctranslate2_greedy, pareto_front
from .paper_points import PAPER_POINTS
from .rows import CTRANSLATE2_ROLES, TEACHER_BEAM, TEACHER_GREEDY, BenchmarkError, Row, relative_path

PARETO_PLOT_FILE = "pareto.png"
LENGTH_PLOT_FILE = "by_length.png"
BATCH_PLOT_FILE = "by_batch_size.png"
# batch 1 timed on fewer sentences than this is no result: the report says so
MIN_LATENCY_SENTENCES = 30
NPD_PLOT_FILE = "npd.png"


def device_name(use_cuda: bool) -> str:
    """GPU name, or the CPU model and torch's thread count."""
    if use_cuda:
        return torch.cuda.get_device_name()
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"


def initial_environment() -> Dict[str, str]:
    """The environment the process started with (``/proc/self/environ``; ``os.environ`` where there is none): what
    the OpenMP runtimes read when they loaded, whatever was changed since."""
    if not os.path.exists("/proc/self/environ"):
        return dict(os.environ)
    with open("/proc/self/environ", "rb") as f:
        entries = f.read().decode(errors="replace").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def library_versions() -> Dict[str, Optional[str]]:
    """Versions of the decoding libraries (ctranslate2: None when not installed)."""
    try:
        import ctranslate2

        ct2 = ctranslate2.__version__
    except ImportError:
        ct2 = None
    return {"torch": torch.__version__, "fairseq": fairseq.__version__, "ctranslate2": ct2}


def distilled_targets_stats(path: Optional[str], work_dir: str) -> Optional[dict]:
    """Sentences and immediately repeated subwords (%) of the distilled training targets at ``path``."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return {
        "path": relative_path(path, work_dir),
        "sentences": len(lines),
        "repeated_subwords": repeated_ratio(lines, window=1),
    }


def length_policy(rows: List[Row]) -> dict:
    """The output length limit of most rows and the rows that differ from it."""
    common = Counter(row.length_limit for row in rows).most_common(1)[0][0]
    return {"limit": common, "except": {row.name: row.length_limit for row in rows if row.length_limit != common}}


def run_metadata(
    args: argparse.Namespace,
    use_cuda: bool,
    num_sentences: int,
    num_latency: int,
    rows: List[Row],
    length_buckets: List[dict],
    length_plot_rows: List[str],
) -> dict:
    """The header: what was measured (files relative to ``--work-dir``), where and how."""
    fastest = fastest_ctranslate2_greedy(rows)
    return {
        "title": args.title,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device_name(use_cuda),
        **library_versions(),
        "nat_plugins": __version__,
        "precision": "fp16" if args.fp16 else "fp32",
        "data_bin": relative_path(args.data_bin, args.work_dir),
        "gen_subset": args.gen_subset,
        "reference": relative_path(args.reference, args.work_dir),
        "num_sentences": num_sentences,
        "latency_sentences": num_latency,
        "warmup": args.warmup,
        "latency_sentences_timed": num_latency - args.warmup,
        "batch_size": args.batch_size,
        "teacher": relative_path(args.teacher, args.work_dir),
        "teacher_beam": args.teacher_beam,
        "post_process": args.post_process,
        "generate_args": args.generate_args,
        "length_limit": length_policy(rows),
        "length_buckets": length_buckets,  # analysis.bucket_counts
        "length_plot_rows": length_plot_rows,
        "seed": args.seed,
        "distilled_targets": distilled_targets_stats(args.distilled_targets, args.work_dir),
        "ctranslate2_fastest_greedy": fastest and {"latency": fastest[0].name, "throughput": fastest[1].name},
        "ctranslate2_agreement": ctranslate2_agreement(rows),
        # the layout of the plugin rows' CPU linear layers in this process (engine/cpu_linear.py)
        "attention_backends": describe_attention_backends(),
        "linear_layout": None if use_cuda or not STATE.model_shapes else linear_layout_choice().to_json(),
    }


def _fmt(value, digits=2, suffix=""):
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def number(digits: int) -> Callable[[Row, str], str]:
    """A table cell: the row's attribute with ``digits`` decimals."""
    return lambda row, attr: _fmt(getattr(row, attr), digits)


def ratio_cell(ratios: List[float], unsettled: bool = False) -> str:
    """Per-round ratios as their median and range, ``2.41× (2.30–2.52)``; ``?`` where the rounds leave them
    unsettled."""
    return f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}){'?' if unsettled else ''}"


def speedup(row: Row, attr: str) -> str:
    """A speedup cell (:func:`ratio_cell` of the ratios behind it); ``–`` where the run has no such reference."""
    ratios = row.speedup_rounds.get(attr)
    return ratio_cell(ratios) if ratios else "–"


def differs_from_greedy(row: Row, attr: str) -> str:
    """The exact check's cell: sentences that differ from the greedy teacher's output over every timed pass, ``0``,
    ``2 (near-ties)``, or in bold with the count that is no near-tie; ``–`` for a row not checked."""
    if row.exact_check is None:
        return "–"
    differ = sum(check["differ"] for check in row.exact_check.values())
    if not differ:
        return "0"
    real = row.real_divergences
    return f"{differ} (near-ties)" if not real else f"**{differ} ({real} not near-ties)**"


def markdown_table(rows: List[Row], teacher_beam: int) -> str:
    """The results as a markdown table (speedups against CTranslate2 only when its rows were measured, the exact
    check only when a row prints the teacher's greedy output)."""
    beam = f"beam {teacher_beam}"
    columns = [  # (title, Row attribute, cell)
        ("BLEU", "bleu", number(2)),
        (f"% of teacher {beam}", "bleu_pct_of_teacher", number(1)),
        ("≠ greedy", "exact_check", differs_from_greedy),
        ("latency ms (median)", "latency_ms_median", number(1)),
        ("latency ms (p90)", "latency_ms_p90", number(1)),
        ("latency ms (mean)", "latency_ms_mean", number(1)),
        (f"latency × vs {beam}", "latency_speedup_vs_ar_beam", speedup),
        ("latency × vs greedy", "latency_speedup_vs_ar_greedy", speedup),
        ("latency × vs greedy, plugin layout", "latency_speedup_vs_ar_greedy_plugin", speedup),
        ("latency × vs CTranslate2 greedy", "latency_speedup_vs_ct2_greedy", speedup),
        ("sent/s (batch)", "throughput_sent_per_s", number(1)),
        (f"throughput × vs {beam}", "throughput_speedup_vs_ar_beam", speedup),
        ("throughput × vs greedy", "throughput_speedup_vs_ar_greedy", speedup),
        ("throughput × vs greedy, plugin layout", "throughput_speedup_vs_ar_greedy_plugin", speedup),
        ("throughput × vs CTranslate2 greedy", "throughput_speedup_vs_ct2_greedy", speedup),
        ("decoder calls / sent", "decoder_calls_per_sentence", number(2)),
        ("ms / decoder call", "ms_per_decoder_call", number(2)),
        ("tokens / call", "tokens_per_call", number(2)),
        ("steps", "mean_steps", number(2)),
        ("tokens / step", "tokens_per_step", number(2)),
        ("ms / drafting call", "drafting_ms_per_call", number(2)),
        ("ms / verifier call", "verify_ms_per_call", number(2)),
        ("Rep %", "rep_ratio", number(2)),
        ("missing tokens %", "mis_ratio", number(2)),
        ("Rep Δ% vs greedy", "rep", number(2)),
        ("Mis Δ% vs greedy", "mis", number(2)),
    ]
    # references, checks and drafting times the run did not have
    for absent in ("_ct2_", "_plugin", "exact_check", "_ms_per_call"):
        if all(getattr(r, attr) is None for r in rows for _, attr, _ in columns if absent in attr):
            columns = [column for column in columns if absent not in column[1]]
    lines = [
        "| system | " + " | ".join(title for title, *_ in columns) + " | flag |",
        "|---|" + "---:|" * len(columns) + "---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([r.name] + [cell(r, attr) for _, attr, cell in columns] + [r.flag]) + " |")
    return "\n".join(lines)


def batch_size_table(rows: List[Row]) -> str:
    """Every row's speed at every timed batch size: emitted tokens/s, ms per sentence and × the greedy teacher (the
    median of the per-round ratios, their range across rounds; ? where the rounds leave it unsettled), and the cold
    pass's ms per sentence (each sentence's first decoding, before the rounds)."""
    sizes = [entry["batch_size"] for entry in rows[0].by_batch_size]
    lines = ["| system | " + " | ".join(f"batch {b}" for b in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for r in rows:
        cells = [
            f"{e['tokens_per_s']:.0f} tok/s, {e['ms_per_sentence']:.1f} ms/sent, "
            + ratio_cell(e["ratio_rounds"], e["unsettled"])
            + ("" if e.get("cold_ms_per_sentence") is None else f"; cold {e['cold_ms_per_sentence']:.1f} ms/sent")
            for e in r.by_batch_size
        ]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def length_table(meta: dict, rows: List[Row]) -> str:
    """BLEU and median batch-1 latency of every row by source length, the buckets' sizes in the header."""
    buckets = meta["length_buckets"]
    lines = [
        "| system | "
        + " | ".join(f"{b['bucket']} ({b['sentences']} sent., {b['timed_sentences']} timed)" for b in buckets)
        + " |",
        "|---|" + "---:|" * len(buckets),
    ]
    for r in rows:
        cells = [f"{_fmt(b['bleu'], 1)} / {_fmt(b['latency_ms_median'], 1)}" for b in r.by_length]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latency_is_result(meta: dict) -> bool:
    """Whether the run timed batch 1 on enough sentences (:data:`MIN_LATENCY_SENTENCES`) for its batch-1 speeds to be
    a result."""
    return meta["latency_sentences_timed"] >= MIN_LATENCY_SENTENCES


def latency_warning(meta: dict) -> List[str]:
    """The header line saying a run's batch-1 speeds are not a result, where they are not."""
    if latency_is_result(meta):
        return []
    return [
        f"- **batch-1 speeds are not a result**: {meta['latency_sentences_timed']} sentences timed, fewer than "
        f"{MIN_LATENCY_SENTENCES}"
    ]


def markdown_report(meta: dict, rows: List[Row], paired: Optional[List[dict]] = None, solo=None) -> str:
    """results.md: header with device/versions/data, the table (and the ``--solo`` tables,
    :class:`.solo.Solo`), the per-row decoding arguments and paired tests."""
    header = [
        f"# {meta['title']}",
        "",
        f"- device: {meta['device']}; torch {meta['torch']}, fairseq {meta['fairseq']}, ctranslate2 "
        f"{meta['ctranslate2'] or '(not installed)'}, nat_plugins {meta['nat_plugins']}; "
        f"precision {meta['precision']}; {meta['date']}",
        f"- data: `{meta['data_bin']}` split `{meta['gen_subset']}`, {meta['num_sentences']} sentences; "
        f"BLEU = sacreBLEU ({rows[0].bleu_signature}) vs `{meta['reference']}`",
        "- Rep % (Ran et al. 2020, eq. 8): repeated tokens, a word equal to any of the "
        f"{DEFAULT_WINDOW} before it, in % of the output's words; missing tokens %: reference words the output lacks, "
        "in % of the reference's; Rep/Mis Δ% vs greedy (eq. 7-10): their relative increments over the teacher's "
        "greedy row; words: sacreBLEU's 13a tokenization of the detokenized output (as `python -m "
        "nat_plugins.cli.rep_mis` counts them)",
        f"- latency: batch 1, **{meta['latency_sentences_timed']} sentences timed** (sentences "
        f"{meta['warmup'] + 1}-{meta['latency_sentences']} of the split; the first {meta['warmup']} are warm-up), "
        f"median / p90 / mean per sentence; throughput: batches of {meta['batch_size']} sentences, decode time only",
        *latency_warning(meta),
        timing_line(meta),
        f"- attention: every row's `F.scaled_dot_product_attention` with the backends {meta['attention_backends']} "
        "(nat_plugins/engine/attention.py)",
        *budget_lines(meta),
        exact_line(meta),
        *twin_check_lines(rows),
        layout_line(meta),
        *graph_failure_lines(rows),
        "- decoder calls / sent: decoder passes per timed batch-1 sentence (runs of a decoder layer stack, "
        "however entered: NAD-AD's NAD pass and NPD's teacher rescoring pass included; ensemble members count once); "
        "ms / decoder call: mean batch-1 latency / decoder calls per sentence (the cost of one greedy step or "
        "one verify-accept call, encoder pass included); "
        "tokens / call: emitted tokens (EOS included) per pass; steps: the generator's own `hypo['steps']` "
        "(fairseq's IterativeRefinementGenerator counts them from 0); ms / drafting call (CPU, blockwise and "
        "speculative rows): batch-1 host time in the drafting calls (blockwise's heads, the speculative drafter) per "
        "drafting call; ms / verifier call: the rest of the batch-1 time (the verifier's calls, the encoder pass and "
        "the loop) per verifier call (`steps`)",
        f"- teacher: `{meta['teacher']}`; arguments of every row: `{meta['generate_args'] or '(none)'}`",
        f"- output length limit: max_len = {meta['length_limit']['limit']} (|x|: source subwords incl. EOS; "
        "fairseq's --max-len-a/--max-len-b from the arguments of every row, default 0·|x| + 200) for every row"
        + "".join(f"; except {name}: {limit}" for name, limit in meta["length_limit"]["except"].items()),
    ]
    kd = meta.get("distilled_targets")
    if kd:
        header.append(
            f"- distilled training targets: `{kd['path']}`, {kd['sentences']} sentences, "
            f"{kd['repeated_subwords']:.2f}% of the subwords repeat the one before"
        )
    header += [
        "",
        markdown_table(rows, meta["teacher_beam"]),
        "",
        *([solo.markdown(rows), ""] if solo else []),
        "Speed against batch size (batch 1: the latency sentences; larger: the whole split), medians over rounds; × "
        "fairseq's greedy teacher: the median of the paired per-round ratios (their range across rounds; ?: "
        "unsettled); cold: the row's first decoding of the same sentences, before the rounds (a cost paid once per "
        "new shape shows there; one that rows of the same shapes share falls on the first of them, in a random "
        f"order); plot: `{BATCH_PLOT_FILE}`",
        "",
        batch_size_table(rows),
        "",
        "By source length (subwords, EOS excluded): BLEU (sacreBLEU over the bucket's sentences) / median batch-1 "
        f"latency in ms (over its timed sentences); plot: `{LENGTH_PLOT_FILE}`",
        "",
        length_table(meta, rows),
        "",
        "| system | checkpoint | fairseq-generate arguments |",
        "|---|---|---|",
    ]
    header += [f"| {r.name} | `{r.spec.checkpoint}` | `{shlex.join(r.spec.args)}` |" for r in rows]
    if paired:
        header += [
            "",
            f"Paired bootstrap resampling (sacreBLEU, {paired[0]['signature']}): p = share of resamples whose "
            "centred BLEU difference exceeds the observed Δ (small p: SYSTEM's gain is unlikely to be chance; "
            "sacreBLEU's rule also gives identical outputs a small p, so read it with Δ); ± = 95% confidence "
            "interval of the resampled mean.",
            "",
            "| baseline | system | BLEU baseline | BLEU system | Δ | p-value |",
            "|---|---|---:|---:|---:|---:|",
        ]
        header += [
            f"| {t['baseline']} | {t['system']} | {t['baseline_bleu']:.2f} (± {t['baseline_ci']:.2f}) | "
            f"{t['system_bleu']:.2f} (± {t['system_ci']:.2f}) | {t['delta']:+.2f} | {t['p_value']:.4f} |"
            for t in paired
        ]
    return "\n".join(header) + "\n"


def timing_line(meta: dict) -> str:
    """The header line of the timing protocol: rounds, threads, OpenMP policy, load, the anchor's drift and the
    CTranslate2 checks."""
    t = meta["timing"]
    drift = ", ".join(f"batch {size}: {100 * value:+.1f}%" for size, value in t["anchor_drift"].items())
    ct2 = t["ctranslate2_threads"]
    line = (
        f"- timing: {t['rounds']} rounds round-robin over shared blocks (rows in a random order per round, seeded "
        f"with --seed {meta['seed']}; the orders in results.json), source ids in, best hypothesis ids out; every × is "
        "the median over rounds of the paired ratio (the reference row's seconds on the round's block / the row's), "
        f"its range over the rounds in brackets; torch threads {t['threads']}"
        + (f", CTranslate2 intra_threads {ct2['intra']} inter_threads {ct2['inter']}" if ct2 else "")
        + f"; OMP_WAIT_POLICY {t['omp_wait_policy'] or '(unset)'}; load average "
        f"{t['load_average_start'][0]:.2f} at start, {t['load_average_end'][0]:.2f} at end; drift of fairseq greedy "
        f"(block 0 re-timed at the end): {drift}; flag: a ratio to fairseq greedy no further from 1 than its spread "
        "across rounds (no win)"
    )
    fastest, agreement = meta.get("ctranslate2_fastest_greedy"), meta.get("ctranslate2_agreement")
    if fastest:
        line += f"; × CTranslate2 greedy: against {fastest['latency']} (batch 1), {fastest['throughput']} (batched)"
    if agreement:
        line += (
            f"; {agreement['row']} differs from fairseq greedy on {agreement['differing_sentences']} of "
            f"{agreement['sentences']} sentences"
        )
    return line


def budget_lines(meta: dict) -> List[str]:
    """With ``--time-budget``: the header line saying what the budget left out (rows, sentences, rounds, sizes)."""
    budget = meta.get("time_budget")
    if not budget:
        return []
    parts = [
        f"- time budget {budget['seconds']:.0f} s (spent {budget['spent']:.0f} s): batch 1 timed on "
        f"{meta['latency_sentences_timed']} of the {budget['latency_sentences_available']} latency sentences"
    ]
    cut = {size: n for size, n in budget["rounds_cut"].items() if n}
    if cut:
        parts.append("rounds not timed: " + ", ".join(f"batch {size}: {n}" for size, n in cut.items()))
    if budget["batch_sizes_not_timed"]:
        parts.append("batch sizes not timed: " + ", ".join(map(str, budget["batch_sizes_not_timed"])))
    left_out = budget["rows_left_out"]
    parts.append("rows left out (not decoded): " + ", ".join(left_out) if left_out else "every row decoded")
    return ["; ".join(parts)]


def graph_failure_lines(rows: List[Row]) -> List[str]:
    """A header line per row whose static-step CUDA graphs could not all be captured (those call shapes ran eagerly:
    the same tokens, not the graphs' speed), saying why."""
    return [
        f"- **{r.name}: {sum(r.graph_capture_failures.values())} call shapes ran without CUDA graphs** (their "
        "capture failed; the same output, eager speed): "
        + "; ".join(f"{reason} ({count}×)" for reason, count in r.graph_capture_failures.items())
        for r in rows
        if r.graph_capture_failures
    ]


def layout_line(meta: dict) -> str:
    """The header line of the CPU linear layout of the plugin rows (``meta["linear_layout"]``, absent on a GPU)."""
    chosen = meta.get("linear_layout")
    if chosen is None:
        return "- CPU linear layout: not used (no plugin layer decoded on the CPU)"
    how = {
        "override": "forced by NAT_LINEAR_LAYOUT",
        "measured": "measured in this run",
        "cache": f"measured by an earlier run on this machine (`{chosen['cache_file']}`)",
    }[chosen["source"]]
    times = (
        f": one pass of the models' products {chosen['weight_first_ms']:.2f} ms in W·xᵀ, {chosen['torch_ms']:.2f} ms "
        "in F.linear"
        if chosen["torch_ms"] is not None
        else ""
    )
    if (chosen.get("spread") or 0) > MAX_LAYOUT_SPREAD:
        times += f" (fastest passes; they varied up to {chosen['spread']:.1f}×, so the choice was not cached)"
    return (
        f"- CPU linear layout of the plugin rows and *AR teacher, greedy (plugin layout)*: **{chosen['layout']}** "
        f"({'W·xᵀ' if chosen['layout'] == WEIGHT_FIRST else 'F.linear, x·Wᵀ'}) at {chosen['threads']} "
        f"thread{'s' if chosen['threads'] > 1 else ''}, {how}{times} (engine/cpu_linear.py)"
    )


def exact_line(meta: dict) -> str:
    """The header line of the exact check: which rows, against what, and when a difference is a near-tie."""
    return (
        "- ≠ greedy: the rows that print the teacher's greedy output (its greedy search through another layout, exact "
        "blockwise and speculative decoding, greedy steps only) against fairseq's greedy teacher row, token for token "
        "in every timed pass (batch 1 and every batch size): sentences that differ, summed over the passes (per pass "
        "in results.json); a near-tie: at the first differing token the teacher's log-probabilities of the two tokens "
        f"given the common prefix differ by less than {meta['exact_check']['near_tie_tolerance']:g} (floating-point "
        "rounding); a row is exact when every difference is a near-tie, and flagged `≠ greedy` where one is not"
    )


def twin_check_lines(rows: List[Row]) -> List[str]:
    """A line per row checked against another row's tokens (the NAT through ONNX Runtime float32 against its PyTorch
    row, ``twin_check``): the passes and how many sentences differed, near-ties among them."""
    lines = []
    for row in rows:
        if row.twin_check is None:
            continue
        passes = row.twin_check["passes"]
        differ = sum(check["differ"] for check in passes.values())
        near = sum(check["near_ties"] for check in passes.values())
        verdict = (
            "the same tokens" if differ == near else f"**{differ - near} sentences differ by more than a near-tie**"
        )
        lines.append(
            f"- {row.name}: against *{row.twin_check['reference']}*, token for token in every timed pass "
            f"({', '.join(passes)}): {verdict} ({differ} differ, {near} of them near-ties: the PyTorch pass's top-2 "
            "gap where they part, a fertility's or a token's, below the tolerance above)"
        )
    return lines


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend; a :class:`BenchmarkError` that says what to install when
    matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as err:
        raise BenchmarkError(
            "the benchmark's plots need matplotlib: pip install 'nat-plugins[plot]' (or matplotlib), or pass "
            "--no-plots for the tables alone"
        ) from err

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# label offsets (points) tried in turn: right/left of the marker, then further above/below
LABEL_OFFSETS = [(dx, dy) for dy in (3, -10, 12, -19, 21, -28) for dx in (5, -5)]


def place_labels(ax, labels: List[tuple]):
    """Write ``(x, y, text, style)`` labels next to their points, each at the first offset where it overlaps no
    label placed before it and stays inside the axes (else the first offset)."""
    renderer = ax.figure.canvas.get_renderer()
    legend = ax.get_legend()
    inside, placed = ax.get_window_extent(renderer), [legend.get_window_extent(renderer)] if legend else []
    for x, y, text, style in labels:
        for attempt, (dx, dy) in enumerate(LABEL_OFFSETS + [LABEL_OFFSETS[0]]):
            artist = ax.annotate(
                text, (x, y), xytext=(dx, dy), textcoords="offset points", ha="left" if dx > 0 else "right", **style
            )
            box = artist.get_window_extent(renderer)
            fits = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            if attempt == len(LABEL_OFFSETS) or fits and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            artist.remove()


def plot_pareto(meta: dict, rows: List[Row], path: str):
    """BLEU as % of the teacher beam row's against batch-1 latency speedup over it (log x): every row a labelled
    point, this run's Pareto front dashed, the papers' claims (:mod:`.paper_points`, relative to their own AR
    baselines) as hollow grey markers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 6))
    beam = f"AR beam {meta['teacher_beam']}"
    shown = [r for r in rows if r.bleu_pct_of_teacher is not None]  # none if the teacher scored 0 BLEU
    ax.scatter(
        [p.speedup for p in PAPER_POINTS],
        [p.bleu_pct for p in PAPER_POINTS],
        s=40,
        facecolors="none",
        edgecolors="0.55",
        label="paper (% of its own AR baseline, its speedup; WMT14 en-de)",
    )
    points = [(r.latency_speedup_vs_ar_beam, r.bleu_pct_of_teacher) for r in shown]
    front = [points[i] for i in sorted(pareto_front(points), key=lambda i: points[i][0])]
    if len(front) > 1:
        ax.plot(*zip(*front), linestyle="--", color="tab:blue", alpha=0.5, linewidth=1, label="this run's Pareto front")
    ax.scatter([x for x, _ in points], [y for _, y in points], s=36, color="tab:blue", zorder=3, label="this run")
    ax.axhline(100, color="0.8", linewidth=0.8)
    ax.axvline(1, color="0.8", linewidth=0.8)  # the teacher beam row
    ax.set_xscale("log")
    ax.margins(x=0.12, y=0.08)
    low, high = ax.get_xlim()
    ax.set_xticks([t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64) if low <= t <= high])
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:g}×"))
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel(f"batch-1 latency speedup over {beam} (log scale)")
    ax.set_ylabel(f"BLEU as % of {beam}")
    ax.set_title(f"{meta['title']}\n{meta['device']}, {meta['precision']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=7, frameon=False)
    fig.tight_layout()
    paper_style = {"fontsize": 6, "color": "0.5"}
    place_labels(
        ax,
        [(x, y, r.name, {"fontsize": 7}) for r, (x, y) in zip(shown, points)]
        + [(p.speedup, p.bleu_pct, f"paper: {p.label}", paper_style) for p in PAPER_POINTS],
    )
    fig.savefig(path, dpi=150)
    plt.close(fig)


def plot_by_length(meta: dict, rows: List[Row], path: str):
    """BLEU and median batch-1 latency by source-length bucket of the rows ``meta["length_plot_rows"]``, one line
    per row (Ran et al. 2020, Figure 2; Gu et al. 2018, Figure 7)."""
    plt = pyplot()
    shown = [r for r in rows if r.name in meta["length_plot_rows"]]
    labels = [f"{b['bucket']}\n({b['sentences']} / {b['timed_sentences']})" for b in meta["length_buckets"]]
    fig, (bleu_ax, latency_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    markers = "osD^v<>Pp*hX"
    for i, r in enumerate(shown):
        style = dict(
            marker=markers[i % len(markers)], color=plt.cm.tab20(i % 20), label=r.name, linewidth=1.2, markersize=5
        )
        xs = range(len(labels))
        bleu_ax.plot(xs, [float("nan") if b["bleu"] is None else b["bleu"] for b in r.by_length], **style)
        latency_ax.plot(
            xs,
            [float("nan") if b["latency_ms_median"] is None else b["latency_ms_median"] for b in r.by_length],
            **style,
        )
    for ax, ylabel in ((bleu_ax, "BLEU (sacreBLEU over the bucket)"), (latency_ax, "median batch-1 latency (ms)")):
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_xlabel("source length in subwords (sentences / timed sentences)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    latency_ax.set_ylim(bottom=0)
    fig.suptitle(f"{meta['title']}: by source length\n{meta['device']}, {meta['precision']}", fontsize=9)
    fig.legend(
        *bleu_ax.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.83, 0.5), fontsize=7, frameon=False
    )
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    fig.savefig(path, dpi=150)
    plt.close(fig)


def npd_groups(rows: List[Row]) -> Dict[str, List[Row]]:
    """The noisy-parallel-decoding rows of every checkpoint that has rows of two or more S, by S."""
    groups = defaultdict(list)
    for row in rows:
        if row.npd_samples is not None:
            groups[row.spec.checkpoint].append(row)
    return {
        checkpoint: sorted(group, key=lambda row: row.npd_samples)
        for checkpoint, group in groups.items()
        if len({row.npd_samples for row in group}) > 1
    }


def plot_npd(meta: dict, rows: List[Row], path: str):
    """Noisy parallel decoding against its number of samples S (Gu et al. 2018, Figure 7): median batch-1 latency
    (shaded to p90) and BLEU of every checkpoint's NPD rows (log x), the teacher's rows as horizontal lines."""
    plt = pyplot()
    groups = npd_groups(rows)
    fig, (latency_ax, bleu_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    for checkpoint, group in groups.items():
        label = "NPD" if len(groups) == 1 else f"NPD, {checkpoint}"
        samples = [row.npd_samples for row in group]
        medians = [row.latency_ms_median for row in group]
        latency_ax.plot(samples, medians, marker="o", label=f"{label}, median")
        latency_ax.fill_between(samples, medians, [row.latency_ms_p90 for row in group], alpha=0.2, label="to p90")
        bleu_ax.plot(samples, [row.bleu for row in group], marker="o", label=label)
    teacher = [row for row in rows if row.role in (TEACHER_BEAM, TEACHER_GREEDY)]
    for row, style in zip(teacher, ("--", ":")):
        latency_ax.axhline(row.latency_ms_median, linestyle=style, color="0.4", label=row.name)
        bleu_ax.axhline(row.bleu, linestyle=style, color="0.4", label=row.name)
    ticks = sorted({row.npd_samples for group in groups.values() for row in group})
    for ax, ylabel in ((latency_ax, "batch-1 latency (ms)"), (bleu_ax, "BLEU")):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [str(s) for s in ticks])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("NPD samples S (log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    latency_ax.set_ylim(bottom=0)
    fig.suptitle(
        f"{meta['title']}: noisy parallel decoding against S\n{meta['device']}, {meta['precision']}, batch 1, "
        f"{meta['latency_sentences_timed']} sentences timed",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def plot_by_batch_size(meta: dict, rows: List[Row], path: str):
    """× fairseq's greedy teacher against batch size (log x), one line per row, CTranslate2 rows dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    markers = "osD^v<>Pp*hX"
    for i, r in enumerate(rows):
        sizes = [e["batch_size"] for e in r.by_batch_size]
        style = "--" if r.role in CTRANSLATE2_ROLES else "-"
        ax.plot(
            sizes,
            [e["speedup_vs_ar_greedy"] for e in r.by_batch_size],
            linestyle=style,
            marker=markers[i % len(markers)],
            color=plt.cm.tab20(i % 20),
            label=r.name,
        )
    ax.axhline(1, color="0.6", linewidth=0.8)
    ax.set_xscale("log", base=2)
    sizes = [e["batch_size"] for e in rows[0].by_batch_size]
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("batch size (sentences)")
    ax.set_ylabel("× fairseq greedy (median of paired per-round ratios)")
    ax.set_title(f"{meta['title']}: speed against batch size\n{meta['device']}, {meta['precision']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def write_report(out_dir: str, meta: dict, rows: List[Row], paired: List[dict], plots: bool = True, solo=None) -> dict:
    """Write ``results.json``, ``results.md`` and (``plots``) the plots, with the ``--solo`` pass where ``solo`` (a
    :class:`.solo.Solo`) has it; returns the ``results.json`` content."""
    meta["latency_is_result"] = latency_is_result(meta)
    results = {"meta": meta, "rows": [row.to_json() for row in rows], "paired_tests": paired}
    if solo:
        solo.add_to(results)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown_report(meta, rows, paired, solo))
    if plots:
        plot_pareto(meta, rows, os.path.join(out_dir, PARETO_PLOT_FILE))
        plot_by_length(meta, rows, os.path.join(out_dir, LENGTH_PLOT_FILE))
        plot_by_batch_size(meta, rows, os.path.join(out_dir, BATCH_PLOT_FILE))
        if npd_groups(rows):
            plot_npd(meta, rows, os.path.join(out_dir, NPD_PLOT_FILE))
    return results
