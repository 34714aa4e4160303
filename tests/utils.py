"""In-process fairseq helpers for the tests (after fairseq's own ``tests/utils.py``): dummy data, binarize,
train, generate, interactive — each a call of the fairseq CLI's ``main`` with parsed arguments, so a test
pays fairseq's ~5 s import once per session instead of once per command."""

import contextlib
import copy
import io
import logging
import os
import random
import re
import sys

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.data import data_utils
from fairseq_cli import generate, interactive, train

from nat_plugins.cli import prepare_data

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO_ROOT, "nat_plugins")
MULTI30K_DIR = os.environ.get("MULTI30K_DIR") or os.path.join(os.path.dirname(REPO_ROOT), "shared", "data", "multi30k")

TINY_TEACHER_UPDATES = 150  # enough for the toy task: validation BLEU ~48
TINY_TRANSFORMER = [
    "--arch",
    "transformer",
    "--share-all-embeddings",
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]


# the tiny teacher of tests/conftest.py: AR Transformer under translation_nat, checkpoints selected by BLEU
TINY_TEACHER_ARGS = TINY_TRANSFORMER + [
    "--task",
    "translation_nat",
    "--criterion",
    "label_smoothed_cross_entropy",
    "--label-smoothing",
    "0.1",
    "--eval-bleu",
    "--eval-bleu-args",
    '{"beam": 1}',
    "--best-checkpoint-metric",
    "bleu",
    "--maximize-best-checkpoint-metric",
    "--lr",
    "0.005",
]


# --max-drafting-sentences on a command line that drafts at every step of any test batch: tests of what drafts and
# heads propose (in-process generators take math.inf)
DRAFT_EVERY_STEP = 100_000

# the teacher of the learning tests (tests/conftest.py: synthetic_teacher), 2 x 64-d
SYNTHETIC_TEACHER_UPDATES = 300
SYNTHETIC_MODEL_SIZE = [
    "--share-all-embeddings",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--encoder-embed-dim",
    "64",
    "--decoder-embed-dim",
    "64",
    "--encoder-ffn-embed-dim",
    "128",
    "--decoder-ffn-embed-dim",
    "128",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
]
SYNTHETIC_TEACHER_ARGS = (
    ["--arch", "transformer"]
    + SYNTHETIC_MODEL_SIZE
    + [
        "--task",
        "translation_nat",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--lr",
        "0.003",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "50",
        "--max-tokens",
        "2000",
        "--dropout",
        "0.1",
        "--disable-validation",
    ]
)


def with_task_options(task, **options):
    """``task`` with ``options`` set in a copy of its config: generators read their own options from ``task.cfg``."""
    copied = copy.copy(task)
    copied.cfg = copy.deepcopy(task.cfg)
    for name, value in options.items():
        setattr(copied.cfg, name, value)
    return copied


def console_script(name):
    """Path of a console script (fairseq-generate, ...) of the Python running the tests, activated or not."""
    return os.path.join(os.path.dirname(sys.executable), name)


