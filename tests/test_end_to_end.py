"""Tiny end-to-end runs through fairseq's own CLI entry points with ``--user-dir nat_plugins``."""

import logging
import os
import shutil

import pytest
import torch

from nat_plugins.cli import distill

from .utils import (
    TINY_TEACHER_ARGS,
    TINY_TEACHER_UPDATES,
    TINY_TRANSFORMER,
    USER_DIR,
    assert_best_checkpoint_is_the_best_validation,
    generate_lines,
    hypotheses,
    interactive_lines,
    log_file,
    train_model,
)


def test_eval_bleu_selects_the_best_checkpoint(dummy_data_bin, tiny_teacher, tmp_path):
    """checkpoint_best.pt is the checkpoint of the highest validation BLEU of the training log (translation_nat's
    --eval-bleu is the metric fairseq selects by): the tiny teacher's, and that of a run whose best validation is not
    its last. That run fine-tunes the teacher for 3 epochs of one update each (``--max-tokens 4000``: the whole
    training set in one batch) at the learning rate 1e-6 (BLEU stays the teacher's), then 0.03 (Adam's steps of
    ~0.03 per weight wreck the model; measured BLEU: 46.9, then 0.05 and 0.06; a rate that leaves only empty
    translations would crash the run: the task then reports no BLEU). Takes ~3 s besides the teacher."""
    state = torch.load(tiny_teacher)  # weights_only=True: loads thanks to nat_plugins.compat
    assert state["cfg"]["task"]["_name"] == "translation_nat"
    teacher_dir = os.path.dirname(tiny_teacher)
    bleu = assert_best_checkpoint_is_the_best_validation(teacher_dir, "bleu", os.path.join(teacher_dir, "train.log"))
    assert len(bleu) >= 2 and len(set(value for _, value in bleu)) > 1, bleu  # a choice to make

    save_dir = str(tmp_path / "finetuned")
    os.makedirs(save_dir)
    log = os.path.join(save_dir, "train.log")
    with log_file(log):
        train_model(
            dummy_data_bin,
            save_dir,
            TINY_TEACHER_ARGS
            + [
                "--finetune-from-model",
                tiny_teacher,
                "--lr",
                "0.000001,0.03",
                "--max-tokens",
                "4000",
                "--max-epoch",
                "3",
            ],
            max_update=100,
        )
    bleu = assert_best_checkpoint_is_the_best_validation(save_dir, "bleu", log)
    assert [updates for updates, _ in bleu] == [1, 2, 3], bleu
    assert bleu[0][1] > max(bleu[1][1], bleu[2][1]), bleu  # the best is the first validation, not the last


def test_generate_and_interactive(dummy_data_bin, dummy_raw, tiny_teacher, tmp_path):
    # batches of 12, 12, 12, 4: fairseq alone would drop the last (not a multiple of 8); the task keeps it
    lines = generate_lines(
        dummy_data_bin, tiny_teacher, ["--task", "translation_nat", "--beam", "2", "--batch-size", "12"]
    )
    hyps = hypotheses(lines)
    assert sorted(hyps) == list(range(40))
    assert any(line.startswith("Generate test with beam=2") for line in lines)

    with open(os.path.join(dummy_raw, "test.src")) as f:
        sources = [next(f).strip() for _ in range(3)]
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(sources) + "\n")
    inter = hypotheses(
        interactive_lines(dummy_data_bin, tiny_teacher, str(input_file), ["--task", "translation_nat", "--beam", "2"])
    )
    assert [inter[i] for i in range(3)] == [hyps[i] for i in range(3)]  # same model, same beam, same input


