"""Sequence-level distillation (``nat-distill``, nat_plugins/cli/distill.py) against its reference, fairseq-generate:
the distilled training targets are the teacher's fairseq-generate hypotheses sentence by sentence (same options, in
sentence-id order), as text and as the binarized targets a student trains on, sharded or not.

(tests/test_end_to_end.py covers what this does not: shards decoded in any order, merge refusals, a second name.)"""

import logging
import os
import re
import shutil

import pytest
from fairseq import options, tasks

from nat_plugins.cli import distill

from .utils import USER_DIR, generate_lines, hypotheses

NUM_TRAIN = 300  # tests/utils.py: write_dummy_parallel
# the same batches for both (generate_lines: --batch-size 16), so even a beam near-tie cannot tell them apart
COMMON = ["--user-dir", USER_DIR, "--cpu", "--batch-size", "16", "--num-workers", "0", "--no-progress-bar"]


def run_distill(data_bin, teacher, decoding, shard_dir, extra=()):
    distill.cli_main([data_bin, "--path", teacher, "--shard-dir", shard_dir] + COMMON + decoding + list(extra))


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def training_targets(data_bin):
    """The training split's targets as the translation_nat task gives them to a student with ``--use-distilled
    target`` (token ids, EOS included), and the target dictionary."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [data_bin, "--task", "translation_nat", "--arch", "transformer", "--use-distilled", "target"],
    )
    task = tasks.setup_task(args)
    task.load_dataset("train")
    dataset = task.dataset("train")
    return [dataset[i]["target"].tolist() for i in range(len(dataset))], task.target_dictionary


def assert_trains_on(data_bin, expected):
    """A student of ``data_bin`` with ``--use-distilled target`` trains on the sentences ``expected``, EOS-ended."""
    targets, dictionary = training_targets(data_bin)
    assert targets == [dictionary.encode_line(line, add_if_not_exist=False).tolist() for line in expected]


@pytest.mark.parametrize(
    "decoding, sharded",
    [
        # run_scripts/distill.sh: beam 4 and its length limits, fairseq's translation task (no --task)
        pytest.param(["--beam", "4", "--max-len-a", "1.2", "--max-len-b", "10"], True, id="recipe-beam4"),
        # the speculative drafter's greedy targets, through translation_nat (its CPU linear layers)
        pytest.param(["--task", "translation_nat", "--beam", "1"], False, id="greedy-translation_nat"),
    ],
)
def test_distilled_targets_are_the_teachers_fairseq_generate_output(
    dummy_data_bin, tiny_teacher, tmp_path, decoding, sharded
):
    """Line i of ``train.kd.tgt.txt`` and target i of the binarized ``train.kd.tgt`` (read through the task) are
    fairseq-generate's hypothesis H-i of the teacher with the same options, for all 300 training sentences; with
    ``sharded``, the training sentences decoded as 2 shards and merged give the same files."""
    data_bin = shutil.copytree(dummy_data_bin, str(tmp_path / "bin"))
    # fairseq's translation task drops a last batch of fewer than --required-batch-size-multiple (8) sentences
    lines = generate_lines(
        data_bin, tiny_teacher, ["--gen-subset", "train", "--required-batch-size-multiple", "1"] + decoding
    )
    generated = hypotheses(lines)
    assert sorted(generated) == list(range(NUM_TRAIN))
    expected = [generated[i] for i in range(NUM_TRAIN)]
    assert len(set(expected)) > NUM_TRAIN // 2  # real translations, not one line repeated

    run_distill(data_bin, tiny_teacher, decoding, str(tmp_path / "whole"))
    text_path = os.path.join(data_bin, "train.kd.tgt.txt")
    assert read_lines(text_path) == expected
    assert_trains_on(data_bin, expected)
    binarized = {ext: read_bytes(os.path.join(data_bin, f"train.kd.tgt.{ext}")) for ext in ("bin", "idx")}
    if not sharded:
        return
    for name in ("txt", "bin", "idx"):
        os.remove(os.path.join(data_bin, f"train.kd.tgt.{name}"))
    shard_dir = str(tmp_path / "shards")
    for shard_id in (0, 1):
        shard = ["--num-shards", "2", "--shard-id", str(shard_id), "--no-merge"]
        run_distill(data_bin, tiny_teacher, decoding, shard_dir, shard)
    assert not os.path.exists(text_path)
    distill.cli_main([data_bin, "--num-shards", "2", "--merge-only", "--shard-dir", shard_dir])
    shards = [read_lines(os.path.join(shard_dir, f"train.kd.tgt.shard{i}of2")) for i in (0, 1)]
    assert all(len(shard) < NUM_TRAIN for shard in shards)  # each holds part of the split
    assert sorted(int(line.split("\t")[0]) for shard in shards for line in shard) == list(range(NUM_TRAIN))
    assert read_lines(text_path) == expected
    assert_trains_on(data_bin, expected)
    for ext, content in binarized.items():
        assert read_bytes(os.path.join(data_bin, f"train.kd.tgt.{ext}")) == content, ext


def test_decoding_logs_its_progress(dummy_data_bin, tiny_teacher, tmp_path, caplog):
    """Decoding a shard logs the shard's sentence count first, then (``--log-interval-seconds 0``: after every batch)
    the sentences done of it with the rate and the time left, and last the count reached with the rate."""
    caplog.set_level(logging.INFO, logger=distill.logger.name)
    shard_dir = tmp_path / "shards"
    shard = ["--num-shards", "2", "--shard-id", "1", "--no-merge", "--log-interval-seconds", "0"]
    run_distill(dummy_data_bin, tiny_teacher, ["--beam", "1"], str(shard_dir), shard)
    total = len(read_lines(shard_dir / "train.kd.tgt.shard1of2"))
    assert 0 < total < NUM_TRAIN  # the shard's sentences, not the split's
    prefix = "distill train shard 2/2: "
    messages = [r.getMessage() for r in caplog.records if r.name == distill.logger.name]
    lines = [message[len(prefix) :] for message in messages if message.startswith(prefix)]
    assert lines[0] == f"{total} sentences to decode"
    during = [
        re.fullmatch(r"(\d+) / (\d+) sentences done \(\d+%\), [\d.]+ sentences/s, \d+:\d\d:\d\d left", line)
        for line in lines[1:-1]
    ]
    assert during and all(during), lines
    done = [int(match[1]) for match in during]
    assert done == sorted(set(done)) and done[-1] < total
    assert all(int(match[2]) == total for match in during)
    assert re.fullmatch(rf"{total} / {total} sentences done in \d+:\d\d:\d\d \([\d.]+ sentences/s\)", lines[-1])


def test_the_progress_line_says_the_time_left_at_the_rate_so_far(monkeypatch, caplog):
    """At 25 of 100 sentences after 25 s (1 sentence/s), the 75 left take 75 s: the line says 0:01:15 left; at 80
    after 40 s (2/s), 10 s. Lines come at most every --log-interval-seconds; the last says the time taken."""
    clock = [1000.0]
    monkeypatch.setattr(distill.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.INFO, logger=distill.logger.name)
    progress = distill.ProgressLog("distill train", 100, interval=10)
    for seconds, sentences in ((5, 10), (20, 15), (5, 30), (10, 25), (10, 20)):
        clock[0] += seconds
        progress.add(sentences)
    progress.finish()
    messages = [r.getMessage() for r in caplog.records if r.name == distill.logger.name]
    assert messages == [
        "distill train: 100 sentences to decode",
        "distill train: 25 / 100 sentences done (25%), 1.0 sentences/s, 0:01:15 left",
        "distill train: 80 / 100 sentences done (80%), 2.0 sentences/s, 0:00:10 left",
        "distill train: 100 / 100 sentences done in 0:00:50 (2.0 sentences/s)",
    ]
