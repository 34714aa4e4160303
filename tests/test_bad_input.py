"""Bad input (docs/errors.md): what a user gets for each case its table lists, on tiny checkpoints of
every system (2 updates each: the messages, not the translations, are under test), and a check that every test the
table names exists."""

import logging
import os
import re
import shutil
import subprocess

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from nat_plugins.compat import CheckpointFileError
from nat_plugins.modules.teacher import FrozenTeacher
from nat_plugins.systems.fertility_nat.loss import FertilityNATLoss

from .test_blockwise import TINY_BLOCKWISE
from .test_fertility_nat import TINY_FNAT
from .test_nad_ad import TINY_NAD_AD
from .test_recover_sat import TINY_RECOVER_SAT
from .test_sat import TINY_SAT
from .utils import (
    REPO_ROOT,
    TINY_TRANSFORMER,
    binarize,
    console_script,
    generate_lines,
    hypotheses,
    interactive_lines,
    train_model,
    write_dummy_parallel,
)

TASK = ["--task", "translation_nat"]
SYSTEMS = {
    "teacher": TINY_TRANSFORMER + TASK + ["--criterion", "cross_entropy"],
    "sat": TINY_SAT + TASK + ["--criterion", "cross_entropy", "--group-size", "2"],
    "recover_sat": TINY_RECOVER_SAT + TASK + ["--criterion", "recover_sat_loss", "--num-segments", "3"],
    "blockwise": TINY_BLOCKWISE + TASK + ["--criterion", "blockwise_loss", "--block-size", "3"],
    "fertility_nat": TINY_FNAT + TASK + ["--criterion", "fertility_nat_loss"],
    "nad_ad": TINY_NAD_AD + TASK + ["--criterion", "nad_ad_loss", "--use-distilled", "side"],
    "spec_drafter": ["--arch", "spec_drafter", "--draft-size", "3"]
    + TINY_TRANSFORMER[2:]
    + TASK
    + ["--criterion", "spec_drafter_loss", "--use-distilled", "target"],
}
# what a system's checkpoint always decodes with (TEACHER: the teacher's checkpoint)
SPECULATIVE = ["--spec-drafter-teacher", "TEACHER"]
SYSTEM_DECODING = {"spec_drafter": SPECULATIVE}
# the decoding of every generator: (system, fairseq-generate options)
DECODINGS = [
    ("teacher", ["--beam", "2"]),
    ("sat", ["--beam", "1"]),
    ("sat", ["--beam", "2"]),
    ("recover_sat", ["--beam", "1"]),
    ("blockwise", ["--beam", "1"]),
    ("blockwise", ["--beam", "1", "--block-accept", "topk:2"]),
    ("fertility_nat", ["--beam", "1"]),
    ("fertility_nat", ["--beam", "1", "--fertility-decoding", "average"]),
    ("fertility_nat", ["--beam", "1", "--fertility-decoding", "npd", "--npd-samples", "3", "--npd-teacher", "TEACHER"]),
    ("nad_ad", ["--beam", "2"]),
    ("spec_drafter", ["--beam", "1"] + SPECULATIVE),
]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """Toy data whose test split has an empty source line (id 2), with the side files every system trains on:
    fertilities (all 1: the toy targets translate word by word) and the real targets as 'distilled' ones."""
    tmp = tmp_path_factory.mktemp("bad-input")
    raw = write_dummy_parallel(str(tmp / "raw"), n_train=80, n_valid=8, n_test=6)
    for lang, line in (("src", "\n"), ("tgt", "t1\n")):
        with open(tmp / "raw" / f"test.{lang}", "r+") as f:
            lines = f.readlines()
            f.seek(0)
            f.writelines(lines[:2] + [line] + lines[2:])
    path = binarize(raw, str(tmp / "bin"))
    for split in ("train", "valid"):
        with open(os.path.join(raw, f"{split}.src")) as src, open(os.path.join(path, f"{split}.fert.src"), "w") as out:
            out.writelines(" ".join("1" for _ in line.split()) + "\n" for line in src)
        for ext in ("bin", "idx"):
            shutil.copy(os.path.join(path, f"{split}.src-tgt.tgt.{ext}"), os.path.join(path, f"{split}.kd.tgt.{ext}"))
    return path


@pytest.fixture(scope="module")
def checkpoints(data_bin, tmp_path_factory):
    """``{system: checkpoint}``: every system trained 2 updates from random initialisation."""
    return {
        name: train_model(data_bin, str(tmp_path_factory.mktemp(f"bad-input-{name}")), args, max_update=2)
        for name, args in SYSTEMS.items()
    }


