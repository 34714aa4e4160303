"""The system catalogue (nat_recipes.catalogue): consistent with itself (a target or paired test naming a row its
preset does not make fails), the quickstart's steps and rows as run_scripts/quickstart.sh ran them before the
catalogue, and its command line as the run scripts read it."""

import dataclasses
import glob
import os
import re

import pytest

from nat_plugins.bench.rows import parse_system_spec
from nat_recipes import catalogue

from .utils import REPO_ROOT

RUN = dict(work="W", data_bin="W/data-bin", teacher="W/ckpt/teacher/checkpoint_best.pt")
T = RUN["teacher"]


def cli(capsys, *argv):
    catalogue.main(list(argv))
    return capsys.readouterr().out


def run_options(preset, checkpoint_name="checkpoint_last.pt"):
    return ["--preset", preset, "--work", "W", "--data-bin", "W/data-bin", "--teacher", T] + [
        "--checkpoint-name",
        checkpoint_name,
    ]


def test_the_catalogue_is_consistent():
    """Every target and paired test of every preset names a row that preset makes, every row a step it trains."""
    catalogue.check()
    for preset in catalogue.PRESETS:
        names = [row.name for row in catalogue.rows(preset)]
        assert len(names) == len(set(names))
        names += catalogue.REFERENCE_ROWS
        assert all(name in names for target in catalogue.targets(preset) for name in target.rows)


