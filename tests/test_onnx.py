"""The fertility NAT through ONNX Runtime: ``nat-export-onnx`` (nat_plugins/cli/export_onnx.py) and ``--onnx-model``
(nat_plugins/systems/fertility_nat/onnx_decoding.py).

A tiny fertility_nat trained a few updates on the dummy data-bin is exported; its float32 graphs decode the PyTorch
generator's tokens (any sentence that differs must be a floating-point near-tie: a top-2 gap below 1e-4 where the
outputs part) with the same scores, in argmax and average decoding, through the generator, fairseq-generate and
fairseq-interactive; the int8 graphs decode outputs of the right form. Refused: a directory without graphs, graphs
of another checkpoint, NPD, a half-precision model, and exporting a checkpoint that is not a fertility_nat model."""

import copy
import json
import os
import shutil
import subprocess
import sys
from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks

from nat_plugins.bench import benchmark
from nat_plugins.bench.measure import NEAR_TIE_TOLERANCE, DecoderPassCounter
from nat_plugins.cli import export_onnx
from nat_plugins.systems.fertility_nat import onnx_decoding as fertility_nat_onnx
from nat_plugins.systems.fertility_nat.decoding import FertilityNATGenerator

from .test_fertility_nat import TINY_FNAT, make_task
from .utils import (
    REPO_ROOT,
    TINY_TRANSFORMER,
    console_script,
    generate_lines,
    hypotheses,
    interactive_lines,
    train_model,
    with_task_options,
)

pytest.importorskip("onnxruntime", reason="the optional `onnx` extra (pip install -e '.[onnx]')")

NEAR_TIE = NEAR_TIE_TOLERANCE["fp32"]  # the benchmark's
GENERATE = ["--task", "translation_nat", "--beam", "1"]


@pytest.fixture(scope="module")
def checkpoint(fert_data_bin, tmp_path_factory):
    """A tiny fertility_nat trained 30 updates from scratch (fairseq-train)."""
    extra = ["--task", "translation_nat", "--criterion", "fertility_nat_loss", "--label-smoothing", "0.1"]
    save_dir = str(tmp_path_factory.mktemp("onnx-nat"))
    return train_model(fert_data_bin, save_dir, TINY_FNAT + extra + ["--disable-validation"], max_update=30)


@pytest.fixture(scope="module")
def task(fert_data_bin):
    return make_task(fert_data_bin)


@pytest.fixture(scope="module")
def model(checkpoint, task):
    models, _cfg = checkpoint_utils.load_model_ensemble([checkpoint], task=task)
    return models[0].eval()


@pytest.fixture(scope="module")
def graphs(checkpoint, tmp_path_factory):
    """``{"float32": DIR, "int8": DIR}``: the checkpoint exported by the command (in-process)."""
    root = tmp_path_factory.mktemp("onnx-graphs")
    export_onnx.cli_main([checkpoint, str(root / "float32")])
    export_onnx.cli_main([checkpoint, str(root / "int8"), "--int8"])
    return {"float32": str(root / "float32"), "int8": str(root / "int8")}


@pytest.fixture(scope="module")
def ar_checkpoint(fert_data_bin, tmp_path_factory):
    """A random AR Transformer of the data-bin's dictionaries, saved as a fairseq checkpoint (not a NAT)."""
    args = options.parse_args_and_arch(
        options.get_training_parser(), [fert_data_bin, "--task", "translation_nat"] + TINY_TRANSFORMER
    )
    model = tasks.setup_task(args).build_model(args)
    path = str(tmp_path_factory.mktemp("onnx-ar") / "ar.pt")
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {}}]
    torch.save({"args": args, "model": model.state_dict(), "optimizer_history": history, "extra_state": {}}, path)
    return path


def generator(model, task, mode="argmax", onnx_model=None, **gen):
    return FertilityNATGenerator(
        [model],
        with_task_options(task, fertility_decoding=mode, onnx_model=onnx_model),
        Namespace(**{"beam": 1, "max_len_a": 0, "max_len_b": 200, **gen}),
    )


