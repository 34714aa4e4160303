"""The attention backends the plugin decodes and trains with (nat_plugins/engine/attention.py): every generator's
decode through the task, fairseq's own generator through the benchmark's ``Generation.decode`` and a training step
run with cuDNN's attention (which plans per shape on sm90) excluded, PyTorch's flags restored afterwards;
``NAT_ATTENTION_BACKENDS`` changes the choice, a bad value is refused by name. The flags exist on every build, so the
CPU checks what a GPU would run under."""

from argparse import Namespace

import pytest
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch.nn.attention import SDPBackend

from nat_plugins.cli.decoding import Generation
from nat_plugins.engine import attention
from nat_plugins.engine.config import ATTENTION_BACKENDS_ENV
from nat_plugins.generators.verify_accept_loop import GreedyLoop

from .test_fuzz_generators import DECODINGS, collate, random_model, teacher_checkpoint
from .utils import with_task_options


def record_cudnn_flag(models):
    """Forward pre-hooks on every module of ``models``: the cuDNN-attention flag at each call."""
    seen, handles = [], []
    for model in models:
        for module in model.modules():
            hook = module.register_forward_pre_hook(lambda *_: seen.append(attention.cudnn_attention_enabled()))
            handles.append(hook)
    return seen, handles


def decoded_flags(task, generator, models, sample):
    seen, handles = record_cudnn_flag(models)
    try:
        task.inference_step(generator, models, sample)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def a_sample(task):
    dictionary = task.target_dictionary
    return collate([5, 9, 3], list(range(4, 20)), dictionary.eos(), dictionary.pad())


def test_the_choice_excludes_cudnn_by_default_and_follows_the_variable(monkeypatch):
    monkeypatch.delenv(ATTENTION_BACKENDS_ENV, raising=False)
    assert SDPBackend.CUDNN_ATTENTION not in attention.chosen_backends()
    assert SDPBackend.MATH in attention.chosen_backends()  # always possible
    assert attention.describe() == f"flash,efficient,math ({ATTENTION_BACKENDS_ENV})"
    monkeypatch.setenv(ATTENTION_BACKENDS_ENV, "torch")
    assert attention.chosen_backends() is None and "PyTorch's own choice" in attention.describe()
    monkeypatch.setenv(ATTENTION_BACKENDS_ENV, "math, cudnn")
    assert attention.chosen_backends() == [SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]
    refused = f"{ATTENTION_BACKENDS_ENV}=.*expected 'torch' or a comma-separated subset"
    for bad in ("fast", ",", "math,fast"):
        monkeypatch.setenv(ATTENTION_BACKENDS_ENV, bad)
        with pytest.raises(ValueError, match=refused):
            attention.chosen_backends()


@pytest.mark.parametrize("system, beam, task_options", DECODINGS, ids=lambda v: str(v))
def test_every_generator_decodes_without_cudnn_attention(tmp_path_factory, monkeypatch, system, beam, task_options):
    monkeypatch.delenv(ATTENTION_BACKENDS_ENV, raising=False)
    _args, task, model = random_model(system, 0)
    task_options = {
        name: teacher_checkpoint(str(tmp_path_factory.getbasetemp())) if value == "TEACHER" else value
        for name, value in task_options.items()
    }
    task = with_task_options(task, **task_options)
    generator = task.build_generator([model], Namespace(beam=beam, max_len_a=0, max_len_b=6))
    models = [model] + [value for value in vars(generator).values() if isinstance(value, torch.nn.Module)]
    assert attention.cudnn_attention_enabled()
    seen = decoded_flags(task, generator, models, a_sample(task))
    assert seen and not any(seen)  # every module ran with cuDNN's attention excluded
    assert attention.cudnn_attention_enabled()  # restored


@pytest.mark.parametrize("beam, generator_class", [(1, GreedyLoop), (4, SequenceGenerator)])
def test_the_teacher_decodes_without_cudnn_attention_unless_asked(monkeypatch, beam, generator_class):
    """The teacher through the plugin's task (its greedy loop, fairseq's beam search) and through fairseq's own
    ``translation`` task by the benchmark's ``Generation.decode``; with ``NAT_ATTENTION_BACKENDS=torch``, PyTorch's
    flags are left as they are."""
    _args, task, model = random_model("teacher", 0)
    generator = task.build_generator([model], Namespace(beam=beam, max_len_a=0, max_len_b=6))
    assert isinstance(generator, generator_class)
    fairseq_task = TranslationTask(TranslationConfig(), task.source_dictionary, task.target_dictionary)
    fairseq_generator = fairseq_task.build_generator([model], Namespace(beam=beam, max_len_a=0, max_len_b=6))
    for setting, expected in ((None, False), ("torch", True)):
        if setting is None:
            monkeypatch.delenv(ATTENTION_BACKENDS_ENV, raising=False)
        else:
            monkeypatch.setenv(ATTENTION_BACKENDS_ENV, setting)
        assert set(decoded_flags(task, generator, [model], a_sample(task))) == {expected}
        seen, handles = record_cudnn_flag([model])
        cfg = Namespace(generation=Namespace(prefix_size=0))
        Generation(cfg, fairseq_task, [model], fairseq_generator, use_cuda=False).decode(a_sample(task))
        for handle in handles:
            handle.remove()
        assert seen and set(seen) == {expected}


def test_a_training_step_of_the_task_runs_without_cudnn_attention(monkeypatch):
    monkeypatch.delenv(ATTENTION_BACKENDS_ENV, raising=False)
    _args, task, model = random_model("teacher", 1)
    model = type(model).build_model(_args, task)  # a fresh copy: the cached one stays in evaluation
    sample = a_sample(task)
    sample["target"] = sample["net_input"]["src_tokens"].flip(1)
    sample["net_input"]["prev_output_tokens"] = sample["target"]
    sample["ntokens"] = int(sample["target"].ne(task.target_dictionary.pad()).sum())
    criterion = CrossEntropyCriterion(task, sentence_avg=False)
    optimizer = Namespace(backward=lambda loss: loss.backward())
    seen, handles = record_cudnn_flag([model])
    task.train_step(sample, model, criterion, optimizer, update_num=1)
    task.valid_step(sample, model, criterion)
    for handle in handles:
        handle.remove()
    assert seen and not any(seen) and attention.cudnn_attention_enabled()