def test_the_readme_states_the_numbers_the_main_job_checks():
    """Every BLEU / speed-up of the README's systems table is a claim the main job's report checks, number for
    number, and the README states no other (the table's last column)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8") as f:
        table = [line for line in f.read().split("## Systems", 1)[1].splitlines() if line.startswith("| ")][1:]
    cells = [line.rstrip(" |").rsplit(" | ", 1)[1] for line in table]
    claims = catalogue.README_CLAIMS["cpu"]
    for claim in claims:
        assert any(claim.text() in cell for cell in cells), f"the README does not state {claim.row}: {claim.text()}"
    stated = [n for cell in cells for n in re.findall(r"\d+\.\d\d / \d+(?:\.\d+)?×", cell)]
    assert sorted(stated) == sorted(claim.text().split(" (")[0] for claim in claims)


@pytest.mark.parametrize(
    "preset, target",
    [
        ("cpu-long", catalogue.Speculative("Speculative k=4, exact", 1.5)),  # the drift this check exists for
        ("gpu", catalogue.BleuShare("SAT K=4, greedy", 0.8)),  # a cpu-long row
    ],
)
def test_a_target_naming_a_row_its_preset_lacks_is_an_error(monkeypatch, preset, target):
    sat = next(system for system in catalogue.SYSTEMS if system.key == "sat")
    bad = dataclasses.replace(sat, targets={**sat.targets, preset: sat.targets[preset] + (target,)})
    monkeypatch.setattr(catalogue, "SYSTEMS", tuple(bad if s is sat else s for s in catalogue.SYSTEMS))
    with pytest.raises(catalogue.CatalogueError, match=f"{preset}: target .* names the row '{target.row}'"):
        catalogue.check()


def test_a_paired_test_naming_a_missing_row_is_an_error(monkeypatch):
    def nad_ad(value):
        return dataclasses.replace(catalogue.nad_ad(value), paired_tests=(("SAT K=9, greedy", catalogue.NAD_AD_ROW),))

    system = next(s for s in catalogue.SYSTEMS if s.key == "nad-ad")
    bad = dataclasses.replace(system, configure=nad_ad)
    monkeypatch.setattr(catalogue, "SYSTEMS", tuple(bad if s is system else s for s in catalogue.SYSTEMS))
    with pytest.raises(catalogue.CatalogueError, match="paired test .* names the row 'SAT K=9, greedy'"):
        catalogue.check()


def test_one_block_and_one_key_per_system():
    """A system's block holds its budgets and README claims (the module's BUDGETS and README_CLAIMS are theirs), and
    a plugin system's key, '-' for '_', names its recipe script (examples/multi30k/KEY.sh), the prefix of the
    architecture it trains and its budgets; a claim on a row its system does not make is an error."""
    assert catalogue.BUDGETS == {name: budget for s in catalogue.SYSTEMS for name, budget in s.budgets.items()}
    systems = {s.key: s for s in catalogue.SYSTEMS}
    claims = [claim for key in catalogue.README_ORDER for claim in systems[key].claims.get("cpu", ())]
    assert catalogue.README_CLAIMS["cpu"] == tuple(claims) + catalogue.REFERENCE_CLAIMS["cpu"]
    plugin = [s for s in catalogue.SYSTEMS if any(row.plugin for row in catalogue.rows("cpu-long", s.key))]
    assert [s.key for s in plugin] == ["blockwise", "spec-drafter", "sat", "recover-sat", "fertility-nat", "nad-ad"]
    for system in plugin:
        name = system.key.replace("-", "_")
        script = f"examples/multi30k/{name}.sh"
        assert script in [step.script for job in catalogue.jobs("cpu", system.key) for step in job.steps]
        with open(os.path.join(REPO_ROOT, script), encoding="utf-8") as f:
            assert re.search(rf"^arch_args {name}\w*$", f.read(), flags=re.M), script
        assert any(budget == system.key or budget.startswith(system.key + "-") for budget in system.budgets)
    sat = systems["sat"]
    stray = dataclasses.replace(sat, claims={"cpu": (catalogue.Claim("RecoverSAT K=2", 24.38, 2.8),)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalogue, "SYSTEMS", tuple(stray if s is sat else s for s in catalogue.SYSTEMS))
        with pytest.raises(catalogue.CatalogueError, match="cpu: 'sat' claims the row 'RecoverSAT K=2'"):
            catalogue.check()


def test_cpu_quickstart_rows_are_the_ones_it_made_before_the_catalogue(capsys):
    """run_scripts/quickstart.sh's PRESET=cpu rows as its bash made them (checkpoint_last.pt, --int8-drafts on the
    drafting rows): same names, checkpoints and arguments, in the same order."""
    ckpt = "W/ckpt/{}/checkpoint_last.pt"
    expected = [
        ("Blockwise k=4 frozen, exact", "blockwise-4-frozen", "--beam 1 --block-accept exact --int8-drafts"),
        ("Blockwise k=4 fine-tuned, exact", "blockwise-4-finetuned", "--beam 1 --block-accept exact --int8-drafts"),
        ("Speculative k=3, exact", "spec-drafter-3", f"--beam 1 --spec-drafter-teacher {T} --int8-drafts"),
        (
            "Speculative k=3, relaxed",
            "spec-drafter-3",
            f"--beam 1 --spec-drafter-teacher {T} --spec-drafter-verify relaxed --spec-drafter-beta 3 "
            "--spec-drafter-tau 1",
        ),
        (
            "Speculative k=3, greedy steps only",
            "spec-drafter-3",
            f"--beam 1 --spec-drafter-teacher {T} --max-drafting-sentences 0",
        ),
        ("SAT K=2, greedy", "sat-2", "--beam 1"),
        ("SAT K=2, beam 4", "sat-2", "--beam 4"),
        ("RecoverSAT K=2", "recover-sat-2", "--beam 1"),
        ("NAT, argmax fertility", "fertility-nat", "--beam 1 --fertility-decoding argmax"),
        (
            "NAT, argmax fertility (ONNX Runtime)",
            "fertility-nat-onnx",
            "--beam 1 --fertility-decoding argmax --onnx-model W/ckpt/fertility-nat-onnx/float32",
        ),
        (
            "NAT, argmax fertility (ONNX Runtime int8)",
            "fertility-nat-onnx",
            "--beam 1 --fertility-decoding argmax --onnx-model W/ckpt/fertility-nat-onnx/int8",
        ),
        ("NAT, average fertility", "fertility-nat", "--beam 1 --fertility-decoding average"),
        ("NAT, NPD S=10", "fertility-nat", f"--beam 1 --fertility-decoding npd --npd-samples 10 --npd-teacher {T}"),
        ("NAT+FT, argmax fertility", "fertility-nat-rkl", "--beam 1 --fertility-decoding argmax"),
        (
            "NAT+FT, NPD S=10",
            "fertility-nat-rkl",
            f"--beam 1 --fertility-decoding npd --npd-samples 10 --npd-teacher {T}",
        ),
    ]
    words = cli(capsys, "rows", *run_options("cpu")).splitlines()
    assert words[0::2] == ["--system"] * (len(expected) + 1) + ["--paired-test"] * 4
    assert words[1:-10:2] == [f"{name}={ckpt.format(step)}::{args}" for name, step, args in expected]
    # Encoder-NAD-AD, trained with the teacher's recipe, decodes the checkpoint that recipe selects, as the teacher
    assert words[-9] == "Encoder-NAD-AD, beam 4=W/ckpt/nad-ad/checkpoint_best.pt::--beam 4"
    assert words[-7:-1:2] == [
        "NAT, argmax fertility::NAT, NPD S=10",
        "NAT, argmax fertility::NAT+FT, argmax fertility",
        "NAT+FT, argmax fertility::NAT+FT, NPD S=10",
    ]
    assert words[-1] == "AR teacher, beam 4::Encoder-NAD-AD, beam 4"  # its AR twin: the teacher (the same recipe)
    assert [parse_system_spec(spec).name for spec in words[1:-10:2]] == [name for name, _, _ in expected]


def test_gpu_and_cpu_long_rows():
    gpu = [row.name for row in catalogue.rows("gpu")]
    assert gpu[:2] == ["Blockwise k=4 frozen, exact", "Blockwise k=4 fine-tuned, exact"]
    assert [n for n in gpu if n.startswith(("SAT", "RecoverSAT", "NAT"))] == [
        "SAT K=2, greedy",
        "SAT K=2, beam 4",
        "RecoverSAT K=2",
        "NAT, argmax fertility",
        "NAT, average fertility",
        "NAT, NPD S=10",
        "NAT+FT, argmax fertility",
        "NAT+FT, NPD S=10",
    ]
    assert gpu[-1] == catalogue.NAD_AD_ROW  # fairseq's NAT/CMLM: the cpu-long preset
    speculative = catalogue.rows("gpu", "spec-drafter")[0].spec(
        catalogue.Run(checkpoint_name="c.pt", **RUN), catalogue.PRESETS["gpu"]
    )
    assert "--int8-drafts" not in speculative.args  # the GPU preset decodes in fp16 without int8 drafts
    cpu_long = [row.name for row in catalogue.rows("cpu-long")]
    assert "SAT K=4, beam 4" in cpu_long and catalogue.FAIRSEQ_CMLM_ROW in cpu_long
    recover_sat = ["RecoverSAT K=2", "RecoverSAT K=10", "RecoverSAT K=10, empty segments last"]
    assert [n for n in cpu_long if n.startswith("RecoverSAT")] == recover_sat
    last = next(row for row in catalogue.rows("cpu-long") if row.name == recover_sat[-1])
    assert last.step == "recover-sat-10-nonempty-first" and "beyond the paper" in last.made
    summed = next(row for row in catalogue.rows("cpu-long") if row.name == "NAT, NPD S=10, eq. 8 sum")
    assert summed.args[-2:] == ("--npd-ranking", "sum") and "--npd-samples" in summed.args
    default = next(row for row in catalogue.rows("cpu") if row.name == "NAT, NPD S=10")
    assert "--npd-ranking" not in default.args and "--npd-ranking mean, as the authors' released code" in default.made
    assert catalogue.FAIRSEQ_NAT_ROW not in [row.name for row in catalogue.rows("cpu")]


def test_steps_are_the_quickstarts_jobs(capsys):
    lines = [line.split("\t") for line in cli(capsys, "steps", *run_options("cpu")).splitlines()]
    examples = "examples/multi30k"
    assert lines == [
        ["blockwise-4-frozen", "blockwise-4-frozen", f"{examples}/blockwise.sh", "W/data-bin", T]
        + ["W/ckpt/blockwise-4-frozen", "4", "frozen"],
        ["blockwise-4-frozen", "blockwise-4-finetuned", f"{examples}/blockwise.sh", "W/data-bin"]
        + ["W/ckpt/blockwise-4-frozen/checkpoint_last.pt", "W/ckpt/blockwise-4-finetuned", "4", "finetuned"],
        ["spec-drafter-3", "spec-drafter-3", f"{examples}/spec_drafter.sh", "W/data-bin", T, "W/ckpt/spec-drafter-3"]
        + ["3"],
        ["sat-2", "sat-2", f"{examples}/sat.sh", "W/data-bin", T, "W/ckpt/sat-2", "2"],
        ["recover-sat-2", "recover-sat-2", f"{examples}/recover_sat.sh", "W/data-bin", T, "W/ckpt/recover-sat-2", "2"],
        ["fertility", "fertility", "run_scripts/fertility.sh", "W/data-bin", "--save-links", "W/links"],
        ["fertility", "fertility-nat", f"{examples}/fertility_nat.sh", "W/data-bin", T, "W/ckpt/fertility-nat"],
        ["fertility", "fertility-nat-onnx", f"{examples}/fertility_nat_onnx.sh"]
        + ["W/ckpt/fertility-nat/checkpoint_last.pt", "W/ckpt/fertility-nat-onnx"],
        ["fertility", "fertility-nat-rkl", f"{examples}/fertility_nat_rkl.sh", "W/data-bin", T]
        + ["W/ckpt/fertility-nat-rkl", "W/ckpt/fertility-nat/checkpoint_last.pt"],
        ["nad-ad", "nad-ad", f"{examples}/nad_ad.sh", "W/data-bin", T, "W/ckpt/nad-ad"],
    ]
    gpu = [line.split("\t")[1] for line in cli(capsys, "steps", *run_options("gpu")).splitlines()]
    assert gpu.count("fertility-nat") == 1 and gpu[-1] == "nad-ad"


def test_speed_steps_time_every_training_recipe(capsys):
    """Every fairseq-train step of the preset (the speculative drafter included; not the alignment), saving into one
    scratch directory, after the teacher's recipe on the distilled targets that they are compared with."""
    out = cli(capsys, "speed-steps", *run_options("cpu"), "--save-dir", "S")
    lines = [line.split("\t") for line in out.splitlines()]
    assert [(line[0], line[1]) for line in lines] == [
        ("teacher-on-distilled", "teacher-on-distilled"),
        ("blockwise-4-frozen", "teacher-on-distilled"),
        ("blockwise-4-finetuned", "teacher-on-distilled"),
        ("spec-drafter-3", "teacher-on-distilled"),
        ("sat-2", "teacher-on-distilled"),
        ("recover-sat-2", "teacher-on-distilled"),
        ("fertility-nat", "teacher-on-distilled"),
        ("fertility-nat-rkl", "teacher-on-distilled"),
        ("nad-ad", "teacher-on-distilled"),  # the teacher's recipe (its AD batched by the real targets)
    ]
    assert lines[0][2:] == ["run_scripts/train_teacher.sh", "W/data-bin", "S", "--use-distilled", "target"]
    assert lines[2][4:6] == ["W/ckpt/blockwise-4-frozen/checkpoint_last.pt", "S"]  # starts from the run's checkpoint


