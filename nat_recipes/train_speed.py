"""Training throughput of a fairseq-train command line: updates/s over the same batches for every system.

    python -m nat_recipes.train_speed --label sat-2 --updates 20 --output speed.jsonl -- \\
        DATA_BIN --user-dir nat_plugins --task translation_nat --arch sat_transformer ...  # fairseq-train's options
    python -m nat_recipes.train_speed --table speed.jsonl  # the runs as a markdown table

Takes exactly fairseq-train's options after ``--`` and builds what fairseq-train builds (task, model with its
``--init-from-ar``/``--finetune-from-model`` initialisation, criterion, optimizer, fairseq's ``Trainer``), then
runs ``Trainer.train_step`` — fairseq-train's own update — on the first ``--warmup + --updates`` batches
(epoch 1's, then epoch 2's when it has fewer) and times the last ``--updates`` of them (nothing is saved). Batches
depend only on the data, the
batching options and ``--seed``, so commands that share them time the same batches (students trained on the
distilled targets batch by those targets' lengths). One JSON line per run is appended to ``--output``;
``run_scripts/train_speed.sh`` runs every recipe through it (``FAIRSEQ_TRAIN``), each ``--compared-with`` the recipe
trained on the same batches (:mod:`nat_recipes.catalogue`), and prints the table.
"""

import argparse
import itertools
import json
import logging
import os
import sys
import time
from typing import List

import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from tqdm import tqdm

logger = logging.getLogger("nat_recipes.train_speed")


def parse(argv):
    """(options, fairseq-train's config), or (options, None) for ``--table``."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", metavar="FILE", help="print the runs of this JSON-lines file as a table and exit")
    parser.add_argument("--label", help="name of the row (e.g. the recipe)")
    parser.add_argument(
        "--compared-with",
        metavar="LABEL",
        help="the row whose updates/s the table divides this one's by (a recipe trained on the same batches)",
    )
    parser.add_argument("--updates", type=int, default=20, help="timed updates (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="updates run before timing starts (default: 3)")
    parser.add_argument("--output", help="JSON-lines file the result is appended to")
    args = parser.parse_args(argv[:split])
    if args.table:
        if not os.path.isfile(args.table):
            parser.error(f"--table {args.table}: no such file")
        return args, None
    if split == len(argv):
        raise SystemExit("train_speed: put fairseq-train's options after '--' (see --help)")
    if not args.label or not args.output:
        parser.error("--label and --output are required to time a fairseq-train command")
    if args.updates < 1 or args.warmup < 0:
        parser.error(f"--updates must be >= 1 and --warmup >= 0 (got {args.updates}, {args.warmup})")
    train_args = options.parse_args_and_arch(options.get_training_parser(), argv[split + 1 :])
    return args, convert_namespace_to_omegaconf(train_args)


def measure(cfg, updates, warmup, label):
    """Seconds of ``updates`` updates after ``warmup`` untimed ones, and the target tokens they trained on."""
    utils.import_user_module(cfg.common)
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    if cfg.checkpoint.finetune_from_model:  # --finetune-from-model: the weights fairseq-train would start from
        trainer.load_checkpoint(
            cfg.checkpoint.finetune_from_model, reset_optimizer=True, reset_lr_scheduler=True, reset_meters=True
        )
    samples, epoch = [], 1
    while len(samples) < warmup + updates:  # epoch 1's batches, then epoch 2's, ... (a small training set)
        batches = trainer.get_train_iterator(epoch=epoch, load_dataset=False).next_epoch_itr(shuffle=True)
        samples += list(itertools.islice(batches, warmup + updates - len(samples)))
        if epoch == 1 and not samples:
            raise SystemExit(f"train_speed: no training batch in {cfg.task.data} ({cfg.dataset.train_subset})")
        epoch += 1
    tokens, seconds = 0, 0.0
    for index, sample in enumerate(tqdm(samples, desc=f"{label}: train steps", unit="update")):
        start = time.perf_counter()
        trainer.train_step([sample])
        if index >= warmup:
            seconds += time.perf_counter() - start
            tokens += int(sample["ntokens"])
    return seconds, tokens


def table(rows: List[dict]) -> str:
    """The runs as a markdown table: updates/s, target tokens/s and the ratio to the run each is compared with."""
    speed = {row["label"]: row["updates_per_s"] for row in rows}
    lines = [
        f"{rows[0]['updates']} timed updates per recipe on {rows[0]['device']} ({rows[0]['threads']} threads)",
        "",
        "| recipe | updates/s | target tokens/s | × the AR recipe on the same batches |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        base = row.get("compared_with")
        ratio = f"{row['updates_per_s'] / speed[base]:.2f} ({base})" if base in speed else "–"
        lines.append(f"| {row['label']} | {row['updates_per_s']:.3f} | {row['target_tokens_per_s']:.0f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None):
    args, cfg = parse(sys.argv[1:] if argv is None else argv)
    if cfg is None:
        with open(args.table, encoding="utf-8") as f:
            print(table([json.loads(line) for line in f]))
        return
    seconds, tokens = measure(cfg, args.updates, args.warmup, args.label)
    device = "cpu" if cfg.common.cpu or not torch.cuda.is_available() else torch.cuda.get_device_name()
    result = {
        "label": args.label,
        "compared_with": args.compared_with,
        "updates": args.updates,
        "seconds": round(seconds, 3),
        "updates_per_s": round(args.updates / seconds, 4),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "device": device,
        "threads": torch.get_num_threads(),
        "arch": cfg.model._name,
        "criterion": cfg.criterion._name,
    }
    with open(args.output, "a") as f:
        f.write(json.dumps(result) + "\n")
    logger.info(f"{args.label}: {result['updates_per_s']} updates/s ({args.updates} updates in {seconds:.1f} s)")


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    main()
