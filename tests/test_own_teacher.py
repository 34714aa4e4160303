"""Bring your own teacher (``TEACHER=... DATA_BIN=... bash run_scripts/quickstart.sh``, nat_plugins/cli/own_teacher.py):
a fairseq Transformer of a shape the quickstart never makes (3 layers, 64-d, pre-norm, all embeddings shared, words
without BPE, trained by plain ``fairseq-train --task translation``) is accelerated end to end, its exact rows print its
greedy output; what the command cannot take is refused with the file and what to do."""

import hashlib
import json
import os
import re
import shutil
import subprocess

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.data import Dictionary
from omegaconf import OmegaConf

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


# ----- the checks on what the command is given, on untrained checkpoints (no fairseq-train: seconds) ----------------
def untrained_teacher(data_bin, path, extra=()):
    """An untrained Transformer of plain fairseq (``--task translation``) on ``data_bin``, saved as fairseq saves
    one (its config, not its arguments): what the own-teacher checks read."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [data_bin, "--task", "translation", "--arch", "transformer", *SYNTHETIC_MODEL_SIZE, *extra],
    )
    model = tasks.setup_task(args).build_model(args)
    history = [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}, "num_updates": 0}]
    torch.save({"args": args, "model": model.state_dict(), "optimizer_history": history, "extra_state": {}}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)  # the config fairseq converts them to, saved as it saves it
    state.pop("args", None)
    torch.save({**state, "cfg": OmegaConf.to_container(state["cfg"])}, path)
    return path


@pytest.fixture(scope="module")
def plain(dummy_data_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("plain-teacher")
    return {"root": root, "data_bin": dummy_data_bin, "teacher": untrained_teacher(dummy_data_bin, str(root / "t.pt"))}


def data_bin_without(plain, name, *patterns):
    """A copy of the dummy data-bin without the files matching ``patterns``."""
    copy = plain["root"] / name
    shutil.copytree(plain["data_bin"], copy, ignore=shutil.ignore_patterns(*patterns), dirs_exist_ok=True)
    return str(copy)


def test_a_data_bin_without_a_test_split_or_a_dictionary_is_refused_before_the_first_step(plain):
    """The test split is read by the benchmark (after distillation and training), the dictionaries by every step:
    each is checked first, with the file and what to do."""
    no_test = data_bin_without(plain, "no-test", "test.*")
    with pytest.raises(own_teacher.TeacherError, match=r"has no test split \(test\.src-tgt\.src\.bin, ") as caught:
        own_teacher.check_inputs(no_test)
    assert no_test in str(caught.value) and "fairseq-preprocess --testpref" in str(caught.value)
    no_dict = data_bin_without(plain, "no-dict", "dict.tgt.txt")
    for check in (own_teacher.check_inputs, lambda data_bin: own_teacher.checked_model_cfg(plain["teacher"], data_bin)):
        with pytest.raises(own_teacher.TeacherError, match=r"has no dict\.tgt\.txt .*copy the target dictionary"):
            check(no_dict)  # shape too: a message, not FileNotFoundError's traceback


def test_a_given_reference_must_be_a_line_per_test_sentence(plain, tmp_path):
    """A missing REFERENCE would be written with the data-bin's targets (``<unk>`` for every word its dictionary
    lacks) and scored without a word; one of another length scores every row against other sentences."""
    missing = str(tmp_path / "test.de")  # its folder exists
    with pytest.raises(own_teacher.TeacherError, match="does not exist: give the raw target side") as caught:
        own_teacher.check_inputs(plain["data_bin"], missing)
    assert f"REFERENCE {missing!r}" in str(caught.value) and "(40 lines)" in str(caught.value)
    assert not os.path.exists(missing)
    short = tmp_path / "short.txt"
    short.write_text("a\nb\nc\n")
    with pytest.raises(own_teacher.TeacherError, match="has 3 lines, DATA_BIN's test split 40 sentences"):
        own_teacher.check_inputs(plain["data_bin"], str(short))
    right = tmp_path / "right.txt"
    right.write_text("x\n" * 40)
    own_teacher.check_inputs(plain["data_bin"], str(right))


def grown(state, extra_rows):
    """``state`` with ``extra_rows`` more rows in every vocabulary-sized tensor (the tokens a task appended)."""
    size = state["model"]["encoder.embed_tokens.weight"].size(0)
    for name, tensor in state["model"].items():
        if tensor.dim() and tensor.size(0) == size:
            state["model"][name] = torch.cat([tensor, tensor[:extra_rows]])


@pytest.mark.parametrize(
    "task, langs, extra_rows, message",
    [
        ("translation_multi_simple_epoch", None, 2, r"translation_multi_simple_epoch task appended a language token"),
        ("multilingual_denoising", None, 3, r"multilingual_denoising task appended .* and <mask> \(mBART\)"),
        ("translation_from_pretrained_bart", None, 3, r"appended a language token .* and <mask> \(an mBART fine-tune"),
        ("denoising", None, 1, r"fairseq's denoising task appended <mask> \(BART\)"),
        # a task of another --user-dir: its embeddings longer by the languages it names (and <mask>)
        ("my_multilingual", "src,tgt", 3, r"its task my_multilingual appended a token per language it names \(src, t"),
    ],
)
def test_a_multilingual_or_denoising_teacher_is_refused_for_the_tokens_its_task_appended(
    plain, task, langs, extra_rows, message
):
    """mBART, BART and multilingual teachers read token ids the data-bin's dictionaries do not have (their task
    appended language tokens or <mask>): the refusal says so, not "trained with another dictionary"."""
    state = torch.load(plain["teacher"], weights_only=False)
    state["cfg"]["task"].update(_name=task, **({"langs": langs} if langs else {}))
    grown(state, extra_rows)
    path = str(plain["root"] / f"{task}.pt")
    torch.save(state, path)
    with pytest.raises(own_teacher.TeacherError, match=message) as caught:
        own_teacher.checked_model_cfg(path, plain["data_bin"])
    assert "another source dictionary" not in str(caught.value) and "--task translation" in str(caught.value)


def test_a_teacher_with_layernorm_embedding_passes_it_on_to_the_students_shape(plain, capsys):
    """BART-style fine-tunes (--layernorm-embedding) decode exactly (tests/test_static_cache.py): the shape check
    takes them and gives the students the same embedding layer norm (TEACHER_SHAPE)."""
    path = untrained_teacher(plain["data_bin"], str(plain["root"] / "ln.pt"), ["--layernorm-embedding"])
    own_teacher.main(["shape", path, plain["data_bin"]])
    assert "--layernorm-embedding" in capsys.readouterr().out.split()


def own_teacher_env(plain, work, **env):
    """The own-teacher command's environment on the untrained teacher (``env``: more, or others); progress lines
    every second (a step's progress reporter holds the output open until its sleep ends: a failed step's caller
    would wait for it)."""
    own = {"TEACHER": plain["teacher"], "DATA_BIN": plain["data_bin"], "WORK": str(work), "PRESET": "cpu"}
    return {**own, "PROGRESS_SECONDS": "1", **env}


def test_quickstart_refuses_a_reference_it_cannot_score_against_before_any_step(plain, tmp_path):
    work = tmp_path / "work"
    missing = tmp_path / "test.de"
    run = quickstart(own_teacher_env(plain, work, REFERENCE=str(missing)), timeout=300)
    assert run.returncode == 2 and f"own_teacher check: REFERENCE '{missing}' does not exist" in run.stderr, run.stderr
    assert not work.exists() and not missing.exists(), "nothing is written for inputs it refuses"


def test_encoder_nad_ad_is_refused_on_a_teacher_whose_recipe_its_ar_twin_needs(plain, tmp_path):
    """Encoder-NAD-AD's comparison is with an AR twin trained by the same recipe from random weights; a run on your
    own teacher cannot know that recipe, so SYSTEMS=...nad-ad is refused, with what to do, before anything is
    written."""
    work = tmp_path / "work"
    run = quickstart(own_teacher_env(plain, work, SYSTEMS="sat,nad-ad"), timeout=300)
    assert run.returncode == 2 and "SYSTEMS=sat,nad-ad: Encoder-NAD-AD is compared with an AR twin" in run.stderr
    assert "leave nad-ad out of SYSTEMS" in run.stderr and not work.exists()


def made_for(plain):
    with open(plain["teacher"], "rb") as f:
        sha1 = hashlib.sha1(f.read()).hexdigest()
    return sha1, f"teacher sha1 {sha1}, data-bin {os.path.realpath(plain['data_bin'])}"


def test_a_work_folder_with_finished_steps_of_an_unknown_teacher_is_refused(plain, tmp_path):
    """A WORK with finished steps but no teacher.txt (the Multi30k quickstart's, or one made before teacher.txt was
    written) cannot be proven to hold this teacher's students: refused, not adopted with its steps. Without WORK the
    folder is work/own-teacher-PRESET-<the checkpoint's sha1, 8 digits>."""
    work = tmp_path / "multi30k-cpu"
    work.mkdir()
    (work / ".teacher.done").touch()
    run = quickstart(own_teacher_env(plain, work), timeout=300)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"WORK={work} has finished steps (.teacher.done) but no teacher.txt" in run.stderr
    assert f"write '{made_for(plain)[1]}' into {work}/teacher.txt" in run.stderr
    assert not (work / "teacher.txt").exists()
    default = os.path.join(REPO_ROOT, "work", f"own-teacher-cpu-{made_for(plain)[0][:8]}")
    os.makedirs(default)
    try:
        open(os.path.join(default, ".data.done"), "w").close()
        run = quickstart(own_teacher_env(plain, work, WORK=""), timeout=300)  # WORK unset
        assert run.returncode == 2 and f"WORK={default} has finished steps (.data.done)" in run.stderr, run.stderr
    finally:
        shutil.rmtree(default)


