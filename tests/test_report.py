"""The quickstart's report: the preset's targets (nat_recipes.catalogue) checked against the benchmark's rows, a
target whose row is missing refused, the teacher's curve and step times from the run's logs; and the builders'
tools: the one that puts a report into docs/results.md (dev/results_section.py), the one that pools seeds
(dev/seed_gain.py) and the decoding counts (dev/decode_stats.py)."""

import importlib.util
import json
import os

import pytest

from nat_plugins.bench.rows import CT2_GREEDY, TEACHER_BEAM, TEACHER_GREEDY, TEACHER_GREEDY_PLUGIN
from nat_recipes import catalogue
from nat_recipes import run_report as report

from .utils import REPO_ROOT

META = {
    "date": "2026-11-24T00:00:00",
    "device": "AMD EPYC 7B13 (2 threads)",  # the kind the README's claims were measured on
    "torch": "2",
    "fairseq": "0.12",
    "nat_plugins": "0.1",
    "precision": "fp32",
}


def row(name, bleu, latency, role="system", **extra):
    return {
        "name": name,
        "role": role,
        "bleu": bleu,
        "latency_ms_median": latency,
        "latency_round_seconds": [latency / 1000, 1.1 * latency / 1000, 0.9 * latency / 1000],
        "hyp_file": f"hyp.{len(name)}-{bleu}.txt",
        "latency_speedup_vs_ar_beam": 100.0 / latency,
        "latency_speedup_vs_ar_greedy": 80.0 / latency,
        **extra,
    }


def write_run(work, rows, paired=(), meta=META):
    bench = os.path.join(work, "bench")
    os.makedirs(bench, exist_ok=True)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    with open(os.path.join(bench, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "paired_tests": list(paired)}, f)
    with open(os.path.join(bench, "results.md"), "w") as f:
        f.write("# Decoding benchmark\n\n| system | BLEU |\n")
    for r in rows:
        with open(os.path.join(bench, r["hyp_file"]), "w") as f:
            same = "frozen" in r["name"] or r["name"].startswith("Speculative") or r["role"] == TEACHER_GREEDY
            f.write("same\n" if same else "other\n")
    with open(os.path.join(work, "logs", "teacher.log"), "w") as f:
        for updates, loss in ((250, 5.5), (500, 4.75)):
            f.write(
                f"x | valid | epoch 001 | valid on 'valid' subset | loss {loss} | nll_loss 4.0 | ppl 16.00 | wps 1 "
                f"| num_updates {updates}\n"
            )
    with open(os.path.join(work, "logs", "steps.tsv"), "w") as f:
        f.write("teacher\t100\nsat-2\t30\nteacher\t125\n")


def exact_check(*differ_near_ties):
    """A row's ``exact_check`` in results.json: per timed pass (batch 1, batch 64) the sentences that differ from the
    greedy teacher's output and how many of them are near-ties."""
    return {
        size: {"sentences": 100, "differ": differ, "near_ties": near_ties}
        for size, (differ, near_ties) in zip(("1", "64"), differ_near_ties)
    }


def cpu_long_rows():
    """Every row of a cpu-long run: the teacher's two and the catalogue's, each with a measurement the test needs."""
    measured = {
        "SAT K=2, beam 4": row("SAT K=2, beam 4", 28.6, 60.0),  # 95.3% of the teacher: met
        "SAT K=4, greedy": row("SAT K=4, greedy", 23.0, 30.0),  # 76.7%: missed
        "Blockwise k=4 frozen, exact": row(
            "Blockwise k=4 frozen, exact", 29.0, 60.0, tokens_per_call=1.6, exact_check=exact_check((0, 0), (0, 0))
        ),
        "Blockwise k=4 fine-tuned, exact": row("Blockwise k=4 fine-tuned, exact", 27.5, 50.0, tokens_per_call=2.5),
        "Speculative k=3, exact": row(  # two near-ties at batch 1: exact
            "Speculative k=3, exact",
            29.0,
            40.0,
            tokens_per_step=3.2,
            drafting_ms_per_call=0.8,
            verify_ms_per_call=1.25,
            latency_speedup_vs_ct2_greedy=0.9,
            exact_check=exact_check((2, 2), (0, 0)),
        ),
        catalogue.NAD_AD_ROW: row(catalogue.NAD_AD_ROW, 30.5, 110.0),  # against its AR twin, the teacher's beam row
        catalogue.FAIRSEQ_NAT_ROW: row(catalogue.FAIRSEQ_NAT_ROW, 10.0, 5.0),
        catalogue.FAIRSEQ_CMLM_ROW: row(catalogue.FAIRSEQ_CMLM_ROW, 12.0, 50.0),
    }
    teacher = [
        row("AR teacher, beam 4", 30.0, 100.0, TEACHER_BEAM),
        row("AR teacher, greedy", 29.0, 80.0, TEACHER_GREEDY),
    ]
    return teacher + [measured.get(r.name) or row(r.name, 25.0, 20.0) for r in catalogue.rows("cpu-long")]


