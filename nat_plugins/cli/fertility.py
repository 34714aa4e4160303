"""Fertility supervision for ``fertility_nat`` (Gu et al., ICLR 2018, §3.3/§4.1: fertilities from an external
aligner): word-align the source and target *subwords* of a binarized data-bin and write one fertility per source
subword.

    python -m nat_plugins.cli.fertility DATA_BIN                         # eflomal, train (+ distilled), valid, test
    python -m nat_plugins.cli.fertility DATA_BIN --save-links DIR        # + the links, to reproduce the fertilities
    python -m nat_plugins.cli.fertility DATA_BIN --aligner links --links-dir DIR   # your own links (fast_align, ...)
    python -m nat_plugins.cli.fertility DATA_BIN --aligner monotone      # fallback without an aligner (not alignment)

* The subword text is read back from the data-bin (fairseq's indexed datasets + ``dict.{lang}.txt``), so it always
  matches what ``translation_nat`` loads. The training split's target is the distilled ``train.kd.{tgt}`` when it
  exists (``--target auto``; ``real``/``distilled`` force one): fertilities must sum to the target the model trains
  on (``--use-distilled target``). Validation/test use the real targets (needed for gold-fertility evaluation and
  the validation loss).
* Aligners: ``eflomal`` (GPLv3, the package's optional ``eflomal`` extra, installed separately and called as a
  separate library through its Python API; all splits are aligned together in one run, since alignment is
  unsupervised and more text helps; not deterministic: ``--save-links DIR`` keeps the links for ``--aligner links``);
  ``links``: Pharaoh ``i-j`` files ``{links_dir}/{split}.links`` (i = source subword, j = target subword, 0-based,
  EOS excluded); ``monotone``: target position t copies source position floor(t * n / T) (uniform copy,
  a clearly labelled fallback, *not* an alignment).
* Forward links only: every target subword has at most one source subword (if a links file gives several, the
  leftmost source is kept). A target subword without a link is attached to the source of its nearest aligned
  target neighbour, the left one first (the previous target subword), else the right one; a sentence without any
  link falls back to the monotone rule. So fertilities always sum to the target length (EOS excluded on both
  sides, the task's convention).
* Clamping to ``--max-fertility`` L (the predictor's softmax covers 0..L-1): the overflow of a source subword above
  L-1 is moved to the nearest source subwords with room (distance 1 first, the right neighbour before the left),
  which keeps the sum; a sentence whose target is longer than (L-1) * source length cannot be clamped (error).

Writes ``{split}.fert.{src}`` next to the data-bin (through a temporary file) and checks it with the task's reader.
"""

import argparse
import glob
import logging
import os
import sys
import tempfile

from ..modules.options import DEFAULT_MAX_FERTILITY

logger = logging.getLogger("nat_plugins.cli.fertility")

EFLOMAL_MISSING = (
    "the eflomal word aligner (GPLv3, the optional `eflomal` extra) is not installed: run "
    "`pip install -e '.[eflomal]'` in the nat-plugins checkout (or `NAT_SETUP_EXTRAS=eflomal bash "
    "run_scripts/setup_env.sh`, the set-up's default); or pass --aligner links --links-dir DIR with "
    "your own alignments"
)


class FertilityError(ValueError):
    """Bad input to the fertility pipeline (missing file, wrong line count, malformed link, ...)."""


# ----- links -> fertilities ---------------------------------------------------------------------------------------
def parse_links(line, src_len, tgt_len, where="links"):
    """Source position of every target position (None = unaligned) from a Pharaoh ``i-j`` line."""
    alignment = [None] * tgt_len
    for link in line.split():
        parts = link.split("-")
        try:
            if len(parts) != 2:
                raise ValueError
            i, j = int(parts[0]), int(parts[1])
        except ValueError:
            raise FertilityError(f"{where}: malformed link {link!r} (expected 'i-j' with integer positions)") from None
        if not (0 <= i < src_len and 0 <= j < tgt_len):
            raise FertilityError(
                f"{where}: link {link!r} is outside the sentence pair ({src_len} source, {tgt_len} "
                "target subwords, 0-based, EOS excluded): were the links made from this data?"
            )
        if alignment[j] is None or i < alignment[j]:
            alignment[j] = i
    return alignment


