"""The checks every teacher checkpoint goes through (nat_plugins/modules/teacher.py): ``--npd-teacher``,
``--teacher-path``, ``--spec-drafter-teacher`` and ``--init-from-ar`` refuse a checkpoint that is not an autoregressive
encoder-decoder, and one trained with other dictionaries than the student's data-bin, also after the teacher's data
directory moved (the dictionaries ``translation_nat`` stores in its checkpoints)."""

import logging

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary

from nat_plugins.modules.teacher import FrozenTeacher
from nat_plugins.tasks.translation_nat import TranslationNATConfig, TranslationNATTask

from .utils import TINY_TRANSFORMER

TEACHER_OPTIONS = ["--npd-teacher", "--teacher-path", "--spec-drafter-teacher"]
SIZES = [a for a in TINY_TRANSFORMER[2:] if a != "--share-all-embeddings"]
WORDS = [f"w{i}" for i in range(24)]
SWAPPED = [WORDS[1], WORDS[0]] + WORDS[2:]  # a dictionary of the same size, two symbols swapped


def make_toy_task(words=None):
    """A translation_nat task whose source and target dictionary holds ``words`` (default :data:`WORDS`)."""
    dictionary = Dictionary()
    for word in words or WORDS:
        dictionary.add_symbol(word)
    return TranslationNATTask(TranslationNATConfig(), dictionary, dictionary)


def save_teacher(path, arch_args, task=None, task_state=True):
    """A random ``arch_args`` model built through ``task`` (default: a fresh toy task) saved as fairseq-train saves
    it, with its task state (``task_state``: as translation_nat writes it); the data directory it names is gone."""
    task = task or make_toy_task()
    args = options.parse_args_and_arch(
        options.get_training_parser(), ["unused-data", "--task", "translation_nat"] + arch_args + SIZES
    )
    torch.manual_seed(0)
    model = task.build_model(args)
    args.data, args.source_lang, args.target_lang = str(path) + ".moved-away", "src", "tgt"
    history = [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}, "num_updates": 0}]
    state = {"args": args, "model": model.state_dict(), "optimizer_history": history, "extra_state": {}}
    if task_state:
        state["task_state"] = task.state_dict()
    torch.save(state, path)
    return str(path)


def test_translation_nat_checkpoints_store_their_dictionaries():
    task = make_toy_task(["a", "b", "c"])
    stored = task.state_dict()["dictionaries"]
    assert stored == {"source": task.src_dict.symbols, "target": task.tgt_dict.symbols}
    assert stored["target"][-3:] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "arch_args",
    [
        ["--arch", "sat_transformer", "--group-size", "2"],
        ["--arch", "recover_sat", "--num-segments", "2"],
        ["--arch", "nad_ad_transformer"],
        ["--arch", "blockwise_transformer", "--block-size", "2"],
        ["--arch", "spec_drafter", "--draft-size", "2"],
        ["--arch", "fertility_nat"],
        ["--arch", "nonautoregressive_transformer"],  # fairseq's own NAT
    ],
)
def test_a_non_autoregressive_checkpoint_is_refused_as_a_teacher(tmp_path, arch_args):
    """Their decoders would be run as a Transformer's (teacher-forced scores, verification steps): SAT, RecoverSAT,
    Encoder-NAD-AD and blockwise checkpoints used to be scored as plain Transformers. The refusal comes before the
    model is built: a RecoverSAT model would add its DEL symbol to the student's dictionary."""
    path = save_teacher(tmp_path / "teacher.pt", arch_args)
    student = make_toy_task()
    for option in TEACHER_OPTIONS:
        with pytest.raises(ValueError, match=f"{option} .* is a {arch_args[1]} checkpoint .*not an autoregressive "):
            FrozenTeacher(path, student, option)
    assert len(student.target_dictionary) == 28


@pytest.mark.parametrize("option", TEACHER_OPTIONS)
def test_a_teacher_whose_data_directory_is_gone_is_compared_by_its_stored_dictionaries(tmp_path, caplog, option):
    """The teacher's data directory is gone: the dictionaries its checkpoint stores are compared with the
    student's (a dictionary of the same size with two symbols swapped used to pass with a warning at most); a
    checkpoint that stores none is accepted with a warning."""
    student = make_toy_task()
    other = save_teacher(tmp_path / "other.pt", ["--arch", "transformer"], make_toy_task(SWAPPED))
    with pytest.raises(
        ValueError,
        match=f"{option} .*other.pt' was trained with the source dictionary stored in its checkpoint, which is not "
        "this data-bin's \\(symbol 4 is 'w1' there, 'w0' here\\).*--arch transformer",
    ):
        FrozenTeacher(other, student, option)
    with caplog.at_level(logging.WARNING):
        FrozenTeacher(save_teacher(tmp_path / "same.pt", ["--arch", "transformer"]), student, option)
    assert "cannot check" not in caplog.text
    unknown = save_teacher(tmp_path / "unknown.pt", ["--arch", "transformer"], task_state=False)
    with caplog.at_level(logging.WARNING):
        FrozenTeacher(unknown, student, option)
    assert "cannot check that the teacher was trained with this data-bin's source dictionary (its data" in caplog.text


def test_a_teacher_dictionary_of_another_size_is_refused_before_loading(tmp_path):
    path = save_teacher(tmp_path / "teacher.pt", ["--arch", "transformer"], make_toy_task(["x", "y"]))
    with pytest.raises(
        ValueError,
        match="--npd-teacher .*: that checkpoint was trained with another source dictionary "
        r"\(encoder.embed_tokens.weight has 6 rows, this data-bin's dictionary has 28 symbols\)",
    ):
        FrozenTeacher(path, make_toy_task(), "--npd-teacher")


@pytest.mark.parametrize("arch_args", [["--arch", "sat_transformer"], ["--arch", "recover_sat", "--num-segments", "2"]])
def test_init_from_ar_compares_the_stored_dictionaries(tmp_path, arch_args):
    """``--init-from-ar`` too: a teacher of the same size with other symbols is refused once its data directory is
    gone (the embeddings of other words used to be copied); RecoverSAT's added DEL is left out of the comparison."""
    other = save_teacher(tmp_path / "other.pt", ["--arch", "transformer"], make_toy_task(SWAPPED))
    same = save_teacher(tmp_path / "same.pt", ["--arch", "transformer"])
    args = options.parse_args_and_arch(
        options.get_training_parser(), ["unused-data", "--task", "translation_nat"] + arch_args + SIZES
    )
    student = make_toy_task().build_model(args)
    with pytest.raises(
        ValueError,
        match="--init-from-ar .*other.pt' was trained with the source dictionary stored in its checkpoint.*"
        "binarize the data with the teacher's dictionaries",
    ):
        student.init_from_ar(other)
    assert "encoder.embed_tokens.weight" in student.init_from_ar(same)