def verdicts_of(text):
    return {
        line.split(" | ")[0][2:]: line.rsplit(" | ", 2)[1:]
        for line in text.splitlines()
        if line.startswith("| ") and line.endswith(("yes |", "**no** |"))
    }


@pytest.mark.parametrize("tokens, met", [(3.1, True), (2.4, False)])
def test_the_speculative_target_reads_each_engine_alone_tokens_per_call_and_ctranslate2_float32(tokens, met):
    """The main job's speculative bar: batch 1 vs fairseq greedy and vs CTranslate2's float32 greedy search, each
    engine alone where the run timed it so, and tokens per teacher call; a bar the row misses says so."""
    speculative = row(
        "Speculative k=3, exact",
        29.0,
        10.0,
        tokens_per_step=tokens,
        exact_check=exact_check((0, 0), (0, 0)),
        solo={"latency_speedup_vs_ar_greedy": 2.6},
    )
    ct2 = row(catalogue.CT2_GREEDY_ROW, 29.0, 5.0, solo={"latency_speedup_vs_ar_greedy": 2.4})
    greedy = row("AR teacher, greedy", 29.0, 80.0, TEACHER_GREEDY)
    measured = catalogue.Measured({r["name"]: r for r in (speculative, ct2, greedy)}, [], ())
    (target,) = catalogue.SPEC_DRAFTER.targets["cpu"]
    text, ok = target.check(measured)
    assert ok is met
    assert text == (
        f"identical to greedy, {tokens:.2f} tokens per teacher call, 2.60x vs greedy (each engine alone), "
        "1.08x CTranslate2 float32 greedy"
    )
    assert ">= 3.0 tokens per teacher call" in target.what and ">= 1.0x CTranslate2 float32 greedy" in target.what


def test_cpu_long_targets_are_checked_against_the_rows(tmp_path):
    paired = [{"system": catalogue.NAD_AD_ROW, "p_value": 0.04}]
    write_run(str(tmp_path), cpu_long_rows(), paired)
    text = report.build_report(str(tmp_path), "cpu-long")
    verdicts = verdicts_of(text)
    assert len(verdicts) == len(catalogue.targets("cpu-long"))  # every target checked
    assert verdicts["SAT K=2, beam 4: BLEU >= 95% of the teacher's beam"] == ["95.3% at 1.67x vs beam", "yes |"]
    assert verdicts["SAT K=4, greedy: BLEU >= 80% of the teacher's beam"][1] == "**no** |"
    frozen = next(v for k, v in verdicts.items() if k.startswith("Blockwise k=4 frozen"))
    assert frozen == ["identical to greedy, block 1.60, 1.33x vs greedy", "yes |"]
    finetuned = next(v for k, v in verdicts.items() if k.startswith("Blockwise k=4 fine-tuned"))
    assert finetuned[1] == "**no** |"
    spec = next(v for k, v in verdicts.items() if k.startswith("Speculative k=3, exact"))  # the row the run makes
    assert spec == [
        "identical to greedy, 3.20 tokens per teacher call (drafter 0.80 ms, teacher 1.25 ms a call), 2.00x vs greedy "
        "(round-robin)",
        "yes |",
    ]
    nad = next(v for k, v in verdicts.items() if k.startswith(catalogue.NAD_AD_ROW))
    assert nad == ["+0.50 BLEU (p = 0.040), +10% time", "yes |"]
    fairseq = next(v for k, v in verdicts.items() if k.startswith("every plugin row"))
    assert fairseq[1] == "yes |" and "SAT K=2, beam 4: BLEU" in fairseq[0]
    assert "250 updates: loss 5.500 / ppl 16.00, 500 updates: loss 4.750" in text
    assert "| teacher | 2 min 05 s |" in text and "| all steps | 2 min 35 s |" in text  # the last run of a step
    assert str(tmp_path) not in text  # nothing of the machine's paths