def batches_of(task, size=16):
    dataset = task.dataset("test")
    for start in range(0, len(dataset), size):
        yield dataset.collater([dataset[i] for i in range(start, min(start + size, len(dataset)))])


def sentence(sample, index):
    """Sentence ``index`` of a collated batch as a batch of one, without its padding."""
    tokens = sample["net_input"]["src_tokens"][index]
    tokens = tokens[tokens.ne(1)].unsqueeze(0)
    return {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([tokens.size(1)])}}


def assert_same_or_near_ties(pytorch, ours, theirs, sample):
    """Equal tokens and scores, or (tokens differing) a PyTorch near-tie where they part."""
    for index, (ref, hyp) in enumerate(zip(ours, theirs)):
        ref, hyp = ref[0], hyp[0]
        if torch.equal(ref["tokens"], hyp["tokens"]):
            assert torch.allclose(ref["positional_scores"], hyp["positional_scores"], atol=NEAR_TIE)
            assert abs(float(ref["score"]) - float(hyp["score"])) < NEAR_TIE and hyp["steps"] == 1
        else:
            source = sentence(sample, index)["net_input"]["src_tokens"]
            gap = pytorch.choice_margin(source, ref["tokens"], hyp["tokens"])
            assert gap < NEAR_TIE, (index, ref["tokens"], hyp["tokens"], gap)


@pytest.mark.parametrize("mode", ["argmax", "average"])
def test_float32_graphs_decode_the_pytorch_tokens(model, task, graphs, mode):
    pytorch, onnx = generator(model, task, mode), generator(model, task, mode, onnx_model=graphs["float32"])
    assert onnx.onnx is not None and not onnx.onnx.int8
    equal = 0
    for sample in batches_of(task):
        ours, theirs = pytorch.generate([model], sample), onnx.generate([model], sample)
        assert_same_or_near_ties(pytorch, ours, theirs, sample)
        equal += sum(torch.equal(a[0]["tokens"], b[0]["tokens"]) for a, b in zip(ours, theirs))
    assert equal == len(task.dataset("test"))  # no near-tie on this model: every sentence is the same


