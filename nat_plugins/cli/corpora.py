"""The official releases of the benchmarks the NAT papers report on, read as downloaded, into the sentence-aligned
train/valid/test splits that :mod:`nat_plugins.cli.prepare_data` segments and binarizes (``--corpus iwslt14`` or
``--corpus wmt14``). The splits follow fairseq's own preparation scripts
(``examples/translation/prepare-iwslt14.sh``, ``prepare-wmt14en2de.sh``) except that no Moses tokenization is run:
sentencepiece reads the raw text, and the length filters count whitespace-separated words.

**IWSLT14 de-en** (``--raw-dir`` = the ``de-en/`` directory extracted from the IWSLT 2014 evaluation campaign's
``de-en.tgz``, TED talks):

* ``train.tags.de-en.{de,en}``: one sentence a line between talk metadata lines (``<url>``, ``<talkid>``,
  ``<keywords>``, ...), which are dropped; ``<title>`` and ``<description>`` lines keep their text. Pairs with a side
  of 0 or more than 175 words, or a length ratio above 1.5, are dropped; then valid = every 23rd pair, train = the rest.
* test = the ``<seg>`` lines of ``IWSLT14.TED.dev2010``, ``IWSLT14.TEDX.dev2012``, ``IWSLT14.TED.tst2010``,
  ``tst2011`` and ``tst2012`` (``.de-en.{de,en}.xml``), in that order.
* fairseq's recipe lowercases all of it: ``prepare_data --lowercase``.

**WMT14 en-de** (``--raw-dir`` = the directory where the WMT archives were extracted; files are found anywhere below
it):

* train = ``europarl-v7.de-en``, ``commoncrawl.de-en`` and ``news-commentary-v*.de-en`` (WMT14's v9, or the v12 that
  fairseq's script downloads; exactly one version), ``.{de,en}``, without non-printing characters, pairs with a side
  of 0 or more than 250 words or a length ratio above 1.5 dropped;
* valid = ``newstest2013.{de,en}`` (``dev.tgz``; the NAT papers' development set);
* test = ``newstest2014-deen-src.{SRC}.sgm`` and ``newstest2014-deen-ref.{TGT}.sgm`` (``test-full.tgz``).

XML/SGML segments are unescaped (``&amp;`` -> ``&``) and ``’`` becomes ``'``, as fairseq's scripts do.
"""

import glob
import html
import logging
import os
import re
import unicodedata

logger = logging.getLogger("nat_plugins.cli.corpora")


class DataError(ValueError):
    """The raw corpus is missing or malformed."""


CORPORA = ("iwslt14", "wmt14")
WHERE = {
    "iwslt14": "IWSLT14 de-en: the IWSLT 2014 evaluation campaign's de-en.tgz (TED talks; the file fairseq's "
    "examples/translation/prepare-iwslt14.sh downloads), extracted: --raw-dir .../de-en",
    "wmt14": "WMT14 en-de: training-parallel-europarl-v7.tgz, training-parallel-commoncrawl.tgz, "
    "training-parallel-nc-v9.tgz, dev.tgz and test-full.tgz from the WMT14 translation task (the files "
    "fairseq's examples/translation/prepare-wmt14en2de.sh downloads), extracted into one directory: "
    "--raw-dir DIR",
}
IWSLT14_TEST_SETS = (
    "IWSLT14.TED.dev2010",
    "IWSLT14.TEDX.dev2012",
    "IWSLT14.TED.tst2010",
    "IWSLT14.TED.tst2011",
    "IWSLT14.TED.tst2012",
)
IWSLT14_TEXT_TAGS = ("title", "description")  # metadata lines whose text is kept
WMT14_TRAIN = ("europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v*.de-en")
TAG_LINE = re.compile(r"^\s*<(/?)([A-Za-z]+)[^>]*>")
SEGMENT = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def require(path, corpus):
    if not os.path.isfile(path):
        raise DataError(f"missing {path}: --corpus {corpus} reads {WHERE[corpus]}")
    return path


def segments(path):
    """The text of every ``<seg>`` line of an IWSLT/WMT XML or SGML file."""
    return [html.unescape(m.group(1)).replace("\u2019", "'") for m in SEGMENT.finditer("\n".join(read_lines(path)))]


def iwslt14_text_line(line):
    """A line of ``train.tags``: the sentence, the text of a title/description line, or None for metadata."""
    m = TAG_LINE.match(line)
    if m is None:
        return line.strip()
    if m.group(2) in IWSLT14_TEXT_TAGS:
        return re.sub(rf"</?({'|'.join(IWSLT14_TEXT_TAGS)})>", "", line).strip()
    return None


def without_non_printing(line):
    return "".join(c for c in line if c in " \t" or unicodedata.category(c)[0] != "C")


