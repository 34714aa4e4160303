"""Tests of the benchmark harness (nat_plugins/bench/benchmark.py and nat_plugins/bench/).

End to end on the session's tiny teacher (toy sN -> tN data, 40 test sentences), all in-process: the
teacher rows, a ``--system`` row that is the same teacher decoded greedily through ``--task translation`` and one of
fairseq's own CMLM (2 updates) decoded by its IterativeRefinementGenerator for exactly 5 passes.
"""

import json
import logging
import os
import sys

import numpy as np
import pytest
import sacrebleu
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from nat_plugins.bench import analysis, benchmark, measure, paper_points, progress, report, schedule
from nat_plugins.bench import rows as bench_rows
from nat_plugins.bench.rows import BenchmarkError
from nat_plugins.cli import rep_mis
from nat_plugins.cli.decoding import Generation
from nat_plugins.engine import static_cache, step_graphs
from nat_plugins.engine.config import STATE
from nat_recipes import catalogue

from .utils import TINY_TRANSFORMER, train_model

SYSTEM = "same teacher greedy=CHECKPOINT::--task translation --beam 1"
PAIRED = "AR teacher, greedy::same teacher greedy"
CMLM = "fairseq CMLM=CHECKPOINT::--task translation_lev --iter-decode-max-iter 4 --iter-decode-force-max-iter"
NUM_TEST = 40
NAMES = [
    "AR teacher, beam 4",
    "AR teacher, greedy",
    "AR teacher, greedy (plugin layout)",
    "fairseq CMLM",
    "same teacher greedy",
]
TINY_CMLM_ARGS = (
    ["--arch", "cmlm_transformer"]
    + TINY_TRANSFORMER[2:]
    + ["--task", "translation_lev", "--noise", "random_mask", "--criterion", "nat_loss", "--disable-validation"]
)


@pytest.fixture(scope="module")
def tiny_cmlm(dummy_data_bin, tmp_path_factory):
    """fairseq's own CMLM (fairseq.models.nat) after 2 updates."""
    return train_model(dummy_data_bin, str(tmp_path_factory.mktemp("cmlm")), TINY_CMLM_ARGS, max_update=2)


@pytest.fixture(scope="module")
def fixture(dummy_data_bin, dummy_raw, tiny_teacher, tiny_cmlm, tmp_path_factory):
    """One benchmark run: its arguments, output directory and returned results."""
    out_dir = str(tmp_path_factory.mktemp("bench"))
    reference = os.path.join(dummy_raw, "test.tgt")
    distilled = os.path.join(out_dir, "train.kd.tgt.txt")  # 5 subwords, one repeats the one before: 20%
    with open(distilled, "w", encoding="utf-8") as f:
        f.write("t1 t1 t2\nt3 t1\n")
    argv = [
        dummy_data_bin,
        "--teacher",
        tiny_teacher,
        "--reference",
        reference,
        "--out-dir",
        out_dir,
        "--cpu",
        "--post-process",
        "none",
        "--warmup",
        "2",
        "--batch-size",
        "12",
        "--length-buckets",
        "4,7",
        "--distilled-targets",
        distilled,
        "--work-dir",
        str(tmp_path_factory.getbasetemp()),
        "--paired-test",
        PAIRED,
        "--system",
        CMLM.replace("CHECKPOINT", tiny_cmlm),
        "--system",
        SYSTEM.replace("CHECKPOINT", tiny_teacher),
    ]
    results = benchmark.main(benchmark.get_parser().parse_args(argv))
    return {"teacher": tiny_teacher, "reference": reference, "out": out_dir, "argv": argv, "results": results}


def _args(fixture, **changes):
    """The fixture's benchmark arguments with some options replaced."""
    args = benchmark.get_parser().parse_args(fixture["argv"])
    for key, value in changes.items():
        setattr(args, key, value)
    return args


def test_outputs_written(fixture):
    names = {"results.md", "results.json", report.PARETO_PLOT_FILE, report.LENGTH_PLOT_FILE, report.BATCH_PLOT_FILE}
    names |= {f"hyp.{slug}.txt" for slug in ("ar-teacher-beam-4", "ar-teacher-greedy", "same-teacher-greedy")}
    for name in names:
        assert os.path.getsize(os.path.join(fixture["out"], name)) > 0, name
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    assert "AR teacher, beam 4" in markdown and "same teacher greedy" in markdown and "fp32" in markdown


def test_a_row_whose_cuda_graphs_could_not_be_captured_says_so(fixture, tmp_path, monkeypatch):
    """A capture of the static step's CUDA graphs that fails leaves those call shapes eager (the same output): the
    row decoded by the plugin's loop records why and how often, results.md says it; fairseq's rows have nothing.
    (The bank path and a failing capture on the CPU, as tests/test_step_graphs.py runs them.)"""

    def failing(run):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(step_graphs, "graphs_wanted", lambda reference: not torch.is_grad_enabled())
    monkeypatch.setattr(step_graphs, "capture", failing)
    monkeypatch.setattr(step_graphs, "EAGER_CALLS_BEFORE_CAPTURE", 0)
    monkeypatch.setattr(STATE, "capture_failures", {})
    args = _args(fixture, out_dir=str(tmp_path), no_plots=True, time_budget=0.01, optional_row=["fairseq CMLM"])
    rows = {row["name"]: row for row in benchmark.main(args)["rows"]}
    STATE.banks.clear()
    failures = rows["AR teacher, greedy (plugin layout)"]["graph_capture_failures"]
    ((reason, count),) = failures.items()
    assert reason == "RuntimeError: CUDA error: operation not permitted when stream is capturing" and count >= 1
    assert rows["AR teacher, greedy"]["graph_capture_failures"] is None
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert f"- **AR teacher, greedy (plugin layout): {count} call shapes ran without CUDA graphs** (" in markdown
    assert rows["AR teacher, greedy (plugin layout)"]["bleu"] == rows["AR teacher, greedy"]["bleu"]


def test_a_budget_too_small_for_every_row_decodes_the_required_ones_and_names_the_rest(fixture, tmp_path):
    """--time-budget used up before the plan: the teacher rows and the required row decode the batched pass and batch 1
    (one sentence, the first round's: it ends past the budget), the optional row is left out, never decoded, and
    results.md says so; progress.json, written as the run goes, ends finished with every decoded row's BLEU."""
    args = _args(fixture, out_dir=str(tmp_path), no_plots=True, time_budget=0.01, optional_row=["fairseq CMLM"])
    results = benchmark.main(args)
    assert [row["name"] for row in results["rows"]] == [name for name in NAMES if name != "fairseq CMLM"]
    budget = results["meta"]["time_budget"]
    assert budget["latency_sentences_planned"] == 3 and budget["latency_sentences_available"] == NUM_TEST - 2
    assert budget["rounds_cut"]["1"] == 2 and results["meta"]["latency_sentences_timed"] == 1
    assert budget["rows_left_out"] == ["fairseq CMLM"] and set(budget["estimates"]) == set(NAMES)
    assert not os.path.exists(tmp_path / "hyp.fairseq-cmlm.txt")  # never decoded
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "rows left out (not decoded): fairseq CMLM" in markdown
    assert "- **batch-1 speeds are not a result**: 1 sentences timed, fewer than 30" in markdown
    assert results["meta"]["latency_is_result"] is False
    progress = json.loads((tmp_path / "progress.json").read_text(encoding="utf-8"))
    assert progress["finished"] and set(progress["bleu"]) == set(NAMES) - {"fairseq CMLM"}
    assert progress["passes"]["1"]["rounds_done"] == 1 and progress["passes"]["12"]["rounds_done"] == 3
    greedy = {row["name"]: row for row in fixture["results"]["rows"]}["AR teacher, greedy"]["bleu"]
    assert progress["bleu"]["AR teacher, greedy"] == pytest.approx(greedy)
    for bad, message in ((dict(time_budget=0.0), "--time-budget"), (dict(optional_row=["x"]), "no row named 'x'")):
        with pytest.raises(BenchmarkError, match=message):
            benchmark.main(_args(fixture, out_dir=str(tmp_path), **{"time_budget": 1.0, **bad}))
    with pytest.raises(BenchmarkError, match="give a --time-budget"):
        benchmark.main(_args(fixture, out_dir=str(tmp_path), optional_row=["fairseq CMLM"]))


