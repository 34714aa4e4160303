"""Rep and Mis (Ran et al., ACL 2020, §4, eq. 7-10): how much more a system repeats and drops tokens than the AR
model, the errors the multi-modality problem causes.

    python -m nat_plugins.cli.rep_mis --references ref.txt --ar-output teacher.txt --hypotheses system.txt \\
        [--window 9] [--field D] [--json]

For translations Y = (y^1 .. y^M) of M sources with references Y* (tokens: the words of sacreBLEU's 13a
tokenization, the tokenization of the benchmark's BLEU, so that punctuation is a token of its own and "Haus." ends in
the word "Haus"; c_y(w) = count of token w in y):

    r(Y)     = 100 * sum_i #{j : y^i_j in {y^i_{j-N}, .., y^i_{j-1}}} / sum_i |y^i|          repeated tokens (%)
    m(Y, Y*) = 100 * sum_i sum_w max(0, c_{y*^i}(w) - c_{y^i}(w)) / sum_i |y*^i|             missing tokens (%)
    Rep = 100 * (r(Y) - r(Y_AR)) / r(Y_AR)         Mis = 100 * (m(Y, Y*) - m(Y_AR, Y*)) / m(Y_AR, Y*)

A token is repeated when it equals any of the N tokens before it in its sentence: the paper's eq. 8 counts
y_j when sum_{i=1..9} 1(y_j = y_{j-i}) >= 1, so N = 9 (``--window``, default 9); NAT outputs repeat a phrase a
few tokens later ("lots of farmers doing this of farmers"), which a window of 1 or 2 misses. A reference token is
missing when the translation has fewer copies of it than the reference. Like the paper, Rep and Mis are relative
increments (%) over the AR model's ratios on the same sources: 0 for the AR model itself, negative for a system
that repeats (drops) less; undefined (None, printed ``n/a``) only when the AR output has no repeated (missing)
token at all, which with N = 9 takes outputs without a single repeated word (a narrow window makes that the
ordinary case: "a man in a blue shirt" repeats "a" 3 tokens later). The absolute ratios are reported too: the
system's (``rep_ratio``, ``mis_ratio``) and the AR model's (``ar_rep_ratio``, ``ar_mis_ratio``); ``--window 1``
gives the rate of immediately repeated tokens.

Each file is plain text (one translation per line, in the same order; detokenized like the references) or
fairseq-generate/-interactive output, whose ``H-<id>`` lines (``--field D``: the detokenized ``D-<id>`` lines) are read
and sorted by id. :func:`rep_mis` tokenizes every line with 13a (:func:`tokenize_13a`), so this command and the
benchmark's Rep/Mis columns give the same numbers for the same output; :func:`repeated_ratio` and
:func:`missing_ratio` take whitespace-separated tokens as given (the distilled targets' repeated subwords use them on
subword text). Prints
``Rep <value>\\tMis <value>\\trep% <value>\\tmis% <value>\\tAR rep% <value>\\tAR mis% <value>`` (and a JSON object
with ``--json``); the benchmark imports :func:`rep_mis`.
"""

import argparse
import json
import re
import sys
from collections import Counter

from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

GENERATE_LINE = re.compile(r"^([HD])-(\d+)\t")
DEFAULT_WINDOW = 9  # eq. 8: sum_{i=1}^{9} 1(y_j = y_{j-i})
TOKENIZER_13A = Tokenizer13a()


def tokenize_13a(line):
    """``line`` as sacreBLEU's 13a tokenization writes it: words and punctuation separated by single spaces."""
    return TOKENIZER_13A(line)


