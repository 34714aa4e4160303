"""The GPU preset's teacher recipe (run_scripts/train_teacher.sh, PRESET=gpu), rehearsed on the CPU
(GPU_PRESET_ON_CPU=1) at a tiny size (TEACHER_SHAPE): fairseq's recipe for a transformer_iwslt_de_en-sized model
(8k tokens, lr 5e-4, inverse square root after the warm-up, 3,000 updates by default), validated by BLEU, so the
recipe that a GPU run trains is the one fairseq-train accepts and follows."""

import os
import re
import subprocess

from .utils import REPO_ROOT

TINY_SHAPE = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2"
)


def test_the_gpu_teacher_recipe_trains_with_fairseqs_schedule(dummy_data_bin, tmp_path):
    env = {
        **os.environ,
        "PRESET": "gpu",
        "GPU_PRESET_ON_CPU": "1",
        "TEACHER_UPDATES": "6",
        "TEACHER_SHAPE": TINY_SHAPE,
    }
    save_dir = str(tmp_path / "teacher")
    run = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "run_scripts", "train_teacher.sh"), dummy_data_bin, save_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    for setting in ("'max_tokens': 8192", "'lr': [0.0005]", "'warmup_updates': 3", "'warmup_init_lr': 1e-07"):
        assert setting in log, setting
    assert "'_name': 'inverse_sqrt'" in log and "'max_update': 6" in log
    # after the warm-up the rate falls as 1/sqrt(update): 5e-4 * sqrt(3 / 6) at the last update
    lrs = [float(lr) for lr in re.findall(r"\| lr ([0-9.e-]+) \|", log)]
    assert lrs and abs(lrs[-1] - 5e-4 * (3 / 6) ** 0.5) < 1e-6, lrs
    assert re.search(r"valid on 'valid' subset .*\| bleu [0-9.]+ .*\| num_updates 6", log), log[-2000:]
    assert os.path.isfile(os.path.join(save_dir, "checkpoint_best.pt"))