def decoding_args(options, checkpoints, system=None):
    """fairseq-generate/-interactive options: ``options`` (and the system's ``SYSTEM_DECODING``), the teacher's
    checkpoint for TEACHER."""
    options = list(options) + SYSTEM_DECODING.get(system, [])
    return TASK + [checkpoints["teacher"] if a == "TEACHER" else a for a in options]


def write_input(tmp_path, lines):
    path = tmp_path / "input.txt"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


# ----- source sentences --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("system, options", DECODINGS)
def test_empty_source_line_is_translated(data_bin, checkpoints, tmp_path, system, options):
    """An empty source line is EOS alone: every decoder translates it (NAT: at least one token) like any other."""
    args = decoding_args(options, checkpoints)
    generated = hypotheses(generate_lines(data_bin, checkpoints[system], args))
    assert sorted(generated) == list(range(7))
    input_file = write_input(tmp_path, ["s1 s2", "", "s3"])
    interactive = hypotheses(interactive_lines(data_bin, checkpoints[system], input_file, args))
    assert sorted(interactive) == [0, 1, 2]
    if system == "fertility_nat":  # test sentence 2 and input line 1 are the empty ones
        assert generated[2].split() and interactive[1].split(), (generated[2], interactive[1])


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_unknown_words_become_unk(data_bin, checkpoints, tmp_path, system):
    input_file = write_input(tmp_path, ["s1 nosuchword s2", "zzz"])
    lines = interactive_lines(
        data_bin, checkpoints[system], input_file, decoding_args(["--beam", "1"], checkpoints, system)
    )
    sources = dict(line.split("\t", 1) for line in lines if line.startswith("S-"))
    assert sources == {"S-0": "s1 <unk> s2", "S-1": "<unk>"}
    assert sorted(hypotheses(lines)) == [0, 1]


def test_source_longer_than_max_positions(data_bin, checkpoints, tmp_path):
    message = r"Size of sample #0 is invalid .* skip this example with --skip-invalid-size-inputs-valid-test"
    input_file = write_input(tmp_path, [" ".join(["s1"] * 1100)])  # the models' 1024 source positions
    for system in SYSTEMS:
        with pytest.raises(Exception, match=message):
            interactive_lines(
                data_bin, checkpoints[system], input_file, decoding_args(["--beam", "1"], checkpoints, system)
            )
    short = ["--max-source-positions", "5", "--beam", "1"]
    with pytest.raises(Exception, match=r"Size of sample #\d+ is invalid"):
        generate_lines(data_bin, checkpoints["sat"], TASK + short)
    kept = hypotheses(
        generate_lines(data_bin, checkpoints["sat"], TASK + short + ["--skip-invalid-size-inputs-valid-test"])
    )
    assert kept and len(kept) < 7


# ----- options -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "system, override, message",
    [
        ("sat", "{'group_size': 3}", "trained with --group-size 2 and cannot decode with --group-size 3"),
        ("recover_sat", "{'num_segments': 2}", "size mismatch for decoder.embed_segments.weight"),
        ("blockwise", "{'block_size': 2}", "decoder.block_heads"),
        ("fertility_nat", "{'max_fertility': 10}", "fertility_predictor"),
        ("spec_drafter", "{'decoder_layers': 2}", r'Missing key\(s\) in state_dict: "decoder\.layers\.1\.'),
    ],
)
def test_model_options_cannot_change_at_decoding(data_bin, checkpoints, capsys, system, override, message):
    with pytest.raises(ValueError, match=message) as error:
        generate_lines(data_bin, checkpoints[system], TASK + ["--beam", "1", "--model-overrides", override])
    assert "--model-overrides" in str(error.value)
    capsys.readouterr()
    with pytest.raises(SystemExit, match="2"):  # on the command line they are not decoding options at all
        generate_lines(data_bin, checkpoints["sat"], TASK + ["--group-size", "3"])
    assert "error: unrecognized arguments: --group-size 3" in capsys.readouterr().err


def test_speculative_draft_size_may_change_at_decoding(data_bin, checkpoints):
    """The drafter's k query slots share one mask embedding, so --model-overrides may change --draft-size: exact
    verification still prints the teacher's greedy output."""
    teacher = hypotheses(generate_lines(data_bin, checkpoints["teacher"], TASK + ["--beam", "1"]))
    for draft_size in (1, 5):
        override = ["--beam", "1", "--model-overrides", f"{{'draft_size': {draft_size}}}"]
        args = decoding_args(override, checkpoints, "spec_drafter")
        assert hypotheses(generate_lines(data_bin, checkpoints["spec_drafter"], args)) == teacher


