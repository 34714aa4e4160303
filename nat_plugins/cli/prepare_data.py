"""Raw parallel text -> joint sentencepiece subwords -> ``fairseq-preprocess --joined-dictionary``.

    python -m nat_plugins.cli.prepare_data --raw-dir ../shared/data/multi30k --out-dir work/multi30k

The raw directory holds ``{train,valid,test}.{src,tgt}`` (one sentence per line, untokenized). Without
``--raw-dir``: ``$MULTI30K_DIR``, else ``../shared/data/multi30k`` next to the checkout, else the public
Multi30k task-1 files are downloaded (when online). Output in ``--out-dir``:

* ``raw/{split}.{lang}``: the raw text used (references for sacreBLEU),
* ``spm.model``/``spm.vocab``: joint sentencepiece BPE model (default 8k) trained on both training sides,
* ``spm/{split}.{lang}``: subword text (input for aligners and fairseq-preprocess),
* ``data-bin/``: fairseq binarized data with one joined dictionary (share all embeddings).
"""

import argparse
import gzip
import logging
import os
import shutil
import urllib.request

logger = logging.getLogger("nat_plugins.cli.prepare_data")

SPLITS = ("train", "valid", "test")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_MULTI30K = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data", "multi30k")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
MULTI30K_NAMES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


class DataError(ValueError):
    """The raw corpus is missing or malformed."""


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
                    f"no raw corpus given and downloading {url} failed ({e}). Pass --raw-dir DIR (or set "
                    f"MULTI30K_DIR) with {{train,valid,test}}.{{{','.join(langs)}}}, one sentence per line"
                ) from None
            with open(target, "wb") as f:
                f.write(data)
    return dest


def resolve_raw_dir(raw_dir, langs, download_dir):
    """The raw-corpus directory: the argument, $MULTI30K_DIR, the shared copy, else a download."""
    for candidate in (raw_dir, os.environ.get("MULTI30K_DIR")):
        if candidate:
            if not os.path.isdir(candidate):
                raise DataError(f"raw corpus directory {candidate} does not exist")
            return candidate
    if os.path.isdir(SHARED_MULTI30K):
        return SHARED_MULTI30K
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


def train_sentencepiece(train_files, model_prefix, vocab_size):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=",".join(train_files), model_prefix=model_prefix, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, minloglevel=2,
        # fairseq's dictionary adds its own <s>, <pad>, </s>, <unk>
        bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
    )
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def binarize(spm_dir, dest_dir, src, tgt, workers):
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args([
        "--source-lang", src, "--target-lang", tgt,
        "--trainpref", os.path.join(spm_dir, "train"), "--validpref", os.path.join(spm_dir, "valid"),
        "--testpref", os.path.join(spm_dir, "test"), "--destdir", dest_dir,
        "--joined-dictionary", "--workers", str(workers),
    ])
    preprocess.main(args)


def main(args):
    src, tgt = args.source_lang, args.target_lang
    raw_in = resolve_raw_dir(args.raw_dir, (src, tgt), os.path.join(args.out_dir, "download"))
    logger.info(f"raw corpus: {raw_in}")
    raw_dir, spm_dir = os.path.join(args.out_dir, "raw"), os.path.join(args.out_dir, "spm")
    os.makedirs(raw_dir, exist_ok=True)
    os.makedirs(spm_dir, exist_ok=True)
    corpus = {split: read_parallel(raw_in, split, src, tgt, args.max_lines) for split in SPLITS}
    for split, sides in corpus.items():
        for lang, lines in sides.items():
            with open(os.path.join(raw_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines)
        logger.info(f"{split}: {len(sides[src])} sentence pairs")

    model_prefix = os.path.join(args.out_dir, "spm")
    sp = train_sentencepiece([os.path.join(raw_dir, f"train.{lang}") for lang in (src, tgt)],
                             model_prefix, args.vocab_size)
    for split, sides in corpus.items():
        for lang, lines in sides.items():
            with open(os.path.join(spm_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(pieces) + "\n" for pieces in sp.encode(lines, out_type=str))

    dest = os.path.join(args.out_dir, "data-bin")
    if os.path.exists(dest):
        shutil.rmtree(dest)  # fairseq-preprocess would mix old and new files
    binarize(spm_dir, dest, src, tgt, args.workers)
    logger.info(f"done: {dest} (sentencepiece model {model_prefix}.model)")


def get_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-dir", help="directory with raw {train,valid,test}.{src,tgt} (default: $MULTI30K_DIR, "
                        "../shared/data/multi30k, else download Multi30k)")
    parser.add_argument("--out-dir", required=True, help="output directory (raw/, spm.model, spm/, data-bin/)")
    parser.add_argument("-s", "--source-lang", default="en", help="source language suffix")
    parser.add_argument("-t", "--target-lang", default="de", help="target language suffix")
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint sentencepiece vocabulary size")
    parser.add_argument("--max-lines", type=int, default=None,
                        help="use only the first N lines of each split (smoke tests)")
    parser.add_argument("--workers", type=int, default=2, help="fairseq-preprocess worker processes")
    return parser


def cli_main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    main(get_parser().parse_args(argv))


if __name__ == "__main__":
    cli_main()