def test_exact_means_every_difference_in_every_timed_pass_is_a_near_tie(tmp_path):
    """An exact row's hypothesis file (the batched pass) can equal the greedy teacher's while its batch-1 pass, every
    sentence drafted, differs: the targets "= the teacher's greedy output" read the benchmark's exact check of every
    pass, where only near-ties may differ; a row the benchmark did not check is not exact."""
    rows = cpu_long_rows()
    for r in rows:
        if r["name"] == "Speculative k=3, exact":
            r["exact_check"] = exact_check((3, 2), (0, 0))  # one real divergence at batch 1, none at batch 64
        if r["name"] == "Blockwise k=4 frozen, exact":
            del r["exact_check"]
    write_run(str(tmp_path), rows)
    verdicts = verdicts_of(report.build_report(str(tmp_path), "cpu-long"))
    spec = next(v for k, v in verdicts.items() if k.startswith("Speculative k=3, exact"))
    assert spec[0].startswith("differs from greedy") and spec[1] == "**no** |"
    frozen = next(v for k, v in verdicts.items() if k.startswith("Blockwise k=4 frozen"))
    assert frozen[0].startswith(catalogue.NO_EXACT_CHECK) and frozen[1] == "**no** |"  # a failure, named as one
    measured = catalogue.Measured({r["name"]: r for r in rows}, [], ())
    greedy = measured.role(TEACHER_GREEDY)
    assert measured.same_output(greedy, greedy)  # the reference itself


def test_a_target_whose_row_the_benchmark_lacks_is_an_error(tmp_path, capsys):
    rows = [r for r in cpu_long_rows() if r["name"] != "RecoverSAT K=2"]
    write_run(str(tmp_path), rows)
    with pytest.raises(catalogue.MissingRow, match="'RecoverSAT K=2'"):
        report.build_report(str(tmp_path), "cpu-long")
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path), "--preset", "cpu-long"])
    assert exit_info.value.code == 2 and "RecoverSAT K=2" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "report.md")


def claimed_rows(speed_share=1.0, bleu_drop=0.0, solo_share=None):
    """A cpu run whose every README claim is measured at ``speed_share`` of its speed-up and ``bleu_drop`` below its
    BLEU (the exact rows print the teacher's greedy output); ``solo_share``: the one-process-per-engine speed-ups
    at that share instead (the round-robin ones then halved)."""
    roles = {catalogue.TEACHER_BEAM_ROW: TEACHER_BEAM, catalogue.TEACHER_GREEDY_ROW: TEACHER_GREEDY}
    rows = []
    for claim in catalogue.README_CLAIMS["cpu"]:
        measured = row(claim.row, claim.bleu - bleu_drop, 20.0, roles.get(claim.row, "system"))
        if claim.exact:  # checked by the benchmark in every pass: one near-tie at batch 1
            measured["exact_check"] = exact_check((1, 1), (0, 0))
        for key, claimed in (("latency", claim.speedup), ("throughput", claim.batched or 1.0)):
            measured[f"{key}_speedup_vs_ar_greedy"] = claimed * speed_share
            if solo_share is not None:
                measured.setdefault("solo", {})[f"{key}_speedup_vs_ar_greedy"] = claimed * solo_share
                measured[f"{key}_speedup_vs_ar_greedy"] = claimed * speed_share / 2
        rows.append(measured)
    # the rows of the ONNX Runtime targets the README does not claim: CTranslate2's float32 greedy search and the NAT
    # through ONNX Runtime at the speeds and BLEU that meet them
    nat = next(r for r in rows if r["name"] == "NAT, argmax fertility")
    same = {"sentences": 100, "differ": 0, "near_ties": 0, "divergences": []}
    rows.append(row(catalogue.CT2_GREEDY_ROW, 28.0, 20.0, latency_speedup_vs_ar_greedy=5.0))
    rows.append(
        row(
            catalogue.ONNX_ROWS["float32"],
            nat["bleu"],
            20.0,
            latency_speedup_vs_ar_greedy=6.0,
            twin_check={"reference": nat["name"], "passes": {"1": same}},
        )
    )
    ct2_int8 = next(r for r in rows if r["name"] == catalogue.CT2_INT8_GREEDY_ROW)
    rows.append(
        row(
            catalogue.ONNX_ROWS["int8"],
            nat["bleu"],
            20.0,
            latency_speedup_vs_ar_greedy=1.6 * ct2_int8["latency_speedup_vs_ar_greedy"],
        )
    )
    # the fine-tuned NAT decoded with NPD: the row of Gu et al.'s NPD target (its argmax row is a README claim)
    rows.append(row("NAT+FT, NPD S=10", nat["bleu"] + 1.6, 100.0))
    return rows


