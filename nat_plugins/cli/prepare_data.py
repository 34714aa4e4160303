"""Raw parallel text -> joint subwords (sentencepiece or fastBPE) -> ``fairseq-preprocess --joined-dictionary``.

    python -m nat_plugins.cli.prepare_data --raw-dir ~/data/multi30k --out-dir work/multi30k
    MULTI30K_DIR=~/data/multi30k python -m nat_plugins.cli.prepare_data --subword fastbpe --out-dir work/multi30k-bpe
    python -m nat_plugins.cli.prepare_data --corpus iwslt14 --raw-dir ~/data/iwslt14/de-en -s de -t en \\
        --lowercase --vocab-size 10000 --out-dir work/iwslt14

``--corpus plain`` (default): the raw directory holds ``{train,valid,test}.{src,tgt}`` (one sentence per line,
untokenized). It is ``--raw-dir``, else the directory in the environment variable ``MULTI30K_DIR``; with neither,
the public Multi30k task-1 files (train, val, test_2016_flickr) are downloaded into ``OUT_DIR/download`` (needs
network access). ``--corpus iwslt14`` / ``wmt14``: ``--raw-dir`` is the official release as downloaded
(:mod:`nat_plugins.cli.corpora` says which files and how they become the splits). Output in ``--out-dir``:

* ``raw/{split}.{lang}``: the raw text used (references for sacreBLEU),
* ``--subword sentencepiece`` (default): ``spm.model``/``spm.vocab``, a joint sentencepiece BPE model (8k) trained
  on both training sides, and ``spm/{split}.{lang}``, the subword text; decode with ``--post-process sentencepiece``;
* ``--subword fastbpe``: ``bpe.codes``, joint BPE merges (as many as ``--vocab-size``) learnt with subword-nmt on the
  whitespace-split raw text and written in fastBPE's format, and ``bpe/{split}.{lang}``, the text segmented by
  fastBPE (``@@ `` marks a split word); decode with ``--post-process subword_nmt``;
* ``data-bin/``: fairseq binarized data with one joined dictionary (share all embeddings).

The subword text is the input of aligners and of fairseq-preprocess.
"""

import argparse
import gzip
import io
import logging
import os
import shutil
import urllib.request

from .corpora import CORPORA, DataError, read_corpus

logger = logging.getLogger("nat_plugins.cli.prepare_data")

SPLITS = ("train", "valid", "test")
MULTI30K_PAGE = "https://github.com/multi30k/dataset"
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
MULTI30K_NAMES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
SEGMENT_CHUNK = 100_000


def download_multi30k(dest, langs):
    """Fetch the public Multi30k task-1 raw files into ``dest`` (needs network access)."""
    os.makedirs(dest, exist_ok=True)
    for split, name in MULTI30K_NAMES.items():
        for lang in langs:
            url = MULTI30K_URL.format(name=name, lang=lang)
            target = os.path.join(dest, f"{split}.{lang}")
            if os.path.exists(target):
                continue
            logger.info(f"downloading {url}")
            try:
                with urllib.request.urlopen(url, timeout=30) as response:
                    data = gzip.decompress(response.read())
            except OSError as e:
                raise DataError(
                    f"no raw corpus given (--raw-dir, or the environment variable MULTI30K_DIR) and downloading {url} "
                    f"failed ({e}). Point --raw-dir or MULTI30K_DIR at a directory with {{train,valid,test}}."
                    f"{{{','.join(langs)}}}, one sentence per line; Multi30k's files are at {MULTI30K_PAGE} "
                    f"(data/task1/raw: train, val, test_2016_flickr .{{{','.join(langs)}}}.gz, gunzipped and renamed "
                    "train, valid, test)"
                ) from None
            with open(target, "wb") as f:
                f.write(data)
    return dest


def resolve_raw_dir(raw_dir, langs, download_dir):
    """The raw-corpus directory: ``--raw-dir``, else $MULTI30K_DIR, else Multi30k downloaded into ``download_dir``."""
    for candidate, name in ((raw_dir, "--raw-dir"), (os.environ.get("MULTI30K_DIR"), "MULTI30K_DIR")):
        if candidate:
            if not os.path.isdir(candidate):
                raise DataError(
                    f"{name} {candidate} does not exist: point it at a directory with "
                    f"{{train,valid,test}}.{{{','.join(langs)}}}"
                )
            return candidate
    return download_multi30k(download_dir, langs)


