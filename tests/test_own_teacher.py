"""Bring your own teacher (``TEACHER=... DATA_BIN=... bash run_scripts/quickstart.sh``, nat_plugins/cli/own_teacher.py):
a fairseq Transformer of a shape the quickstart never makes (3 layers, 64-d, pre-norm, all embeddings shared, words
without BPE, trained by plain ``fairseq-train --task translation``) is accelerated end to end, its exact rows print its
greedy output; what the command cannot take is refused with the file and what to do."""

import json
import os
import subprocess

import pytest
import torch
from fairseq.data import Dictionary

from nat_plugins.cli import own_teacher

from .utils import REPO_ROOT, SYNTHETIC_MODEL_SIZE, binarize, console_script, write_dummy_parallel

# the learning tests' model sizes with 3 layers each, pre-norm (the quickstart's teacher: 2 layers, post-norm)
OWN_SHAPE = ["--arch", "transformer", *SYNTHETIC_MODEL_SIZE, "--encoder-layers", "3", "--decoder-layers", "3"] + [
    "--encoder-normalize-before",
    "--decoder-normalize-before",
]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A data-bin (word-level toy pair) and a teacher trained on it by plain fairseq (no --user-dir, task
    translation) in the shape of :data:`OWN_SHAPE`."""
    root = tmp_path_factory.mktemp("own-teacher")
    data_bin = binarize(write_dummy_parallel(str(root / "raw")), str(root / "data-bin"))
    save_dir = str(root / "teacher")
    train = subprocess.run(
        [console_script("fairseq-train"), data_bin, "--task", "translation", *OWN_SHAPE, "--cpu", "--optimizer", "adam"]
        + ["--lr", "5e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20", "--max-tokens", "1000"]
        + ["--max-update", "300", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
        + ["--dropout", "0.1", "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    return {"root": root, "data_bin": data_bin, "teacher": os.path.join(save_dir, "checkpoint_best.pt")}


def edited_checkpoint(own, name, edit):
    """A copy of the own teacher's checkpoint with ``edit(state)`` applied."""
    state = torch.load(own["teacher"], weights_only=False)
    edit(state)
    path = str(own["root"] / f"{name}.pt")
    torch.save(state, path)
    return path


def test_the_shape_gives_students_the_teachers_sizes_and_sharing(own):
    words = own_teacher.shape_options(own_teacher.checked_model_cfg(own["teacher"], own["data_bin"]))
    text = " ".join(words)
    for option in ("--encoder-layers 3", "--decoder-layers 3", "--decoder-embed-dim 64", "--decoder-ffn-embed-dim 128"):
        assert option in text
    for flag in ("--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings"):
        assert flag in words
    assert own_teacher.detect_post_process(own["data_bin"]) == "none"


def set_model(field, value):
    def edit(state):
        setattr(state["cfg"]["model"], field, value)
        if field == "arch":
            state["cfg"]["model"]._name = value

    return edit


def set_task(field, value):
    def edit(state):
        state["cfg"]["task"][field] = value

    return edit