@pytest.mark.parametrize("copy_mode, fertility", [("uniform", 2), ("fertility", 0)])
def test_graphs_of_a_model_in_memory(fert_data_bin, task, tmp_path, copy_mode, fertility):
    """write_graphs on a random model built in memory, with learned decoder positions and no hidden fertility layer:
    the uniform copy with fertilities of 2 that a length limit (--max-len-a/b) cuts, and the fertility copy with
    fertilities of 0 that leave sentences empty (one token given back); a penalty on unk; the same tokens."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [fert_data_bin, "--task", "translation_nat"]
        + TINY_FNAT
        + ["--decoder-input-copy", copy_mode, "--decoder-learned-pos", "--fertility-hidden-layers", "0"],
    )
    torch.manual_seed(3)
    model = task.build_model(args).eval()
    with torch.no_grad():
        model.fertility_predictor.out.bias[fertility] += 4.0
        model.decoder.output_projection.weight[task.target_dictionary.unk()] *= 3.0  # unk often best: --unkpen counts
    manifest = export_onnx.write_graphs(model, str(tmp_path))
    assert manifest["model"]["copy_mode"] == copy_mode and manifest["checkpoint"] is None
    gen = {"max_len_a": 1.0, "max_len_b": 1, "unkpen": 0.5}
    pytorch, onnx = generator(model, task, **gen), generator(model, task, onnx_model=str(tmp_path), **gen)
    lengths = []
    for sample in batches_of(task):
        ours, theirs = pytorch.generate([model], sample), onnx.generate([model], sample)
        assert_same_or_near_ties(pytorch, ours, theirs, sample)
        for (hypo,), length in zip(theirs, sample["net_input"]["src_lengths"].tolist()):
            assert len(hypo["tokens"]) <= length + 1 + 1  # --max-len-a 1 --max-len-b 1, and EOS
            lengths.append(len(hypo["tokens"]) - 1)
    # the length rules were exercised: some outputs cut at the limit, or (fertility 0) given one token
    assert (max(lengths) > 2) if fertility else (min(lengths) == 1)


def test_int8_graphs_decode_outputs_of_the_right_form(model, task, graphs):
    with open(os.path.join(graphs["int8"], "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["int8"] and "int8" in manifest["quantization"]
    onnx = generator(model, task, onnx_model=graphs["int8"], max_len_a=1.5, max_len_b=2)
    eos, pad = task.target_dictionary.eos(), task.target_dictionary.pad()
    for sample in batches_of(task):
        hypos = onnx.generate([model], sample)
        assert len(hypos) == sample["net_input"]["src_tokens"].size(0)
        for (hypo,), length in zip(hypos, sample["net_input"]["src_lengths"].tolist()):
            tokens, scores = hypo["tokens"], hypo["positional_scores"]
            assert tokens[-1] == eos and not torch.isin(tokens[:-1], torch.tensor([eos, pad])).any()
            assert 2 <= len(tokens) <= int(1.5 * length + 2) + 1 and scores.shape == tokens.shape
            assert torch.isfinite(scores).all() and (scores <= 0).all() and scores[-1] == 0 and hypo["steps"] == 1


def test_the_benchmark_counts_one_decoder_pass(model, task, graphs):
    """The decoder runs in ONNX Runtime, where no hook sees it: the runner reports its pass to the benchmark's
    counter (bench/measure.py DecoderPassCounter)."""
    onnx = generator(model, task, onnx_model=graphs["float32"])
    sample = sentence(next(batches_of(task)), 0)
    with DecoderPassCounter([model]) as counter:
        onnx.generate([model], sample)
    assert counter.passes == 1


def test_fairseq_generate_and_interactive_with_onnx_model(fert_data_bin, dummy_raw, checkpoint, graphs, tmp_path):
    for mode in ("argmax", "average"):
        args = GENERATE + ["--fertility-decoding", mode]
        pytorch = generate_lines(fert_data_bin, checkpoint, args)
        onnx = generate_lines(fert_data_bin, checkpoint, args + ["--onnx-model", graphs["float32"]])
        assert hypotheses(onnx) == hypotheses(pytorch) and len(hypotheses(onnx)) == 40
        scores = {line.split("\t")[0]: float(line.split("\t")[1]) for line in pytorch if line.startswith("H-")}
        for line in onnx:
            if line.startswith("H-"):
                assert abs(float(line.split("\t")[1]) - scores[line.split("\t")[0]]) < 1e-3
    int8 = hypotheses(generate_lines(fert_data_bin, checkpoint, GENERATE + ["--onnx-model", graphs["int8"]]))
    assert sorted(int8) == list(range(40)) and all(text.strip() for text in int8.values())
    with open(os.path.join(dummy_raw, "test.src")) as f:
        sources = [next(f).strip() for _ in range(3)]
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(sources) + "\n")
    onnx = interactive_lines(fert_data_bin, checkpoint, str(input_file), GENERATE + ["--onnx-model", graphs["float32"]])
    pytorch = interactive_lines(fert_data_bin, checkpoint, str(input_file), GENERATE)
    assert hypotheses(onnx) == hypotheses(pytorch) and len(hypotheses(onnx)) == 3


def test_refusals(fert_data_bin, model, task, graphs, checkpoint, ar_checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="--onnx-model .*no such directory.*nat-export-onnx"):
        generator(model, task, onnx_model=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no manifest.json"):
        generator(model, task, onnx_model=str(tmp_path / "empty"))
    partial = tmp_path / "partial"
    shutil.copytree(graphs["float32"], partial)
    os.remove(partial / "decoder.onnx")
    with pytest.raises(FileNotFoundError, match="decoder.onnx is missing"):
        generator(model, task, onnx_model=str(partial))

    # graphs of another checkpoint: the same architecture, one weight changed
    state = torch.load(checkpoint)  # weights_only: nat_plugins.compat
    state["model"]["decoder.nad.layers.0.fc1.bias"][0] += 1e-3
    other = str(tmp_path / "other.pt")
    torch.save(state, other)
    export_onnx.cli_main([other, str(tmp_path / "other")])
    with pytest.raises(ValueError, match="another checkpoint .*other.pt"):
        generator(model, task, onnx_model=str(tmp_path / "other"))
    with pytest.raises(ValueError, match="another checkpoint"):
        generate_lines(fert_data_bin, checkpoint, GENERATE + ["--onnx-model", str(tmp_path / "other")])

    with pytest.raises(ValueError, match="--fertility-decoding npd .*not exported"):
        generate_lines(
            fert_data_bin,
            checkpoint,
            GENERATE + ["--fertility-decoding", "npd", "--npd-teacher", ar_checkpoint, "--onnx-model", graphs["int8"]],
        )
    with pytest.raises(ValueError, match="on the CPU in float32"):
        generator(copy.deepcopy(model).half(), task, onnx_model=graphs["float32"])

    # the export command refuses a checkpoint that is not a fertility_nat model, and a missing one
    with pytest.raises(SystemExit, match="not a fertility_nat model"):
        export_onnx.cli_main([ar_checkpoint, str(tmp_path / "ar")])
    assert not os.path.exists(tmp_path / "ar" / "manifest.json")
    with pytest.raises(SystemExit, match="does not exist"):
        export_onnx.cli_main([str(tmp_path / "nothing.pt"), str(tmp_path / "x")])


def test_console_script_is_installed(ar_checkpoint, tmp_path):
    """`nat-export-onnx` is a console script of the package (pyproject.toml), refusing a non-NAT checkpoint."""
    with open(os.path.join(REPO_ROOT, "pyproject.toml")) as f:
        assert 'nat-export-onnx = "nat_plugins.cli.export_onnx:cli_main"' in f.read()
    script = console_script("nat-export-onnx")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "nat_plugins.cli.export_onnx"]
    done = subprocess.run(command + [ar_checkpoint, str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 1 and "nat-export-onnx: error:" in done.stderr and "fertility_nat" in done.stderr


def test_catalogue_rows_on_the_cpu_presets():
    """The quickstart's ONNX rows: on the CPU presets, after the export step, the float32 and int8 graphs beside the
    NAT's checkpoint (linked there by the step); none on the GPU preset."""
    from nat_recipes import catalogue

    for preset in ("cpu", "cpu-long"):
        rows = {row.name: row for row in catalogue.rows(preset, "fertility-nat")}
        run = catalogue.Run("W", "W/data-bin", "T", "checkpoint_last.pt")
        for kind, name in catalogue.ONNX_ROWS.items():
            spec = rows[name].spec(run, catalogue.PRESETS[preset])
            assert spec.checkpoint == "W/ckpt/fertility-nat-onnx/checkpoint_last.pt"
            assert spec.args[-2:] == ["--onnx-model", f"W/ckpt/fertility-nat-onnx/{kind}"]
        steps = [step.name for job in catalogue.jobs(preset, "fertility-nat") for step in job.steps]
        assert steps.index("fertility-nat-onnx") == steps.index("fertility-nat") + 1
    assert not any("ONNX" in row.name for row in catalogue.rows("gpu"))
    assert "fertility-nat-onnx" not in [step.name for job in catalogue.jobs("gpu") for step in job.steps]