def test_one_system_with_other_values_and_existing_checkpoints(capsys, tmp_path):
    options = run_options("cpu")
    options[options.index("--work") + 1] = str(tmp_path)
    words = cli(capsys, "rows", *options, "--only", "spec-drafter", "--values", "4").splitlines()
    assert [parse_system_spec(w).name for w in words[1::2]] == [
        "Speculative k=4, exact",
        "Speculative k=4, relaxed",
        "Speculative k=4, greedy steps only",
    ]
    assert cli(capsys, "rows", *options, "--existing") == ""  # nothing trained yet
    (tmp_path / "ckpt" / "nad-ad").mkdir(parents=True)
    (tmp_path / "ckpt" / "nad-ad" / "checkpoint_last.pt").write_text("")
    assert cli(capsys, "rows", *options, "--existing") == ""  # the row decodes checkpoint_best.pt, not there yet
    (tmp_path / "ckpt" / "nad-ad" / "checkpoint_best.pt").write_text("")
    words = cli(capsys, "rows", *options, "--existing").splitlines()
    assert words == [
        "--system",
        f"Encoder-NAD-AD, beam 4={os.path.join(tmp_path, 'ckpt/nad-ad/checkpoint_best.pt')}::--beam 4",
        "--paired-test",  # against the teacher's beam row, which every benchmark makes
        "AR teacher, beam 4::Encoder-NAD-AD, beam 4",
    ]
    with pytest.raises(SystemExit):
        catalogue.main(["rows", *options, "--values", "4"])  # --values needs --only


