"""The quickstart's report: targets checked against the benchmark's rows, the teacher's curve and step times from
the run's logs, and the preset's section of a results file replaced in place."""

import json
import os

from nat_plugins.cli import report

META = {
    "date": "2026-11-24T00:00:00",
    "device": "CPU",
    "torch": "2",
    "fairseq": "0.12",
    "nat_plugins": "0.1",
    "precision": "fp32",
}


def row(name, bleu, latency, **extra):
    return {
        "name": name,
        "bleu": bleu,
        "latency_ms_median": latency,
        "hyp_file": f"hyp.{len(name)}-{bleu}.txt",
        "latency_speedup_vs_ar_beam": 100.0 / latency,
        "latency_speedup_vs_ar_greedy": 80.0 / latency,
        **extra,
    }


def write_run(work, rows, paired=()):
    bench = os.path.join(work, "bench")
    os.makedirs(bench)
    os.makedirs(os.path.join(work, "logs"))
    with open(os.path.join(bench, "results.json"), "w") as f:
        json.dump({"meta": META, "rows": rows, "paired_tests": list(paired)}, f)
    with open(os.path.join(bench, "results.md"), "w") as f:
        f.write("# Decoding benchmark\n\n| system | BLEU |\n")
    for r in rows:
        with open(os.path.join(bench, r["hyp_file"]), "w") as f:
            same = "frozen" in r["name"] or r["name"].startswith("Speculative") or r["name"] == report.TEACHER_GREEDY
            f.write("same\n" if same else "other\n")
    with open(os.path.join(work, "logs", "teacher.log"), "w") as f:
        for updates, loss in ((250, 5.5), (500, 4.75)):
            f.write(
                f"x | valid | epoch 001 | valid on 'valid' subset | loss {loss} | nll_loss 4.0 | ppl 16.00 | wps 1 "
                f"| num_updates {updates}\n"
            )
    with open(os.path.join(work, "logs", "steps.tsv"), "w") as f:
        f.write("teacher\t100\nsat-2\t30\nteacher\t125\n")


def test_cpu_long_targets_are_checked_against_the_rows(tmp_path):
    rows = [
        row(report.TEACHER_BEAM, 30.0, 100.0),
        row(report.TEACHER_GREEDY, 29.0, 80.0),
        row("SAT K=2, beam 4", 28.6, 60.0),  # 95.3% of the teacher: met
        row("SAT K=4, greedy", 23.0, 30.0),  # 76.7%: missed
        row("Blockwise k=4 frozen, exact", 29.0, 60.0, tokens_per_call=1.6),  # identical output, block 1.6
        row("Blockwise k=4 fine-tuned, exact", 27.5, 50.0, tokens_per_call=2.5),  # 1.5 BLEU below greedy
        row("Speculative k=4, exact", 29.0, 40.0, tokens_per_step=3.2, latency_speedup_vs_ct2_greedy=0.9),
        row(report.NAD_AD, 30.5, 110.0),
        row(report.NAD_AD_BASELINE, 30.0, 100.0),
        row(report.FAIRSEQ_ROWS[0], 10.0, 5.0),
    ]
    paired = [{"system": report.NAD_AD, "p_value": 0.04}]
    write_run(str(tmp_path), rows, paired)
    text = report.build_report(str(tmp_path), "cpu-long")
    verdicts = {
        line.split(" | ")[0][2:]: line.rsplit(" | ", 2)[1:]
        for line in text.splitlines()
        if line.startswith("| ") and line.endswith(("yes |", "**no** |"))
    }
    assert verdicts["SAT K=2, beam 4: BLEU >= 95% of the teacher's beam"] == ["95.3% at 1.67x", "yes |"]
    assert verdicts["SAT K=4, greedy: BLEU >= 80% of the teacher's beam"][1] == "**no** |"
    frozen = next(v for k, v in verdicts.items() if k.startswith("Blockwise k=4 frozen"))
    assert frozen == ["identical to greedy, block 1.60, 1.33x vs greedy", "yes |"]
    finetuned = next(v for k, v in verdicts.items() if k.startswith("Blockwise k=4 fine-tuned"))
    assert finetuned[1] == "**no** |"
    spec = next(v for k, v in verdicts.items() if k.startswith("Speculative k=4, exact"))
    assert spec == [
        "identical to greedy, 3.20 tokens per teacher call, 2.00x vs greedy (0.90x vs CTranslate2 greedy)",
        "yes |",
    ]
    nad = next(v for k, v in verdicts.items() if k.startswith(report.NAD_AD))
    assert nad == ["+0.50 BLEU (p = 0.040), +10% time", "yes |"]
    fairseq = next(v for k, v in verdicts.items() if k.startswith("every plugin row"))
    assert fairseq[1] == "yes |" and "SAT K=2, beam 4: BLEU" in fairseq[0]
    assert not any(k.startswith("RecoverSAT") for k in verdicts)  # rows the run lacks are not checked
    assert "250 updates: loss 5.500 / ppl 16.00, 500 updates: loss 4.750" in text
    assert "| teacher | 2 min 05 s |" in text and "| all steps | 2 min 35 s |" in text  # the last run of a step


def test_the_presets_section_is_replaced_in_place(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nkept above\n")
    report.replace_section(str(doc), "cpu-long", "first\n")
    report.replace_section(str(doc), "gpu", "gpu body\n")
    report.replace_section(str(doc), "cpu-long", "second\n")
    text = doc.read_text()
    assert text.startswith("# Results\n\nkept above\n") and "first" not in text
    assert text.count("<!-- report:cpu-long -->\nsecond\n<!-- /report:cpu-long -->") == 1
    assert "<!-- report:gpu -->\ngpu body\n<!-- /report:gpu -->" in text
