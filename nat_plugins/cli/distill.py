"""Sequence-level knowledge distillation (Kim & Rush 2016): re-translate a split with the AR teacher.

    python -m nat_plugins.cli.distill DATA_BIN --path teacher.pt --gen-subset train --beam 4 --max-tokens 8000
    # shard a large corpus over machines/GPUs, then merge (the shards come back in sentence order):
    python -m nat_plugins.cli.distill DATA_BIN --path teacher.pt --num-shards 4 --shard-id 0 --no-merge  # ... 3
    python -m nat_plugins.cli.distill DATA_BIN --num-shards 4 --merge-only

Takes fairseq-generate's options (beam, lenpen, batching, --fp16, --cpu). Each shard writes
``{shard_dir}/{split}.{name}.{tgt}.shard{I}of{N}`` (``id<TAB>subwords`` lines, written to a temporary file and
renamed when complete). Merging checks that every sentence id is there exactly once and writes, next to
the binarized data, ``{split}.{name}.{tgt}.txt`` (subword text, one line per sentence in corpus order) and
``{split}.{name}.{tgt}.bin/.idx`` (binarized with the teacher's target dictionary), which the
``translation_nat`` task loads (``--use-distilled target|side``). ``name`` is ``--output-name`` (default ``kd``; the
task's ``--distilled-name``): the speculative drafter trains on greedy outputs beside the students' beam outputs.
"""

import datetime
import glob
import logging
import os
import time

from fairseq import options, tasks, utils
from fairseq.data import indexed_dataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from .decoding import load_generation
from .rep_mis import repeated_ratio

logger = logging.getLogger("nat_plugins.cli.distill")


def add_distill_args(parser):
    group = parser.add_argument_group("distillation")
    group.add_argument(
        "--output-name",
        default="kd",
        help="the distilled files' name: {split}.NAME.{tgt}.txt/.bin/.idx and their shards (default kd; the "
        "translation_nat task reads another name with --distilled-name NAME)",
    )
    group.add_argument("--shard-dir", default=None, help="where shard outputs go (default: DATA_BIN/kd-shards)")
    group.add_argument(
        "--no-merge",
        action="store_true",
        help="only decode this shard; merge later with --merge-only once all shards are done",
    )
    group.add_argument(
        "--merge-only", action="store_true", help="do not decode: merge the --num-shards shard files and binarize them"
    )
    group.add_argument(
        "--log-interval-seconds",
        type=float,
        default=30,
        metavar="N",
        help="while decoding, log the sentences done of the shard's total, sentences/s and the time left at most "
        "every N seconds, besides a first and a last line (default 30; fairseq's --log-interval counts batches)",
    )
    return parser


def shard_path(shard_dir, name, split, tgt, shard_id, num_shards):
    return os.path.join(shard_dir, f"{split}.{name}.{tgt}.shard{shard_id}of{num_shards}")


def duration(seconds):
    """``H:MM:SS``."""
    return str(datetime.timedelta(seconds=round(seconds)))


class ProgressLog:
    """Logs ``prefix: DONE / TOTAL sentences done (P%), R sentences/s, H:MM:SS left`` at most every ``interval``
    seconds, after a first line with the total and before a last one with the time taken."""

    def __init__(self, prefix, total, interval):
        self.prefix, self.total, self.interval = prefix, total, interval
        self.done = 0
        self.start = self.last_logged = time.monotonic()
        logger.info(f"{prefix}: {total} sentences to decode")

    def rate(self, now):
        """Sentences/s so far."""
        return self.done / max(now - self.start, 1e-6)

    def add(self, sentences):
        self.done += sentences
        now = time.monotonic()
        if self.done < self.total and now - self.last_logged >= self.interval:
            self.last_logged = now
            rate = self.rate(now)
            logger.info(
                f"{self.prefix}: {self.done} / {self.total} sentences done ({100 * self.done // self.total}%), "
                f"{rate:.1f} sentences/s, {duration((self.total - self.done) / rate)} left"
            )

    def finish(self):
        now = time.monotonic()
        logger.info(
            f"{self.prefix}: {self.done} / {self.total} sentences done in {duration(now - self.start)} "
            f"({self.rate(now):.1f} sentences/s)"
        )