def test_json_rows_and_metadata(fixture):
    with open(os.path.join(fixture["out"], "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    assert [r["name"] for r in results["rows"]] == NAMES
    assert [r["role"] for r in results["rows"]] == ["teacher_beam", "teacher_greedy", "teacher_greedy_plugin"] + [
        "system"
    ] * 2
    expected = {
        "name",
        "slug",
        "role",
        "generator",
        "length_limit",
        "checkpoint",
        "args",
        "bleu",
        "bleu_signature",
        "hyp_file",
        "num_sentences",
        "throughput_sent_per_s",
        "throughput_round_rates",
        "latency_ratio_rounds",
        "throughput_ratio_rounds",
        "latency_ratio_spread",
        "throughput_ratio_spread",
        "latency_round_seconds",
        "speedup_rounds",
        "exact_check",
        "twin_check",
        "flag",
        "by_batch_size",
        "latency_speedup_vs_ar_greedy_plugin",
        "throughput_speedup_vs_ar_greedy_plugin",
        "latency_ms_median",
        "latency_ms_p90",
        "latency_ms_mean",
        "latency_sentences_timed",
        "timed_ids",
        "timed_latency_ms",
        "decoder_calls_per_sentence",
        "ms_per_decoder_call",
        "tokens_per_call",
        "mean_steps",
        "tokens_per_step",
        "npd_samples",
        "drafting_ms_per_call",
        "verify_ms_per_call",
        "graph_capture_failures",
        "latency_speedup_vs_ar_beam",
        "latency_speedup_vs_ar_greedy",
        "latency_speedup_vs_ct2_greedy",
        "throughput_speedup_vs_ar_beam",
        "throughput_speedup_vs_ar_greedy",
        "throughput_speedup_vs_ct2_greedy",
        "bleu_pct_of_teacher",
        "rep",
        "mis",
        "rep_ratio",
        "mis_ratio",
        "timed_src_lengths",
        "by_length",
    }
    for row in results["rows"]:
        assert set(row) == expected
        assert row["num_sentences"] == NUM_TEST and row["latency_sentences_timed"] == NUM_TEST - 2
        assert row["timed_ids"] == list(range(2, NUM_TEST)) and len(row["timed_latency_ms"]) == NUM_TEST - 2
        assert 0 < row["latency_ms_median"] <= row["latency_ms_p90"] <= max(row["timed_latency_ms"])
        assert row["latency_ms_p90"] == pytest.approx(np.percentile(row["timed_latency_ms"], 90))
        assert row["latency_ms_mean"] == pytest.approx(np.mean(row["timed_latency_ms"]))
        assert row["throughput_sent_per_s"] > 0 and row["decoder_calls_per_sentence"] >= 1
        assert row["ms_per_decoder_call"] == pytest.approx(row["latency_ms_mean"] / row["decoder_calls_per_sentence"])
    plugin = results["rows"][2]  # the plugin's greedy loop on the CPU: no drafting calls, its time per verifier call
    assert plugin["generator"] == "GreedyLoop" and plugin["drafting_ms_per_call"] is None
    assert plugin["verify_ms_per_call"] > 0 and all(row["verify_ms_per_call"] is None for row in results["rows"][3:])
    assert results["rows"][0]["latency_speedup_vs_ar_beam"] == pytest.approx(1.0)
    teacher_bleu = results["rows"][0]["bleu"]
    for row in results["rows"]:  # no --ctranslate2: nothing to compare with
        assert row["bleu_pct_of_teacher"] == pytest.approx(100 * row["bleu"] / teacher_bleu)
        assert row["latency_speedup_vs_ct2_greedy"] is None and row["throughput_speedup_vs_ct2_greedy"] is None
    assert results["rows"][1]["throughput_speedup_vs_ar_greedy"] == pytest.approx(1.0)
    for row in results["rows"]:  # 3 rounds at batch 1 and at --batch-size 12; the sizes of the sweep: 1 and 12
        assert len(row["latency_ratio_rounds"]) == len(row["throughput_ratio_rounds"]) == 3
        assert [e["batch_size"] for e in row["by_batch_size"]] == [1, 12]
        assert all(e["cold_ms_per_sentence"] > 0 for e in row["by_batch_size"])  # the cold pass, beside the rounds
        assert row["throughput_sent_per_s"] == pytest.approx(np.median(row["throughput_round_rates"]))
    assert results["rows"][1]["latency_ratio_rounds"] == [1.0] * 3 and results["rows"][1]["flag"] == ""
    meta = results["meta"]
    for key in ("device", "torch", "fairseq", "precision", "date", "num_sentences", "data_bin", "teacher"):
        assert meta[key], key
    timing = meta["timing"]
    assert timing["rounds"] == 3 and timing["batch_sizes"] == [1, 12] and timing["threads"] >= 1
    assert timing["cold_pass"] and meta["latency_is_result"]  # 38 sentences timed at batch 1
    assert meta["attention_backends"] == "flash,efficient,math (NAT_ATTENTION_BACKENDS)"
    assert set(timing["anchor_drift"]) == {"1", "12"} and len(timing["load_average_start"]) == 3
    assert timing["ctranslate2_threads"] is None and meta["ctranslate2_agreement"] is None
    assert meta["num_sentences"] == NUM_TEST and meta["precision"] == "fp32"
    assert meta["latency_sentences_timed"] == NUM_TEST - 2
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    assert f"**{NUM_TEST - 2} sentences timed** (sentences 3-{NUM_TEST} of the split" in markdown
    assert "| system | BLEU | % of teacher beam 4 | ≠ greedy | latency ms (median) | latency ms (p90) |" in markdown
    assert "CTranslate2" not in markdown
    assert "| system | batch 1 | batch 12 |" in markdown and "- timing: 3 rounds round-robin" in markdown
    assert "; cold " in markdown and "not a result" not in markdown
    attention_line = "- attention: every row's `F.scaled_dot_product_attention` with the backends flash,efficient,math"
    assert attention_line in markdown


def test_reports_name_files_relative_to_the_work_directory(fixture):
    """results.md and results.json name the data, teacher, references and checkpoints (also inside a row's
    arguments) relative to --work-dir, not by the machine's absolute paths."""
    work = fixture["argv"][fixture["argv"].index("--work-dir") + 1]
    for name in ("results.md", "results.json"):
        with open(os.path.join(fixture["out"], name), encoding="utf-8") as f:
            assert work not in f.read(), name
    meta, rows = fixture["results"]["meta"], fixture["results"]["rows"]
    assert meta["teacher"] == os.path.relpath(fixture["teacher"], work) == rows[-1]["checkpoint"]
    for path in (meta["teacher"], meta["data_bin"], meta["reference"], meta["distilled_targets"]["path"]):
        assert not os.path.isabs(path) and os.path.exists(os.path.join(work, path)), path
    ensemble = f"{work}/a.pt:{work}/ckpt/b.pt"
    shown = bench_rows.RowSpec("x", ensemble, ["--npd-teacher", fixture["teacher"], "--beam", "1"]).relative_to(work)
    assert shown.checkpoint == "a.pt:ckpt/b.pt"
    assert shown.args == ["--npd-teacher", meta["teacher"], "--beam", "1"]  # an existing file in the arguments


def test_plots_need_matplotlib_and_no_plots_writes_the_tables(fixture, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    out = tmp_path / "out"
    with pytest.raises(BenchmarkError, match=r"plots need matplotlib: pip install 'nat-plugins\[plot\]'.*--no-plots"):
        benchmark.main(_args(fixture, out_dir=str(out), system=[], paired_test=[]))
    assert not out.exists()  # refused before decoding anything
    benchmark.main(_args(fixture, out_dir=str(out), system=[], paired_test=[], no_plots=True, latency_sentences=4))
    written = sorted(p.name for p in out.iterdir() if not p.name.startswith("hyp."))
    assert written == ["progress.json", "results.json", "results.md"]


def test_npd_plot_of_rows_decoded_with_several_samples(tmp_path):
    """npd.png: drawn for a checkpoint whose NPD rows have two or more S (latency and BLEU against S)."""
    rows = [
        fixed_row("AR teacher, beam 4", bench_rows.TEACHER_BEAM, 30.0, 10.0, 1.0),
        fixed_row("AR teacher, greedy", bench_rows.TEACHER_GREEDY, 29.0, 8.0, 1.0),
    ]
    for samples in (10, 1, 5):
        rows.append(fixed_row(bench_rows.npd_name(samples), bench_rows.SYSTEM, 20.0 + samples, samples, 1.0))
        rows[-1].npd_samples = samples
    alone = fixed_row("other checkpoint's NPD", bench_rows.SYSTEM, 20.0, 1.0, 1.0)
    alone.spec.checkpoint, alone.npd_samples = "y.pt", 10
    groups = report.npd_groups(rows + [alone])
    assert list(groups) == ["x.pt"] and [row.npd_samples for row in groups["x.pt"]] == [1, 5, 10]
    meta = {"title": "t", "device": "CPU", "precision": "fp32", "latency_sentences_timed": 1}
    report.plot_npd(meta, rows, str(tmp_path / report.NPD_PLOT_FILE))
    assert (tmp_path / report.NPD_PLOT_FILE).stat().st_size > 0
    assert report.npd_groups(rows[:3]) == {}  # one S: no plot


def test_npd_rows_of_a_checkpoint():
    specs = bench_rows.npd_specs("nat.pt", "teacher.pt", "1,10")
    assert [(s.name, s.checkpoint) for s in specs] == [("NAT, NPD S=1", "nat.pt"), ("NAT, NPD S=10", "nat.pt")]
    assert (
        specs[1].args
        == bench_rows.npd_args(10, "teacher.pt")
        == [
            "--beam",
            "1",
            "--fertility-decoding",
            "npd",
            "--npd-samples",
            "10",
            "--npd-teacher",
            "teacher.pt",
        ]
    )
    assert bench_rows.parse_system_spec(specs[1].option()) == specs[1]  # --system reads it back
    for samples in ("0,5", "5,5", "ten", ""):
        with pytest.raises(BenchmarkError, match="--npd-samples"):
            bench_rows.npd_specs("nat.pt", "teacher.pt", samples)


def fixed_row(name, role, bleu, latency_ms, seconds):
    """A row of fixed measurements in one round: 4 sentences decoded in ``seconds``, one timed at batch 1 in
    ``latency_ms``."""
    return bench_rows.Row(
        bench_rows.RowSpec(name, "x.pt", role=role),
        ["h"] * 4,
        bleu,
        "sig",
        [4 / seconds],
        [0],
        [latency_ms],
        "SequenceGenerator",
        "0·|x| + 200",
        latency_round_seconds=[latency_ms / 1000],
    )


def test_percent_of_teacher_and_speedups_on_fixed_rows():
    rows = [
        fixed_row("system", bench_rows.SYSTEM, 20.0, 10.0, 1.0),
        fixed_row("beam", bench_rows.TEACHER_BEAM, 25.0, 80.0, 4.0),
        fixed_row("ct2 greedy", bench_rows.CT2_GREEDY, 24.0, 20.0, 0.5),
        fixed_row("greedy", bench_rows.TEACHER_GREEDY, 24.0, 40.0, 2.0),
    ]
    analysis.compare(rows)
    system, beam, ct2, greedy = rows  # found by role, not by position
    assert [row.bleu_pct_of_teacher for row in (system, beam, ct2)] == pytest.approx([80, 100, 96])
    assert (
        system.latency_speedup_vs_ar_beam,
        system.latency_speedup_vs_ar_greedy,
        system.latency_speedup_vs_ct2_greedy,
    ) == pytest.approx((8, 4, 2))
    assert (
        system.throughput_speedup_vs_ar_beam,
        system.throughput_speedup_vs_ar_greedy,
        system.throughput_speedup_vs_ct2_greedy,
    ) == pytest.approx((4, 2, 0.5))
    assert ct2.latency_speedup_vs_ct2_greedy == greedy.latency_speedup_vs_ar_greedy == 1
    table = report.markdown_table(rows, 4)
    assert "| latency × vs greedy | latency × vs CTranslate2 greedy | sent/s (batch) |" in table
    assert "| system | 20.00 | 80.0 | 10.0 |" in table
    assert "| 2.00× (2.00–2.00) | 4.0 | 4.00× (4.00–4.00) | 2.00× (2.00–2.00) | 0.50× (0.50–0.50) |" in table
    with pytest.raises(BenchmarkError, match="one row with role 'teacher_greedy', found 0"):
        analysis.compare(rows[:3])


def test_bleu_and_latency_by_source_length(fixture):
    """--length-buckets 4,7 on sources of 2-10 words: every row's BLEU over each bucket's sentences and median
    latency over its timed ones; the bucket sizes in the header."""
    with open(os.path.join(os.path.dirname(fixture["reference"]), "test.src"), encoding="utf-8") as f:
        lengths = [len(line.split()) for line in f]
    with open(fixture["reference"], encoding="utf-8") as f:
        references = f.read().splitlines()
    meta = fixture["results"]["meta"]
    buckets = [range(1, 5), range(5, 8), range(8, 100)]
    assert [b["bucket"] for b in meta["length_buckets"]] == ["1-4", "5-7", "8+"]
    assert [b["sentences"] for b in meta["length_buckets"]] == [sum(n in b for n in lengths) for b in buckets]
    assert [b["timed_sentences"] for b in meta["length_buckets"]] == [sum(n in b for n in lengths[2:]) for b in buckets]
    assert meta["length_plot_rows"] == NAMES  # default: every row but CTranslate2's
    for row in fixture["results"]["rows"]:
        hyps = open(os.path.join(fixture["out"], row["hyp_file"]), encoding="utf-8").read().splitlines()
        assert row["timed_src_lengths"] == [lengths[i] for i in row["timed_ids"]]
        for bucket, cell in zip(buckets, row["by_length"]):
            ids = [i for i, n in enumerate(lengths) if n in bucket]
            timed = [ms for n, ms in zip(row["timed_src_lengths"], row["timed_latency_ms"]) if n in bucket]
            assert cell["sentences"] == len(ids) and cell["timed_sentences"] == len(timed)
            assert cell["bleu"] == pytest.approx(
                sacrebleu.corpus_bleu([hyps[i] for i in ids], [[references[i] for i in ids]]).score
            )
            assert cell["latency_ms_median"] == pytest.approx(np.median(timed))
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    n = meta["length_buckets"][0]
    assert f"| system | 1-4 ({n['sentences']} sent., {n['timed_sentences']} timed) | 5-7 (" in markdown
    with pytest.raises(BenchmarkError, match="--length-plot-rows: no row named 'nosuch'"):
        benchmark.main(_args(fixture, length_plot_rows=["AR teacher, greedy", "nosuch"]))


def test_pareto_front_on_fixed_points():
    points = [(1.0, 100.0), (2.0, 95.0), (1.5, 90.0), (8.0, 60.0), (4.0, 95.0), (8.0, 50.0)]
    assert analysis.pareto_front(points) == [3, 4, 0]  # (1.5, 90) and (2, 95) are beaten by (4, 95)


def test_paper_points_are_relative_to_each_papers_baseline():
    by_label = {p.label: p for p in paper_points.PAPER_POINTS}
    assert by_label["NAT+FT"].bleu_pct == pytest.approx(100 * 17.69 / 23.45)
    assert by_label["SAT K=2"].bleu_pct == pytest.approx(100 * 26.09 / 27.11) and by_label["SAT K=2"].speedup == 2.07
    assert by_label["RecoverSAT K=10"].bleu_pct == pytest.approx(100 * 26.32 / 27.17)
    assert all(50 < p.bleu_pct <= 100 and p.speedup > 1 for p in paper_points.PAPER_POINTS)


def test_length_bucket_assignment():
    buckets = analysis.parse_length_buckets("10,20,30")
    assert [b.label for b in buckets] == ["1-10", "11-20", "21-30", "31+"]
    assert [analysis.bucket_of(n, buckets) for n in (0, 1, 10, 11, 20, 21, 30, 31, 500)] == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert [b.label for b in analysis.parse_length_buckets("5")] == ["1-5", "6+"]
    for bad in ("20,10", "10,10", "0,5", "ten", ""):
        with pytest.raises(BenchmarkError, match="--length-buckets"):
            analysis.parse_length_buckets(bad)
    counts = analysis.bucket_counts([3, 12, 40, 7, 15], [1, 2, 3], buckets)
    assert [(c["sentences"], c["timed_sentences"]) for c in counts] == [(2, 1), (2, 1), (0, 0), (1, 1)]


def test_by_length_of_fixed_rows():
    """Buckets without timed sentences have no latency; BLEU is sacreBLEU's over the bucket's sentences."""
    refs = ["a b c d", "e f g h", "i j k l m n o p q r s t"]
    row = bench_rows.Row(
        bench_rows.RowSpec("x", "x.pt"),
        ["a b c d", "e f x h", "i j k l m n o p q r s t"],
        0.0,
        "sig",
        1.0,
        [1],
        [7.0],
        "SequenceGenerator",
        "0·|x| + 200",
    )
    analysis.add_length_buckets([row], [2, 3, 12], refs, analysis.parse_length_buckets("10"))
    short, long = row.by_length
    assert (short["sentences"], short["timed_sentences"], short["latency_ms_median"]) == (2, 1, 7.0)
    assert short["bleu"] == pytest.approx(sacrebleu.corpus_bleu(row.hyps[:2], [refs[:2]]).score)
    assert (long["sentences"], long["timed_sentences"], long["latency_ms_median"]) == (1, 0, None)
    assert long["bleu"] == pytest.approx(100)
    assert row.timed_src_lengths == [3]


def test_latency_percentiles_on_a_known_list():
    assert bench_rows.percentile(list(range(1, 11)), 90) == pytest.approx(9.1)
    assert bench_rows.percentile([5.0], 90) == 5.0
    row = bench_rows.Row(
        bench_rows.RowSpec("x", "x.pt"),
        ["h"] * 4,
        0.0,
        "sig",
        [4.0],
        [0, 1, 2, 3],
        [4.0, 1.0, 3.0, 2.0],
        "SequenceGenerator",
        "0·|x| + 200",
    )
    assert (row.latency_ms_median, row.latency_ms_p90, row.latency_ms_mean) == pytest.approx((2.5, 3.7, 2.5))
    assert row.ms_per_decoder_call is None  # decoder passes not observed (CTranslate2)
    row.decoder_calls_per_sentence = 5.0
    assert row.ms_per_decoder_call == pytest.approx(0.5)  # 2.5 ms per sentence over 5 calls
    with pytest.raises(ValueError, match="percentile of no values"):
        bench_rows.percentile([], 90)


def test_distilled_targets_repetition_is_reported(fixture, tmp_path):
    kd = fixture["results"]["meta"]["distilled_targets"]
    assert kd["sentences"] == 2 and kd["repeated_subwords"] == pytest.approx(20.0)
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    assert "2 sentences, 20.00% of the subwords repeat the one before" in markdown
    with pytest.raises(BenchmarkError, match="--distilled-targets .* does not exist"):
        benchmark.main(_args(fixture, distilled_targets=str(tmp_path / "none.txt")))


def test_rep_mis_of_every_row(fixture):
    """Rep/Mis (Ran et al. eq. 7-10): each row's repeated/missing-token ratios on its 13a-tokenized output and the
    references, and their relative increments over the greedy teacher row (0 for that row and its copy)."""
    tokenize = Tokenizer13a()
    with open(fixture["reference"], encoding="utf-8") as f:
        references = [tokenize(line) for line in f.read().splitlines()]
    rows = fixture["results"]["rows"]
    greedy = rows[1]
    assert greedy["rep_ratio"] > 0 and greedy["mis_ratio"] > 0  # the toy teacher is not perfect
    for row in rows:
        with open(os.path.join(fixture["out"], row["hyp_file"]), encoding="utf-8") as f:
            hyps = [tokenize(line) for line in f.read().splitlines()]
        assert row["rep_ratio"] == pytest.approx(rep_mis.repeated_ratio(hyps))
        assert row["mis_ratio"] == pytest.approx(rep_mis.missing_ratio(hyps, references))
        assert row["rep"] == pytest.approx(100 * (row["rep_ratio"] / greedy["rep_ratio"] - 1))
        assert row["mis"] == pytest.approx(100 * (row["mis_ratio"] / greedy["mis_ratio"] - 1))
    same = next(row for row in rows if row["name"] == "same teacher greedy")
    assert greedy["rep"] == greedy["mis"] == same["rep"] == same["mis"] == 0.0
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    assert "| Rep % | missing tokens % | Rep Δ% vs greedy | Mis Δ% vs greedy |" in markdown and "eq. 7-10" in markdown
    assert "words: sacreBLEU's 13a tokenization" in markdown


def test_system_row_matches_greedy_teacher(fixture):
    beam, greedy, plugin, _cmlm, system = fixture["results"]["rows"]

    def read(row):
        return open(os.path.join(fixture["out"], row["hyp_file"]), encoding="utf-8").read()

    assert read(system) == read(greedy) == read(plugin)  # the plugin's linear layout decodes the same
    assert system["decoder_calls_per_sentence"] == greedy["decoder_calls_per_sentence"]
    # greedy AR emits exactly one token (the last one EOS) per decoder call
    assert greedy["tokens_per_call"] == pytest.approx(1.0)
    assert beam["decoder_calls_per_sentence"] >= 1


def test_decoder_passes_of_fairseqs_iterative_refinement(fixture):
    """fairseq's CMLM row: IterativeRefinementGenerator forced to 5 passes (its hypo["steps"] counts from 0);
    the AR rows by fairseq's SequenceGenerator report no steps, the plugin's greedy loop one per decoder call."""
    rows = {row["name"]: row for row in fixture["results"]["rows"]}
    cmlm = rows["fairseq CMLM"]
    assert cmlm["decoder_calls_per_sentence"] == 5 and cmlm["mean_steps"] == 4
    assert cmlm["tokens_per_call"] > 0 and cmlm["generator"] == "IterativeRefinementGenerator"
    plugin = rows["AR teacher, greedy (plugin layout)"]
    assert plugin["generator"] == "GreedyLoop" and plugin["mean_steps"] == plugin["decoder_calls_per_sentence"]
    assert all(rows[name]["mean_steps"] is None for name in NAMES if name not in ("fairseq CMLM", plugin["name"]))


def test_length_limit_policy_is_stated(fixture):
    """fairseq's default limit for every row but the CMLM, whose generator ignores it."""
    assert fixture["results"]["meta"]["length_limit"] == {
        "limit": "0·|x| + 200",
        "except": {"fairseq CMLM": "the model's predicted length (IterativeRefinementGenerator ignores --max-len-a/b)"},
    }
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    assert "- output length limit: max_len = 0·|x| + 200 (|x|: source subwords incl. EOS;" in markdown
    assert "for every row; except fairseq CMLM: the model's predicted length" in markdown


def build_generation(data_bin, task_args, arch_args, gen_args):
    """An untrained tiny model built through ``task_args``'s task and its generator for ``gen_args``."""
    train = options.parse_args_and_arch(options.get_training_parser(), [data_bin] + task_args + arch_args + TINY)
    task = tasks.setup_task(train)
    task.load_dataset("test")
    torch.manual_seed(0)
    model = task.build_model(train, from_checkpoint=True).eval()  # as decoding rebuilds it: no side files needed
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_generation_parser(), [data_bin, "--cpu"] + task_args + gen_args)
    )
    return Generation(cfg, task, [model], task.build_generator([model], cfg.generation), use_cuda=False)


TINY = TINY_TRANSFORMER[2:]
NAT_TASK = ["--task", "translation_nat"]
LEV_TASK = ["--task", "translation_lev"]
SHORT = ["--beam", "1", "--max-len-b", "6"]


def reported_steps(hypo):  # the plugin generators report their decoder passes
    return hypo["steps"]


@pytest.mark.parametrize(
    "task_args, arch_args, gen_args, expected",
    [
        (
            NAT_TASK,
            ["--arch", "transformer"],
            SHORT,
            lambda hypo: len(hypo["tokens"]),
        ),  # SequenceGenerator: 1 per token
        (NAT_TASK, ["--arch", "sat_transformer", "--group-size", "2"], SHORT, reported_steps),
        (NAT_TASK, ["--arch", "recover_sat", "--num-segments", "2"], SHORT, reported_steps),
        (NAT_TASK, ["--arch", "blockwise_transformer", "--block-size", "3"], SHORT, reported_steps),
        (
            NAT_TASK + ["--int8-drafts"],
            ["--arch", "blockwise_transformer", "--block-size", "3", "--identity-first-head"],
            SHORT,
            reported_steps,
        ),
        (
            NAT_TASK + ["--spec-drafter-teacher", "TEACHER", "--int8-drafts"],
            ["--arch", "spec_drafter", "--draft-size", "2"],
            SHORT,
            lambda hypo: hypo["steps"] + hypo["drafter_steps"],
        ),  # teacher calls + calls of the drafter's int8 decoder copy
        (NAT_TASK, ["--arch", "fertility_nat"], SHORT, lambda hypo: 1),
        (
            NAT_TASK + ["--fertility-decoding", "npd", "--npd-samples", "3", "--npd-teacher", "TEACHER"],
            ["--arch", "fertility_nat"],
            SHORT,
            lambda hypo: 2,
        ),  # the NAT's pass + the teacher's rescoring pass
        (NAT_TASK, ["--arch", "nad_ad_transformer"], SHORT, lambda hypo: 1 + len(hypo["tokens"])),  # NAD once, then AD
        (
            LEV_TASK,
            ["--arch", "cmlm_transformer"],
            ["--iter-decode-max-iter", "4", "--iter-decode-force-max-iter"],
            lambda hypo: 5,
        ),
        (LEV_TASK, ["--arch", "cmlm_transformer"], ["--iter-decode-max-iter", "9"], lambda hypo: hypo["steps"] + 1),
        (LEV_TASK, ["--arch", "nonautoregressive_transformer"], ["--iter-decode-max-iter", "0"], lambda hypo: 1),
    ],
    ids=[
        "SequenceGenerator",
        "SAT",
        "RecoverSAT",
        "blockwise",
        "blockwise-int8",
        "speculative-int8",
        "NAT",
        "NAT-NPD",
        "NAD-AD",
        "CMLM-forced",
        "CMLM-adaptive",
        "fairseq-NAT",
    ],
)
def test_decoder_passes_of_every_generator(
    dummy_data_bin, tiny_teacher, task_args, arch_args, gen_args, expected, monkeypatch
):
    """Batch-1 decoder passes counted by the benchmark == what each generator does (plugin generators report it as
    hypo["steps"]; IterativeRefinementGenerator's steps count from 0), traced calls (every width traced from its first
    call here) included."""
    monkeypatch.setattr(static_cache, "EAGER_CALLS_BEFORE_TRACING", 0)
    task_args = [tiny_teacher if a == "TEACHER" else a for a in task_args]
    generation = build_generation(dummy_data_bin, task_args, arch_args, gen_args)
    dataset = generation.dataset
    counter = measure.DecoderPassCounter(
        generation.models, measure.auxiliary_models(generation.generator, generation.models)
    )
    with counter:
        for index in range(4):
            counter.reset()
            hypo = generation.decode(dataset.collater([dataset[index]]))[0][0]
            assert counter.passes == expected(hypo) >= 1, index
    counter.reset()
    generation.decode(dataset.collater([dataset[0]]))
    assert counter.counts == [0] * len(counter.counts)  # hooks removed on exit


def test_bleu_equals_sacrebleu_on_hyp_files(fixture):
    with open(fixture["reference"], encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    for row in fixture["results"]["rows"]:
        with open(os.path.join(fixture["out"], row["hyp_file"]), encoding="utf-8") as f:
            hyps = [line.rstrip("\n") for line in f]
        assert len(hyps) == len(refs) == NUM_TEST
        assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)


def test_reference_line_count_mismatch(fixture, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("".join(open(fixture["reference"], encoding="utf-8").readlines()[:39]), encoding="utf-8")
    with pytest.raises(BenchmarkError, match=r"--reference .* 39 lines .* 40 sentences"):
        benchmark.main(_args(fixture, reference=str(short), out_dir=str(tmp_path / "out")))


def test_missing_split(fixture, tmp_path):
    with pytest.raises(BenchmarkError, match="--gen-subset 'nosuch'"):
        benchmark.main(_args(fixture, gen_subset="nosuch", out_dir=str(tmp_path / "out")))


def test_missing_checkpoints(fixture, tmp_path):
    with pytest.raises(BenchmarkError, match="--teacher: checkpoint"):
        benchmark.main(_args(fixture, teacher=str(tmp_path / "none.pt")))
    with pytest.raises(BenchmarkError, match="--system 'x': checkpoint"):
        benchmark.main(_args(fixture, system=[f"x={tmp_path / 'none.pt'}"]))


def test_cli_error_exit(fixture, tmp_path, capsys):
    argv = fixture["argv"][:-1] + ["no checkpoint given"]
    with pytest.raises(SystemExit) as exit_info:
        benchmark.cli_main(argv)
    assert exit_info.value.code == 2
    assert "--system 'no checkpoint given'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec, name, checkpoint, args",
    [
        ("NAT=ckpt/nat.pt", "NAT", "ckpt/nat.pt", []),
        ("SAT, K=2=ckpt/sat.pt::--beam 1", "SAT, K=2", "ckpt/sat.pt", ["--beam", "1"]),
        (
            "NPD s=10 = a.pt:b.pt :: --task translation_nat --npd-teacher 'my dir/ar.pt'",
            "NPD s=10",
            "a.pt:b.pt",
            ["--task", "translation_nat", "--npd-teacher", "my dir/ar.pt"],
        ),
        ("x=y.pt::", "x", "y.pt", []),
    ],
)
def test_parse_system_spec(spec, name, checkpoint, args):
    parsed = bench_rows.parse_system_spec(spec)
    assert (parsed.name, parsed.checkpoint, parsed.args) == (name, checkpoint, args)


def test_system_slug():
    assert bench_rows.parse_system_spec("SAT, K=2 (greedy)=a.pt").slug == "sat-k-2-greedy"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-equals-sign", "expected 'NAME=CHECKPOINT"),
        ("=ckpt.pt", "expected 'NAME=CHECKPOINT"),
        ("name=", "expected 'NAME=CHECKPOINT"),
        ("name=::--beam 1", "expected 'NAME=CHECKPOINT"),
        ("name=a.pt::--npd-teacher 'unclosed", "cannot split"),
        ("name=a.pt::--beam 1 --path b.pt", "--path is set by the benchmark"),
        ("name=a.pt::--batch-size=8", "--batch-size=8 is set by the benchmark"),
    ],
)
def test_parse_system_spec_malformed(spec, message):
    with pytest.raises(BenchmarkError, match=message.replace("(", r"\(")) as err:
        bench_rows.parse_system_spec(spec)
    assert repr(spec) in str(err.value)


