"""``nat-benchmark --solo`` (nat_plugins/bench/solo.py): every engine timed alone in its own process, in the
setting its calibration picks.

The schedule and the statistics with fake processes (:class:`FakeChild` in place of :class:`solo.Child`, fake
seconds); a child that fails; and end to end on the session's tiny teacher (slow: a dozen real processes), with
CTranslate2 where it is installed.
"""

import itertools
import json
import os
import statistics
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch

from nat_plugins.bench import benchmark, measure, solo
from nat_plugins.bench.rows import CT2_GREEDY, SYSTEM, BenchmarkError, RowSpec, teacher_specs
from nat_plugins.bench.schedule import interleaved_blocks, round_orders, units_of
from nat_recipes import catalogue

from .test_speculative import random_teacher

ANCHOR, PLUGIN, INT8 = "AR teacher, greedy", "plugin row", "CTranslate2 int8 greedy"
# ms per sentence of each engine in each setting (policy, threads): every engine is fastest in another one
MS = {
    ANCHOR: {(None, 1): 20.0, (None, 2): 14.0, ("PASSIVE", 2): 16.0, ("ACTIVE", 2): 10.0},
    PLUGIN: {(None, 1): 5.0, (None, 2): 6.0, ("PASSIVE", 2): 7.0, ("ACTIVE", 2): 8.0},
    INT8: {(None, 1): 4.0, (None, 2): 3.0, ("PASSIVE", 2): 2.0, ("ACTIVE", 2): 9.0},
}
LAYOUTS = {1: "weight-first", 2: "torch"}  # what the torch family's calibration processes choose at each count
WARMUP, LATENCY, ORDER = range(2), range(2, 11), list(range(12))  # 9 timed sentences: 3 rounds of 3; 12 batched


class FakeChild:
    """A solo process that decodes nothing: a unit of n sentences costs n × ``MS[engine][setting]`` ms (× ``slow``
    where it says so), its hypotheses are ``h<sentence>`` (token ids ``[sentence, 2]``, none from CTranslate2);
    everything is logged in ``FakeChild.log`` (a kill only where it ends a process that was not closed)."""

    log, pids, slow, fail = [], itertools.count(100), {}, None

    def __init__(self, job, env, directory, name):
        self.job, self.env, self.name, self.pid = job, env, name, next(FakeChild.pids)
        self.start_seconds, self.closed = 3.0, False
        self.engines = [spec["name"] for spec in job["engines"]]
        self.setting = (env.get("OMP_WAIT_POLICY"), int(env["OMP_NUM_THREADS"]))
        assert self.setting[1] == job["threads"]
        FakeChild.log.append(("launch", name, self.engines, self.setting, env.get("NAT_LINEAR_LAYOUT")))

    def run(self, passes):
        FakeChild.log.append(("run", self.name, [p["units"] for p in passes]))
        if self.name == FakeChild.fail:
            raise BenchmarkError(f"solo process {self.name} exited (1)")
        engines = []
        for engine in self.engines:
            seconds = [
                [len(unit) * MS[engine][self.setting] * FakeChild.slow.get((engine, unit[0]), 1.0) / 1000 for unit in p]
                for p in (p["units"] for p in passes)
            ]
            outputs = {  # as JSON carries them: sentence keys as text, ids as a list (None: CTranslate2 gives none)
                str(p["batch_size"]): {
                    str(i): [f"h{i}", None if engine == INT8 else [i, 2]] for u in p["units"] for i in u
                }
                for p in passes
            }
            engines.append(
                {"name": engine, "seconds": seconds, "outputs": outputs, "linear_layout": "layout of " + engine}
            )
        torch_family = self.job["family"] == solo.TORCH_FAMILY
        return {
            "pid": self.pid,
            "omp_wait_policy": self.env.get("OMP_WAIT_POLICY"),
            "omp_num_threads": self.env["OMP_NUM_THREADS"],
            "threads": self.job["threads"],
            "engines": engines,
            "linear_layout": {"layout": LAYOUTS[self.job["threads"]]} if torch_family else None,
        }

    def close(self):
        FakeChild.log.append(("close", self.name))
        self.closed = True

    def kill(self):  # as Child.kill: nothing to end after close()
        if not self.closed:
            FakeChild.log.append(("kill", self.name))