def decode_shard(cfg, task, shard_file, log_interval_seconds):
    """Beam-search one shard of ``cfg.dataset.gen_subset`` with the teacher; write ``id<TAB>subwords`` lines."""
    generation = load_generation(cfg, task)
    split = cfg.dataset.gen_subset
    prefix = f"distill {split} shard {cfg.dataset.shard_id + 1}/{cfg.dataset.num_shards}"
    tgt_dict = task.target_dictionary
    n_empty = 0
    progress = ProgressLog(prefix, generation.shard_sentences(), log_interval_seconds)
    tmp = shard_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for sample in generation.batches(prefix, num_workers=cfg.dataset.num_workers):
            hypos = generation.decode(sample)
            for i, sample_id in enumerate(sample["id"].tolist()):
                text = tgt_dict.string(hypos[i][0]["tokens"].int().cpu())
                n_empty += text == ""
                out.write(f"{sample_id}\t{text}\n")
            progress.add(len(hypos))
    progress.finish()
    os.replace(tmp, shard_file)
    logger.info(f"wrote {progress.done} distilled targets to {shard_file}")
    if n_empty:
        logger.warning(f"{n_empty} distilled targets are empty (the teacher emitted EOS at once)")


def merge_shards(shard_files, num_sentences, text_out, tgt_dict, bin_prefix):
    """Merge shard files into corpus order, check coverage, write text and the binarized dataset."""
    targets = [None] * num_sentences
    for path in shard_files:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                sample_id, _, text = line.rstrip("\n").partition("\t")
                sample_id = int(sample_id)
                if not 0 <= sample_id < num_sentences:
                    raise ValueError(
                        f"{path}:{line_no}: sentence id {sample_id} is outside the split (0..{num_sentences - 1})"
                    )
                if targets[sample_id] is not None:
                    raise ValueError(
                        f"{path}:{line_no}: sentence {sample_id} was distilled twice (overlapping shards?)"
                    )
                targets[sample_id] = text
    missing = [i for i, t in enumerate(targets) if t is None]
    if missing:
        raise ValueError(
            f"{len(missing)} of {num_sentences} sentences have no distilled target (first ids: {missing[:5]}); "
            "were all shards decoded with the same --num-shards?"
        )
    with open(text_out, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in targets)
    builder = indexed_dataset.make_builder(bin_prefix + ".bin", impl="mmap", vocab_size=len(tgt_dict))
    for text in targets:
        builder.add_item(tgt_dict.encode_line(text, add_if_not_exist=False, append_eos=True).long())
    builder.finalize(bin_prefix + ".idx")
    logger.info(f"merged {len(shard_files)} shard(s): {text_out}, {bin_prefix}.bin/.idx")
    # a teacher that stutters teaches its students to stutter: say how much it does
    logger.info(f"distilled targets: {repeated_ratio(targets, window=1):.2f}% of the subwords repeat the one before")


def main(args):
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    num_shards, shard_id = cfg.dataset.num_shards, cfg.dataset.shard_id
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"--shard-id {shard_id} must be in [0, --num-shards {num_shards})")
    if args.merge_only and args.no_merge:
        raise ValueError("--merge-only and --no-merge exclude each other")
    if not args.output_name or any(c in args.output_name for c in "-./"):
        raise ValueError(
            f"--output-name {args.output_name!r}: use a name without '-', '.' or '/' (fairseq reads the X-Y in a "
            "data-bin file name {split}.X-Y.* as a language pair), e.g. kd_greedy"
        )
    task = tasks.setup_task(cfg.task)
    data_dir = utils.split_paths(cfg.task.data)[0]
    split, tgt = cfg.dataset.gen_subset, task.cfg.target_lang
    shard_dir = args.shard_dir or os.path.join(data_dir, "kd-shards")
    os.makedirs(shard_dir, exist_ok=True)

    if not args.merge_only:
        if cfg.common_eval.path is None:
            raise ValueError("--path TEACHER.pt is required to decode (or pass --merge-only)")
        shard_file = shard_path(shard_dir, args.output_name, split, tgt, shard_id, num_shards)
        decode_shard(cfg, task, shard_file, args.log_interval_seconds)
        if args.no_merge:
            return
    shard_files = [shard_path(shard_dir, args.output_name, split, tgt, i, num_shards) for i in range(num_shards)]
    absent = [p for p in shard_files if not os.path.exists(p)]
    if absent:
        pattern = os.path.join(shard_dir, f"{split}.{args.output_name}.{tgt}.shard*")
        stale = sorted(set(glob.glob(pattern)) - set(shard_files))
        raise FileNotFoundError(
            f"cannot merge: missing shard file(s) {absent}; decode them with --shard-id"
            + (f" (found shards of another --num-shards: {stale})" if stale else "")
        )
    if split not in task.datasets:
        task.load_dataset(split)
    prefix = os.path.join(data_dir, f"{split}.{args.output_name}.{tgt}")
    merge_shards(shard_files, len(task.dataset(split)), prefix + ".txt", task.target_dictionary, prefix)


def get_parser():
    parser = options.get_generation_parser(default_task="translation")
    parser.set_defaults(gen_subset="train")  # distillation is about the training data
    return add_distill_args(parser)


def cli_main(argv=None):
    args = options.parse_args_and_arch(get_parser(), input_args=argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    main(args)


if __name__ == "__main__":
    cli_main()