@pytest.mark.parametrize(
    "name, edit, message",
    [
        ("language-model", set_model("arch", "transformer_lm"), "is a language model"),
        # a Transformer's arch under fairseq's language_modeling task: refused by the task alone
        (
            "language-modeling-task",
            set_task("_name", "language_modeling"),
            r"is a language model \(task language_modeling, arch transformer\)",
        ),
        ("lstm", set_model("arch", "lstm"), "not fairseq's Transformer"),
        # a Transformer variant registered by a --user-dir this fairseq does not load
        (
            "unknown-arch",
            set_model("arch", "transformer_of_another_user_dir"),
            r"is 'transformer_of_another_user_dir' \(an architecture this fairseq does not know\), not fairseq's Trans",
        ),
        ("sat", set_model("arch", "sat_transformer"), "not an autoregressive teacher"),
        ("cross-self", set_model("cross_self_attention", True), "was trained with --cross-self-attention"),
        ("adaptive-softmax", set_model("adaptive_softmax_cutoff", "2,4"), "was trained with --adaptive-softmax-cutoff"),
        # NormFormer (Shleifer et al.): each of its options adds decoder parameters the exact rows do not compute
        ("normformer-attn", set_model("scale_attn", True), "was trained with NormFormer's --scale-attn"),
        ("normformer-fc", set_model("scale_fc", True), "was trained with NormFormer's --scale-fc"),
        ("normformer-heads", set_model("scale_heads", True), "was trained with NormFormer's --scale-heads"),
        ("normformer-resids", set_model("scale_resids", True), "was trained with NormFormer's --scale-resids"),
    ],
)
def test_checkpoints_it_cannot_take_are_refused_with_what_to_do(own, name, edit, message):
    path = edited_checkpoint(own, name, edit)
    with pytest.raises(own_teacher.TeacherError, match=message) as caught:
        own_teacher.checked_model_cfg(path, own["data_bin"])
    assert path in str(caught.value) and "checkpoint of fairseq's transformer architecture" in str(caught.value)


def test_a_data_bin_with_other_dictionaries_is_refused(own):
    other = binarize(write_dummy_parallel(str(own["root"] / "raw-other"), seed=1), str(own["root"] / "other-bin"))
    with pytest.raises(own_teacher.TeacherError, match="was trained with the source dictionary"):
        own_teacher.checked_model_cfg(own["teacher"], other)
    with pytest.raises(own_teacher.TeacherError, match="does not exist"):
        own_teacher.checked_model_cfg(str(own["root"] / "missing.pt"), own["data_bin"])
    with pytest.raises(own_teacher.TeacherError, match="is not a directory"):
        own_teacher.checked_model_cfg(own["teacher"], str(own["root"] / "no-such-bin"))


@pytest.mark.parametrize(
    "symbols, expected",
    [
        (["▁Ein", "▁Mann", "er", "▁Hut"], "sentencepiece"),
        (["Ein", "Man@@", "n", "Hut"], "subword_nmt"),
        (["a", "b"], "none"),
    ],
)
def test_the_subword_scheme_is_read_off_the_dictionary(tmp_path, symbols, expected):
    data_bin = tmp_path / "bin"
    data_bin.mkdir()
    dictionary = Dictionary()
    for symbol in symbols:
        dictionary.add_symbol(symbol)
    for lang in ("en", "de"):
        dictionary.save(str(data_bin / f"dict.{lang}.txt"))
    (data_bin / "train.en-de.en.idx").touch()
    assert own_teacher.detect_post_process(str(data_bin)) == expected