def test_the_deployment_targets_read_the_token_check_the_bleu_and_ctranslate2s_speed():
    """The main job's ONNX targets (CPU presets): float32 met only with the PyTorch row's tokens up to near-ties in
    every pass and >= 1x CTranslate2 float32; int8 only within 0.3 BLEU of the PyTorch NAT and >= 1.5x CTranslate2
    int8 (each engine alone: speed-ups over fairseq greedy divided)."""
    from nat_recipes import catalogue

    float32, int8 = catalogue.ONNX_TARGETS
    assert (float32.row, int8.row) == (catalogue.ONNX_ROWS["float32"], catalogue.ONNX_ROWS["int8"])
    assert {name for target in catalogue.targets("cpu") for name in target.rows} >= {float32.row, int8.row}

    def alone(speedup):
        return {"solo": {"latency_speedup_vs_ar_greedy": speedup}}

    same = {"sentences": 100, "differ": 2, "near_ties": 2, "divergences": []}
    rows = {
        "NAT, argmax fertility": {"bleu": 23.0, **alone(5.0)},
        float32.row: {
            "bleu": 23.0,
            "twin_check": {"reference": "NAT", "passes": {"1": same, "solo": same}},
            **alone(10.0),
        },
        int8.row: {"bleu": 22.8, **alone(13.0)},
        catalogue.CT2_GREEDY_ROW: {"bleu": 28.0, **alone(5.0)},
        catalogue.CT2_INT8_GREEDY_ROW: {"bleu": 28.0, **alone(8.0)},
    }
    measured = catalogue.Measured(rows, [], ())
    assert float32.check(measured) == (
        f"4 sentences differ (0 by more than a near-tie; passes: 1, solo), 2.00x {catalogue.CT2_GREEDY_ROW} "
        "(each engine alone)",
        True,
    )
    assert int8.check(measured)[1]  # 1.62x, 0.2 BLEU below
    rows[int8.row]["bleu"] = 22.6  # 0.4 below
    assert not int8.check(measured)[1]
    rows[int8.row]["bleu"], rows[int8.row]["solo"]["latency_speedup_vs_ar_greedy"] = 22.8, 11.0  # 1.38x
    assert not int8.check(measured)[1]
    rows[float32.row]["twin_check"]["passes"]["solo"] = {**same, "near_ties": 1}  # one real divergence
    assert not float32.check(measured)[1]
    del rows[float32.row]["twin_check"]
    assert float32.check(measured) == (
        f"no token check (no PyTorch row to compare with), 2.00x {catalogue.CT2_GREEDY_ROW} (each engine alone)",
        False,
    )


