"""nat_recipes.train_speed: fairseq-train's options in, timed updates of fairseq's Trainer out."""

import json
import os

import pytest

from nat_recipes import train_speed

from .utils import TINY_TRANSFORMER, USER_DIR


def train_options(data_bin, save_dir, max_tokens="200"):
    return [
        data_bin,
        "--user-dir",
        USER_DIR,
        "--cpu",
        "--task",
        "translation_nat",
        *TINY_TRANSFORMER,
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        max_tokens,
        "--criterion",
        "cross_entropy",
        "--num-workers",
        "0",
        "--seed",
        "1",
        "--save-dir",
        save_dir,
    ]


def test_times_the_updates_of_a_fairseq_train_command_and_saves_nothing(dummy_data_bin, tmp_path):
    output = tmp_path / "speed.jsonl"
    save_dir = tmp_path / "checkpoints"
    for label in ("first", "second"):
        train_speed.main(
            ["--label", label, "--compared-with", "first", "--updates", "3", "--warmup", "1", "--output", str(output)]
            + ["--"]
            + train_options(dummy_data_bin, str(save_dir))
        )
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["label"] for row in rows] == ["first", "second"]  # appended, one line per run
    assert [row["compared_with"] for row in rows] == ["first", "first"]
    for row in rows:
        assert row["updates"] == 3 and row["seconds"] > 0 and row["device"] == "cpu"
        assert row["updates_per_s"] == pytest.approx(3 / row["seconds"], rel=0.05)  # both rounded
        assert row["target_tokens_per_s"] > 0 and row["arch"] == "transformer" and row["criterion"] == "cross_entropy"
    assert not os.path.exists(save_dir) or not os.listdir(save_dir)


def test_bad_invocations_say_what_to_do(dummy_data_bin, tmp_path):
    output = str(tmp_path / "speed.jsonl")
    with pytest.raises(SystemExit, match="after '--'"):
        train_speed.main(["--label", "x", "--output", output])
    with pytest.raises(SystemExit):
        train_speed.main(
            ["--label", "x", "--updates", "0", "--output", output, "--"]
            + train_options(dummy_data_bin, str(tmp_path / "ckpt"))
        )


def test_a_small_training_set_is_cycled_through_epochs(dummy_data_bin, tmp_path):
    output = tmp_path / "speed.jsonl"  # 4000 tokens a batch: the toy training set is a couple of batches
    train_speed.main(
        ["--label", "x", "--updates", "6", "--warmup", "0", "--output", str(output), "--"]
        + train_options(dummy_data_bin, str(tmp_path / "ckpt"), max_tokens="4000")
    )
    assert json.loads(output.read_text())["updates"] == 6


def test_the_table_divides_each_run_by_the_one_it_is_compared_with(tmp_path, capsys):
    runs = [
        {"label": "teacher", "compared_with": "teacher", "updates_per_s": 2.0},
        {"label": "sat-2", "compared_with": "teacher", "updates_per_s": 1.0},
        {"label": "alone", "compared_with": None, "updates_per_s": 0.5},
    ]
    output = tmp_path / "speed.jsonl"
    output.write_text(
        "".join(
            json.dumps({**r, "updates": 5, "target_tokens_per_s": 100.0, "device": "cpu", "threads": 2}) + "\n"
            for r in runs
        )
    )
    train_speed.main(["--table", str(output)])
    table = capsys.readouterr().out
    assert "5 timed updates per recipe on cpu (2 threads)" in table
    assert "| sat-2 | 1.000 | 100 | 0.50 (teacher) |" in table and "| alone | 0.500 | 100 | – |" in table