@pytest.mark.parametrize(
    "speed_share, bleu_drop, solo_share, met",
    [
        (0.8, 0.9, None, True),  # within both tolerances
        (0.7, 0.0, None, False),  # 30% slower than the README says
        (1.0, 1.2, None, False),  # 1.2 BLEU below it
        (1.0, 0.0, 0.8, True),  # each engine alone: the headline, read before the round-robin ratios
        (1.0, 0.0, 0.5, False),
    ],
)
def test_the_main_job_checks_the_readme_numbers(tmp_path, speed_share, bleu_drop, solo_share, met):
    """PRESET=cpu's report says met/missed for every number of the README's systems table."""
    write_run(str(tmp_path), claimed_rows(speed_share, bleu_drop, solo_share))
    report.main([str(tmp_path), "--preset", "cpu"])
    text = (tmp_path / "report.md").read_text()
    verdicts = verdicts_of(text)
    assert len(verdicts) == len(catalogue.targets("cpu")) and "| system | BLEU |" in text
    claim = next(c for c in catalogue.README_CLAIMS["cpu"] if c.row == "NAT, argmax fertility")
    nat = next(v for k, v in verdicts.items() if k.startswith(f"README: {claim.row} {claim.text()}"))
    assert nat[1] == ("yes |" if met else "**no** |")
    assert ("each engine alone" in nat[0]) == (solo_share is not None)
    exact = [v for k, v in verdicts.items() if k.startswith("README: ") and "exact" in k]
    assert len(exact) == 2 and all("the teacher's greedy output" in v[0] for v in exact)


@pytest.mark.parametrize(
    "device, speed_checked",
    [
        ("AMD EPYC (2 threads)", True),
        ("Intel(R) Xeon(R) CPU @ 2.20GHz (2 threads)", False),
        ("NVIDIA H200", False),
    ],
)
def test_the_readme_speed_ups_are_checked_on_the_cpu_kind_they_were_measured_on(tmp_path, device, speed_checked):
    """Speed-ups move with the CPU: on another kind than the claims' (an Intel Xeon for the AMD EPYC's numbers) the
    report checks the README's BLEU and exactness and says it did not check the speed-ups, rather than call a
    slower CPU's speed a miss; a BLEU below the claim is still one."""
    for bleu_drop, met in ((0.0, True), (1.2, False)):
        write_run(str(tmp_path), claimed_rows(speed_share=0.5, bleu_drop=bleu_drop), meta={**META, "device": device})
        report.main([str(tmp_path), "--preset", "cpu"])
        verdicts = verdicts_of((tmp_path / "report.md").read_text())
        claims = [v for k, v in verdicts.items() if k.startswith("README: ")]
        assert len(claims) == len(catalogue.README_CLAIMS["cpu"])
        nat = next(v for k, v in verdicts.items() if k.startswith("README: NAT, argmax fertility"))
        if speed_checked:
            assert all(v[1] == "**no** |" for v in claims)  # half the claimed speed-ups
        else:
            assert all("speed-ups not checked: the README's are an AMD EPYC's" in v[0] for v in claims)
            assert nat[1] == ("yes |" if met else "**no** |")


def test_the_report_says_how_each_row_was_made(tmp_path):
    """Which initialisation and which protocol each row used, where the paper leaves a choice or the recipe departs
    from it: the initialisation scope of the students, NPD's candidates counting the argmax."""
    write_run(str(tmp_path), claimed_rows())
    report.main([str(tmp_path), "--preset", "cpu"])
    made = dict(
        line.split(" | ")[:2]
        for line in (tmp_path / "report.md").read_text().split("How each row was made")[1].splitlines()
        if line.startswith("| ") and not line.startswith("| row |")
    )
    assert "--init-from-ar-scope all" in made["| SAT K=2, greedy"]
    assert "--npd-candidates argmax_and_samples" in made["| NAT, NPD S=10"]
    assert "splits at any subword" in made["| RecoverSAT K=2"]
    assert set(made) >= {f"| {name}" for name in catalogue.plugin_rows("cpu")}