def test_export_step_script(checkpoint, model, task, tmp_path):
    """examples/multi30k/fertility_nat_onnx.sh: both graph directories and the checkpoint linked beside them."""
    script = os.path.join(REPO_ROOT, "examples", "multi30k", "fertility_nat_onnx.sh")
    env = {**os.environ, "NAT_VENV": "system", "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", script, checkpoint, str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    linked = tmp_path / "out" / os.path.basename(checkpoint)
    assert os.path.islink(linked) and os.path.samefile(linked, checkpoint)
    for kind in ("float32", "int8"):
        with open(tmp_path / "out" / kind / "manifest.json") as f:
            assert json.load(f)["int8"] == (kind == "int8")
        assert generator(model, task, onnx_model=str(tmp_path / "out" / kind)).onnx is not None


def test_manifest_names_the_checkpoint(checkpoint, graphs, model):
    with open(os.path.join(graphs["float32"], "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["checkpoint"] == os.path.abspath(checkpoint) and manifest["int8"] is False
    assert manifest["checkpoint_sha256"] == export_onnx.file_sha256(checkpoint)
    assert manifest["weights_fingerprint"] == fertility_nat_onnx.weights_fingerprint(model)
    assert manifest["model"] == fertility_nat_onnx.model_options(model)
    assert manifest["model"]["max_fertility"] == model.max_fertility and manifest["model"]["copy_mode"] == "fertility"
    assert manifest["float32_check"]["scores"] < NEAR_TIE


def onnx_benchmark(fert_data_bin, dummy_raw, tiny_teacher, checkpoint, graphs, out_dir):
    """A small benchmark of the NAT in PyTorch and through ONNX Runtime float32 and int8 (argmax fertilities)."""
    decoding = f"{checkpoint}::--task translation_nat --beam 1 --fertility-decoding argmax"
    argv = [
        fert_data_bin,
        "--teacher",
        tiny_teacher,
        "--reference",
        os.path.join(dummy_raw, "test.tgt"),
        "--out-dir",
        out_dir,
        "--cpu",
        "--post-process",
        "none",
        "--warmup",
        "2",
        "--latency-sentences",
        "8",
        "--batch-size",
        "16",
        "--no-plots",
        "--system",
        f"NAT={decoding}",
        "--system",
        f"NAT (ONNX Runtime)={decoding} --onnx-model {graphs['float32']}",
        "--system",
        f"NAT (ONNX Runtime int8)={decoding} --onnx-model {graphs['int8']}",
    ]
    results = benchmark.main(benchmark.get_parser().parse_args(argv))
    return {row["name"]: row for row in results["rows"]}


def test_the_benchmark_checks_the_float32_rows_tokens_against_the_pytorch_row(
    fert_data_bin, dummy_raw, tiny_teacher, checkpoint, graphs, tmp_path, monkeypatch
):
    """The ONNX Runtime float32 row is checked token for token against the PyTorch row of the same NAT in every timed
    pass (results.json's twin_check, a line of results.md); int8 and the PyTorch row are not; an ONNX pass that
    emits other tokens is a divergence no near-tie covers."""
    rows = onnx_benchmark(fert_data_bin, dummy_raw, tiny_teacher, checkpoint, graphs, str(tmp_path / "same"))
    check = rows["NAT (ONNX Runtime)"]["twin_check"]
    assert check["reference"] == "NAT" and set(check["passes"]) == {"1", "16"}
    assert check["passes"]["16"]["sentences"] == 40 and check["passes"]["1"]["sentences"] == 6
    assert all(p["differ"] == p["near_ties"] for p in check["passes"].values())
    assert rows["NAT"]["twin_check"] is None and rows["NAT (ONNX Runtime int8)"]["twin_check"] is None
    markdown = (tmp_path / "same" / "results.md").read_text(encoding="utf-8")
    assert (
        "- NAT (ONNX Runtime): against *NAT*, token for token in every timed pass (1, 16): the same tokens" in markdown
    )

    decode = fertility_nat_onnx.OnnxFertilityNAT.decode

    def other_first_token(self, sample):  # a wrong graph: the first token of every output replaced
        hypos = decode(self, sample)
        for (hypo,) in hypos:
            if not self.int8:
                hypo["tokens"][0] = 4 if int(hypo["tokens"][0]) != 4 else 5
        return hypos

    monkeypatch.setattr(fertility_nat_onnx.OnnxFertilityNAT, "decode", other_first_token)
    rows = onnx_benchmark(fert_data_bin, dummy_raw, tiny_teacher, checkpoint, graphs, str(tmp_path / "wrong"))
    passes = rows["NAT (ONNX Runtime)"]["twin_check"]["passes"]
    assert passes["16"]["differ"] == 40 and passes["16"]["near_ties"] == 0
    assert all(d["position"] == 0 and d["log_prob_gap"] > NEAR_TIE for d in passes["16"]["divergences"])
    markdown = (tmp_path / "wrong" / "results.md").read_text(encoding="utf-8")
    assert "**46 sentences differ by more than a near-tie**" in markdown


def test_the_stage_probe_splits_a_sentences_time(fert_data_bin, checkpoint, graphs, tmp_path):
    """dev/onnx_stages.py on a trained NAT's graphs: the encoder graph, the decoder graph and the host work between
    them, and inside each graph the operators by module (encoder layers, fertility predictor, decoder layers, output
    projection), each a positive number of ms."""
    out = tmp_path / "stages.json"
    script = os.path.join(REPO_ROOT, "dev", "onnx_stages.py")
    argv = [fert_data_bin, checkpoint, graphs["int8"], "--sentences", "6", "--warmup", "2", "--json", str(out)]
    subprocess.run([sys.executable, script, *argv], check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert result["int8"] is True and result["sentences"] == 6
    medians = result["ms_per_sentence_median"]
    assert set(medians) == {"total", "encoder graph", "decoder graph", "host (fertilities, copy, hypotheses)"}
    assert medians["total"] >= medians["encoder graph"] > 0 and medians["decoder graph"] > 0
    operators = result["operators_ms_per_sentence"]
    assert {"encoder layers", "fertility predictor"} <= set(operators["encoder"])
    assert {"decoder layers", "output projection, argmax"} <= set(operators["decoder"])
    assert all(ms > 0 for split in operators.values() for ms in split.values())
