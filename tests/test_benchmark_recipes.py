"""The IWSLT14 de-en and WMT14 en-de recipes (examples/iwslt14, examples/wmt14): their prepare step on tiny slices
laid out like the downloaded releases, and the fairseq-train command line each training step builds (run with
FAIRSEQ_TRAIN set to a script that prints its arguments, then parsed by fairseq's own parser)."""

import json
import os
import subprocess
import sys

import pytest
from fairseq import options

from .test_prepare_data import read, write_iwslt14, write_wmt14
from .utils import REPO_ROOT


def run_script(path, *args, env=None):
    done = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, path), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("corpus", ["iwslt14", "wmt14"])
def test_prepare_step_on_a_slice_of_the_release(corpus, tmp_path):
    if corpus == "iwslt14":
        release, src, tgt = write_iwslt14(str(tmp_path))[0], "de", "en"
    else:
        release, src, tgt = str(tmp_path / "wmt14"), "en", "de"
        write_wmt14(release)
    out = str(tmp_path / "out")
    run_script(f"examples/{corpus}/prepare.sh", release, out, "--vocab-size", "60", "--workers", "1")
    assert os.path.isfile(os.path.join(out, "data-bin", f"train.{src}-{tgt}.{tgt}.bin"))
    lines = read(os.path.join(out, "raw", f"test.{tgt}"))
    if corpus == "iwslt14":
        assert len(lines) == 15 and all(line == line.lower() for line in lines)  # fairseq's IWSLT14: lowercased
    else:
        assert len(lines) == 7 and any(line != line.lower() for line in lines)


@pytest.fixture(scope="module")
def recipe_env(tmp_path_factory):
    """A data-bin with the side files the recipes check for, a teacher file, and FAIRSEQ_TRAIN printing argv."""
    root = tmp_path_factory.mktemp("recipes")
    data_bin = root / "data-bin"
    data_bin.mkdir()
    for name in ("train.kd.de.idx", "valid.kd.de.idx", "train.fert.en", "valid.fert.en"):
        (data_bin / name).write_text("")
    (root / "teacher.pt").write_text("")
    (root / "argv.py").write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    return {
        "data": str(data_bin),
        "teacher": str(root / "teacher.pt"),
        "save": str(root / "save"),
        "env": {"FAIRSEQ_TRAIN": f"{sys.executable} {root / 'argv.py'}"},
    }


def training_args(recipe_env, corpus, system, *args):
    out = run_script(f"examples/{corpus}/train.sh", system, *args, env=recipe_env["env"])
    argv = json.loads(out.strip().splitlines()[-1])
    return options.parse_args_and_arch(options.get_training_parser(), argv)


def test_wmt14_teacher_is_transformer_base_with_the_base_schedule(recipe_env):
    args = training_args(recipe_env, "wmt14", "teacher", recipe_env["data"], recipe_env["save"])
    assert (args.arch, args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (
        "transformer_wmt_en_de",
        512,
        2048,
        8,
    )
    assert (args.max_tokens, args.update_freq, args.max_update, args.warmup_updates, args.dropout) == (
        4096,
        [8],
        100000,
        4000,
        0.1,
    )
    assert args.lr == [7e-4] and args.lr_scheduler == "inverse_sqrt" and args.fp16 and args.share_all_embeddings


@pytest.mark.parametrize(
    "corpus, system, extra, expected",
    [
        (
            "wmt14",
            "sat",
            ["2"],
            {
                "arch": "sat_transformer_wmt_en_de",
                "group_size": 2,
                "dropout": 0.1,
                "max_update": 100000,
                "criterion": "label_smoothed_cross_entropy",
            },
        ),
        (
            "wmt14",
            "blockwise",
            ["8", "frozen"],
            {
                "arch": "blockwise_transformer",
                "block_size": 8,
                "dropout": 0.0,
                "freeze_base": True,
                "decoder_ffn_embed_dim": 2048,
            },
        ),
        (
            "iwslt14",
            "recover_sat",
            ["10"],
            {
                "arch": "recover_sat_iwslt_de_en",
                "num_segments": 10,
                "pseudo_rep_prob": 0.5,
                "dropout": 0.3,
                "max_tokens": 4096,
                "anneal_steps": 33333,
            },
        ),
        (
            "iwslt14",
            "nad_ad",
            [],
            {
                "arch": "nad_ad_transformer_iwslt_de_en",
                "criterion": "nad_ad_loss",
                "use_distilled": "side",
                "encoder_ffn_embed_dim": 1024,
            },
        ),
        (
            "wmt14",
            "fertility_nat",
            [],
            {
                "arch": "fertility_nat_wmt_en_de",
                "max_fertility": 50,
                "update_freq": [8],
                "use_distilled": "target",
                "warmup_updates": 4000,
            },
        ),
    ],
)
def test_students_get_the_system_recipe_at_the_benchmark_size(recipe_env, corpus, system, extra, expected):
    args = training_args(
        recipe_env, corpus, system, recipe_env["data"], recipe_env["teacher"], recipe_env["save"], *extra
    )
    assert {key: getattr(args, key) for key in expected} == expected
    assert args.task == "translation_nat" and args.fp16


def test_unknown_system_and_missing_arguments_are_named(recipe_env):
    done = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "examples/wmt14/train.sh"), "cmlm", "x"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown system 'cmlm'" in done.stderr
    done = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "examples/wmt14/train.sh"), "sat", recipe_env["data"]],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "sat needs 4 arguments" in done.stderr