def monotone_alignment(src_len, tgt_len):
    """The fallback: target position t copies source position floor(t * n / T) (not a word alignment)."""
    return [t * src_len // tgt_len for t in range(tgt_len)]


def fill_unaligned(alignment, src_len):
    """Attach every unaligned target position to its nearest aligned target neighbour's source (left first)."""
    if not alignment:
        return []
    if all(a is None for a in alignment):
        return monotone_alignment(src_len, len(alignment))
    filled, previous = list(alignment), None
    for t, a in enumerate(alignment):
        if a is None:
            filled[t] = previous
        else:
            previous = a
    following = None
    for t in range(len(alignment) - 1, -1, -1):
        if alignment[t] is not None:
            following = alignment[t]
        elif filled[t] is None:
            filled[t] = following
    return filled


def clamp_fertility(fertility, max_value):
    """Cap every fertility at ``max_value``, moving the overflow to the nearest positions with room (distance 1
    first, right before left): the sum is kept. Raises when sum > max_value * len."""
    fertility = list(fertility)
    n = len(fertility)
    if sum(fertility) > max_value * n:
        raise FertilityError(
            f"a target of {sum(fertility)} subwords cannot be spread over {n} source subwords with "
            f"fertilities <= {max_value}: raise --max-fertility"
        )
    for i in range(n):
        excess = fertility[i] - max_value
        if excess <= 0:
            continue
        fertility[i] = max_value
        for d in range(1, n):
            for j in (i + d, i - d):
                if 0 <= j < n and excess > 0:
                    moved = min(excess, max_value - fertility[j])
                    if moved > 0:
                        fertility[j] += moved
                        excess -= moved
            if excess == 0:
                break
    return fertility


def alignment_to_fertility(alignment, src_len, max_fertility):
    """Fertilities (one per source subword, summing to len(alignment)) of a forward alignment (target -> source
    or None); returns (fertilities, number of unaligned target positions, number of clamped source positions)."""
    if alignment and src_len == 0:
        raise FertilityError(f"a target of {len(alignment)} subwords has an empty source: it has no fertilities")
    unaligned = sum(a is None for a in alignment)
    fertility = [0] * src_len
    for a in fill_unaligned(alignment, src_len):
        fertility[a] += 1
    clamped = sum(f > max_fertility - 1 for f in fertility)
    return clamp_fertility(fertility, max_fertility - 1), unaligned, clamped


# ----- reading the data-bin --------------------------------------------------------------------------------------
def infer_languages(data_bin):
    pairs = {os.path.basename(p).split(".")[1] for p in glob.glob(os.path.join(data_bin, "train.*-*.*.idx"))}
    if len(pairs) != 1:
        raise FertilityError(
            f"cannot tell the language pair of {data_bin} (found {sorted(pairs) or 'no train.*-*.*.idx'}):"
            " pass --source-lang and --target-lang"
        )
    src, tgt = pairs.pop().split("-")
    return src, tgt


def split_prefix(data_bin, split, src, tgt, lang):
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = os.path.join(data_bin, f"{split}.{pair}.{lang}")
        if os.path.exists(prefix + ".idx"):
            return prefix
    raise FertilityError(
        f"{os.path.join(data_bin, f'{split}.{src}-{tgt}.{lang}')}.bin/.idx is missing: is "
        f"{data_bin} a fairseq-preprocess data-bin with split '{split}'?"
    )


def read_indexed(prefix, dictionary):
    """Subword symbols of every sentence of a binarized dataset, EOS removed."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(prefix, dictionary)
    if dataset is None:
        raise FertilityError(f"{prefix}.bin/.idx is missing or unreadable")
    eos = dictionary.eos()
    sentences = []
    for i in range(len(dataset)):
        ids = dataset[i].tolist()
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        sentences.append([dictionary[t] for t in ids])
    return sentences


def load_split(data_bin, split, src, tgt, target="auto"):
    """(source subwords, target subwords, target description) of ``split``; the training split's target is the
    distilled one when ``target`` is 'distilled', or 'auto' and ``train.kd.{tgt}`` exists."""
    from fairseq.data import Dictionary

    dicts = {}
    for lang in (src, tgt):
        path = os.path.join(data_bin, f"dict.{lang}.txt")
        if not os.path.exists(path):
            raise FertilityError(f"{path} is missing: is {data_bin} a fairseq-preprocess data-bin?")
        dicts[lang] = Dictionary.load(path)
    sources = read_indexed(split_prefix(data_bin, split, src, tgt, src), dicts[src])
    kd_prefix = os.path.join(data_bin, f"{split}.kd.{tgt}")
    use_kd = split == "train" and (target == "distilled" or (target == "auto" and os.path.exists(kd_prefix + ".idx")))
    if use_kd:
        if not os.path.exists(kd_prefix + ".idx"):
            raise FertilityError(f"--target distilled: {kd_prefix}.bin/.idx is missing (run nat_plugins.cli.distill)")
        targets, described = read_indexed(kd_prefix, dicts[tgt]), f"distilled {kd_prefix}"
    else:
        targets = read_indexed(split_prefix(data_bin, split, src, tgt, tgt), dicts[tgt])
        described = f"real {split}.{tgt}"
    if len(sources) != len(targets):
        raise FertilityError(f"{split}: {len(sources)} source but {len(targets)} target sentences ({described})")
    return sources, targets, described


# ----- aligners --------------------------------------------------------------------------------------------------
def read_links_file(path, pairs):
    """Forward alignments of ``pairs`` [(source subwords, target subwords)] from a Pharaoh file, one line each."""
    if not os.path.exists(path):
        raise FertilityError(f"links file {path} is missing")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if len(lines) != len(pairs):
        raise FertilityError(f"{path} has {len(lines)} lines but the split has {len(pairs)} sentence pairs")
    return [
        parse_links(line, len(s), len(t), where=f"{path}:{n + 1}") for n, (line, (s, t)) in enumerate(zip(lines, pairs))
    ]


def eflomal_alignments(pairs, model=3):
    """Forward links of all ``pairs`` from one eflomal run (eflomal: each target word -> at most one source word).

    eflomal seeds its sampler from ``/dev/urandom`` (it has no seed option): two runs give different links, hence
    different fertilities; :func:`write_links_file` keeps them for ``--aligner links``."""
    try:
        import eflomal
    except ImportError:
        raise FertilityError(EFLOMAL_MISSING) from None
    with tempfile.TemporaryDirectory() as tmp:
        links_path = os.path.join(tmp, "links.fwd")
        # eflomal cannot align an empty side: a placeholder word, whose links are dropped below
        src_lines = [" ".join(s) if s else "<empty>" for s, _ in pairs]
        tgt_lines = [" ".join(t) if t else "<empty>" for _, t in pairs]
        aligner = eflomal.Aligner(model=model)
        aligner.align(src_lines, tgt_lines, links_filename_fwd=links_path, quiet=True)
        with open(links_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    if len(lines) != len(pairs):
        raise FertilityError(f"eflomal wrote {len(lines)} alignment lines for {len(pairs)} sentence pairs")
    alignments = []
    for n, (line, (s, t)) in enumerate(zip(lines, pairs)):
        if not s or not t:
            alignments.append([None] * len(t))
            continue
        alignments.append(parse_links(line, len(s), len(t), where=f"eflomal output line {n + 1}"))
    return alignments


# ----- the pipeline ----------------------------------------------------------------------------------------------
def write_links_file(path, alignments):
    """Pharaoh ``i-j`` lines of ``alignments`` (per sentence, the source position of each target position or None),
    as ``--aligner links`` reads them back: the same alignments."""
    with open(path, "w", encoding="utf-8") as f:
        for alignment in alignments:
            f.write(" ".join(f"{i}-{j}" for j, i in enumerate(alignment) if i is not None) + "\n")


def write_fertility_file(path, fertilities):
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, encoding="utf-8", suffix=".tmp") as f:
        for row in fertilities:
            f.write(" ".join(map(str, row)) + "\n")
    os.replace(f.name, path)


def make_fertilities(
    data_bin,
    splits=("train", "valid", "test"),
    src=None,
    tgt=None,
    aligner="eflomal",
    links_dir=None,
    max_fertility=DEFAULT_MAX_FERTILITY,
    target="auto",
    eflomal_model=3,
    save_links=None,
):
    """Run the pipeline (module docstring); returns {split: path written}."""
    if max_fertility < 2:
        raise FertilityError(f"--max-fertility must be >= 2, got {max_fertility}")
    if aligner == "links" and not links_dir:
        raise FertilityError("--aligner links needs --links-dir DIR holding {split}.links")
    if src is None or tgt is None:
        src, tgt = infer_languages(data_bin)
    data = {}
    for split in splits:
        sources, targets, described = load_split(data_bin, split, src, tgt, target)
        data[split] = list(zip(sources, targets))
        logger.info(f"{split}: {len(sources)} sentence pairs, target = {described}")

    if aligner == "eflomal":
        corpus = [pair for split in splits for pair in data[split]]
        logger.info(f"aligning {len(corpus)} sentence pairs with eflomal (model {eflomal_model})")
        flat = eflomal_alignments(corpus, model=eflomal_model)
        if save_links:
            os.makedirs(save_links, exist_ok=True)
        alignments, start = {}, 0
        for split in splits:
            alignments[split] = flat[start : start + len(data[split])]
            start += len(data[split])
            if save_links:
                write_links_file(os.path.join(save_links, f"{split}.links"), alignments[split])
    elif aligner == "links":
        alignments = {
            split: read_links_file(os.path.join(links_dir, f"{split}.links"), data[split]) for split in splits
        }
    elif aligner == "monotone":
        logger.warning(
            "--aligner monotone: target subwords are spread uniformly over the source (a fallback, "
            "NOT a word alignment)"
        )
        alignments = {
            split: [monotone_alignment(len(s), len(t)) if s else [None] * len(t) for s, t in data[split]]
            for split in splits
        }
    else:
        raise FertilityError(f"unknown --aligner {aligner!r} (eflomal, links, monotone)")

    from ..tasks.translation_nat import read_fertility_file

    written = {}
    for split in splits:
        rows, unaligned, clamped, target_tokens = [], 0, 0, 0
        for n, ((s, t), alignment) in enumerate(zip(data[split], alignments[split])):
            try:
                fertility, u, c = alignment_to_fertility(alignment, len(s), max_fertility)
            except FertilityError as err:
                raise FertilityError(f"{split} sentence {n + 1}: {err}") from None
            rows.append(fertility)
            unaligned, clamped, target_tokens = unaligned + u, clamped + c, target_tokens + len(t)
        path = os.path.join(data_bin, f"{split}.fert.{src}")
        write_fertility_file(path, rows)
        read_fertility_file(path, [len(s) + 1 for s, _ in data[split]], [len(t) + 1 for _, t in data[split]])
        largest = max((max(r) for r in rows if r), default=0)
        logger.info(
            f"wrote {path}: {100 * unaligned / max(target_tokens, 1):.2f}% target subwords unaligned "
            f"(attached to a neighbour's source), {clamped} source subwords clamped to {max_fertility - 1}, "
            f"largest fertility {largest}"
        )
        written[split] = path
    return written


def get_parser():
    parser = argparse.ArgumentParser(
        prog="nat-fertility", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("data_bin", help="fairseq-preprocess output directory (the fertility files are written there)")
    parser.add_argument("--source-lang", "-s", default=None, help="source language (default: from the file names)")
    parser.add_argument("--target-lang", "-t", default=None, help="target language (default: from the file names)")
    parser.add_argument("--splits", nargs="+", default=["train", "valid", "test"], help="splits to process")
    parser.add_argument(
        "--aligner",
        choices=["eflomal", "links", "monotone"],
        default="eflomal",
        help="eflomal (default; optional GPLv3 extra), links (your Pharaoh files) or monotone "
        "(uniform spread: a fallback, not an alignment)",
    )
    parser.add_argument(
        "--links-dir",
        default=None,
        help="--aligner links: directory of {split}.links Pharaoh files "
        "(i-j = source i, target j, 0-based subword positions, EOS excluded)",
    )
    parser.add_argument(
        "--max-fertility",
        type=int,
        default=DEFAULT_MAX_FERTILITY,
        help="the model's --max-fertility L: fertilities are clamped to L-1, the overflow moved to "
        f"neighbours (default {DEFAULT_MAX_FERTILITY})",
    )
    parser.add_argument(
        "--target",
        choices=["auto", "distilled", "real"],
        default="auto",
        help="training split's target: the distilled train.kd.TGT when it exists (auto), or forced",
    )
    parser.add_argument(
        "--eflomal-model",
        type=int,
        choices=[1, 2, 3],
        default=3,
        help="eflomal's model: 1 = IBM1, 2 = + HMM, 3 = + fertility (default)",
    )
    parser.add_argument(
        "--save-links",
        default=None,
        metavar="DIR",
        help="also write eflomal's forward links to DIR/{split}.links: eflomal is not deterministic (it seeds "
        "itself from /dev/urandom), and --aligner links --links-dir DIR reproduces these fertilities exactly",
    )
    return parser


def cli_main(argv=None):
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr
    )
    args = get_parser().parse_args(argv)
    try:
        make_fertilities(
            args.data_bin,
            splits=args.splits,
            src=args.source_lang,
            tgt=args.target_lang,
            aligner=args.aligner,
            links_dir=args.links_dir,
            max_fertility=args.max_fertility,
            target=args.target,
            eflomal_model=args.eflomal_model,
            save_links=args.save_links,
        )
    except FertilityError as err:
        sys.exit(f"nat-fertility: error: {err}")


if __name__ == "__main__":
    cli_main()