def write_dummy_parallel(raw_dir, n_train=300, n_valid=40, n_test=40, seed=0):
    """A learnable toy language pair: each source word ``sN`` maps to target word ``tN``, order kept.

    Returns the raw directory holding ``{train,valid,test}.{src,tgt}`` (word-level, no subwords)."""
    rng = random.Random(seed)
    os.makedirs(raw_dir, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        src_lines, tgt_lines = [], []
        for _ in range(n):
            words = [rng.randrange(24) for _ in range(rng.randint(2, 10))]
            src_lines.append(" ".join(f"s{w}" for w in words))
            tgt_lines.append(" ".join(f"t{w}" for w in words))
        for lang, lines in (("src", src_lines), ("tgt", tgt_lines)):
            with open(os.path.join(raw_dir, f"{split}.{lang}"), "w") as f:
                f.writelines(line + "\n" for line in lines)
    return raw_dir


SYNTHETIC_VOCAB = 30


def synthetic_translation(source_ids):
    """The synthetic task of the learning tests: a monotone word mapping whose fertilities vary.

    Source word ``sN`` becomes ``tN``, except that ``N % 5 == 1`` expands to two words ``tN uN`` (fertility 2) and
    ``N % 7 == 3`` is deleted (fertility 0). Returns (target words, fertility of each source word)."""
    target, fertility = [], []
    for n in source_ids:
        words = [] if n % 7 == 3 else [f"t{n}", f"u{n}"] if n % 5 == 1 else [f"t{n}"]
        target.extend(words)
        fertility.append(len(words))
    return target, fertility


def write_synthetic_parallel(raw_dir, n_train=3000, n_valid=100, n_test=100, seed=0):
    """Raw ``{train,valid,test}.{src,tgt}`` of :func:`synthetic_translation` (sources of 3-12 words, never an empty
    target) and the gold fertilities ``{split}.fert.src`` (one integer per source word); returns ``raw_dir``."""
    rng = random.Random(seed)
    os.makedirs(raw_dir, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        lines = {"src": [], "tgt": [], "fert.src": []}
        while len(lines["src"]) < n:
            source = [rng.randrange(SYNTHETIC_VOCAB) for _ in range(rng.randint(3, 12))]
            target, fertility = synthetic_translation(source)
            if not target:
                continue
            lines["src"].append(" ".join(f"s{n}" for n in source))
            lines["tgt"].append(" ".join(target))
            lines["fert.src"].append(" ".join(map(str, fertility)))
        for suffix, content in lines.items():
            with open(os.path.join(raw_dir, f"{split}.{suffix}"), "w") as f:
                f.writelines(line + "\n" for line in content)
    return raw_dir


def binarize(raw_dir, dest_dir, src="src", tgt="tgt"):
    """fairseq-preprocess of ``raw_dir/{train,valid,test}.{src,tgt}`` (joined dictionary), as the pipeline does."""
    prepare_data.binarize(raw_dir, dest_dir, src, tgt, workers=1)
    return dest_dir


def train_model(data_bin, save_dir, extra_args, max_update=20):
    """``fairseq-train`` in-process on CPU with the plugin loaded."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            data_bin,
            "--user-dir",
            USER_DIR,
            "--save-dir",
            save_dir,
            "--cpu",
            "--num-workers",
            "0",
            "--optimizer",
            "adam",
            "--lr",
            "0.003",
            "--max-tokens",
            "1000",
            "--max-update",
            str(max_update),
            "--no-progress-bar",
            "--log-interval",
            "10",
            "--no-epoch-checkpoints",
            "--seed",
            "1",
        ]
        + list(extra_args),
    )
    # fairseq keeps the best validation score on the function, so an earlier in-process run's best (another
    # metric, another model) would decide whether this run writes checkpoint_best.pt: each run starts afresh
    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best
    train.main(args)
    return os.path.join(save_dir, "checkpoint_last.pt")


@contextlib.contextmanager
def log_file(path):
    """Every INFO (and higher) log record of the block (fairseq's training log included) written to ``path``."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO))
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def validations(log_path, metric):
    """``[(num_updates, value of metric)]`` of every validation in a fairseq training log (its ``valid on 'valid'
    subset`` lines), in order. The values are the ones fairseq compared: the task rounds BLEU to 2 decimals, a criterion
    its metrics to their ``round=`` (the log's ``{:g}`` keeps 6 significant digits)."""
    with open(log_path) as f:
        lines = [line for line in f if "valid on 'valid' subset" in line]
    return [
        (
            int(re.search(r"\| num_updates (\d+)", line).group(1)),
            float(re.search(rf"\| {re.escape(metric)} ([-\d.e]+) \|", line).group(1)),
        )
        for line in lines
    ]


def assert_best_checkpoint_is_the_best_validation(save_dir, metric, log_path):
    """``save_dir/checkpoint_best.pt`` holds a validation of the training log ``log_path`` with the highest ``metric``
    (--maximize-best-checkpoint-metric): its update, its value and the best value it saved. On a tie any of the tied
    validations will do (fairseq's checkpoint_utils.save_checkpoint keeps the later one: it writes checkpoint_best.pt
    when ``val_loss >= best``). Returns the log's validations."""
    runs = validations(log_path, metric)
    state = torch.load(os.path.join(save_dir, "checkpoint_best.pt"))  # weights_only=True: nat_plugins.compat
    assert state["cfg"]["checkpoint"]["best_checkpoint_metric"] == metric
    best = max(value for _, value in runs)
    assert state["extra_state"]["val_loss"] == pytest.approx(best, abs=1e-6), runs
    assert state["extra_state"]["best"] == pytest.approx(best, abs=1e-6), runs
    updates = state["optimizer_history"][-1]["num_updates"]
    assert updates in [u for u, value in runs if value == best], (updates, runs)
    return runs


def generate_lines(data_bin, checkpoint, extra_args=()):
    """``fairseq-generate`` in-process; returns the lines it printed."""
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            data_bin,
            "--path",
            checkpoint,
            "--user-dir",
            USER_DIR,
            "--cpu",
            "--batch-size",
            "16",
            "--num-workers",
            "0",
            "--no-progress-bar",
        ]
        + list(extra_args),
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        generate.main(args)
    return out.getvalue().splitlines()


def interactive_lines(data_bin, checkpoint, input_file, extra_args=()):
    """``fairseq-interactive`` in-process reading ``input_file``; returns the lines it printed."""
    parser = options.get_interactive_generation_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            data_bin,
            "--path",
            checkpoint,
            "--user-dir",
            USER_DIR,
            "--cpu",
            "--input",
            input_file,
        ]
        + list(extra_args),
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        interactive.main(args)
    return out.getvalue().splitlines()


def hypotheses(lines, prefix="H-"):
    """``{sentence id: text}`` of the fairseq-generate/-interactive output lines starting with ``prefix``: hypotheses
    (``H-``/``D-``: id, score, text) or, with ``prefix="T-"``, the references (id, text)."""
    result = {}
    for line in lines:
        if line.startswith(prefix):
            key, *_score, text = line.split("\t", 2)
            result[int(key[len(prefix) :])] = text
    return result


def random_batch(dictionary, size, seed):
    """``size`` random sources of 2-8 tokens + EOS, left-padded as fairseq collates them."""
    generator = torch.Generator().manual_seed(seed)
    sources = [
        torch.cat(
            [
                torch.randint(dictionary.nspecial, len(dictionary), (int(n),), generator=generator),
                torch.tensor([dictionary.eos()]),
            ]
        )
        for n in torch.randint(2, 9, (size,), generator=generator)
    ]
    src_tokens = data_utils.collate_tokens(sources, dictionary.pad(), left_pad=True)
    return {"net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor([len(s) for s in sources])}}


def sub_batch(sample, index):
    """Sentence ``index`` of a left-padded ``random_batch`` as a batch of one, without its padding."""
    net_input = sample["net_input"]
    length = int(net_input["src_lengths"][index])
    return {
        "net_input": {
            "src_tokens": net_input["src_tokens"][index : index + 1, -length:],
            "src_lengths": net_input["src_lengths"][index : index + 1],
        }
    }


class RiggedFirstBlockMixin:
    """Mixin for a verify-accept generator: its first step proposes ``first_block`` (a list of token ids), later
    steps its own drafts."""

    first_block = None

    def propose(self, first, features, tokens, last, max_len):
        drafts = super().propose(first, features, tokens, last, max_len)
        if self.first_block is not None:
            drafts, self.first_block = torch.tensor([self.first_block]), None
        return drafts