def multi30k_args(recipe_env, script, *args, **env):
    out = run_script(script, *args, env={**recipe_env["env"], "PRESET": "cpu", **env})
    return options.parse_args_and_arch(options.get_training_parser(), json.loads(out.strip().splitlines()[-1]))


def test_nad_ad_from_scratch_trains_like_the_teacher_its_ar_twin(recipe_env):
    """By default (Zhou et al.'s protocol, the quickstart's): random weights and run_scripts/train_teacher.sh's
    training, so that the teacher trained with the same --seed is its AR twin; NAD_AD_INIT=teacher fine-tunes the
    teacher for a student's budget instead."""
    data, teacher_ckpt, save = recipe_env["data"], recipe_env["teacher"], recipe_env["save"]
    teacher = multi30k_args(recipe_env, "run_scripts/train_teacher.sh", data, save, "--seed", "2")
    scratch = multi30k_args(recipe_env, "examples/multi30k/nad_ad.sh", data, teacher_ckpt, save, "--seed", "2")
    fine_tuned = multi30k_args(
        recipe_env, "examples/multi30k/nad_ad.sh", data, teacher_ckpt, save, NAD_AD_INIT="teacher"
    )
    same = (
        "max_tokens max_update lr warmup_updates lr_scheduler total_num_update dropout optimizer adam_betas "
        "weight_decay seed encoder_layers encoder_embed_dim decoder_ffn_embed_dim share_all_embeddings label_smoothing"
    ).split()
    assert {key: getattr(scratch, key) for key in same} == {key: getattr(teacher, key) for key in same}
    assert (scratch.seed, scratch.max_update, scratch.arch, scratch.criterion) == (
        2,
        500,
        "nad_ad_transformer",
        "nad_ad_loss",
    )
    assert scratch.init_from_ar is None and fine_tuned.init_from_ar == teacher_ckpt
    assert scratch.nad_output_projection == fine_tuned.nad_output_projection == "ad"  # tied to the embeddings
    assert fine_tuned.max_update < teacher.max_update  # a student's budget from the teacher
    with pytest.raises(AssertionError, match="NAD_AD_INIT must be 'scratch' or 'teacher'"):
        run_script("examples/multi30k/nad_ad.sh", data, teacher_ckpt, save, env={"NAD_AD_INIT": "pretrained"})
    # dev/nad_ad_seeds.sh: seeds trained with other options must not take the default seeds' checkpoint names
    with pytest.raises(AssertionError, match="NAD_AD_TRAIN_ARGS needs a NAD_AD_TAG"):
        run_script("dev/nad_ad_seeds.sh", save, env={"NAD_AD_TRAIN_ARGS": "--nad-output-projection own"})