def dev_module(name):
    """The builders' tool dev/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, f"dev/{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_presets_section_of_the_results_file_is_replaced_in_place(tmp_path):
    results_section = dev_module("results_section")
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nkept above\n")
    results_section.replace_section(str(doc), "cpu-long", "first\n")
    results_section.replace_section(str(doc), "gpu", "gpu body\n")
    results_section.replace_section(str(doc), "cpu-long", "second\n")
    text = doc.read_text()
    assert text.startswith("# Results\n\nkept above\n") and "first" not in text
    assert text.count("<!-- report:cpu-long -->\nsecond\n<!-- /report:cpu-long -->") == 1
    assert "<!-- report:gpu -->\ngpu body\n<!-- /report:gpu -->" in text


def solo_run(work):
    """A run whose greedy engines were timed alone (three rounds) and whose beam row only round-robin."""
    greedy, ct2, spec = catalogue.TEACHER_GREEDY_ROW, catalogue.CT2_INT8_GREEDY_ROW, "Speculative k=3, exact"
    seconds = {greedy: [2.0, 2.2, 1.8], ct2: [0.2, 0.2, 0.3], spec: [1.0, 1.0, 1.2]}
    rows = [
        row(catalogue.TEACHER_BEAM_ROW, 30.0, 80.0, TEACHER_BEAM, latency_ratio_rounds=[0.6, 0.7, 0.65]),
        row(greedy, 29.0, 50.0, TEACHER_GREEDY, decoder_calls_per_sentence=14.0, rep_ratio=12.04),
        row(ct2, 28.9, 3.0, CT2_GREEDY, throughput_ratio_rounds=[5.0, 6.0, 5.5]),
        row(spec, 29.0, 30.0, exact_check=exact_check((0, 0), (1, 1)), decoder_calls_per_sentence=11.5),
    ]
    for r in rows[1:]:
        r["solo"] = {
            "ms_per_sentence": 10 * seconds[r["name"]][0],
            "latency_ratio_rounds": [2.0, 2.2, 1.5],
            "latency_speedup_vs_ar_greedy": 2.0,  # their median, as the solo pass writes it
        }
    write_run(work, rows)
    path = os.path.join(work, "bench", "results.json")
    with open(path) as f:
        results = json.load(f)
    results["meta"].update(batch_size=64, num_sentences=1000, latency_sentences_timed=100)
    results["solo"] = {"per_round_seconds": {name: {"1": values} for name, values in seconds.items()}}
    with open(path, "w") as f:
        json.dump(results, f)


EXACT_ROW_BAR = "| Speculative k=3, exact: = the teacher's greedy output in every timed pass"


def test_the_summary_has_one_line_per_row_timed_alone_where_the_run_did(tmp_path):
    """docs/results.md's short form: each row's batch-1 time alone where the run timed it alone (else round-robin),
    its speed-up over the fastest CTranslate2 engine from the same rounds, and whether it printed greedy's output."""
    solo_run(str(tmp_path))
    text = report.build_summary(str(tmp_path), "cpu", "img/x-", "runs/x.md", only="spec-drafter")
    table = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in text.splitlines() if line.startswith("| ")}
    assert table[catalogue.TEACHER_BEAM_ROW][2:5] == ["round-robin", "80.0", "0.65× (0.60–0.70)"]
    spec = table["Speculative k=3, exact"]
    assert spec[1:4] == ["1", "alone", "10.0"]  # the differing sentence (a near-tie) counted
    assert spec[5] == "0.20× (0.20–0.25)"  # CTranslate2's seconds over its own, round by round
    assert table[catalogue.TEACHER_GREEDY_ROW][-2:] == ["14.00", "12.0 |"]
    assert "Wall time: 2 min 35 s over the steps" in text and "pareto" not in text  # no plot in this run
    assert "[runs/x.md](runs/x.md)" in text
    # a run on the user's own teacher has the bars of its exact rows (no README claim: those are the quickstart's)
    bar = next(line for line in text.splitlines() if line.startswith(EXACT_ROW_BAR))
    assert (
        "identical to greedy (passes: 1, 64), BLEU 29.00 (greedy 29.00), 2.00x vs greedy (each engine alone) | yes |"
        in (bar)
    )
    path = tmp_path / "bench" / "results.json"
    results = json.loads(path.read_text())
    (spec,) = [r for r in results["rows"] if r["name"] == "Speculative k=3, exact"]
    spec["exact_check"]["solo"] = {"sentences": 100, "differ": 1, "near_ties": 0, "divergences": []}
    path.write_text(json.dumps(results))
    text = report.build_summary(str(tmp_path), "cpu", "img/x-", "runs/x.md", only="spec-drafter")
    bar = next(line for line in text.splitlines() if line.startswith(EXACT_ROW_BAR))
    assert "differs from greedy (passes: 1, 64, solo)" in bar and bar.endswith("| **no** |")  # alone it differed