def test_the_benchmark_reruns_for_another_reference_or_post_processing(plain, tmp_path):
    """The report's advice for a reference with <unk> (``REFERENCE=`` raw test targets) in the same WORK re-runs the
    benchmark: its step's key holds the reference (path and content) and the post-processing. Every other step is
    marked done (the benchmark then fails on the missing checkpoints: only its key is read here)."""
    work = tmp_path / "work"
    (work / "data-bin").mkdir(parents=True)
    (work / "data-bin" / "train.kd.tgt.txt").write_text("a b\n")
    for name in ("data", "distill", "spec-drafter-3"):
        (work / f".{name}.done").touch()
    (work / "teacher.txt").write_text(made_for(plain)[1] + "\n")
    reference = tmp_path / "test.tgt"
    reference.write_text("x\n" * 40)

    def key(**env):
        run = quickstart(own_teacher_env(plain, work, REFERENCE=str(reference), SYSTEMS="spec-drafter", **env))
        found = re.findall(r"\] (benchmark-[0-9a-f]{8})(?:: done before| \.\.\.)", run.stdout)
        assert found, run.stdout[-2000:] + run.stderr[-2000:]
        return found[0]

    first = key()
    reference.write_text("y\n" * 40)  # the raw targets, same path
    second = key()
    assert second != first
    assert key(POST_PROCESS="sentencepiece") not in (first, second)
