"""Every plugin criterion trains through fairseq's own distributed engine: two CPU ranks (gloo, ``fairseq-train``'s
``main`` with ``--distributed-world-size 2``) take a few updates on their own shards of the batches, and afterwards
both hold bit-identical parameters that differ from where they started, so the gradients really were all-reduced
(a parameter whose gradient stayed local would differ between the ranks).

``--ddp-backend pytorch_ddp`` (fairseq's default, what a GPU run gets) wraps the model in torch's
DistributedDataParallel, which all-reduces only what the wrapped ``forward`` produced: every criterion must reach
the model through it. fairseq hands that wrapper a CUDA device id even on CPU, so the ranks here drop it (the same
class otherwise); ``legacy_ddp`` (fairseq's own all-reduce after the backward, what a CPU run uses) is run too."""

import faulthandler
import os
import socket
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from .utils import SYNTHETIC_MODEL_SIZE, USER_DIR

UPDATES = 3
TIMEOUT_S = 240

COMMON = SYNTHETIC_MODEL_SIZE + [
    "--task",
    "translation_nat",
    "--optimizer",
    "adam",
    "--lr",
    "0.001",
    "--max-tokens",
    "600",
    "--dropout",
    "0.1",
    "--disable-validation",
    "--cpu",
    "--num-workers",
    "0",
    "--no-progress-bar",
    "--no-epoch-checkpoints",
    "--seed",
    "1",
    "--max-update",
    str(UPDATES),
    "--log-interval",
    "1",
]
# criterion -> its model and options (TEACHER is replaced by the synthetic teacher's checkpoint); the NAT trains on
# the real targets, which the gold fertilities of the synthetic data-bin describe
CASES = {
    "fertility_nat_loss": ["--arch", "fertility_nat", "--criterion", "fertility_nat_loss", "--init-from-ar", "TEACHER"],
    "nat_rkl_finetune": [
        "--arch",
        "fertility_nat",
        "--criterion",
        "nat_rkl_finetune",
        "--teacher-path",
        "TEACHER",
        "--init-from-ar",
        "TEACHER",
    ],
    "sat_transformer+label_smoothed_cross_entropy": [
        "--arch",
        "sat_transformer",
        "--group-size",
        "2",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--init-from-ar",
        "TEACHER",
        "--use-distilled",
        "target",
    ],
    "recover_sat_loss": [
        "--arch",
        "recover_sat",
        "--num-segments",
        "2",
        "--criterion",
        "recover_sat_loss",
        "--init-from-ar",
        "TEACHER",
        "--use-distilled",
        "target",
    ],
    "blockwise_loss-random": [
        "--arch",
        "blockwise_transformer",
        "--block-size",
        "3",
        "--criterion",
        "blockwise_loss",
        "--head-sampling",
        "random",
        "--find-unused-parameters",
        "--init-from-ar",
        "TEACHER",
        "--use-distilled",
        "target",
    ],
    "blockwise_loss-mean": [
        "--arch",
        "blockwise_transformer",
        "--block-size",
        "3",
        "--criterion",
        "blockwise_loss",
        "--head-sampling",
        "mean",
        "--init-from-ar",
        "TEACHER",
        "--use-distilled",
        "target",
    ],
    "spec_drafter_loss": [
        "--arch",
        "spec_drafter",
        "--decoder-layers",
        "1",
        "--criterion",
        "spec_drafter_loss",
        "--init-from-ar",
        "TEACHER",
        "--use-distilled",
        "target",
    ],
    "nad_ad_loss": [
        "--arch",
        "nad_ad_transformer",
        "--criterion",
        "nad_ad_loss",
        "--init-from-ar",
        "TEACHER",
        "--use-distilled",
        "side",
    ],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DistributedDataParallelOnCPU(torch.nn.parallel.DistributedDataParallel):
    """torch's DistributedDataParallel without the CUDA device id fairseq passes (torch refuses one for a CPU
    module)."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        super().__init__(module, **kwargs)


def train_rank(rank, argv, out_dir):
    """One rank (a spawned process: a child forked from the multi-threaded pytest process can deadlock): fairseq's
    training ``main`` through ``call_main``, as ``fairseq-train`` runs it; the unwrapped model's parameters are saved
    before the first update and whenever fairseq saves a checkpoint (every rank calls ``save_checkpoint``)."""
    faulthandler.dump_traceback_later(TIMEOUT_S - 30, file=sys.__stderr__)  # where a hang is, if one happens
    torch.set_num_threads(1)
    from fairseq import checkpoint_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq.models import distributed_fairseq_model
    from fairseq.trainer import Trainer
    from fairseq_cli import train

    def parameters(trainer):
        return {name: p.detach().clone() for name, p in trainer.get_model().named_parameters()}

    train_step, save_checkpoint = Trainer.train_step, checkpoint_utils.save_checkpoint

    def first_step_saving_the_start(trainer, samples, raise_oom=False):
        if trainer.get_num_updates() == 0 and not os.path.exists(os.path.join(out_dir, f"start{rank}.pt")):
            torch.save(parameters(trainer), os.path.join(out_dir, f"start{rank}.pt"))
        return train_step(trainer, samples, raise_oom)

    def save_checkpoint_and_parameters(cfg, trainer, epoch_itr, val_loss):
        torch.save(parameters(trainer), os.path.join(out_dir, f"end{rank}.pt"))
        return save_checkpoint(cfg, trainer, epoch_itr, val_loss)

    distributed_fairseq_model.DistributedDataParallel = DistributedDataParallelOnCPU
    Trainer.train_step = first_step_saving_the_start
    checkpoint_utils.save_checkpoint = save_checkpoint_and_parameters
    args = options.parse_args_and_arch(options.get_training_parser(), argv + ["--distributed-rank", str(rank)])
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)


@pytest.mark.parametrize(
    "case,ddp_backend", [(case, "pytorch_ddp") for case in sorted(CASES)] + [("blockwise_loss-mean", "legacy_ddp")]
)
def test_two_ranks_end_with_the_same_trained_parameters(case, ddp_backend, synthetic_teacher, tmp_path):
    teacher, data_bin = synthetic_teacher
    argv = (
        [data_bin, "--user-dir", USER_DIR, "--save-dir", str(tmp_path / "ckpt")]
        + COMMON
        + [teacher if a == "TEACHER" else a for a in CASES[case]]
        + [
            "--distributed-world-size",
            "2",
            "--distributed-backend",
            "gloo",
            "--distributed-no-spawn",
            "--ddp-backend",
            ddp_backend,
            "--distributed-init-method",
            f"tcp://127.0.0.1:{free_port()}",
        ]
    )
    context = mp.start_processes(train_rank, args=(argv, str(tmp_path)), nprocs=2, start_method="spawn", join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{case}: the two ranks did not finish within {TIMEOUT_S} s (stacks on stderr)")

    start = [torch.load(tmp_path / f"start{r}.pt") for r in (0, 1)]
    end = [torch.load(tmp_path / f"end{r}.pt") for r in (0, 1)]
    assert set(end[0]) == set(end[1]) == set(start[0])
    for name in start[0]:
        assert torch.equal(start[0][name], start[1][name]), f"{case}: {name} starts differently on the two ranks"
        assert torch.equal(end[0][name], end[1][name]), f"{case}: {name} differs between the ranks after training"
    moved = [name for name in end[0] if not torch.equal(end[0][name], start[0][name])]
    assert len(moved) >= len(end[0]) // 2, f"{case}: only {moved} changed in {UPDATES} updates"