def test_generate_args_reach_every_row_and_are_checked(fixture, tmp_path):
    results = benchmark.main(
        _args(
            fixture,
            generate_args="--max-len-a 0 --max-len-b 2",
            system=[],
            paired_test=[],
            out_dir=str(tmp_path / "out"),
        )
    )
    for row in results["rows"]:  # at most 2 tokens per sentence, teacher rows included
        with open(tmp_path / "out" / row["hyp_file"], encoding="utf-8") as f:
            assert all(len(line.split()) <= 2 for line in f)
    assert results["meta"]["generate_args"] == "--max-len-a 0 --max-len-b 2"
    assert results["meta"]["length_limit"] == {"limit": "0·|x| + 2", "except": {}}
    assert "max_len = 0·|x| + 2 (|x|" in open(tmp_path / "out" / "results.md", encoding="utf-8").read()
    with pytest.raises(BenchmarkError, match="--generate-args: --path is set by the benchmark"):
        benchmark.main(_args(fixture, generate_args="--path x.pt", out_dir=str(tmp_path / "out2")))


def test_bad_generate_args_name_the_row(fixture, tmp_path):
    spec = "bad=" + fixture["teacher"] + "::--task translation --no-such-option"
    with pytest.raises(BenchmarkError, match="row 'bad': fairseq-generate rejected"):
        benchmark.main(_args(fixture, system=[spec], out_dir=str(tmp_path / "out")))