def read_parallel(raw_dir, split, src, tgt, max_lines=None):
    """Read one split, checking that both sides exist, agree in length and have no empty lines."""
    sides = {}
    for lang in (src, tgt):
        path = os.path.join(raw_dir, f"{split}.{lang}")
        if not os.path.exists(path):
            raise DataError(f"missing {path}: the raw directory needs {{train,valid,test}}.{{{src},{tgt}}}")
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n").strip() for line in f]
        if max_lines:
            lines = lines[:max_lines]
        empty = [i + 1 for i, line in enumerate(lines) if not line]
        if empty:
            raise DataError(f"{path}: line(s) {empty[:5]} are empty; remove those sentence pairs from both sides")
        sides[lang] = lines
    if len(sides[src]) != len(sides[tgt]):
        raise DataError(
            f"{split}.{src} has {len(sides[src])} lines but {split}.{tgt} has {len(sides[tgt])}: "
            "the two sides must be sentence-aligned"
        )
    return sides


def train_sentencepiece(train_files, model_prefix, vocab_size, sample=0):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=",".join(train_files),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        minloglevel=2,
        input_sentence_size=sample,
        shuffle_input_sentence=sample > 0,
        # fairseq's dictionary adds its own <s>, <pad>, </s>, <unk>
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        pad_id=-1,
    )
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def learn_fastbpe(train_files, codes_path, num_merges):
    """Joint BPE merges learnt by subword-nmt, saved in fastBPE's ``left right count`` format (fastBPE ranks
    merges by line order; its own learner is only in its C++ command-line tool); returns the applier."""
    try:
        import fastBPE
        from subword_nmt.learn_bpe import learn_bpe
    except ImportError as err:
        raise DataError(
            f"--subword fastbpe needs fastBPE and subword-nmt ({err}): run bash run_scripts/setup_env.sh"
        ) from None
    joint = io.StringIO()
    for path in train_files:
        with open(path, encoding="utf-8") as f:
            joint.write(f.read())
    joint.seek(0)
    merges = io.StringIO()
    learn_bpe(joint, merges, num_merges, min_frequency=2)
    pairs = [line.split() for line in merges.getvalue().splitlines() if line and not line.startswith("#version")]
    with open(codes_path, "w", encoding="utf-8") as f:
        f.writelines(f"{left} {right} {len(pairs) - rank}\n" for rank, (left, right) in enumerate(pairs))
    return fastBPE.fastBPE(codes_path)


def binarize(subword_dir, dest_dir, src, tgt, workers):
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(
        [
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            os.path.join(subword_dir, "train"),
            "--validpref",
            os.path.join(subword_dir, "valid"),
            "--testpref",
            os.path.join(subword_dir, "test"),
            "--destdir",
            dest_dir,
            "--joined-dictionary",
            "--workers",
            str(workers),
        ]
    )
    preprocess.main(args)


def read_input(args):
    """``{split: {lang: lines}}`` of the raw corpus ``--corpus``/``--raw-dir`` name (``--max-lines``,
    ``--lowercase``)."""
    src, tgt = args.source_lang, args.target_lang
    if args.corpus == "plain":
        raw_in = resolve_raw_dir(args.raw_dir, (src, tgt), os.path.join(args.out_dir, "download"))
        logger.info(f"raw corpus: {raw_in}")
        corpus = {split: read_parallel(raw_in, split, src, tgt, args.max_lines) for split in SPLITS}
    else:
        logger.info(f"raw corpus: {args.corpus} release in {args.raw_dir}")
        corpus = read_corpus(args.corpus, args.raw_dir, src, tgt)
        if args.max_lines:
            corpus = {
                split: {lang: lines[: args.max_lines] for lang, lines in sides.items()}
                for split, sides in corpus.items()
            }
    if args.lowercase:
        corpus = {
            split: {lang: [line.lower() for line in lines] for lang, lines in sides.items()}
            for split, sides in corpus.items()
        }
    return corpus