@pytest.mark.parametrize(
    "pieces, scheme",
    [
        (["▁Ein ▁Mann er ▁trägt ▁einen ▁Hut", "▁Zwei ▁Hunde"], "sentencepiece"),
        (["Ein Mann@@ er trägt einen Hut", "Zwei Hun@@ de"], "subword_nmt"),
    ],
)
def test_the_fallback_reference_is_the_test_targets_in_words(tmp_path, pieces, scheme):
    """Without REFERENCE the quickstart scores an own teacher against its data-bin's test targets: written back as
    words (subwords joined by the scheme read off the dictionary), as the benchmark's hypotheses are after
    --post-process, so that BLEU compares words with words."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            (raw / f"{split}.{lang}").write_text("".join(line + "\n" for line in pieces), encoding="utf-8")
    data_bin = binarize(str(raw), str(tmp_path / "data-bin"))
    post_process = own_teacher.detect_post_process(data_bin)
    assert post_process == scheme
    out = tmp_path / "reference.test.txt"
    own_teacher.main(["reference", data_bin, str(out), "--post-process", post_process])
    assert out.read_text(encoding="utf-8").splitlines() == ["Ein Manner trägt einen Hut", "Zwei Hunde"]


def quickstart(env, timeout=1200):
    return subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "run_scripts", "quickstart.sh")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_quickstart_refuses_a_teacher_without_its_data_bin_and_a_bad_teacher(own):
    run = quickstart({"TEACHER": own["teacher"], "DATA_BIN": ""}, timeout=300)
    assert run.returncode == 2 and "needs DATA_BIN=the data-bin it was trained on" in run.stderr
    lstm = edited_checkpoint(own, "lstm-2", set_model("arch", "lstm"))
    run = quickstart({"TEACHER": lstm, "DATA_BIN": own["data_bin"], "WORK": str(own["root"] / "w")}, timeout=300)
    assert run.returncode == 2 and "not fairseq's Transformer" in run.stderr
    assert not os.path.exists(own["root"] / "w"), "nothing is written for a teacher it refuses"


@pytest.mark.slow
def test_quickstart_accelerates_a_teacher_it_did_not_train(own):
    """The drafter and the blockwise heads are trained on the own teacher (2 updates each: exactness does not depend
    on them) and benchmarked against it; the exact rows print its greedy output, the report names the command."""
    work = str(own["root"] / "work")
    mine = os.path.join(own["data_bin"], "train.kd.tgt.txt")  # a user's own distillation, never overwritten
    with open(mine, "w", encoding="utf-8") as f:
        f.write("mine\n")
    env = {"TEACHER": own["teacher"], "DATA_BIN": own["data_bin"], "WORK": work, "PRESET": "cpu"}
    run = quickstart({**env, "STUDENT_UPDATES": "2", "LATENCY_SENTENCES": "15"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "--encoder-layers 3" in run.stdout and "--share-all-embeddings" in run.stdout
    report = open(os.path.join(work, "report.md"), encoding="utf-8").read()
    assert f"TEACHER={own['teacher']} DATA_BIN={own['data_bin']} PRESET=cpu" in report
    bench = os.path.join(work, "bench")

    def hyps(slug):
        with open(os.path.join(bench, f"hyp.{slug}.txt"), encoding="utf-8") as f:
            return f.read()

    greedy = hyps("ar-teacher-greedy")
    assert greedy.strip()
    for slug in ("speculative-k-3-exact", "blockwise-k-4-frozen-exact"):
        assert hyps(slug) == greedy
    # the hypothesis files are the batch-64 pass's; batch 1 (every sentence drafted) and the solo pass print the same
    with open(os.path.join(bench, "results.json"), encoding="utf-8") as f:
        rows = {row["name"]: row for row in json.load(f)["rows"]}
    for name in ("Speculative k=3, exact", "Blockwise k=4 frozen, exact"):
        checks = rows[name]["exact_check"]
        assert checks["1"]["sentences"] == 5 and "solo" in checks, name  # 15 latency sentences, 10 of warm-up
        assert all(check["differ"] == check["near_ties"] for check in checks.values()), (name, checks)
        # the report checks what the README promises an own teacher: its greedy output, its BLEU, at least as fast
        assert f"| {name}: = the teacher's greedy output in every timed pass, its BLEU, >= 1.0x greedy |" in report
    with open(mine, encoding="utf-8") as f:
        assert f.read() == "mine\n", "the own data-bin is only read"
    assert not os.path.islink(os.path.join(work, "data-bin", "train.kd.tgt.txt"))
    # a second teacher on the same data-bin into the same WORK would find the first one's students (finished steps
    # are skipped) and report them under its name: refused, with what to do, before anything runs
    other = edited_checkpoint(own, "other-teacher", lambda state: state["model"]["encoder.layers.0.fc1.bias"].add_(1))
    run = quickstart({**env, "TEACHER": other, "STUDENT_UPDATES": "2"}, timeout=300)
    assert run.returncode == 2 and "holds the students of another teacher" in run.stderr, run.stderr[-2000:]
    assert "Leave WORK unset (one folder per teacher)" in run.stderr
    assert hyps("ar-teacher-greedy") == greedy  # the first teacher's run is untouched