def clean_pairs(src_lines, tgt_lines, max_words, ratio=1.5):
    """Drop pairs with a side of 0 or more than ``max_words`` words, or whose word counts differ by more than
    ``ratio`` times (the rule of Moses' clean-corpus-n.perl that fairseq's scripts apply)."""
    kept_src, kept_tgt = [], []
    for s, t in zip(src_lines, tgt_lines):
        ns, nt = len(s.split()), len(t.split())
        if 0 < ns <= max_words and 0 < nt <= max_words and ns <= ratio * nt and nt <= ratio * ns:
            kept_src.append(s)
            kept_tgt.append(t)
    return kept_src, kept_tgt


def aligned(sides, what):
    (a, la), (b, lb) = sides.items()
    if len(la) != len(lb):
        raise DataError(f"{what}: {len(la)} {a} lines but {len(lb)} {b} lines; the two sides must be sentence-aligned")
    return sides


def check_pair(corpus, src, tgt):
    if {src, tgt} != {"de", "en"}:
        raise DataError(f"--corpus {corpus} is German-English: -s/-t must be de and en (got {src}, {tgt})")


def read_iwslt14(release_dir, src, tgt):
    check_pair("iwslt14", src, tgt)
    text = aligned(
        {
            lang: [
                iwslt14_text_line(line)
                for line in read_lines(require(os.path.join(release_dir, f"train.tags.de-en.{lang}"), "iwslt14"))
            ]
            for lang in (src, tgt)
        },
        os.path.join(release_dir, "train.tags.de-en.{de,en}"),
    )
    if any((s is None) != (t is None) for s, t in zip(text[src], text[tgt])):
        raise DataError(f"{release_dir}/train.tags.de-en.{{de,en}}: the metadata lines of the two sides differ")
    kept = [(s, t) for s, t in zip(text[src], text[tgt]) if s is not None]
    pairs = dict(zip((src, tgt), clean_pairs([s for s, _ in kept], [t for _, t in kept], max_words=175)))
    corpus = {
        "train": {lang: [line for n, line in enumerate(lines, 1) if n % 23] for lang, lines in pairs.items()},
        "valid": {lang: lines[22::23] for lang, lines in pairs.items()},
        "test": {src: [], tgt: []},
    }
    for name in IWSLT14_TEST_SETS:
        test_set = {
            lang: segments(require(os.path.join(release_dir, f"{name}.de-en.{lang}.xml"), "iwslt14"))
            for lang in (src, tgt)
        }
        aligned(test_set, os.path.join(release_dir, f"{name}.de-en.{{de,en}}.xml"))
        for lang, lines in test_set.items():
            corpus["test"][lang] += lines
    return corpus


def find_one(release_dir, pattern, corpus):
    found = sorted(glob.glob(os.path.join(release_dir, "**", pattern), recursive=True))
    if not found:
        raise DataError(f"no {pattern} below {release_dir}: --corpus {corpus} reads {WHERE[corpus]}")
    if len(found) > 1:
        raise DataError(f"{len(found)} files match {pattern} below {release_dir} ({', '.join(found)}): keep one")
    return found[0]


def read_wmt14(release_dir, src, tgt):
    check_pair("wmt14", src, tgt)
    train = {src: [], tgt: []}
    for name in WMT14_TRAIN:
        part = {
            lang: [
                without_non_printing(line).strip()
                for line in read_lines(find_one(release_dir, f"{name}.{lang}", "wmt14"))
            ]
            for lang in (src, tgt)
        }
        aligned(part, os.path.join(release_dir, f"{name}.{{de,en}}"))
        for lang in (src, tgt):
            train[lang] += part[lang]
    train[src], train[tgt] = clean_pairs(train[src], train[tgt], max_words=250)
    valid = aligned(
        {
            lang: [line.strip() for line in read_lines(find_one(release_dir, f"newstest2013.{lang}", "wmt14"))]
            for lang in (src, tgt)
        },
        "newstest2013.{de,en}",
    )
    test = aligned(
        {
            lang: segments(
                find_one(release_dir, f"newstest2014-deen-{'src' if lang == src else 'ref'}.{lang}.sgm", "wmt14")
            )
            for lang in (src, tgt)
        },
        "newstest2014-deen-{src,ref}.sgm",
    )
    return {"train": train, "valid": valid, "test": test}


def read_corpus(corpus, release_dir, src, tgt):
    """``{split: {lang: lines}}`` of an official release (see the module's docstring)."""
    if not release_dir:
        raise DataError(f"--corpus {corpus} needs --raw-dir, the directory of the downloaded release: {WHERE[corpus]}")
    if not os.path.isdir(release_dir):
        raise DataError(f"--raw-dir {release_dir} does not exist (--corpus {corpus} reads {WHERE[corpus]})")
    splits = (read_iwslt14 if corpus == "iwslt14" else read_wmt14)(release_dir, src, tgt)
    for split, sides in splits.items():
        full = [i for i, pair in enumerate(zip(sides[src], sides[tgt])) if all(pair)]
        if len(full) < len(sides[src]):
            logger.warning(f"{corpus} {split}: dropping {len(sides[src]) - len(full)} pair(s) with an empty side")
            for lang in (src, tgt):
                sides[lang] = [sides[lang][i] for i in full]
    return splits
