"""Half precision: every system's training step and decoding in bfloat16 on CPU and in float16 on a GPU (finite
loss and gradients, no NaN scores, sane lengths, mostly the fp32 tokens of a model initialised from the trained
tiny teacher), and float16 for the attention masks and the NAD length predictor.

fairseq-train itself cannot run half precision on CPU (fairseq 0.12: ``--bf16`` implies ``--tpu`` and needs
torch_xla; ``--fp16`` queries CUDA), so the model-level path is tested; the float16 cases run where CUDA is
available and are skipped, saying so, elsewhere."""

import os
import shutil

import pytest
import torch
from fairseq import options, tasks, utils

from nat_plugins.modules.grouped_decoder import relaxed_causal_mask
from nat_plugins.modules.nat_decoder import LengthPredictor, self_attention_mask

from .utils import TINY_TRANSFORMER, with_task_options

ARCH = TINY_TRANSFORMER[2:]
SYSTEMS = {
    "fertility_nat": ["--arch", "fertility_nat", "--criterion", "fertility_nat_loss"],
    "sat_transformer": [
        "--arch",
        "sat_transformer",
        "--group-size",
        "2",
        "--criterion",
        "label_smoothed_cross_entropy",
    ],
    # --anneal-steps: its default is --max-update, which these training steps outside fairseq-train do not set
    "recover_sat": [
        "--arch",
        "recover_sat",
        "--num-segments",
        "2",
        "--criterion",
        "recover_sat_loss",
        "--anneal-steps",
        "100",
    ],
    "blockwise_transformer": [
        "--arch",
        "blockwise_transformer",
        "--block-size",
        "3",
        "--identity-first-head",
        "--criterion",
        "blockwise_loss",
    ],
    "nad_ad_transformer": ["--arch", "nad_ad_transformer", "--criterion", "nad_ad_loss", "--use-distilled", "side"],
    "spec_drafter": [
        "--arch",
        "spec_drafter",
        "--draft-size",
        "2",
        "--criterion",
        "spec_drafter_loss",
        "--use-distilled",
        "target",
        "--spec-drafter-teacher",
        "TEACHER",  # setup's teacher: it verifies the drafts
    ],
}
NO_GPU = not torch.cuda.is_available()
PRECISIONS = [
    pytest.param(("cpu", torch.bfloat16), id="cpu-bf16"),
    pytest.param(
        ("cuda", torch.float16), id="cuda-fp16", marks=pytest.mark.skipif(NO_GPU, reason="GPU-only: fp16 needs CUDA")
    ),
]
NUM_SENTENCES = 8


@pytest.fixture(scope="module")
def data_bin(fert_data_bin):
    """The data-bin with gold fertilities (tests/conftest.py) and its real targets as the distilled ones of
    nad_ad_loss."""
    for split in ("train", "valid", "test"):
        for ext in ("bin", "idx"):
            target = os.path.join(fert_data_bin, f"{split}.src-tgt.tgt.{ext}")
            shutil.copy(target, os.path.join(fert_data_bin, f"{split}.kd.tgt.{ext}"))
    return fert_data_bin