@pytest.mark.parametrize(
    "change, measured",
    [
        ({"bleu": 28.5}, "identical to greedy (passes: 1, 64), BLEU 28.50 (greedy 29.00), 2.00x vs greedy"),
        ({"solo_speedup": 0.8}, "identical to greedy (passes: 1, 64), BLEU 29.00 (greedy 29.00), 0.80x vs greedy"),
    ],
    ids=["other-bleu", "slower-than-greedy"],
)
def test_an_own_teachers_exact_row_misses_its_bar_on_bleu_or_speed_alone(tmp_path, change, measured):
    """An own teacher's exact row promises three things: the teacher's greedy output, its BLEU and at least greedy's
    speed. A row whose exact check finds no real divergence still misses the bar when its BLEU is not the greedy
    row's (its hypotheses are not the ones scored) or it is slower than fairseq's greedy search."""
    solo_run(str(tmp_path))
    path = tmp_path / "bench" / "results.json"
    results = json.loads(path.read_text())
    (spec,) = [r for r in results["rows"] if r["name"] == "Speculative k=3, exact"]
    spec["bleu"] = change.get("bleu", spec["bleu"])
    spec["solo"]["latency_speedup_vs_ar_greedy"] = change.get("solo_speedup", 2.0)
    path.write_text(json.dumps(results))
    text = report.build_summary(str(tmp_path), "cpu", only="spec-drafter")
    bar = next(line for line in text.splitlines() if line.startswith(EXACT_ROW_BAR))
    assert measured in bar and bar.endswith("| **no** |"), bar


def test_an_own_teachers_report_checks_what_its_command_promises_not_the_multi30k_targets(tmp_path):
    """PRESET=cpu's bar on exact speculative decoding (>= 2.5x greedy, >= 3 tokens per teacher call, >= 1x
    CTranslate2) is about the quickstart's Multi30k teacher: a run on your own teacher (``--only``) checks what its
    command promises (the README: the exact rows print the teacher's greedy output, with its BLEU, at least as fast
    as fairseq's greedy search), so a run that keeps that promise misses no bar."""
    solo_run(str(tmp_path))
    for text in (
        report.build_report(str(tmp_path), "cpu", only="spec-drafter"),
        report.build_summary(str(tmp_path), "cpu", only="spec-drafter"),
    ):
        verdicts = verdicts_of(text)
        assert list(verdicts) == [EXACT_ROW_BAR[2:] + ", its BLEU, >= 1.0x greedy"], verdicts
        assert verdicts[EXACT_ROW_BAR[2:] + ", its BLEU, >= 1.0x greedy"][1] == "yes |"


def test_an_exact_row_without_its_exactness_check_misses_its_bar(tmp_path):
    """The benchmark checks a row against the teacher's greedy output only where the row's verifier has the teacher's
    weights: an exact row that lost its check (another checkpoint as its verifier) fails its bar, said so, on an own
    teacher's run as on the Multi30k presets."""
    solo_run(str(tmp_path))
    path = tmp_path / "bench" / "results.json"
    results = json.loads(path.read_text())
    (spec,) = [r for r in results["rows"] if r["name"] == "Speculative k=3, exact"]
    del spec["exact_check"]
    path.write_text(json.dumps(results))
    bar = next(
        line
        for line in report.build_report(str(tmp_path), "cpu", only="spec-drafter").splitlines()
        if line.startswith(EXACT_ROW_BAR)
    )
    assert "| no exactness check (the row's verifier is not the teacher's weights), BLEU 29.00" in bar, bar
    assert bar.endswith("| **no** |")
    measured = catalogue.Measured({r["name"]: r for r in results["rows"]}, [], ())
    for target in (catalogue.Speculative(spec["name"], 1.0), catalogue.Claim(spec["name"], 29.0, 1.0, exact=True)):
        text, met = target.check(measured)
        assert catalogue.NO_EXACT_CHECK in text and not met, text