def test_ctranslate2_rows_decode_like_the_teacher(fixture, tmp_path):
    """The CTranslate2 baseline rows (float32 and int8, beam and greedy) in the same protocol: the converted
    teacher's float32 greedy output is fairseq's greedy output; speedups against the fastest CTranslate2 greedy row."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is installed by run_scripts/setup_env.sh")
    args = _args(fixture, out_dir=str(tmp_path), ctranslate2=True, system=[], paired_test=[], no_plots=True)
    results = benchmark.main(args)
    rows = {row["name"]: row for row in results["rows"]}
    assert [row["name"] for row in results["rows"]] == [
        "AR teacher, beam 4",
        "AR teacher, greedy",
        "AR teacher, beam 4 (CTranslate2)",
        "AR teacher, greedy (CTranslate2)",
        "AR teacher, beam 4 (CTranslate2 int8)",
        "AR teacher, greedy (CTranslate2 int8)",
        "AR teacher, greedy (plugin layout)",
    ]
    greedy = rows["AR teacher, greedy (CTranslate2)"]
    assert greedy["role"] == bench_rows.CT2_GREEDY and greedy["args"][:3] == [
        "ctranslate2",
        "--compute-type",
        "float32",
    ]
    assert greedy["length_limit"] == "0·|x| + 200" and greedy["decoder_calls_per_sentence"] is None
    agreement = results["meta"]["ctranslate2_agreement"]
    assert agreement["row"] == greedy["name"] and agreement["sentences"] == NUM_TEST
    assert agreement["differing_sentences"] <= 2  # fp32 rounding may flip a near tie
    fastest = results["meta"]["ctranslate2_fastest_greedy"]
    ct2_greedy = [rows[name] for name in ("AR teacher, greedy (CTranslate2)", "AR teacher, greedy (CTranslate2 int8)")]
    assert fastest["latency"] == max(ct2_greedy, key=lambda row: row["latency_speedup_vs_ar_greedy"])["name"]
    assert fastest["throughput"] == max(ct2_greedy, key=lambda row: row["throughput_speedup_vs_ar_greedy"])["name"]
    assert rows[fastest["latency"]]["latency_speedup_vs_ct2_greedy"] == 1.0
    assert rows[fastest["throughput"]]["throughput_speedup_vs_ct2_greedy"] == 1.0
    assert abs(rows["AR teacher, beam 4 (CTranslate2)"]["bleu"] - rows["AR teacher, beam 4"]["bleu"]) < 2.0
    assert results["meta"]["timing"]["ctranslate2_threads"]["inter"] == 1


class FakeRunner:
    """A row whose decoding of a unit takes ``cost(indices)`` seconds on a shared fake clock; it logs every
    decode call as (name, indices)."""

    def __init__(self, name, clock, log, cost):
        self.name, self.clock, self.log, self.cost = name, clock, log, cost
        self.outputs = {}

    def inputs(self, indices):
        return list(indices)

    def decode(self, indices):
        self.log.append((self.name, tuple(indices)))
        self.clock[0] += self.cost(indices)
        return indices

    def record(self, indices, outputs):
        self.outputs.update({i: i for i in outputs})


def fake_rows(costs):
    clock, log = [0.0], []
    runners = [FakeRunner(name, clock, log, cost) for name, cost in costs.items()]
    return runners, log, lambda: clock[0]


def test_round_robin_shares_blocks_in_the_recorded_order():
    runners, log, clock = fake_rows({"a": lambda u: 1.0, "greedy": lambda u: 2.0, "c": lambda u: 4.0})
    units = [[i] for i in range(7)]
    timed = schedule.run_rounds(runners, units, 3, anchor=1, batch_size=1, seed=5, warmup=[[9]], clock=clock)
    assert timed.blocks == [[[0], [3], [6]], [[1], [4]], [[2], [5]]]  # interleaved: the same mix in every block
    assert timed.order == schedule.round_orders(3, 3, seed=5, batch_size=1)
    assert log[:3] == [("a", (9,)), ("greedy", (9,)), ("c", (9,))]  # warm-up first, off the clock
    cold_calls, timed_calls = log[3:24], log[24:]
    # then the cold pass: every row on every unit once, row after row in a random order, timed apart
    cold_rows = [name for name, _ in cold_calls[::7]]
    assert sorted(cold_rows) == ["a", "c", "greedy"]
    assert cold_calls == [(name, (i,)) for name in cold_rows for i in (0, 3, 6, 1, 4, 2, 5)]
    assert timed.cold == [7.0, 14.0, 28.0] and timed.cold_ms_per_sentence(2) == 4000.0
    assert timed_calls[:-3] == [  # round r: every row on block r, in the round's order
        (runners[row].name, tuple(unit))
        for r, block in enumerate(timed.blocks)
        for row in timed.order[r]
        for unit in block
    ]
    assert timed_calls[-3:] == [("greedy", (0,)), ("greedy", (3,)), ("greedy", (6,))]  # the drift anchor
    assert timed.seconds[2] == [[4.0] * 3, [4.0] * 2, [4.0] * 2]
    assert timed.ratios(0) == [2.0] * 3 and timed.ratios(2) == [0.5] * 3 and timed.ratios(1) == [1.0] * 3
    assert timed.sentences() == [3, 2, 2] and timed.drift == 0.0
    del log[:]
    few = schedule.run_rounds(runners, units[:2], 3, anchor=1, batch_size=1, seed=5, clock=clock)
    assert few.blocks == [[[0], [1]]] * 3  # fewer units than rounds: every round times them all
    assert len(log) == 3 * 2 + 3 * 3 * 2 + 2 and few.cold == [2.0, 4.0, 8.0]  # a cold pass over each unit once
    warm_only = schedule.run_rounds(runners, units[:2], 3, anchor=1, batch_size=1, seed=5, clock=clock, cold=False)
    assert warm_only.cold is None
    assert timed.distinct_sentences() == 7 and few.distinct_sentences() == 2  # the header's "sentences timed"


def test_rows_change_slots_and_neighbours_from_round_to_round():
    """With the ~24 rows of a full run, each round's order is a fresh permutation drawn from the seed: few rows keep
    their slot or the row before them from one round to the next (a rotation by one kept every neighbour and moved
    every slot by the same step); the same seed and batch size give the same orders, another seed others."""
    rows, rounds = 24, 3
    orders = schedule.round_orders(rows, rounds, seed=1, batch_size=1)
    assert all(sorted(order) == list(range(rows)) for order in orders)
    for before, after in zip(orders, orders[1:]):
        pairs = set(zip(before, before[1:]))
        assert len(pairs & set(zip(after, after[1:]))) <= 3  # a random order keeps about 2 of 23 on average
        assert sum(a == b for a, b in zip(before, after)) <= 3  # rows in the same slot: about 1 on average
        steps = {(after.index(row) - before.index(row)) % rows for row in range(rows)}
        assert len(steps) > rows // 3  # no common shift of the slots
    assert orders == schedule.round_orders(rows, rounds, seed=1, batch_size=1)
    assert orders != schedule.round_orders(rows, rounds, seed=2, batch_size=1)
    assert orders != schedule.round_orders(rows, rounds, seed=1, batch_size=64)


def test_a_slow_round_shows_in_the_spread_and_flags_the_ratio():
    """Background load during one round of one row: its ratios disagree, the spread shows it and the flag is set;
    a row that wins in every round by more than the spread is not flagged; the anchor's drift is measured."""
    slow_round = {"calls": 0}

    def noisy(unit):  # 1.0 s per sentence, 3.0 s during its second block (a preemption)
        slow_round["calls"] += 1
        return 3.0 if 4 <= slow_round["calls"] <= 5 else 1.0

    anchor_calls = {"n": 0}

    def greedy(unit):  # 1.2 s, 10% slower when re-timed at the end
        anchor_calls["n"] += 1
        return 1.32 if anchor_calls["n"] > 7 else 1.2

    runners, _, clock = fake_rows({"noisy": noisy, "greedy": greedy, "fast": lambda u: 0.4})
    timed = schedule.run_rounds(
        runners, [[i] for i in range(7)], 3, anchor=1, batch_size=1, seed=1, clock=clock, cold=False
    )
    noisy_ratios, fast_ratios = timed.ratios(0), timed.ratios(2)
    assert noisy_ratios == pytest.approx([1.2, 0.4, 1.2])
    assert bench_rows.spread(noisy_ratios) == pytest.approx(0.8) and schedule.unsettled(noisy_ratios)
    assert fast_ratios == pytest.approx([3.0] * 3) and not schedule.unsettled(fast_ratios)
    assert not schedule.unsettled([1.0, 1.0, 1.0]) and schedule.unsettled([1.1, 0.95, 1.05])
    assert schedule.unsettled([1.2, 1.5, 2.5]) and not schedule.unsettled([1.4, 1.5, 1.6])
    assert timed.drift == pytest.approx(0.1)
    rows = [fixed_row(name, role, 20.0, 10.0, 1.0) for name, role in (("b", "teacher_beam"), ("g", "teacher_greedy"))]
    rows[0].latency_round_seconds, rows[1].latency_round_seconds = timed.totals(0), timed.totals(1)
    rows[0].throughput_round_rates = [3.0] * 3  # the greedy teacher's 1 sentence a second, 3x
    rows[1].throughput_round_rates = [1.0] * 3
    analysis.compare(rows)
    assert rows[0].latency_ratio_rounds == pytest.approx(noisy_ratios) and rows[0].throughput_ratio_rounds == [3.0] * 3
    assert rows[0].flag == "latency" and rows[1].flag == ""
    assert rows[0].latency_ratio_spread == pytest.approx(0.8) and "| latency |" in report.markdown_table(rows, 4)