def specs():
    """The teacher's rows (the beam row is not timed alone), a plugin row and a CTranslate2 greedy row."""
    return teacher_specs("t.pt", 4) + [
        RowSpec(PLUGIN, "p.pt", ["--beam", "1"], SYSTEM),
        RowSpec(INT8, "t.pt", [], CT2_GREEDY),
    ]


def fake_solo(monkeypatch, tmp_path, slow=None, fail=None, batched=True, calibration_sentences=2):
    """The solo pass over :func:`specs` with fake processes on a 2-core machine."""
    monkeypatch.setattr(solo, "Child", FakeChild)
    monkeypatch.setattr(solo, "available_cores", lambda: 2)
    FakeChild.log, FakeChild.slow, FakeChild.fail = [], slow or {}, fail
    args = Namespace(
        cpu=True,
        out_dir=str(tmp_path),
        rounds=3,
        seed=7,
        batch_size=4,
        solo_batched=batched,
        solo_calibration_sentences=calibration_sentences,
    )
    return solo.run_solo(args, specs(), 12, WARMUP, LATENCY, ORDER)


def test_calibration_picks_each_engines_fastest_setting(monkeypatch, tmp_path):
    """One process per runtime family and setting (1 thread; 2 threads unset, PASSIVE, ACTIVE), each timing every
    engine of its family on the first calibration sentences after one untimed pass; every setting's number reported;
    each engine then runs in its fastest setting, the torch family with the layout chosen at its thread count."""
    result = fake_solo(monkeypatch, tmp_path)
    launches = [entry for entry in FakeChild.log if entry[0] == "launch"]
    calibrations = [entry for entry in launches if entry[1].startswith("calibrate")]
    settings = {(None, 1), (None, 2), ("PASSIVE", 2), ("ACTIVE", 2)}
    assert {setting for _, _, engines, setting, _ in calibrations if engines[0] == ANCHOR} == settings
    assert sorted(engines for _, _, engines, *_ in calibrations) == [[ANCHOR, PLUGIN]] * 4 + [[INT8]] * 4
    runs = [entry for entry in FakeChild.log if entry[0] == "run" and entry[1].startswith("calibrate")]
    assert all(units == [[[2], [3]]] for *_, units in runs)  # warm-up and timed units: the first 2 timed sentences
    assert all(("close", name) in FakeChild.log for _, name, *_ in calibrations)
    summary = result.summary
    assert summary["calibration"]["sentences"] == 2
    labels = {solo.Setting(policy, threads).label: (policy, threads) for policy, threads in settings}
    for engine in MS:
        measured = summary["calibration"]["seconds"][engine]
        assert {labels[label]: seconds for label, seconds in measured.items()} == {
            setting: pytest.approx(ms / 1000) for setting, ms in MS[engine].items()
        }
    chosen = {name: (s["omp_wait_policy"], s["threads"]) for name, s in summary["chosen"].items()}
    assert chosen == {ANCHOR: ("ACTIVE", 2), PLUGIN: (None, 1), INT8: ("PASSIVE", 2)}
    engines = {engines[0]: (setting, layout) for _, name, engines, setting, layout in launches if name.startswith("e")}
    assert engines == {
        ANCHOR: (("ACTIVE", 2), "torch"),
        PLUGIN: ((None, 1), "weight-first"),
        INT8: (("PASSIVE", 2), None),
    }
    assert summary["linear_layout"] == {"1": {"layout": "weight-first"}, "2": {"layout": "torch"}}
    for name, (setting, _) in engines.items():
        row = result.rows[name]
        assert (row["omp_wait_policy"], row["threads"], row["linear_layout"]) == (*setting, "layout of " + name)
    assert summary["processes"] == 8 + 3
    calibrated = summary["calibration"]["processes"]
    assert [(p["family"], p["start_seconds"]) for p in calibrated] == [("torch", 3.0)] * 4 + [("ctranslate2", 3.0)] * 4
    assert summary["engine_processes"][PLUGIN]["start_seconds"] == 3.0