@pytest.mark.parametrize(
    "system, options, message",
    [
        ("sat", ["--block-accept", "topk:2"], "--block-accept topk:2 is a decoding option of blockwise_transformer"),
        ("blockwise", ["--print-segments"], "--print-segments is a decoding option of recover_sat models; this "),
        ("recover_sat", ["--fertility-decoding", "average"], "--fertility-decoding average is a decoding option of "),
        ("fertility_nat", ["--print-nad-draft"], "checkpoint is a fertility_nat model, whose decoder does not read it"),
        ("nad_ad", ["--min-block-size", "2"], "--min-block-size 2 is a decoding option of blockwise_transformer"),
        ("teacher", ["--npd-teacher", "TEACHER"], "this checkpoint is a transformer model"),
        ("sat", ["--int8-drafts"], "--int8-drafts is a decoding option of blockwise_transformer and spec_drafter "),
    ],
)
def test_decoding_options_of_another_system_are_refused(data_bin, checkpoints, system, options, message):
    with pytest.raises(ValueError, match=message):
        generate_lines(data_bin, checkpoints[system], decoding_args(["--beam", "1"] + options, checkpoints))


@pytest.fixture(scope="module")
def other_dictionary_teacher(tmp_path_factory):
    """A teacher (1 update) of toy data with 7 more source words: another joined dictionary."""
    tmp = tmp_path_factory.mktemp("other-dictionary")
    raw = write_dummy_parallel(str(tmp / "raw"), n_train=30, n_valid=4, n_test=4, seed=1)
    with open(os.path.join(raw, "train.src"), "a") as f:
        f.write("a b c d e f g\n")
    with open(os.path.join(raw, "train.tgt"), "a") as f:
        f.write("t1\n")
    other_bin = binarize(raw, str(tmp / "bin"))
    return train_model(other_bin, str(tmp / "teacher"), SYSTEMS["teacher"], max_update=1)


def test_npd_teacher_with_another_dictionary(data_bin, checkpoints, other_dictionary_teacher):
    """Refused before loading; fairseq-train under translation_nat stored the teacher's dictionaries with its
    checkpoint, which a teacher of the same size is compared with once its data directory is gone
    (tests/test_teacher.py)."""
    state = checkpoint_utils.load_checkpoint_to_cpu(other_dictionary_teacher)
    for side, lang in (("source", "src"), ("target", "tgt")):
        stored = state["task_state"]["dictionaries"][side]
        assert stored == Dictionary.load(os.path.join(state["cfg"]["task"].data, f"dict.{lang}.txt")).symbols
    npd = ["--beam", "1", "--fertility-decoding", "npd", "--npd-teacher", other_dictionary_teacher]
    with pytest.raises(
        ValueError,
        match=r"--npd-teacher .*: that checkpoint was trained with another source dictionary \(encoder.embed_tokens"
        r".weight has \d+ rows, this data-bin's dictionary has \d+ symbols\): pass an autoregressive checkpoint",
    ):
        generate_lines(data_bin, checkpoints["fertility_nat"], TASK + npd)


def test_max_fertility_below_a_fertility_of_the_data_warns(data_bin, checkpoints, caplog):
    _models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoints["fertility_nat"]], arg_overrides={"data": data_bin}
    )
    task.load_dataset("valid")
    cfg.model.max_fertility = 2
    model = task.build_model(cfg.model)
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(4)])
    criterion = FertilityNATLoss(task)

    def warnings():
        return [r.message for r in caplog.records if r.levelno >= logging.WARNING]

    with caplog.at_level(logging.WARNING):
        criterion(model, sample)
        assert not warnings()  # fertilities of 1 fit --max-fertility 2
        row = sample["net_input"]["src_tokens"][0].ne(task.src_dict.pad()).nonzero()[0].item()  # left padded
        sample["fertility"][0, row : row + 2] = torch.tensor([2, 0])  # same sum, one fertility of 2
        criterion(model, sample)
        criterion(model, sample)
    (message,) = warnings()  # once per run
    assert "a fertility of 2 in the training data" in message and "train with --max-fertility 3 or more" in message


# ----- --init-from-ar ----------------------------------------------------------------------------------------------
def test_init_from_ar_file_missing(data_bin, tmp_path):
    missing = str(tmp_path / "no-such-teacher.pt")
    message = (
        f"--init-from-ar {re.escape(missing)}: no such file: pass the AR teacher's checkpoint .*or drop --init-from-ar"
    )
    with pytest.raises(FileNotFoundError, match=message):
        train_model(data_bin, str(tmp_path / "sat"), SYSTEMS["sat"] + ["--init-from-ar", missing], max_update=1)