def test_speed_by_batch_size_of_fixed_timings():
    runners, _, clock = fake_rows({"greedy": lambda u: 0.1 * len(u), "batched": lambda u: 0.02 + 0.01 * len(u)})
    timings, plan, skipped = schedule.time_batch_sizes(
        runners, [4, 1], 3, 0, range(1, 7), range(1), list(range(12)), 1, clock
    )
    assert list(timings) == [1, 4] and plan is None and skipped == []
    batch4, outputs = timings[4]
    assert batch4.blocks == [[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9, 10, 11]]]
    assert runners[0].outputs == {} and sorted(outputs[1]) == list(range(12))  # outputs handed over per size
    tokens = {i: measure.Output("h", 5) for i in range(12)}
    speed = analysis.speed_at(batch4, 1, tokens)
    assert speed["batch_size"] == 4 and speed["ms_per_sentence"] == pytest.approx(15.0)
    assert speed["tokens_per_s"] == pytest.approx(20 / 0.06) and speed["speedup_vs_ar_greedy"] == pytest.approx(
        0.4 / 0.06
    )
    assert speed["cold_ms_per_sentence"] == pytest.approx(15.0)  # the cold pass: each batch once, 0.06 s for 4
    assert speed["ratio_spread"] == pytest.approx(0) and not speed["unsettled"]
    assert benchmark.parse_batch_sizes("8,64,1", 32) == [1, 8, 32, 64] and benchmark.parse_batch_sizes(None, 64) == [
        1,
        64,
    ]
    for bad in ("0,8", "eight"):
        with pytest.raises(BenchmarkError, match="--batch-sizes"):
            benchmark.parse_batch_sizes(bad, 64)