def test_several_systems_own_their_steps_rows_and_targets_without_the_readmes_claims(capsys):
    """What a run on your own teacher selects (quickstart.sh's SYSTEMS=...): those systems' steps and rows, their
    targets, not the README's claims (numbers of the quickstart's own teacher)."""
    options = run_options("cpu-long")
    steps = cli(capsys, "steps", *options, "--only", "spec-drafter,blockwise").splitlines()
    assert [line.split("\t")[1] for line in steps] == ["blockwise-4-frozen", "blockwise-4-finetuned", "spec-drafter-3"]
    assert {t.what for t in catalogue.targets("cpu-long", ["spec-drafter"])} == {
        t.what for t in catalogue.targets("cpu-long") if set(t.rows) <= {"Speculative k=3, exact"}
    }
    assert catalogue.targets("cpu", ["spec-drafter", "blockwise"]) == list(catalogue.SPEC_DRAFTER.targets["cpu"])
    assert catalogue.targets("cpu")[-len(catalogue.README_CLAIMS["cpu"]) :] == list(catalogue.README_CLAIMS["cpu"])
    for bad in (["--only", "specul"], ["--only", "spec-drafter,blockwise", "--values", "4"]):
        with pytest.raises(SystemExit):
            catalogue.main(["rows", *options, *bad])