def test_init_from_ar_without_a_matching_parameter(data_bin, checkpoints, tmp_path):
    """A teacher of other sizes (the student: 16-d, FFN 48): nothing matches, only fairseq's version buffers."""
    sizes = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16"]
    smaller = SYSTEMS["sat"] + sizes + ["--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48"]
    message = (
        r"--init-from-ar .*: no parameter of SATTransformerModel \(--init-from-ar-scope all\) has a name and shape in "
        r"that checkpoint: is it an AR Transformer with this model's sizes .*pass the AR teacher's checkpoint"
    )
    with pytest.raises(ValueError, match=message):
        train_model(data_bin, str(tmp_path / "sat"), smaller + ["--init-from-ar", checkpoints["teacher"]], max_update=1)


@pytest.mark.parametrize("system", ["sat", "recover_sat"])  # RecoverSAT adds DEL to the teacher's dictionary
def test_init_from_ar_with_another_dictionary(data_bin, other_dictionary_teacher, tmp_path, system):
    """Embeddings of another vocabulary size used to be skipped by the shape match (random, one INFO line)."""
    message = (
        r"--init-from-ar .*: that checkpoint was trained with another source dictionary \(encoder.embed_tokens.weight "
        r"has \d+ rows, this data-bin's dictionary has \d+ symbols\): its embeddings cannot initialise this model: "
        r"binarize the data with the teacher's dictionaries \(fairseq-preprocess --srcdict/--tgtdict"
    )
    with pytest.raises(ValueError, match=message):
        train_model(
            data_bin,
            str(tmp_path / system),
            SYSTEMS[system] + ["--init-from-ar", other_dictionary_teacher],
            max_update=1,
        )


# ----- checkpoint files --------------------------------------------------------------------------------------------
def test_truncated_or_corrupt_checkpoint_is_named(data_bin, checkpoints, tmp_path):
    with open(checkpoints["sat"], "rb") as f:
        content = f.read()
    for name, data in (("truncated", content[: len(content) // 2]), ("empty", b""), ("garbage", b"not a zip" * 9)):
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        with pytest.raises(CheckpointFileError, match=f"checkpoint {path} .* is truncated or corrupt"):
            generate_lines(data_bin, str(path), TASK + ["--beam", "1"])
    with pytest.raises(CheckpointFileError, match="truncated.pt .* is truncated or corrupt"):
        FrozenTeacher(str(tmp_path / "truncated.pt"), None, "--npd-teacher")


def test_checkpoint_of_an_older_plugin(data_bin, checkpoints, tmp_path):
    """A checkpoint written before the SAT saved its group size loads (upgraded) and decodes the same; parameters
    renamed by another version are refused with a message that says so."""
    expected = generate_lines(data_bin, checkpoints["sat"], TASK + ["--beam", "1"])
    state = torch.load(checkpoints["sat"], weights_only=False)
    assert int(state["model"].pop("decoder.trained_group_size")) == 2
    older = str(tmp_path / "older.pt")
    torch.save(state, older)
    assert generate_lines(data_bin, older, TASK + ["--beam", "1"]) == expected

    state["model"]["decoder.blocks.0.fc1.weight"] = state["model"].pop("decoder.layers.0.fc1.weight")
    state["task_state"]["nat_plugins"] = {"version": "0.0.1"}
    renamed = str(tmp_path / "renamed.pt")
    torch.save(state, renamed)
    with pytest.raises(ValueError, match=r"Missing key\(s\) .*decoder\.layers\.0\.fc1\.weight.*this one: 0\.0\.1"):
        generate_lines(data_bin, renamed, TASK + ["--beam", "1"])


def test_fairseq_generate_without_user_dir(data_bin, checkpoints):
    """torch's safe unpickler refuses the checkpoint before fairseq (or the plugin) can say anything: torch's message
    names the class it refused."""
    run = subprocess.run(
        [console_script("fairseq-generate"), data_bin, "--path", checkpoints["sat"], "--cpu", "--beam", "1"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"},
    )
    assert run.returncode != 0
    assert "Weights only load failed" in run.stderr and "argparse.Namespace" in run.stderr, run.stderr[-2000:]


# ----- the table of docs/errors.md --------------------------------------------------------------------------------
def bad_input_rows():
    """The rows of the bad-input table in docs/errors.md: (case, the tests its last column names)."""
    with open(os.path.join(REPO_ROOT, "docs", "errors.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| case")]
    return [(row.split(" | ")[0][2:], re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row.split(" | ")[-1])) for row in rows]


def test_bad_input_table_names_existing_tests():
    rows = bad_input_rows()
    assert len(rows) >= 20
    for case, tests in rows:
        assert tests, f"docs/errors.md row {case!r} names no test"
        for path, name in tests:
            with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
                assert re.search(rf"^def {name}\(", f.read(), re.MULTILINE), f"{path}::{name} (row {case!r}) not found"