def test_every_rows_block_of_a_pass_says_where_the_pass_is_and_its_time_left(tmp_path, caplog):
    """After each row's block of the cold pass and of each round, a ``benchmark progress:`` line (run_scripts/step.sh
    shows the latest on the terminal): the batch size, the phase, the row, how much of the pass is done and the time
    left at its pace so far."""
    runners, _, clock = fake_rows({"greedy": lambda u: 1.0 * len(u), "fast": lambda u: 0.5 * len(u)})
    specs = [bench_rows.RowSpec(name, "ckpt") for name in ("greedy", "fast")]
    tracker = progress.Progress(str(tmp_path), specs, ["r"] * 4, 2, None)
    calls = []

    def row_done(*told):
        calls.append(told)
        tracker.row_done(*told)

    with caplog.at_level(logging.INFO, logger="nat_plugins.bench.benchmark"):
        schedule.time_batch_sizes(runners, [2], 3, 0, [], [], list(range(4)), 1, clock, row_done=row_done)
    # 2 units of 2 sentences: the cold pass (2 row blocks of 2 s and 1 s), then 3 rounds over 2 blocks (1 unit each)
    assert [(size, phase, done, total) for size, phase, _, done, total, _ in calls] == [
        (2, "cold pass", 1, 8),
        (2, "cold pass", 2, 8),
        *[(2, f"round {r} of 3", 2 + 2 * (r - 1) + k, 8) for r in (1, 2, 3) for k in (1, 2)],
    ]
    assert sorted(row for _, _, row, *_ in calls[:2]) == [0, 1]
    first = calls[0]
    line = caplog.messages[0]
    seconds = first[5]
    assert line == (
        f"benchmark progress: batch 2, cold pass: {specs[first[2]].name} (1 of 8 of the pass done, "
        f"~{seconds * 7:.0f} s left in it)"
    )
    assert len(caplog.messages) == 8 and "round 3 of 3" in caplog.messages[-1] and "~0 s left" in caplog.messages[-1]
    assert (
        progress.progress_line("x", 0, 4, 0.0)
        == "benchmark progress: x (0 of 4 of the pass done, its pace not known yet)"
    )


def test_a_verify_accept_rows_batch_1_time_is_split_into_drafting_and_verifying():
    """ms per drafting call: the sentences' drafting seconds over their drafting calls; ms per verifier call: the
    rest of their latency over their verifier calls (``steps``); None where a sentence reports no drafting time."""
    outputs = {
        0: measure.Output("a", 6, steps=3, passes=5, drafting_steps=2, drafting_seconds=0.004),
        1: measure.Output("b", 4, steps=2, passes=3, drafting_steps=1, drafting_seconds=0.001),
    }
    batch1 = measure.batch1_stats({0: 12.0, 1: 8.0}, outputs)
    assert batch1.drafting_ms_per_call == pytest.approx(5 / 3)
    assert batch1.verify_ms_per_call == pytest.approx((20 - 5) / 5)
    assert batch1.tokens_per_step == pytest.approx(2) and batch1.decoder_calls_per_sentence == pytest.approx(4)
    outputs[1] = measure.Output("b", 4, steps=2, passes=3)
    batch1 = measure.batch1_stats({0: 12.0, 1: 8.0}, outputs)
    assert batch1.drafting_ms_per_call is None and batch1.verify_ms_per_call is None


def test_a_time_budget_plans_from_the_warm_up_and_leaves_out_the_optional_rows_that_do_not_fit():
    """A budget too small for every row: every row's warm-up is timed (batch 1, a median batch), the plan keeps the
    required rows on the batch-1 sentences that fit and the optional rows in priority order while both their passes
    fit; the kept rows decode the first batched size, then batch 1 (a round ending past the deadline is the last), then
    the other batched sizes whose estimate fits."""
    costs = {"greedy": 0.1, "beam": 0.2, "cheap": 0.01, "dear": 1.0}  # seconds a sentence

    def run(deadline, sizes, cold=False):
        runners, log, clock = fake_rows({name: lambda u, c=c: c * len(u) for name, c in costs.items()})
        progress = []
        budget = schedule.TimeBudget(deadline, reserve=1.0, optional=[3, 2])  # "dear" before "cheap"
        timed = schedule.time_batch_sizes(
            runners,
            sizes,
            3,
            0,
            range(2, 62),
            range(2),
            list(range(6)),
            1,
            clock,
            budget,
            lambda size, rounds, rows, outputs: progress.append((size, len(rounds.blocks), rows, len(outputs[0]))),
            cold=cold,
        )
        return (*timed, progress, log, clock)

    # warm-up: 2 batch-1 sentences and a batch of 2 per row, 4 x 1.31 s = 5.24 s; the batched pass of a row: 3 units
    timings, plan, skipped, progress, log, clock = run(12.7, [2, 1])
    assert plan.estimates == pytest.approx(list(costs.values()))
    assert plan.batched_estimates == pytest.approx([0.6, 1.2, 0.06, 6.0])
    # 12.7 - 1 - 5.24 = 6.46 s: greedy + beam batched 1.8 s, then 0.333 s a sentence (a third of greedy's re-run): 13;
    # "dear" does not fit (6 s batched), "cheap" does (0.06 s + 0.01 s a sentence)
    assert plan.rows == [0, 1, 2] and plan.left_out == [3] and plan.sentences == 13 and skipped == []
    assert all(name != "dear" for name, _ in log[12:])  # after the warm-up (12 units): never decoded
    assert [(size, rows) for size, _, rows, _ in progress[:3]] == [(2, [0, 1, 2])] * 3
    assert progress[2][3] == 6  # after the last batch-2 round every sentence of the split has an output
    assert list(timings) == [1, 2]
    ones, outputs = timings[1]
    assert sum(ones.sentences()) == 13 and ones.rounds_cut == 0 and len(outputs) == 3
    assert progress[-1][:3] == (1, 3, [0, 1, 2]) and clock() <= 12.7
    # a budget gone before it starts: the required rows only, batch 1 on one sentence a round (the least there is),
    # no round after the one that ended past the deadline, and the other batched size skipped
    timings, plan, skipped, _, _, _ = run(5.0, [2, 4, 1])
    assert skipped == [4] and plan.rows == [0, 1] and plan.left_out == [3, 2] and plan.sentences == 3
    assert len(timings[1][0].blocks) == 1 and timings[1][0].rounds_cut == 2 and list(timings) == [1, 2]
    # a budget with time left for a second batched size: timed after batch 1
    timings, plan, skipped, progress, _, _ = run(60.0, [2, 4, 1])
    assert skipped == [] and list(timings) == [1, 2, 4] and [p[0] for p in progress] == [2] * 3 + [1] * 3 + [4] * 3
    # with the cold pass (the benchmark's default) every unit is decoded twice and the plan counts it: 6.46 s leave
    # greedy + beam batched twice 3.6 s, then 0.633 s a sentence (both passes, a third of greedy's re-run): 4 sentences;
    # "cheap" still fits; the run, cold passes included, ends within the budget
    timings, plan, skipped, _, log, clock = run(12.7, [2, 1], cold=True)
    assert plan.rows == [0, 1, 2] and plan.sentences == 4 and plan.estimates == pytest.approx(list(costs.values()))
    assert timings[1][0].cold == pytest.approx([0.4, 0.8, 0.04]) and clock() <= 12.7


def test_paired_bootstrap_of_two_rows(fixture):
    """Identical outputs: Δ = 0 and equal intervals; beam vs greedy: the rows' BLEU and a p-value in (0, 1]."""
    rows, out = fixture["results"]["rows"], fixture["out"]
    references = benchmark.check_inputs(_args(fixture), [])
    hyps = {row["name"]: open(os.path.join(out, row["hyp_file"]), encoding="utf-8").read().splitlines() for row in rows}
    same, differ = analysis.paired_bootstrap(
        [("AR teacher, greedy", "same teacher greedy"), ("AR teacher, greedy", "AR teacher, beam 4")], hyps, references
    )
    assert same["delta"] == 0 and same["system_ci"] == pytest.approx(same["baseline_ci"])
    assert differ["baseline_bleu"] == pytest.approx(rows[1]["bleu"])
    assert differ["system_bleu"] == pytest.approx(rows[0]["bleu"])
    assert 0 < differ["p_value"] <= 1 and differ["system_ci"] >= 0 and "bs:1000" in differ["signature"]
    (reported,) = fixture["results"]["paired_tests"]  # --paired-test of the fixture's run
    assert (reported["baseline"], reported["system"]) == ("AR teacher, greedy", "same teacher greedy")
    assert reported["delta"] == 0
    markdown = open(os.path.join(out, "results.md"), encoding="utf-8").read()
    assert "| AR teacher, greedy | same teacher greedy |" in markdown and "| +0.00 |" in markdown