def test_every_recipe_takes_its_budget_from_the_catalogue(capsys):
    """Updates, learning rate and warm-up of each student recipe per preset live in the catalogue (BUDGETS): the cpu
    preset's, 4x on cpu-long, STUDENT_UPDATES and a tenth of warm-up on the GPU; every examples/multi30k script asks
    for a budget the catalogue has, and every budget is asked for."""
    assert cli(capsys, "budget", "--preset", "cpu", "sat").split() == ["150", "2e-3", "20"]
    assert cli(capsys, "budget", "--preset", "cpu-long", "sat").split() == ["600", "2e-3", "80"]
    assert cli(capsys, "budget", "--preset", "gpu", "sat").split() == ["600", "5e-4", "60"]
    assert cli(capsys, "budget", "--preset", "gpu", "nad-ad").split() == ["400", "5e-4", "40"]  # its own GPU budget
    assert cli(capsys, "budget", "--preset", "gpu", "ar-baseline").split() == ["400", "5e-4", "40"]  # the same
    assert cli(capsys, "budget", "--preset", "cpu", "--updates", "2", "spec-drafter").split() == ["2", "2e-3", "40"]
    assert cli(capsys, "budget", "--preset", "gpu", "--updates", "50", "blockwise-frozen").split() == [
        "50",
        "3e-3",
        "5",
    ]
    asked = set()
    for path in glob.glob(os.path.join(REPO_ROOT, "examples", "multi30k", "*.sh")):
        with open(path, encoding="utf-8") as f:
            asked |= set(re.findall(r"^\s*student_args \"?([\w$-]+)", f.read(), flags=re.M))
    # fairseq_nat.sh asks for "fairseq-$MODEL", MODEL nat or cmlm
    asked = {name for name in asked if "$" not in name} | {"fairseq-nat", "fairseq-cmlm"}
    assert asked == set(catalogue.BUDGETS)