def test_rounds_time_the_same_block_in_a_seeded_order_and_pair_the_ratios(monkeypatch, tmp_path):
    """Every round times every engine's process on the round's block (batch 1 and batched, after the warm-up), the
    engines in the round's seeded order; the anchor re-times block 0 at the end. A slowdown of one round that hits
    every engine cancels in the paired ratios; one that hits one engine shows in its min-max."""
    slow = {(name, i): 3.0 for name in MS for i in (4, 7, 10)}  # round 2's block 3x slower for every engine...
    slow.update({(PLUGIN, i): 2.0 for i in (3, 6, 9)})  # ... and round 1's 2x slower for the plugin row alone
    result = fake_solo(monkeypatch, tmp_path, slow=slow)
    blocks = interleaved_blocks(units_of(1, LATENCY), 3)
    batches = interleaved_blocks(units_of(4, ORDER), 3)
    names = [ANCHOR, PLUGIN, INT8]
    engine_runs = [entry for entry in FakeChild.log if entry[0] == "run" and entry[1].startswith("engine")]
    expected_order = [f"engine-{k}" for order in round_orders(3, 3, 7, 1) for k in order] + ["engine-0"]
    assert [name for _, name, _ in engine_runs] == expected_order
    for i, (_, _, units) in enumerate(engine_runs[:-1]):
        assert units == [blocks[i // 3], batches[i // 3]]
    assert engine_runs[-1][2] == [blocks[0], batches[0]]
    launches = [entry[1] for entry in FakeChild.log if entry[0] == "launch"]
    assert launches[-3:] == ["engine-0", "engine-1", "engine-2"]  # loaded one after the other, after calibration
    assert all(("close", f"engine-{k}") in FakeChild.log for k in range(3))

    summary, rows = result.summary, result.rows
    assert summary["order"] == [[names[k] for k in order] for order in round_orders(3, 3, 7, 1)]
    assert summary["per_round_seconds"][PLUGIN]["1"] == pytest.approx([0.015, 0.030, 0.045])
    assert summary["anchor_drift"] == {"1": pytest.approx(0.0), "4": pytest.approx(0.0)}
    plugin = rows[PLUGIN]
    # anchor 10 ms/sentence at (ACTIVE, 2), the plugin row 5 at (unset, 1): 2x, 1x in round 1, 2x in the slow round
    assert plugin["latency_ratio_rounds"] == pytest.approx([2.0, 1.0, 2.0])
    assert plugin["latency_speedup_vs_ar_greedy"] == pytest.approx(2.0)
    assert (plugin["latency_ratio_min"], plugin["latency_ratio_max"]) == pytest.approx((1.0, 2.0))
    assert plugin["latency_unsettled"]  # |2 - 1| is not more than the spread 1.0
    assert plugin["ms_per_sentence"] == pytest.approx(10.0)  # rounds: 5, 10, 15 ms
    assert rows[INT8]["latency_speedup_vs_ar_greedy"] == pytest.approx(5.0) and not rows[INT8]["latency_unsettled"]
    assert rows[ANCHOR]["latency_ratio_rounds"] == [1.0] * 3
    assert rows[INT8]["throughput_speedup_vs_ar_greedy"] == pytest.approx(5.0)
    assert rows[INT8]["sent_per_s"] == pytest.approx(500.0)
    assert summary["batch_sizes"] == [1, 4]

    outputs = {name: {i: output([i, 2], f"h{i}") for i in LATENCY} for name in names}
    outputs[INT8][5] = output([5, 2], "another")  # CTranslate2's solo output has no ids: compared by text
    outputs[PLUGIN][6] = output([6, 3], "h6")  # the same text from other tokens: differs
    result.check_outputs(outputs)
    differing = [rows[name]["differing_sentences"] for name in names]
    assert differing == [0 if name == ANCHOR else 1 for name in names] and summary["differing_sentences"] == 2

    results = {"rows": [{"name": name} for name in ["AR teacher, beam 4"] + names]}
    result.add_to(results)
    assert results["solo"] is summary and results["rows"][0]["solo"] is None and results["rows"][2]["solo"] is plugin
    table = result.markdown(
        [
            SimpleNamespace(name=name, latency_ratio_rounds=[1.0, 1.1, 1.2], throughput_ratio_rounds=[1.0] * 3)
            for name in names
        ]
    )
    assert (
        "| plugin row | (unset) | 1 | layout of plugin row | 10.0 | 2.00× (1.00–2.00)? | 1.10× (1.00–1.20) |" in table
    )
    assert "| CTranslate2 int8 greedy | 4.0 | 3.0 | **2.0** | 9.0 |" in table  # calibration: ms per sentence


def test_batch_1_only_by_default(monkeypatch, tmp_path):
    result = fake_solo(monkeypatch, tmp_path, batched=False)
    runs = [entry for entry in FakeChild.log if entry[0] == "run"]
    engine_runs = [units for _, name, units in runs if name.startswith("engine")]
    assert all(len(units) == 1 for units in engine_runs) and result.summary["batch_sizes"] == [1]
    assert "throughput_speedup_vs_ar_greedy" not in result.rows[PLUGIN]


def test_a_failing_process_ends_every_other(monkeypatch, tmp_path):
    """A child that fails in a round: the error goes up and every engine process is killed."""
    with pytest.raises(BenchmarkError, match="solo process engine-1 exited"):
        fake_solo(monkeypatch, tmp_path, fail="engine-1")
    assert [entry for entry in FakeChild.log if entry[0] == "kill"] == [("kill", f"engine-{k}") for k in range(3)]


def test_a_child_that_cannot_load_its_engine_reports_its_log(tmp_path):
    """A real process whose row cannot be loaded: it exits before stopping, and its log comes up in the error."""
    args = benchmark.get_parser().parse_args(
        [str(tmp_path), "--teacher", "none.pt", "--reference", "r", "--out-dir", str(tmp_path), "--cpu"]
    )
    job = {"args": vars(args), "num_sentences": 1, "engines": [vars(teacher_specs("none.pt", 4)[1])]}
    job.update(family=solo.TORCH_FAMILY, threads=1)
    with pytest.raises(BenchmarkError, match=r"(?s)solo process broken exited \(1\):.*Traceback"):
        solo.Child(job, solo.Setting(None, 1).environment({}), str(tmp_path), "broken")


def test_solo_refuses_a_gpu_and_bad_calibration_sizes(monkeypatch, tmp_path):
    monkeypatch.setattr(solo.torch.cuda, "is_available", lambda: True)
    args = Namespace(cpu=False, out_dir=str(tmp_path), solo_calibration_sentences=2)
    with pytest.raises(BenchmarkError, match="--solo times CPU engines"):
        solo.run_solo(args, specs(), 12, WARMUP, LATENCY, ORDER)
    args.cpu, args.solo_calibration_sentences = True, 10
    with pytest.raises(BenchmarkError, match="between 1 and the 9 timed sentences"):
        solo.run_solo(args, specs(), 12, WARMUP, LATENCY, ORDER)


@pytest.mark.slow
def test_solo_end_to_end(dummy_data_bin, dummy_raw, tiny_teacher, tmp_path):
    """The benchmark with --solo on the tiny teacher (CTranslate2 rows where it is installed): every engine ran in a
    process of its own (not this one) in the environment of its chosen setting, decoded what the round-robin pass
    decoded, and the tables and results.json have it."""
    try:
        import ctranslate2  # noqa: F401

        ct2 = ["--ctranslate2"]
    except ImportError:
        ct2 = []
    argv = [dummy_data_bin, "--teacher", tiny_teacher, "--reference", os.path.join(dummy_raw, "test.tgt")]
    argv += ["--out-dir", str(tmp_path), "--cpu", "--post-process", "none", "--warmup", "2", "--latency-sentences"]
    argv += ["8", "--batch-size", "12", "--no-plots", "--solo", "--solo-calibration-sentences", "2"] + ct2
    results = benchmark.main(benchmark.get_parser().parse_args(argv))
    summary = results["solo"]
    engines = summary["engines"]
    expected = ["AR teacher, greedy", "AR teacher, greedy (plugin layout)"]
    if ct2:
        expected += ["AR teacher, greedy (CTranslate2)", "AR teacher, greedy (CTranslate2 int8)"]
    assert engines == expected
    processes = summary["engine_processes"]
    pids = [processes[name]["pid"] for name in engines]
    assert len(set(pids)) == len(engines) and os.getpid() not in pids
    for name in engines:  # what the child saw in its environment is the setting chosen for it
        chosen = summary["chosen"][name]
        seen = processes[name]
        assert (seen["omp_wait_policy"], seen["omp_num_threads"], seen["threads"]) == (
            chosen["omp_wait_policy"],
            str(chosen["threads"]),
            chosen["threads"],
        )
        assert set(summary["calibration"]["seconds"][name]) == {s.label for s in solo.settings(solo.available_cores())}
    rows = {row["name"]: row for row in results["rows"]}
    assert rows["AR teacher, beam 4"]["solo"] is None
    for name in engines:
        row = rows[name]["solo"]
        assert row["differing_sentences"] == 0 and len(row["latency_ratio_rounds"]) == 3 and row["ms_per_sentence"] > 0
    assert rows["AR teacher, greedy"]["solo"]["latency_ratio_rounds"] == [1.0] * 3
    # the plugin's greedy loop alone printed the teacher's greedy output: its verdict covers the solo pass
    solo_check = rows["AR teacher, greedy (plugin layout)"]["exact_check"]["solo"]
    assert (solo_check["sentences"], solo_check["differ"]) == (6, 0)
    assert rows["AR teacher, greedy"]["solo"]["linear_layout"] == solo.FAIRSEQ_LAYOUT
    plugin = rows["AR teacher, greedy (plugin layout)"]["solo"]
    assert plugin["linear_layout"] == summary["linear_layout"][str(plugin["threads"])]["layout"]
    assert summary["processes"] == len(solo.settings(solo.available_cores())) * (1 + bool(ct2)) + len(engines)
    assert summary["orchestrator_cpu_seconds"] < 0.25 * summary["wall_seconds"]  # it only waited
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        assert json.load(f)["solo"]["engines"] == engines
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "Solo (`--solo`): every engine alone in its own process" in markdown
    assert "| AR teacher, greedy (plugin layout) |" in markdown.split("Solo (`--solo`)")[1]
    assert "Solo calibration (engine: each setting's process times every engine" in markdown
    layout = results["meta"]["linear_layout"]
    assert layout["layout"] in ("weight-first", "torch") and f"**{layout['layout']}**" in markdown
    assert statistics.median(rows["AR teacher, greedy"]["solo"]["latency_ratio_rounds"]) == 1.0


def test_a_run_timing_fewer_sentences_than_the_calibration_is_not_calibrated(monkeypatch, tmp_path):
    """Without --solo-calibration-sentences, a run timing fewer sentences than the default calibration (a smoke run)
    starts no calibration process: every engine runs in the runtimes' default setting on every core, and the table
    says so; a number above the timed sentences is refused."""
    monkeypatch.setattr(solo, "DEFAULT_CALIBRATION_SENTENCES", len(LATENCY) + 1)
    result = fake_solo(monkeypatch, tmp_path, calibration_sentences=None)
    assert [name for _, name, *_ in FakeChild.log if name.startswith("calibrate")] == []
    assert result.summary["calibration"]["sentences"] == 0 and result.summary["processes"] == len(result.rows)
    assert {(s["omp_wait_policy"], s["threads"]) for s in result.summary["chosen"].values()} == {(None, 2)}
    rows = [
        SimpleNamespace(name=name, latency_ratio_rounds=[1.0] * 3, throughput_ratio_rounds=[1.0] * 3)
        for name in result.rows
    ]
    assert f"Solo calibration: none (fewer than {len(LATENCY) + 1} sentences timed)" in result.markdown(rows)
    monkeypatch.setattr(solo, "DEFAULT_CALIBRATION_SENTENCES", len(LATENCY))
    assert fake_solo(monkeypatch, tmp_path, calibration_sentences=None).summary["calibration"]["sentences"] == len(
        LATENCY
    )
    with pytest.raises(BenchmarkError, match="--solo-calibration-sentences"):
        fake_solo(monkeypatch, tmp_path, calibration_sentences=len(LATENCY) + 1)


def output(ids, text):
    """A round-robin output of token ``ids`` (the last one EOS) detokenized as ``text``."""
    return measure.Output(text, len(ids), ids=tuple(ids))


@pytest.mark.parametrize("ids", [(5, 7, 2), None], ids=["token-ids", "text-only"])
def test_a_solo_output_that_is_neither_the_teachers_nor_the_rows_own_is_a_divergence_no_near_tie_covers(ids):
    """Sentence 1 was a near-tie in the round-robin pass (the row's own output there, ``b'``); alone the row printed
    a third output (by its token ids, or its text where the engine gives no ids): that is not the output the near-tie
    was measured on, so it is a divergence without a gap, and the row no longer prints the teacher's greedy output
    (the verdict the report reads)."""
    greedy = {0: output([5, 2], "a"), 1: output([5, 6, 2], "b")}
    own = {0: output([5, 2], "a"), 1: output([5, 9, 2], "b'")}
    rows = [SimpleNamespace(name=ANCHOR, exact_check=None), SimpleNamespace(name=PLUGIN, exact_check=None)]
    rows[1].exact_check = {"1": measure.exact_check(own, greedy, lambda *_: 1e-6, 1e-4)}
    assert rows[1].exact_check["1"]["near_ties"] == 1  # the round-robin pass: exact up to a near-tie
    alone = {0: measure.SoloOutput("a", None if ids is None else (5, 2)), 1: measure.SoloOutput("b''", ids)}
    benchmark.add_solo_exact_checks(rows, 0, {1: (None, [greedy, own])}, {PLUGIN: {1: alone}}, 1e-4)
    check = rows[1].exact_check["solo"]
    assert check["divergences"] == [{"sentence": 1, "position": None, "log_prob_gap": None}], check
    assert (check["differ"], check["near_ties"]) == (1, 0), check
    measured = catalogue.Measured({PLUGIN: {"name": PLUGIN, "exact_check": rows[1].exact_check}}, [], ())
    assert not measured.same_output(measured.row(PLUGIN), {"name": ANCHOR})


def rig_gap(model, net_input, prefix, token, other, gap):
    """Set the output projection row of ``other`` so that, after ``prefix`` (BOS first), the model's log-probability
    of ``other`` is ``gap`` below that of ``token`` (the row of ``token`` minus ``gap`` along the decoder's features
    there; every other logit unchanged)."""
    with torch.no_grad():
        encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
        features = model.decoder.extract_features(torch.tensor([prefix]), encoder_out=encoder_out)[0][0, -1]
        weight = model.decoder.output_projection.weight
        weight[other] = weight[token] - gap * features / features.dot(features)


def test_an_fp32_divergence_a_hundredth_of_a_nat_apart_is_no_near_tie(dummy_data_bin, dummy_raw, sat_task, tmp_path):
    """The benchmark's exact check in fp32 (its tolerance for a run without --fp16, the teacher's log-probabilities
    scored by the greedy teacher row's model): a row whose output differs from the teacher's greedy output where the
    teacher prefers its own token by 0.01 (a real preference, thousands of times fp32 rounding) is a divergence,
    not a near-tie; one at a gap of fp32 rounding (1e-6) is a near-tie."""
    checkpoint = str(tmp_path / "teacher.pt")
    random_teacher(sat_task, 0, checkpoint, data=dummy_data_bin)
    argv = [dummy_data_bin, "--teacher", checkpoint, "--reference", os.path.join(dummy_raw, "test.tgt")]
    args = benchmark.get_parser().parse_args(argv + ["--out-dir", str(tmp_path), "--cpu", "--post-process", "none"])
    spec = teacher_specs(checkpoint, 4)[1]
    teacher = measure.FairseqRunner(spec, measure.generation_cfg(args, spec, False), 1, 40)
    model, eos = teacher.decoder.generation.models[0], sat_task.target_dictionary.eos()
    outputs = {i: teacher.decode(teacher.inputs([i]))[0]["tokens"].tolist() for i in range(8)}
    sentence, ids = next((i, ids) for i, ids in outputs.items() if len(ids) >= 3)
    others = [x for x in range(sat_task.target_dictionary.nspecial, len(sat_task.target_dictionary)) if x not in ids]
    tolerance = benchmark.NEAR_TIE_TOLERANCE["fp16" if args.fp16 else "fp32"]  # as benchmark.main picks it
    for other, gap, near_tie in ((others[0], 0.01, False), (others[1], 1e-6, True)):
        rig_gap(model, teacher.inputs([sentence])["net_input"], [eos, ids[0]], ids[1], other, gap)
        assert teacher.decode(teacher.inputs([sentence]))[0]["tokens"].tolist() == ids  # still the greedy output
        assert teacher.log_prob_gap(sentence, ids[:1], other, ids[1]) == pytest.approx(gap, rel=0.05, abs=1e-6)
        rows = [SimpleNamespace(exact_check=None), SimpleNamespace(exact_check=None)]
        greedy, diverged = {sentence: output(ids, "g")}, {sentence: output([ids[0], other, eos], "d")}
        benchmark.add_exact_checks(rows, [teacher, teacher], 0, {1: (None, [greedy, diverged])}, tolerance)
        check = rows[1].exact_check["1"]
        assert check["differ"] == 1 and check["divergences"][0]["position"] == 1, check
        assert check["near_ties"] == int(near_tie), f"gap {gap} in fp32 (tolerance {tolerance}): {check}"


def test_the_solo_batched_pass_is_checked_against_the_teacher_too(monkeypatch, tmp_path):
    """With ``--solo-batched`` the solo batched pass, whose throughput the claims read, is checked like the batch-1
    one (by token ids): ``exact_check["solo 4"]`` beside ``["solo"]``; a batched sentence that is neither the teacher's
    nor the row's own round-robin output is a divergence, and the row is no longer exact."""
    result = fake_solo(monkeypatch, tmp_path)
    assert sorted(result.outputs[PLUGIN]) == [1, 4] and result.outputs[PLUGIN][4][0] == measure.SoloOutput("h0", (0, 2))
    assert result.outputs[INT8][1][2].ids is None  # CTranslate2 returns text only

    def pass_outputs(sentences, changed=()):
        return {i: output([i, 3] if i in changed else [i, 2], f"h{i}") for i in sentences}

    timings = {1: (None, [pass_outputs(LATENCY), pass_outputs(LATENCY)]), 4: (None, [pass_outputs(ORDER)] * 2)}
    rows = [SimpleNamespace(name=ANCHOR, exact_check=None), SimpleNamespace(name=PLUGIN, exact_check=None)]
    rows[1].exact_check = {str(size): measure.exact_check(o[1], o[0], None, 1e-4) for size, (_, o) in timings.items()}
    benchmark.add_solo_exact_checks(rows, 0, timings, {PLUGIN: result.outputs[PLUGIN]}, 1e-4)
    assert rows[1].exact_check["solo"]["differ"] == 0 and rows[1].exact_check["solo 4"]["differ"] == 0
    assert rows[1].exact_check["solo 4"]["sentences"] == len(ORDER)
    # the teacher's round-robin batched output differs at sentence 5 (the same text from other tokens): the solo
    # batched pass printed something else than the teacher there
    timings[4] = (None, [pass_outputs(ORDER, changed={5}), pass_outputs(ORDER, changed={5})])
    benchmark.add_solo_exact_checks(rows, 0, timings, {PLUGIN: result.outputs[PLUGIN]}, 1e-4)
    check = rows[1].exact_check["solo 4"]
    assert check["divergences"] == [{"sentence": 5, "position": None, "log_prob_gap": None}]
    measured = catalogue.Measured({PLUGIN: {"name": PLUGIN, "exact_check": rows[1].exact_check}}, [], ())
    assert not measured.same_output(measured.row(PLUGIN), {"name": ANCHOR})