def test_paired_test_names_must_be_rows():
    names = [spec.name for spec in bench_rows.teacher_specs("t.pt", 4)]
    ok = bench_rows.parse_paired_tests(["AR teacher, greedy::AR teacher, beam 4"], names)
    assert ok == [("AR teacher, greedy", "AR teacher, beam 4")]
    with pytest.raises(BenchmarkError, match="no row named 'nosuch'"):
        bench_rows.parse_paired_tests(["AR teacher, greedy::nosuch"], names)
    with pytest.raises(BenchmarkError, match="expected 'BASELINE ROW NAME::SYSTEM ROW NAME'"):
        bench_rows.parse_paired_tests(["AR teacher, greedy"], names)


def test_every_speedup_is_the_median_of_paired_round_ratios():
    """One statistic for every "×": the median over rounds of (the reference's seconds on the round's block / the
    row's), not a ratio of medians, with the range of the per-round ratios beside it in the table."""
    greedy = fixed_row("greedy", bench_rows.TEACHER_GREEDY, 24.0, 10.0, 1.0)
    beam = fixed_row("beam", bench_rows.TEACHER_BEAM, 25.0, 20.0, 1.0)
    system = fixed_row("system", bench_rows.SYSTEM, 20.0, 5.0, 1.0)
    greedy.timed_ids = beam.timed_ids = system.timed_ids = [0, 1, 2]
    greedy.timed_latency_ms, greedy.latency_round_seconds = [10.0, 10.0, 40.0], [1.0, 1.0, 4.0]
    beam.timed_latency_ms, beam.latency_round_seconds = [20.0, 20.0, 20.0], [2.0, 2.0, 2.0]
    system.timed_latency_ms, system.latency_round_seconds = [5.0, 2.5, 10.0], [0.5, 0.25, 1.0]
    greedy.throughput_round_rates, beam.throughput_round_rates = [1.0, 2.0, 1.0], [1.0, 1.0, 1.0]
    system.throughput_round_rates = [2.0, 3.0, 5.0]
    rows = [beam, greedy, system]
    analysis.compare(rows)
    # per round 2, 4, 4 (the ratio of the median latencies would be 10 / 5 = 2)
    assert system.latency_ratio_rounds == [2.0, 4.0, 4.0] and system.latency_speedup_vs_ar_greedy == 4.0
    assert system.speedup_rounds["latency_speedup_vs_ar_beam"] == [4.0, 8.0, 2.0]
    assert system.latency_speedup_vs_ar_beam == 4.0
    # per round 2, 1.5, 5 (the ratio of the median rates would be 3 / 1)
    assert system.throughput_speedup_vs_ar_greedy == 2.0 and system.throughput_speedup_vs_ar_beam == 3.0
    assert (
        greedy.latency_speedup_vs_ar_greedy == 1.0
        and greedy.speedup_rounds["latency_speedup_vs_ar_greedy"] == [1.0] * 3
    )
    table = report.markdown_table(rows, 4)
    assert "| latency × vs beam 4 | latency × vs greedy | sent/s (batch) |" in table  # no "± rounds" column
    assert "| 4.00× (2.00–8.00) | 4.00× (2.00–4.00) | 3.0 | 3.00× (2.00–5.00) | 2.00× (1.50–5.00) |" in table
    system.by_batch_size = [
        {
            "batch_size": 1,
            "tokens_per_s": 10.0,
            "ms_per_sentence": 3.0,
            "ratio_rounds": [2.0, 4.0, 4.0],
            "unsettled": False,
        }
    ]
    greedy.by_batch_size = beam.by_batch_size = system.by_batch_size
    assert "| system | 10 tok/s, 3.0 ms/sent, 4.00× (2.00–4.00) |" in report.batch_size_table(rows)


def test_speedups_of_the_main_table_are_those_of_the_batch_size_table(fixture):
    """The main table's × fairseq greedy at batch 1 and at --batch-size is the batch-size sweep's at those sizes."""
    for row in fixture["results"]["rows"]:
        by_size = {entry["batch_size"]: entry for entry in row["by_batch_size"]}
        assert row["latency_speedup_vs_ar_greedy"] == pytest.approx(by_size[1]["speedup_vs_ar_greedy"], rel=1e-12)
        assert row["throughput_speedup_vs_ar_greedy"] == pytest.approx(by_size[12]["speedup_vs_ar_greedy"], rel=1e-12)
        assert row["latency_ratio_rounds"] == by_size[1]["ratio_rounds"]
        assert row["speedup_rounds"]["latency_speedup_vs_ar_beam"] == pytest.approx(
            [
                b / s
                for b, s in zip(fixture["results"]["rows"][0]["latency_round_seconds"], row["latency_round_seconds"])
            ]
        )


def test_the_order_of_every_round_is_recorded(fixture):
    timing = fixture["results"]["meta"]["timing"]
    assert set(timing["orders"]) == {"1", "12"}
    for size, orders in timing["orders"].items():
        assert len(orders) == 3 and all(sorted(order) == sorted(NAMES) for order in orders)
        indices = schedule.round_orders(len(NAMES), 3, seed=1, batch_size=int(size))
        assert orders == [[NAMES[k] for k in order] for order in indices]


def out(ids, text="h"):
    """An output of ``ids`` (the last one EOS)."""
    return measure.Output(text, len(ids), ids=tuple(ids))


def test_exact_check_counts_divergences_and_near_ties():
    """Sentences that differ from greedy's output, classified by the teacher's log-probability gap at the first
    differing token (scored on the common prefix): below the tolerance a near-tie, else a real divergence."""
    greedy = {0: out([5, 6, 7, 2]), 1: out([5, 6, 2]), 2: out([8, 2]), 3: out([4, 4, 2])}
    row = {0: out([5, 6, 7, 2]), 1: out([5, 9, 2]), 2: out([3, 2]), 3: out([4, 4, 2])}
    asked = []

    def gap(sentence, prefix, token, other):
        asked.append((sentence, tuple(prefix), token, other))
        return {1: 1e-6, 2: 0.5}[sentence]

    check = measure.exact_check(row, greedy, gap, 1e-4)
    assert asked == [(1, (5,), 9, 6), (2, (), 3, 8)]
    assert (check["sentences"], check["differ"], check["near_ties"]) == (4, 2, 1)
    assert check["divergences"] == [
        {"sentence": 1, "position": 1, "log_prob_gap": 1e-6},
        {"sentence": 2, "position": 0, "log_prob_gap": 0.5},
    ]
    assert measure.exact_check(row, greedy, gap, 1.0)["near_ties"] == 2
    assert measure.exact_check(greedy, greedy, gap, 1e-4) == {
        "sentences": 4,
        "differ": 0,
        "near_ties": 0,
        "divergences": [],
    }
    assert measure.first_difference((5, 6), (5, 6, 2)) == 2


def test_the_solo_pass_is_checked_against_the_teachers_greedy_output_too():
    """The solo processes report token ids (and text): a sentence with the greedy teacher's ids does not differ, one
    with the row's own round-robin ids keeps its verdict there (a near-tie stays one, a divergence stays one), any other
    is a divergence no near-tie covers, and the row is no longer exact (what the README's claims read). Two token
    sequences that print the same text are different outputs; without ids (an engine that gives none) text decides."""
    greedy = {0: out([5, 2], "a"), 1: out([5, 6, 2], "b"), 2: out([8, 2], "c"), 3: out([4, 2], "d")}
    own = {0: out([5, 2], "a"), 1: out([5, 9, 2], "b'"), 2: out([3, 2], "c'"), 3: out([4, 2], "d")}
    own_check = measure.exact_check(own, greedy, lambda i, *_: {1: 1e-6, 2: 0.5}[i], 1e-4)
    solo = {
        0: measure.SoloOutput("a", (5, 2)),
        1: measure.SoloOutput("b'", (5, 9, 2)),
        2: measure.SoloOutput("c'", (3, 2)),
        3: measure.SoloOutput("something else", (7, 2)),
    }
    check = measure.solo_exact_check(solo, greedy, own, own_check, 1e-4)
    assert (check["sentences"], check["differ"], check["near_ties"]) == (4, 3, 1)
    assert check["divergences"] == own_check["divergences"] + [{"sentence": 3, "position": None, "log_prob_gap": None}]
    solo_same = {
        0: measure.SoloOutput("a", (5, 2)),
        1: measure.SoloOutput("b'", (5, 9, 2)),
        3: measure.SoloOutput("d", None),
    }
    same = measure.solo_exact_check(solo_same, greedy, own, own_check, 1e-4)
    assert (same["differ"], same["near_ties"]) == (1, 1)  # the near-tie of the round-robin pass, nothing else
    # the teacher's text from other tokens (a split subword): no longer the teacher's output
    other_tokens = measure.solo_exact_check({0: measure.SoloOutput("a", (5, 3, 2))}, greedy, own, own_check, 1e-4)
    assert other_tokens["divergences"] == [{"sentence": 0, "position": None, "log_prob_gap": None}]
    row = {"name": "exact", "exact_check": {"1": own_check, "solo": same}}
    measured = catalogue.Measured({"exact": row}, [], ())
    assert not measured.same_output(row, {"name": "greedy"})  # the round-robin pass's real divergence at sentence 2
    row["exact_check"] = {"1": measure.exact_check(own, own, None, 1e-4), "solo": check}
    assert not measured.same_output(row, {"name": "greedy"})  # the solo pass alone differs: not exact either