def test_benchmark_options_of_the_presets(capsys):
    cpu = cli(capsys, "options", "--preset", "cpu", "--latency-sentences", "15").splitlines()
    assert cpu == ["--cpu", "--warmup", "10", "--batch-size", "64", "--ctranslate2", "--int8-decoder-row", "--solo"] + [
        "--batch-sizes",
        "1,64",
        "--latency-sentences",
        "15",
        "--generate-args",
        "--max-len-a 1.2 --max-len-b 10",
    ]
    long = cli(capsys, "options", "--preset", "cpu-long").splitlines()
    assert long[long.index("--batch-sizes") + 1] == "1,8,32,64"
    gpu = cli(capsys, "options", "--preset", "gpu").splitlines()
    assert "--ctranslate2" not in gpu and "--cpu" not in gpu and gpu[0] == "--fp16"
    assert gpu[gpu.index("--latency-sentences") + 1] == "210" and gpu[gpu.index("--warmup") + 1] == "10"
    assert gpu[gpu.index("--batch-size") + 1] == "64" and "--batch-sizes" not in gpu
    assert gpu[gpu.index("--time-budget") + 1] == "180"  # the 15 minutes the GPU machine is lent leave it 3


def test_the_gpu_preset_marks_the_rows_its_time_budget_may_leave_out(capsys):
    """The GPU rows' options name the optional rows in their priority order, each a row the preset makes; no other
    preset has any."""
    options = ["--work", "W", "--data-bin", "D", "--teacher", "T", "--checkpoint-name", "c.pt"]
    words = cli(capsys, "rows", "--preset", "gpu", *options).splitlines()
    optional = [words[i + 1] for i, word in enumerate(words) if word == "--optional-row"]
    assert optional == list(catalogue.GPU_OPTIONAL_ROWS)
    systems = [words[i + 1] for i, word in enumerate(words) if word == "--system"]
    assert all(any(system.startswith(name + "=") for system in systems) for name in optional)
    assert "--optional-row" not in cli(capsys, "rows", "--preset", "cpu", *options).splitlines()


def test_a_bleu_share_reads_the_speedup_over_the_search_it_names():
    """The GPU preset's targets are speed-ups over the teacher's greedy search (the issue's "x fairseq greedy"), the
    CPU presets' over its beam: one row meets one and misses the other."""
    rows = {
        "beam": {"name": "beam", "role": catalogue.TEACHER_BEAM, "bleu": 30.0},
        "NAT": {"name": "NAT", "bleu": 25.0, "latency_speedup_vs_ar_beam": 6.0, "latency_speedup_vs_ar_greedy": 4.0},
    }
    measured = catalogue.Measured(rows, [], ("NAT",))
    assert catalogue.BleuShare("NAT", 0.8, 5.0).check(measured) == ("83.3% at 6.00x vs beam", True)
    assert catalogue.BleuShare("NAT", 0.8, 5.0, over="greedy").check(measured) == ("83.3% at 4.00x vs greedy", False)


def test_a_slowdown_bar_reads_the_paired_per_round_ratio():
    """Encoder-NAD-AD's "at most 10% slower" is the median over rounds of its batch-1 time over its baseline's on the
    same block (the one statistic of every speed-up), not the ratio of the two medians: here 5% against 15%."""
    rows = {
        "NAD-AD": {
            "name": "NAD-AD",
            "bleu": 30.0,
            "latency_ms_median": 115.0,
            "latency_round_seconds": [1.05, 1.2, 1.05],
        },
        "AR": {"name": "AR", "bleu": 29.0, "latency_ms_median": 100.0, "latency_round_seconds": [1.0, 1.0, 1.0]},
    }
    text, met = catalogue.BleuGain("NAD-AD", "AR", 0.5, max_slowdown=0.10).check(catalogue.Measured(rows, [], ()))
    assert met and text == "+1.00 BLEU, +5% time"
