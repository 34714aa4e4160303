"""translation_nat: side-file loading and its errors, batch alignment, generator dispatch, the task check."""

import argparse
import os
import shutil
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from fairseq.utils import strip_pad

from nat_plugins.cli.distill import merge_shards
from nat_plugins.modules.options import check_label_smoothing
from nat_plugins.modules.plugin_model import NATPluginModel
from nat_plugins.systems.fertility_nat.loss import FertilityNATLoss
from nat_plugins.tasks.translation_nat import SideFileError, TranslationNATConfig, TranslationNATTask

from .utils import REPO_ROOT, TINY_TRANSFORMER, USER_DIR, console_script, with_task_options


@pytest.fixture
def data_bin(dummy_data_bin, tmp_path):
    """A private copy of the dummy data-bin that a test may add side files to."""
    return shutil.copytree(dummy_data_bin, str(tmp_path / "bin"))


def make_task(data_bin, **overrides):
    config = {"source_lang": "src", "target_lang": "tgt", "train_subset": "train", "dataset_impl": None}
    config |= {"required_seq_len_multiple": 1, **overrides}
    return TranslationNATTask.setup_task(TranslationNATConfig(data=data_bin, **config))


def build_plugin_model(task, arch, extra=()):
    """A tiny ``arch`` model (the test teacher's sizes) built through ``task``, as fairseq-train builds it."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [task.cfg.data, "--task", "translation_nat", "--arch", arch] + TINY_TRANSFORMER[2:] + list(extra),
    )
    return task.build_model(args)


def raw_lines(task, split, side):
    pair = getattr(task.dataset(split), "dataset", task.dataset(split))
    dictionary = task.src_dict if side == "src" else task.tgt_dict
    data = pair.src if side == "src" else pair.tgt
    return [dictionary.string(data[i]) for i in range(len(pair))]


def write_fertility(data_bin, split, rows):
    with open(os.path.join(data_bin, f"{split}.fert.src"), "w") as f:
        f.writelines(" ".join(str(v) for v in row) + "\n" for row in rows)


def write_distilled(task, data_bin, split, lines):
    shard = os.path.join(data_bin, "shard")
    with open(shard, "w") as f:
        f.writelines(f"{i}\t{line}\n" for i, line in enumerate(lines))
    prefix = os.path.join(data_bin, f"{split}.kd.tgt")
    merge_shards([shard], len(lines), prefix + ".txt", task.tgt_dict, prefix)


def reversed_targets(task, split):
    return [" ".join(reversed(line.split())) for line in raw_lines(task, split, "tgt")]


# ----- registration, import, checkpoint loading ---------------------------------------------------------
def test_import_registers_task_and_prints_nothing():
    code = "import nat_plugins\nfrom fairseq.tasks import TASK_REGISTRY\nassert 'translation_nat' in TASK_REGISTRY"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and run.stderr == ""


def test_fairseq_generate_help_lists_task_options():
    run = subprocess.run(
        [console_script("fairseq-generate"), "--help", "--user-dir", USER_DIR, "--task", "translation_nat"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "--use-distilled" in run.stdout


def test_torch_load_accepts_fairseq_globals_but_nothing_else(tmp_path):
    path = str(tmp_path / "ck.pt")
    torch.save({"cfg": {"model": argparse.Namespace(arch="transformer")}}, path)
    assert torch.load(path)["cfg"]["model"].arch == "transformer"  # default weights_only=True
    torch.save({"x": subprocess.CompletedProcess(args=[], returncode=0)}, path)
    with pytest.raises(Exception, match="CompletedProcess"):
        torch.load(path)


# ----- fertility side files -----------------------------------------------------------------------------
@pytest.mark.parametrize("multiple", [1, 8])
def test_fertility_batches_align_with_left_padded_source(data_bin, multiple):
    """Fertilities are padded like the source, --required-seq-len-multiple included (its padding used to be missing,
    and the NAT's loss failed on the shapes); the NAT's loss takes such a batch."""
    task = make_task(data_bin)
    task.load_dataset("valid")
    n_src = [len(line.split()) for line in raw_lines(task, "valid", "src")]
    # dummy targets are word-by-word translations: fertility 1 everywhere, except a 2/0 swap on long sentences
    rows = [[2, 0] + [1] * (n - 2) if n > 2 else [1] * n for n in n_src]
    write_fertility(data_bin, "valid", rows)
    task = make_task(data_bin, required_seq_len_multiple=multiple)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batch = dataset.collater([dataset[i] for i in range(8)])
    src, fert = batch["net_input"]["src_tokens"], batch["fertility"]
    assert fert.shape == src.shape
    pad, eos = task.src_dict.pad(), task.src_dict.eos()
    for b, sample_id in enumerate(batch["id"].tolist()):
        real = (src[b] != pad) & (src[b] != eos)
        assert fert[b][real].tolist() == rows[sample_id]  # same order as the source tokens
        assert fert[b][~real].eq(0).all()  # padding and EOS get 0
        assert fert[b].sum() == (batch["target"][b] != pad).sum() - 1  # sums to target length w/o EOS
    assert src.size(1) % multiple == 0
    loss, sample_size, _ = FertilityNATLoss(task)(build_plugin_model(task, "fertility_nat"), batch)
    assert torch.isfinite(loss) and sample_size > 0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda rows: [r + [1] for r in rows], "fertilities for a source of"),
        (lambda rows: [[r[0] + 1] + r[1:] for r in rows], "fertilities sum to"),
        (lambda rows: rows[:-1], "has 39 lines but its split has 40"),
        (lambda rows: rows + [[1]], "has more lines than"),
        (lambda rows: [["x"] + r[1:] for r in rows], "must be integers"),
        (lambda rows: [[-1, 2] + r[2:] if len(r) > 1 else r for r in rows], "must be >= 0"),
    ],
)
def test_bad_fertility_file_is_named_in_the_error(data_bin, mutate, message):
    task = make_task(data_bin)
    task.load_dataset("valid")
    rows = [[1] * len(line.split()) for line in raw_lines(task, "valid", "src")]
    write_fertility(data_bin, "valid", mutate(rows))
    task = make_task(data_bin)
    task.load_dataset("valid")  # a run that needs no fertilities (an AR baseline) is not stopped by the file
    assert task.dataset("valid").fertility is None
    with pytest.raises(SideFileError, match=message) as error:
        task.require_side_inputs(["fertility"], "SomeNATModel")
    assert "valid.fert.src" in str(error.value)
    with pytest.raises(SideFileError, match=message):  # nor loaded after the requirement is known
        task.load_dataset("valid")


def test_required_fertility_missing_is_reported_with_its_path(data_bin):
    task = make_task(data_bin)
    task.load_dataset("valid")
    with pytest.raises(SideFileError, match=r"valid\.fert\.src.*missing"):
        task.require_side_inputs(["fertility"], "SomeNATModel")
    with pytest.raises(ValueError, match="unknown side inputs"):
        task.require_side_inputs(["alignment"], "SomeNATModel")


# ----- distilled targets -------------------------------------------------------------------------------
def test_use_distilled_target_replaces_training_targets_only(data_bin):
    task = make_task(data_bin)
    task.load_dataset("train")
    task.load_dataset("valid")
    write_distilled(task, data_bin, "train", reversed_targets(task, "train"))
    write_distilled(task, data_bin, "valid", reversed_targets(task, "valid"))
    real_valid = raw_lines(task, "valid", "tgt")

    task = make_task(data_bin, use_distilled="target")
    task.load_dataset("train")
    task.load_dataset("valid")
    train_targets = raw_lines(task, "train", "tgt")
    plain = make_task(data_bin)
    plain.load_dataset("train")
    assert train_targets == [" ".join(reversed(t.split())) for t in raw_lines(plain, "train", "tgt")]
    assert raw_lines(task, "valid", "tgt") == real_valid  # validation BLEU keeps real references
    assert "kd_target" not in task.dataset("train").collater([task.dataset("train")[0]])


@pytest.mark.parametrize("multiple", [1, 8])
def test_use_distilled_side_adds_kd_target_in_batch_order(data_bin, multiple):
    """Distilled targets come in the batch's order, padded like the targets, --required-seq-len-multiple included
    (its padding used to be missing from them)."""
    task = make_task(data_bin)
    task.load_dataset("train")
    kd_lines = reversed_targets(task, "train")
    write_distilled(task, data_bin, "train", kd_lines)
    task = make_task(data_bin, use_distilled="side", required_seq_len_multiple=multiple)
    task.load_dataset("train")
    dataset = task.dataset("train")
    batch = dataset.collater([dataset[i] for i in range(10)])
    assert batch["kd_target"].size(1) % multiple == 0 and batch["target"].size(1) % multiple == 0
    real = raw_lines(task, "train", "tgt")
    for b, sample_id in enumerate(batch["id"].tolist()):
        pad = task.tgt_dict.pad()
        assert task.tgt_dict.string(strip_pad(batch["kd_target"][b], pad)) == kd_lines[sample_id]
        assert task.tgt_dict.string(strip_pad(batch["target"][b], pad)) == real[sample_id]
    assert batch["kd_ntokens"] == sum(len(line.split()) + 1 for line in (kd_lines[i] for i in batch["id"].tolist()))


def test_distilled_target_errors_name_the_file(data_bin):
    with pytest.raises(SideFileError, match=r"train\.kd\.tgt\.bin/\.idx.*nat_plugins\.cli\.distill"):
        make_task(data_bin, use_distilled="target").load_dataset("train")
    task = make_task(data_bin)
    task.load_dataset("valid")
    write_distilled(task, data_bin, "train", raw_lines(task, "valid", "tgt"))  # valid's 40 lines for train's 300
    with pytest.raises(SideFileError, match="holds 40 sentences but split 'train' has 300"):
        make_task(data_bin, use_distilled="side").load_dataset("train")
    with pytest.raises(SideFileError, match=r"train\.kd_greedy\.tgt\.bin/\.idx.*--output-name NAME for --distilled"):
        make_task(data_bin, use_distilled="target", distilled_name="kd_greedy").load_dataset("train")


# ----- models and generators ---------------------------------------------------------------------------
class _GeneratorDeclaringModel(NATPluginModel, TransformerModel):
    @staticmethod
    def generator_class(models, task, gen_args):
        return ("declared generator", task, gen_args.beam)


def test_build_generator_uses_the_models_generator_else_fairseqs(data_bin):
    task = make_task(data_bin)
    model = TransformerModel.build_model(tiny_transformer_args(), task)
    assert isinstance(task.build_generator([model], argparse.Namespace(beam=2)), SequenceGenerator)
    plugin_model = _GeneratorDeclaringModel.build_model(tiny_transformer_args(), task)
    assert task.build_generator([plugin_model], argparse.Namespace(beam=3)) == ("declared generator", task, 3)


def test_plugin_model_refuses_other_tasks_and_left_padded_targets(data_bin):
    translation = TranslationTask.setup_task(TranslationConfig(data=data_bin, source_lang="src", target_lang="tgt"))
    with pytest.raises(ValueError, match="--user-dir nat_plugins --task translation_nat"):
        _GeneratorDeclaringModel.build_model(tiny_transformer_args(), translation)
    left_padded = with_task_options(make_task(data_bin), left_pad_target=True)
    with pytest.raises(ValueError, match="_GeneratorDeclaringModel needs right-padded targets: drop --left-pad-target"):
        _GeneratorDeclaringModel.build_model(tiny_transformer_args(), left_padded)


# ----- --init-from-ar -----------------------------------------------------------------------------------------
# every model with --init-from-ar, and the options it needs
INIT_FROM_AR_ARCHS = {
    "sat_transformer": ["--group-size", "2"],
    "recover_sat": ["--num-segments", "2"],
    "fertility_nat": [],
    "nad_ad_transformer": [],
    "blockwise_transformer": ["--block-size", "2"],
    "spec_drafter": ["--draft-size", "2"],
}


@pytest.mark.parametrize("arch", sorted(INIT_FROM_AR_ARCHS))
def test_init_from_ar_scope(dummy_data_bin, tiny_teacher, arch):
    """``--init-from-ar-scope all`` (the default) copies every parameter whose (mapped) name and shape match the
    teacher's, decoder layers included; ``paper`` copies the encoder and the embeddings and leaves every parameter
    that corresponds to a teacher's decoder layer random (blockwise: the paper trains on the whole base model, so
    ``paper`` is ``all``). A RecoverSAT embedding holds the teacher's rows and a random DEL row."""
    teacher = checkpoint_utils.load_checkpoint_to_cpu(tiny_teacher)["model"]
    for scope in ("all", "paper"):
        init = ["--init-from-ar", tiny_teacher, "--init-from-ar-scope", scope]
        model = build_plugin_model(make_task(dummy_data_bin), arch, INIT_FROM_AR_ARCHS[arch] + init)
        copied, random = set(), set()
        for name, tensor in model.named_parameters():
            ar_name = model.ar_parameter_name(name)
            if ar_name not in teacher or teacher[ar_name].shape[1:] != tensor.shape[1:]:
                continue
            ar_tensor = teacher[ar_name]
            (copied if torch.equal(tensor[: ar_tensor.size(0)], ar_tensor) else random).add(ar_name)
        decoder_layers = {name for name in copied | random if name.startswith(("decoder.layers.", "decoder.layer_"))}
        assert decoder_layers, arch  # every model has parameters that the teacher's decoder layers can initialise
        assert "encoder.embed_tokens.weight" in copied and "encoder.layers.0.fc1.weight" in copied, (arch, scope)
        if scope == "all" or arch == "blockwise_transformer":
            assert not random, (arch, scope, sorted(random))
        else:
            assert decoder_layers <= random and random <= decoder_layers | {"decoder.output_projection.weight"}, (
                arch,
                sorted(random),
            )


def test_label_smoothing_range():
    assert check_label_smoothing(0.0) == 0.0 and check_label_smoothing(0.1) == 0.1
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"--label-smoothing must be in \[0, 1\)"):
            check_label_smoothing(bad)


def tiny_transformer_args():
    from fairseq.models.transformer import base_architecture

    args = argparse.Namespace(
        encoder_layers=1,
        decoder_layers=1,
        encoder_embed_dim=16,
        decoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        share_all_embeddings=True,
        max_source_positions=64,
        max_target_positions=64,
    )
    base_architecture(args)
    return args