def test_exact_check_in_the_table_and_the_flag():
    rows = [
        fixed_row("beam", bench_rows.TEACHER_BEAM, 25.0, 20.0, 1.0),
        fixed_row("greedy", bench_rows.TEACHER_GREEDY, 24.0, 10.0, 1.0),
        fixed_row("exact", bench_rows.SYSTEM, 24.0, 5.0, 1.0),
        fixed_row("near", bench_rows.SYSTEM, 24.0, 5.0, 1.0),
        fixed_row("wrong", bench_rows.SYSTEM, 24.0, 5.0, 1.0),
    ]
    passes = {"1": {"sentences": 10, "differ": 0, "near_ties": 0}, "64": {"sentences": 40, "differ": 0, "near_ties": 0}}
    rows[2].exact_check = passes
    rows[3].exact_check = {**passes, "1": {"sentences": 10, "differ": 2, "near_ties": 2}}
    rows[4].exact_check = {**passes, "1": {"sentences": 10, "differ": 3, "near_ties": 1}}
    analysis.compare(rows)
    assert [row.flag for row in rows] == ["", "", "", "", "≠ greedy"]
    table = report.markdown_table(rows, 4)
    assert "| BLEU | % of teacher beam 4 | ≠ greedy | latency ms (median) |" in table
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[3] for line in table.splitlines()[2:]}
    assert cells == {
        "beam": "–",
        "greedy": "–",
        "exact": "0",
        "near": "2 (near-ties)",
        "wrong": "**3 (2 not near-ties)**",
    }
    assert "≠ greedy" not in report.markdown_table(rows[:2], 4)  # no row to check: no column


def test_rows_that_print_the_teachers_greedy_output_are_checked_in_every_pass(fixture):
    """The plugin-layout teacher row and the --system copy of the greedy teacher print its greedy output: both are
    checked at batch 1 (the timed sentences) and at --batch-size (the split), and every difference is a near-tie; the
    beam, CMLM and greedy rows themselves are not checked."""
    rows = {row["name"]: row for row in fixture["results"]["rows"]}
    for name in ("AR teacher, greedy (plugin layout)", "same teacher greedy"):
        check = rows[name]["exact_check"]
        assert set(check) == {"1", "12"}, name
        assert check["1"]["sentences"] == NUM_TEST - 2 and check["12"]["sentences"] == NUM_TEST
        assert all(p["differ"] == p["near_ties"] for p in check.values()), check
    for name in ("AR teacher, beam 4", "AR teacher, greedy", "fairseq CMLM"):
        assert rows[name]["exact_check"] is None, name
    assert fixture["results"]["meta"]["exact_check"]["near_tie_tolerance"] == measure.NEAR_TIE_TOLERANCE["fp32"]
    markdown = open(os.path.join(fixture["out"], "results.md"), encoding="utf-8").read()
    assert "| same teacher greedy | " in markdown and "- ≠ greedy: the rows that print the teacher's greedy" in markdown


def test_a_divergence_is_a_near_tie_by_the_teachers_log_probabilities(fixture):
    """The gap the exact check classifies is the teacher's: log p(greedy token) - log p(other token) after the common
    prefix, as fairseq's SequenceGenerator and SequenceScorer score them."""
    from fairseq.sequence_scorer import SequenceScorer

    args = _args(fixture)
    spec = bench_rows.teacher_specs(fixture["teacher"], 4)[1]
    teacher = measure.FairseqRunner(spec, measure.generation_cfg(args, spec, False), 1, NUM_TEST)
    generation = teacher.decoder.generation
    tgt_dict, eos = generation.task.target_dictionary, generation.task.target_dictionary.eos()
    sample = teacher.inputs([3])
    best = teacher.decode(sample)[0]
    ids = best["tokens"].tolist()
    assert len(ids) >= 3
    other = next(x for x in range(tgt_dict.nspecial, len(tgt_dict)) if x != ids[1])
    diverged = [ids[0], other, eos]
    sample["target"] = torch.tensor([diverged])
    sample["net_input"]["prev_output_tokens"] = torch.tensor([[eos] + diverged[:-1]])
    scored = SequenceScorer(tgt_dict).generate(generation.models, sample)[0][0]["positional_scores"]
    expected = (best["positional_scores"][1] - scored[1]).item()
    assert expected > 0
    assert teacher.log_prob_gap(3, ids[:1], other, ids[1]) == pytest.approx(expected, abs=1e-5)
    outputs, greedy = {3: out(diverged)}, {3: out(ids)}
    assert measure.exact_check(outputs, greedy, teacher.log_prob_gap, 2 * expected)["near_ties"] == 1
    assert measure.exact_check(outputs, greedy, teacher.log_prob_gap, expected / 2)["near_ties"] == 0


@pytest.mark.parametrize(
    "task_args, arch_args, gen_args, prints",
    [
        (NAT_TASK, ["--arch", "transformer"], ["--beam", "1"], "model"),
        (NAT_TASK, ["--arch", "transformer"], ["--beam", "4"], None),
        (NAT_TASK, ["--arch", "transformer"], ["--beam", "1", "--sampling"], None),
        (NAT_TASK, ["--arch", "transformer"], ["--beam", "1", "--no-repeat-ngram-size", "2"], None),
        (NAT_TASK, ["--arch", "blockwise_transformer", "--block-size", "3", "--identity-first-head"], SHORT, "model"),
        (NAT_TASK, ["--arch", "blockwise_transformer", "--block-size", "3"], SHORT, None),  # head 1 through a layer
        (
            NAT_TASK + ["--block-accept", "topk:2"],
            ["--arch", "blockwise_transformer", "--block-size", "3", "--identity-first-head"],
            SHORT,
            None,
        ),
        (
            NAT_TASK + ["--spec-drafter-teacher", "TEACHER"],
            ["--arch", "spec_drafter", "--draft-size", "2"],
            SHORT,
            "teacher",
        ),
        (
            NAT_TASK + ["--spec-drafter-teacher", "TEACHER", "--max-drafting-sentences", "0"],
            ["--arch", "spec_drafter", "--draft-size", "2"],
            SHORT,
            "teacher",
        ),
        (
            NAT_TASK + ["--spec-drafter-teacher", "TEACHER", "--spec-drafter-verify", "relaxed"],
            ["--arch", "spec_drafter", "--draft-size", "2"],
            SHORT,
            None,
        ),
        (NAT_TASK, ["--arch", "nad_ad_transformer"], SHORT, None),  # a SequenceGenerator subclass
        (NAT_TASK, ["--arch", "fertility_nat"], SHORT, None),
    ],
    ids=[
        "greedy",
        "beam",
        "sampling",
        "ngram-blocking",
        "blockwise-exact",
        "blockwise-head-1-layer",
        "blockwise-topk",
        "speculative-exact",
        "speculative-greedy-steps",
        "speculative-relaxed",
        "NAD-AD",
        "NAT",
    ],
)
def test_which_rows_print_a_models_greedy_output(dummy_data_bin, tiny_teacher, task_args, arch_args, gen_args, prints):
    """The exact check's rows, told from the generator and its settings: the model whose greedy output a row prints
    (None: it prints something else), and whether that model has the teacher's weights."""
    from fairseq import checkpoint_utils

    task_args = [tiny_teacher if a == "TEACHER" else a for a in task_args]
    generation = build_generation(dummy_data_bin, task_args, arch_args, gen_args)
    model = measure.greedy_model(generation)
    (teacher,), _ = checkpoint_utils.load_model_ensemble([tiny_teacher])
    if prints is None:
        assert model is None
    elif prints == "model":
        assert model is generation.models[0] and not measure.same_weights(model, teacher)  # untrained, not the teacher
    else:
        assert model is generation.generator.verifier and measure.same_weights(model, teacher)
    assert measure.same_weights(teacher, teacher)


def test_rep_is_counted_in_13a_words_by_the_benchmark_and_the_command(tmp_path, capsys):
    """The benchmark's Rep/Mis columns and `python -m nat_plugins.cli.rep_mis` count the same output the same way:
    in the words of sacreBLEU's 13a tokenization, where "Dach." is the word "Dach" and a full stop."""
    references = ["Leute reparieren das Dach eines Hauses.", "Ein Hund, ein Ball."]
    greedy = ["Leute reparieren das Dach eines Hauses.", "Ein Hund, ein Ball, ein Ball."]
    system = ["Leute reparieren das Dach, das Dach.", "Ein Hund, ein Hund, ein Ball."]
    rows = [
        fixed_row("beam", bench_rows.TEACHER_BEAM, 25.0, 20.0, 1.0),
        fixed_row("greedy", bench_rows.TEACHER_GREEDY, 24.0, 10.0, 1.0),
        fixed_row("system", bench_rows.SYSTEM, 20.0, 5.0, 1.0),
    ]
    rows[0].hyps, rows[1].hyps, rows[2].hyps = greedy, greedy, system
    analysis.add_rep_mis(rows, references)
    # 13a words: "Leute reparieren das Dach , das Dach ." repeats das and Dach, "Ein Hund , ein Hund , ein Ball ." the
    # second Hund and "," and the third ein: 5 of 17 words (split at whitespace, "Dach," and "Dach." differ: 3 of 13)
    assert rows[2].rep_ratio == pytest.approx(100 * 5 / 17)
    for name, lines in (("ref", references), ("ar", greedy), ("sys", system)):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = ["--references", str(tmp_path / "ref.txt"), "--ar-output", str(tmp_path / "ar.txt")]
    scores = rep_mis.main(files + ["--hypotheses", str(tmp_path / "sys.txt")])
    assert (scores["rep_ratio"], scores["mis_ratio"], scores["rep"]) == pytest.approx(
        (rows[2].rep_ratio, rows[2].mis_ratio, rows[2].rep)
    )
    assert "rep% 29.41" in capsys.readouterr().out
    table = report.markdown_table(rows, 4)
    assert "| Rep % | missing tokens % | Rep Δ% vs greedy | Mis Δ% vs greedy |" in table
    assert f"| {rows[2].rep_ratio:.2f} |" in table.splitlines()[-1]