def test_restore_file_continues_training(dummy_data_bin, tiny_teacher, tmp_path, caplog):
    """The same command on a save directory with checkpoint_last.pt (of update 150) loads it and goes on to 155 (a
    fresh run would also end at 155: the load is what shows it continued)."""
    save_dir = str(tmp_path / "resume")
    shutil.copytree(os.path.dirname(tiny_teacher), save_dir)
    resumed_to = TINY_TEACHER_UPDATES + 5
    with caplog.at_level(logging.INFO):
        last = train_model(dummy_data_bin, save_dir, TINY_TEACHER_ARGS, max_update=resumed_to)
    loaded = f"Loaded checkpoint {os.path.join(save_dir, 'checkpoint_last.pt')} (epoch "
    assert any(m.startswith(loaded) and m.endswith(f" @ {TINY_TEACHER_UPDATES} updates)") for m in caplog.messages), [
        m for m in caplog.messages if "checkpoint" in m
    ]
    optimizer_history = torch.load(last)["optimizer_history"]
    assert optimizer_history[-1]["num_updates"] == resumed_to


def test_distillation_shards_merge_in_corpus_order(dummy_data_bin, tiny_teacher, tmp_path):
    data_bin = shutil.copytree(dummy_data_bin, str(tmp_path / "bin"))
    common = [
        data_bin,
        "--path",
        tiny_teacher,
        "--user-dir",
        USER_DIR,
        "--cpu",
        "--beam",
        "2",
        "--batch-size",
        "32",
        "--no-progress-bar",
        "--shard-dir",
        str(tmp_path / "shards"),
    ]
    distill.cli_main(common)
    with open(os.path.join(data_bin, "train.kd.tgt.txt")) as f:
        whole = f.read()
    os.remove(os.path.join(data_bin, "train.kd.tgt.txt"))

    for shard_id in (1, 0, 2):  # any order; the last one merges
        distill.cli_main(common + ["--num-shards", "3", "--shard-id", str(shard_id), "--no-merge"])
    distill.cli_main([data_bin, "--num-shards", "3", "--merge-only", "--shard-dir", str(tmp_path / "shards")])
    with open(os.path.join(data_bin, "train.kd.tgt.txt")) as f:
        assert f.read() == whole
    assert len(whole.splitlines()) == 300

    # the binarized side file trains a model on distilled targets through the task
    train_model(
        data_bin,
        str(tmp_path / "student"),
        TINY_TRANSFORMER + ["--task", "translation_nat", "--use-distilled", "target"],
        max_update=2,
    )

    # a second distillation under another name (the speculative drafter's greedy one) leaves the first alone
    distill.cli_main(common + ["--beam", "1", "--output-name", "kd_greedy"])
    with open(os.path.join(data_bin, "train.kd.tgt.txt")) as f:
        assert f.read() == whole
    with open(os.path.join(data_bin, "train.kd_greedy.tgt.txt")) as f:
        assert len(f.read().splitlines()) == 300
    with pytest.raises(ValueError, match="--output-name 'kd-greedy': use a name without '-'"):
        distill.cli_main(common + ["--output-name", "kd-greedy"])
    train_model(
        data_bin,
        str(tmp_path / "drafter"),
        TINY_TRANSFORMER + ["--task", "translation_nat", "--use-distilled", "target", "--distilled-name", "kd_greedy"],
        max_update=2,
    )


def test_distillation_merge_refuses_missing_shards(dummy_data_bin, tiny_teacher, tmp_path):
    data_bin = shutil.copytree(dummy_data_bin, str(tmp_path / "bin"))
    shards = str(tmp_path / "shards")
    distill.cli_main(
        [
            data_bin,
            "--path",
            tiny_teacher,
            "--cpu",
            "--batch-size",
            "64",
            "--no-progress-bar",
            "--num-shards",
            "2",
            "--shard-id",
            "0",
            "--no-merge",
            "--shard-dir",
            shards,
        ]
    )
    with pytest.raises(FileNotFoundError, match=r"train\.kd\.tgt\.shard1of2"):
        distill.cli_main([data_bin, "--num-shards", "2", "--merge-only", "--shard-dir", shards])