def main(args):
    src, tgt = args.source_lang, args.target_lang
    corpus = read_input(args)
    subword_dir = os.path.join(args.out_dir, "spm" if args.subword == "sentencepiece" else "bpe")
    raw_dir = os.path.join(args.out_dir, "raw")
    os.makedirs(raw_dir, exist_ok=True)
    os.makedirs(subword_dir, exist_ok=True)
    for split, sides in corpus.items():
        for lang, lines in sides.items():
            with open(os.path.join(raw_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines)
        logger.info(f"{split}: {len(sides[src])} sentence pairs")

    train_files = [os.path.join(raw_dir, f"train.{lang}") for lang in (src, tgt)]
    if args.subword == "sentencepiece":
        subword_model = os.path.join(args.out_dir, "spm.model")
        sp = train_sentencepiece(train_files, os.path.join(args.out_dir, "spm"), args.vocab_size, args.spm_sample)

        def segment(lines):
            return [" ".join(pieces) for pieces in sp.encode(lines, out_type=str)]

    else:
        subword_model = os.path.join(args.out_dir, "bpe.codes")
        segment = learn_fastbpe(train_files, subword_model, args.vocab_size).apply
    for split, sides in corpus.items():
        for lang, lines in sides.items():
            with open(os.path.join(subword_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                for start in range(0, len(lines), SEGMENT_CHUNK):  # millions of lines (WMT14): a chunk at a time
                    f.writelines(line + "\n" for line in segment(lines[start : start + SEGMENT_CHUNK]))

    dest = os.path.join(args.out_dir, "data-bin")
    if os.path.exists(dest):
        shutil.rmtree(dest)  # fairseq-preprocess would mix old and new files
    binarize(subword_dir, dest, src, tgt, args.workers)
    logger.info(f"done: {dest} (subword model {subword_model})")


def get_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--raw-dir",
        help="raw corpus directory: for --corpus plain {train,valid,test}.{src,tgt} "
        "(default: the environment variable MULTI30K_DIR, else Multi30k task 1 downloaded into "
        "OUT_DIR/download); for iwslt14/wmt14 the downloaded release (see nat_plugins.cli.corpora)",
    )
    parser.add_argument(
        "--corpus",
        choices=("plain",) + CORPORA,
        default="plain",
        help="layout of --raw-dir: plain {train,valid,test}.{src,tgt} files (default), or the "
        "IWSLT14 de-en / WMT14 en-de release, split as fairseq's preparation scripts split it",
    )
    parser.add_argument(
        "--lowercase",
        action="store_true",
        help="lowercase every split (fairseq's IWSLT14 recipe does; scores are then case-insensitive)",
    )
    parser.add_argument(
        "--out-dir", required=True, help="output directory (raw/, spm.model + spm/ or bpe.codes + bpe/, data-bin/)"
    )
    parser.add_argument("-s", "--source-lang", default="en", help="source language suffix")
    parser.add_argument("-t", "--target-lang", default="de", help="target language suffix")
    parser.add_argument(
        "--subword",
        choices=("sentencepiece", "fastbpe"),
        default="sentencepiece",
        help="subword model: sentencepiece BPE (default) or BPE codes learnt by subword-nmt and "
        "applied by fastBPE (decode with --post-process subword_nmt)",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=8000, help="joint sentencepiece vocabulary size, or number of fastBPE merges"
    )
    parser.add_argument(
        "--spm-sample",
        type=int,
        default=0,
        help="train sentencepiece on this many randomly sampled training sentences (0: all; "
        "millions of sentences, e.g. WMT14, need a sample)",
    )
    parser.add_argument(
        "--max-lines", type=int, default=None, help="use only the first N lines of each split (smoke tests)"
    )
    parser.add_argument("--workers", type=int, default=2, help="fairseq-preprocess worker processes")
    return parser


def cli_main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    main(get_parser().parse_args(argv))


if __name__ == "__main__":
    cli_main()