def setup(data_bin, teacher, system):
    """(task, fp32 model initialised from the tiny teacher, criterion) as fairseq-train builds them."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            data_bin,
            "--task",
            "translation_nat",
            "--label-smoothing",
            "0.1",
            "--init-from-ar",
            teacher,
        ]
        + ARCH
        + [teacher if arg == "TEACHER" else arg for arg in SYSTEMS[system]],
    )
    task = tasks.setup_task(args)
    task.load_dataset("test")
    torch.manual_seed(0)
    model = task.build_model(args)
    criterion = task.build_criterion(args)
    return task, model, criterion


def batch(task):
    dataset = task.dataset("test")
    return dataset.collater([dataset[i] for i in range(NUM_SENTENCES)])


def decode(task, model, sample):
    args = options.parse_args_and_arch(
        options.get_generation_parser(),
        [task.cfg.data, "--task", "translation_nat", "--beam", "1", "--max-len-a", "1", "--max-len-b", "5"],
    )
    generator = task.build_generator([model], args)
    with torch.no_grad():
        return task.inference_step(generator, [model], sample)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("system", list(SYSTEMS))
def test_half_precision_training_step_and_decoding(data_bin, tiny_teacher, system, precision):
    device, dtype = precision
    task, model, criterion = setup(data_bin, tiny_teacher, system)
    sample = utils.move_to_cuda(batch(task)) if device == "cuda" else batch(task)
    expected = decode(task, model.to(device).eval(), sample)

    model = model.to(dtype).train()
    loss, _sample_size, _log = criterion(model, sample)
    assert torch.isfinite(loss).all(), system
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads), system

    check_half_precision_decoding(task, model.eval(), sample, expected, system)


def check_half_precision_decoding(task, model, sample, expected, system):
    """``model`` (bf16 or fp16) decodes ``sample`` with finite scores, sane lengths and mostly the fp32 tokens
    ``expected``."""
    hypos = decode(task, model, sample)
    same = 0
    source_length = sample["net_input"]["src_tokens"].size(1)  # the batch's limit: fairseq's padded |x|
    for hypo, reference in zip(hypos, expected):
        tokens, score = hypo[0]["tokens"], hypo[0]["score"]
        assert torch.isfinite(torch.as_tensor(score)).all(), (system, score)  # not NaN and not +-inf
        assert 1 <= tokens.numel() <= 2 * (source_length + 5) + 3, system  # RecoverSAT: 2 segments of max_len
        same += torch.equal(tokens, reference[0]["tokens"])
    assert same >= len(hypos) // 2 + 1, f"{system}: {same}/{len(hypos)} sentences keep their fp32 tokens"


@pytest.mark.parametrize(
    "system, decoding",
    [
        ("fertility_nat", {"fertility_decoding": "average"}),
        ("fertility_nat", {"fertility_decoding": "npd", "npd_samples": 4}),
        ("blockwise_transformer", {"block_accept": "topk:2"}),
        ("spec_drafter", {"spec_drafter_verify": "relaxed"}),
    ],
)
def test_bf16_decoding_options(data_bin, tiny_teacher, system, decoding):
    """Average fertilities, noisy parallel decoding (its teacher moves to bf16 with the student), approximate
    blockwise acceptance and relaxed speculative verification in bf16."""
    if decoding.get("fertility_decoding") == "npd":
        decoding["npd_teacher"] = tiny_teacher
    task, model, _criterion = setup(data_bin, tiny_teacher, system)
    task = with_task_options(task, **decoding)
    sample = batch(task)
    torch.manual_seed(0)
    expected = decode(task, model.eval(), sample)
    torch.manual_seed(0)
    check_half_precision_decoding(task, model.to(torch.bfloat16), sample, expected, system)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_masks_hide_keys_without_nan_in_half_precision(dtype):
    """The SAT mask (-inf, as fairseq's causal mask: every query sees its own group) and the NAD's finite diagonal
    mask give a softmax in ``dtype`` that is finite, hides the masked keys and keeps a one-key row defined."""
    reference = torch.zeros(1, dtype=dtype)
    scores = (10 * torch.randn(5, 5)).to(dtype)
    for mask in (relaxed_causal_mask(5, 2).to(reference), self_attention_mask(5, True, reference)):
        assert mask.dtype == dtype
        weights = torch.softmax(scores + mask, dim=-1)
        assert torch.isfinite(weights).all() and weights.masked_select(mask < 0).max() == 0
    alone = torch.softmax(torch.zeros(1, 1, dtype=dtype) + self_attention_mask(1, True, reference), dim=-1)
    assert torch.equal(alone, torch.ones(1, 1, dtype=dtype))


def test_length_predictor_pools_long_fp16_sources_without_overflow():
    torch.manual_seed(0)
    predictor = LengthPredictor(8, 20)
    states = torch.full((2, 1000, 8), 100.0)  # an fp16 sum over the 1000 positions (1e5) overflows
    padding = torch.zeros(2, 1000, dtype=torch.bool)
    padding[1, 500:] = True
    expected = predictor(states, padding)
    logits = predictor.half()(states.half(), padding)
    assert logits.dtype == torch.float16 and torch.isfinite(logits).all()
    torch.testing.assert_close(logits.float(), expected, rtol=1e-2, atol=0.5)