def test_the_summary_compares_every_row_with_the_plugins_greedy_loop_where_the_run_has_it(tmp_path):
    """On a GPU the plugin's greedy loop (CUDA graphs) is the honest baseline beside fairseq's eager search: a run
    with its row gets a × plugin greedy column, alone against alone and round-robin against round-robin."""
    solo_run(str(tmp_path))
    assert "× plugin greedy" not in report.build_summary(str(tmp_path), "cpu", only="spec-drafter")
    path = tmp_path / "bench" / "results.json"
    results = json.loads(path.read_text())
    plugin = "AR teacher, greedy (plugin layout)"
    results["rows"].append(row(plugin, 29.0, 40.0, TEACHER_GREEDY_PLUGIN))
    results["rows"][-1]["solo"] = {"ms_per_sentence": 15.0, "latency_ratio_rounds": [1.3, 1.3, 1.3]}
    results["solo"]["per_round_seconds"][plugin] = {"1": [1.5, 1.5, 1.5]}
    results["rows"][0]["speedup_rounds"] = {"latency_speedup_vs_ar_greedy_plugin": [0.5, 0.4, 0.6]}
    path.write_text(json.dumps(results))
    text = report.build_summary(str(tmp_path), "cpu", only="spec-drafter")
    assert f"× plugin greedy: against *{plugin}*" in text
    header = next(line for line in text.splitlines() if line.startswith("| system |")).split(" | ")
    table = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in text.splitlines() if line.startswith("| ")}
    column = header.index("× plugin greedy") - 1
    assert table["Speculative k=3, exact"][column] == "1.50× (1.25–1.50)"  # its seconds 1.0, 1.0, 1.2 alone
    assert table[catalogue.TEACHER_BEAM_ROW][column] == "0.50× (0.40–0.60)"  # round-robin
    assert table[catalogue.TEACHER_GREEDY_ROW][column] == "0.75× (0.68–0.83)"


def test_students_trained_side_by_side_count_once_in_the_wall_time(tmp_path):
    """On a GPU the students train STUDENT_JOBS at a time: the run's wall time counts their group's wall time (the
    quickstart's "phase" line), not the sum of its steps; each such step is marked side by side."""
    solo_run(str(tmp_path))
    with open(tmp_path / "logs" / "steps.tsv", "w") as f:
        f.write("teacher\t100\t\nsat-2\t200\tside by side\nnad-ad\t150\tside by side\n")
        f.write("students, 2 at a time\t210\tphase\nbenchmark-1a2b\t60\t\n")
    summary = report.build_summary(str(tmp_path), "cpu", "img/x-", "runs/x.md", only="spec-drafter")
    assert "Wall time: 6 min 10 s over the steps (set-up not counted): teacher 1 min 40 s, sat-2 (side by side) " in (
        summary
    )
    assert "students, 2 at a time 3 min 30 s, benchmark 1 min 00 s; training 5 min 10 s." in summary
    full = report.build_report(str(tmp_path), "cpu", only="spec-drafter")
    assert "| nad-ad (side by side) | 2 min 30 s |" in full and "| all steps | 6 min 10 s |" in full