def read_translations(path, field="H"):
    """Translations in sentence order from a plain text file or fairseq-generate/-interactive output."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not any(GENERATE_LINE.match(line) for line in lines):
        return lines
    by_id = {}
    for line in lines:
        match = GENERATE_LINE.match(line)
        if match and match.group(1) == field:
            parts = line.split("\t", 2)
            by_id.setdefault(int(match.group(2)), parts[2] if len(parts) == 3 else "")  # best hypothesis first
    if not by_id:
        raise ValueError(
            f"{path}: fairseq output without {field}-<id> lines (try --field {'H' if field == 'D' else 'D'})"
        )
    return [by_id[i] for i in sorted(by_id)]


def repeated_tokens(tokens, window=DEFAULT_WINDOW):
    """Number of tokens equal to any of the ``window`` tokens before them (eq. 8: ``window`` = 9)."""
    if window < 1:
        raise ValueError(f"the repetition window must be >= 1, got {window}")
    return sum(token in tokens[max(0, j - window) : j] for j, token in enumerate(tokens))


def missing_tokens(hypothesis, reference):
    """Number of reference tokens (with multiplicity) that the hypothesis lacks."""
    hyp = Counter(hypothesis)
    return sum(max(0, count - hyp[token]) for token, count in Counter(reference).items())


def repeated_ratio(translations, window=DEFAULT_WINDOW):
    """r(Y): repeated tokens in % of all tokens of ``translations`` (lines of whitespace-separated tokens)."""
    sentences = [line.split() for line in translations]
    return 100.0 * sum(repeated_tokens(s, window) for s in sentences) / max(sum(map(len, sentences)), 1)


def missing_ratio(translations, references):
    """m(Y, Y*): reference tokens missing from the aligned ``translations``, in % of all reference tokens."""
    if len(translations) != len(references):
        raise ValueError(
            f"{len(translations)} translations but {len(references)} references: they must translate the same sentences"
        )
    pairs = [(t.split(), r.split()) for t, r in zip(translations, references)]
    return 100.0 * sum(missing_tokens(t, r) for t, r in pairs) / max(sum(len(r) for _, r in pairs), 1)


def relative_increment(value, baseline):
    """100 * (value - baseline) / baseline; None when the baseline is 0."""
    return None if baseline == 0 else 100.0 * (value - baseline) / baseline


def rep_mis(hypotheses, references, ar_outputs, window=DEFAULT_WINDOW):
    """{"rep", "mis"}: Rep and Mis (%, relative to the AR model; module docstring) of aligned lists of translations
    (detokenized lines, counted in 13a words: :func:`tokenize_13a`), the system's absolute ratios {"rep_ratio",
    "mis_ratio"} and the AR model's {"ar_rep_ratio", "ar_mis_ratio"} (%), which Rep and Mis are relative to."""
    if not len(hypotheses) == len(references) == len(ar_outputs):
        raise ValueError(
            f"{len(hypotheses)} hypotheses, {len(references)} references and {len(ar_outputs)} AR "
            "outputs: they must translate the same sentences"
        )
    hypotheses, references, ar_outputs = (
        list(map(tokenize_13a, lines)) for lines in (hypotheses, references, ar_outputs)
    )
    rep_ratio, mis_ratio = repeated_ratio(hypotheses, window), missing_ratio(hypotheses, references)
    ar_rep_ratio, ar_mis_ratio = repeated_ratio(ar_outputs, window), missing_ratio(ar_outputs, references)
    return {
        "rep": relative_increment(rep_ratio, ar_rep_ratio),
        "mis": relative_increment(mis_ratio, ar_mis_ratio),
        "rep_ratio": rep_ratio,
        "mis_ratio": mis_ratio,
        "ar_rep_ratio": ar_rep_ratio,
        "ar_mis_ratio": ar_mis_ratio,
    }


def get_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--references",
        required=True,
        metavar="FILE",
        help="reference translations (plain text, one per line, detokenized; every file is counted in the words of "
        "sacreBLEU's 13a tokenization)",
    )
    parser.add_argument(
        "--ar-output",
        required=True,
        metavar="FILE",
        help="the AR model's translations of the same sources (text or fairseq-generate output)",
    )
    parser.add_argument(
        "--hypotheses",
        required=True,
        metavar="FILE",
        help="the system's translations (text or fairseq-generate output)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        metavar="N",
        help=f"a token is repeated when it equals any of the N tokens before it (default {DEFAULT_WINDOW}: "
        "the paper's eq. 8; 1: immediate repetitions only)",
    )
    parser.add_argument(
        "--field",
        choices=("H", "D"),
        default="H",
        help="which lines of fairseq output to read: H (hypothesis) or D (detokenized)",
    )
    parser.add_argument("--json", action="store_true", help="also print the result as a JSON object")
    return parser


def _fmt(value):
    return "n/a" if value is None else f"{value:.2f}"


def main(argv=None):
    args = get_parser().parse_args(argv)
    scores = rep_mis(
        read_translations(args.hypotheses, args.field),
        read_translations(args.references),
        read_translations(args.ar_output, args.field),
        args.window,
    )
    print(
        f"Rep {_fmt(scores['rep'])}\tMis {_fmt(scores['mis'])}\t"
        f"rep% {_fmt(scores['rep_ratio'])}\tmis% {_fmt(scores['mis_ratio'])}\t"
        f"AR rep% {_fmt(scores['ar_rep_ratio'])}\tAR mis% {_fmt(scores['ar_mis_ratio'])}"
    )
    if args.json:
        print(json.dumps(scores))
    return scores


if __name__ == "__main__":
    main(sys.argv[1:])