def test_a_run_goes_into_the_docs_as_a_section_and_a_full_report(tmp_path, monkeypatch):
    solo_run(str(tmp_path / "work"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "results.md").write_text("# Results\n\n<!-- report:mine -->\nold\n<!-- /report:mine -->\nkept\n")
    argv = ["results_section", str(tmp_path / "work"), "--preset", "cpu", "--section", "mine", "--only", "spec-drafter"]
    monkeypatch.setattr("sys.argv", argv + ["--docs", str(docs / "results.md")])
    dev_module("results_section").main()
    text = (docs / "results.md").read_text()
    assert "old" not in text and text.endswith("<!-- /report:mine -->\nkept\n") and "| Speculative k=3" in text
    assert (docs / "runs" / "mine.md").read_text().startswith("# Run `mine`: the full report")


def test_a_gain_over_seeds_pools_each_seeds_pair_of_hypotheses():
    seed_gain = dev_module("seed_gain").seed_gain
    references = ["a man rides a red bike", "two dogs play in the snow", "a girl reads a book"]
    good = {"hyps": list(references)}
    worse = {"hyps": ["a man rides a bike", "two dogs in snow", "a girl a book"]}
    baselines = [{**worse, "name": f"base {i}", "bleu": 40.0 + i} for i in (1, 2, 3)]
    systems = [{**good, "name": f"sys {i}", "bleu": 42.0 + 2 * i} for i in (1, 2, 3)]
    result = seed_gain(baselines, systems, references)
    assert [seed["system"] for seed in result["seeds"]] == ["sys 1", "sys 2", "sys 3"]
    assert all(0 < seed["p_value"] <= 0.05 for seed in result["seeds"])  # each seed's own paired test
    assert "| 1 | 41.00 | 44.00 | +3.00 | 0.0010 |" in dev_module("seed_gain").markdown(result)
    assert result["gain"] == pytest.approx((4.0, 1.0))  # gains 3, 4, 5: mean 4, sample std 1
    pooled = result["pooled"]
    assert pooled["system_bleu"] == pytest.approx(100.0) and pooled["baseline_bleu"] < 100.0
    assert pooled["delta"] == pytest.approx(pooled["system_bleu"] - pooled["baseline_bleu"])
    with pytest.raises(ValueError, match="one of each per seed"):
        seed_gain(baselines, systems[:2], references)


def test_decoder_calls_tokens_and_recover_sat_segments_are_counted(tmp_path):
    decode_stats = dev_module("decode_stats")
    output = tmp_path / "gen.out"
    output.write_text(
        "S-0\tsource\nH-0\t-0.5\t▁Ein ▁Mann ▁läuft .\nP-0\t-1 -1 -1 -1 -1\nI-0\t2\n"
        "SEG-0\t▁Ein ▁Mann | ▁läuft .\n"
        "P-1\t-1 -1 -1 -1 -1\nI-1\t4\nSEG-1\t▁Ein ▁Hund ▁bellt . | ▁Ein ▁Hund <del>\n"
        "P-2\t-1 -1 -1 -1 -1\nI-2\t2\nSEG-2\t▁Zwei ▁Katzen | ▁Zwei ▁Katzen\n"
        "P-3\t-1 -1\nI-3\t2\nSEG-3\t▁Ja | \n"
    )
    stats = decode_stats.decode_stats(decode_stats.read_generate_output(str(output)))
    first, second = stats["segments"]
    assert first == {"empty": 0.0, "deleted": 0.0, "restarts": 0.0}
    assert second == {"empty": 25.0, "deleted": 25.0, "restarts": 50.0}
    assert stats["calls_per_sentence"] == 2.5 and stats["tokens_per_call"] == pytest.approx(17 / 10)
    output.write_text("H-0\t-0.5\t▁Ein\nP-0\t-1 -1\nI-0\t1\n")  # not RecoverSAT: no segments
    assert decode_stats.decode_stats(decode_stats.read_generate_output(str(output))) == {
        "sentences": 1,
        "calls_per_sentence": 1.0,
        "tokens_per_call": 2.0,
    }
    output.write_text("H-0\t-0.5\t▁Ein\n")
    with pytest.raises(SystemExit, match="--print-step"):
        decode_stats.read_generate_output(str(output))


@pytest.mark.parametrize("p_value, met", [(None, False), (0.2, False), (0.01, True)])
def test_npd_above_argmax_needs_a_significant_paired_test(tmp_path, p_value, met):
    """A gain of NPD over argmax is met only with the run's paired bootstrap p <= 0.05: one run's +0.16 BLEU is within
    the aligner's run-to-run spread."""
    rows = cpu_long_rows()
    next(r for r in rows if r["name"] == "NAT, NPD S=10")["bleu"] = 25.16
    paired = [{"system": catalogue.NAD_AD_ROW, "baseline": catalogue.TEACHER_BEAM_ROW, "p_value": 0.04}]
    if p_value is not None:
        paired.append({"system": "NAT, NPD S=10", "baseline": "NAT, argmax fertility", "p_value": p_value})
    write_run(str(tmp_path), rows, paired)
    verdicts = verdicts_of(report.build_report(str(tmp_path), "cpu-long"))
    npd = verdicts["NAT, NPD S=10 vs NAT, argmax fertility: >= +0.0 BLEU, p <= 0.05"]
    assert npd[0].startswith("+0.16 BLEU") and npd[1] == ("yes |" if met else "**no** |")


def test_a_reference_read_back_from_the_data_bin_says_its_unknown_words_lower_bleu(tmp_path):
    """An own teacher's run without REFERENCE scores against the data-bin's test targets, where words the dictionary
    lacks are <unk>: the report says how many and what to do; a raw reference gets no such line."""
    solo_run(str(tmp_path))
    path = tmp_path / "bench" / "results.json"
    results = json.loads(path.read_text())
    results["meta"]["reference"] = "reference.test.txt"
    path.write_text(json.dumps(results))
    (tmp_path / "reference.test.txt").write_text("a <unk> b\nc d <unk> <unk>\n")
    for text in (
        report.build_summary(str(tmp_path), "cpu", only="spec-drafter"),
        report.build_report(str(tmp_path), "cpu", only="spec-drafter"),
    ):
        assert "with 3 `<unk>` where the dictionary lacks a word" in text and "`REFERENCE=raw test targets`" in text
    (tmp_path / "reference.test.txt").write_text("a raw reference\n")
    assert "<unk>" not in report.build_summary(str(tmp_path), "cpu", only="spec-drafter")
