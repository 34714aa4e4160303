"""Rep and Mis (Ran et al., ACL 2020, §4, eq. 7-10): repeated and missing tokens of a system's translations,
measured against the AR teacher's translations of the same sources (not against human references).

    python -m nat_plugins.cli.rep_mis --ar-output teacher.gen.txt --hypotheses system.gen.txt [--field D] [--json]

Each file is either plain text (one translation per line, in the same order) or fairseq-generate /
fairseq-interactive output, whose ``H-<id>`` lines (``--field D``: the detokenized ``D-<id>`` lines) are read and
sorted by id. Tokens are whitespace-separated words of the chosen field (subwords for ``H`` without
``--post-process``). Written c_y(w) for the count of token w in y, per sentence pair (y = system, a = AR output):

    rep(y, a) = sum_w max(0, c_y(w) - max(c_a(w), 1))     occurrences of a token repeated beyond the AR output's
    mis(y, a) = sum_w max(0, c_a(w) - c_y(w))             occurrences of the AR output's tokens that are missing
    Rep = 100 * sum rep / sum |y|                         Mis = 100 * sum mis / sum |a|

Prints ``Rep <value>\\tMis <value>`` (and a JSON object with ``--json``); the benchmark imports :func:`rep_mis`.
"""

import argparse
import json
import re
import sys
from collections import Counter

GENERATE_LINE = re.compile(r"^([HD])-(\d+)\t")


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
        raise ValueError(f"{path}: fairseq output without {field}-<id> lines (try --field {'H' if field == 'D' else 'D'})")
    return [by_id[i] for i in sorted(by_id)]


def sentence_counts(hypothesis, ar_output):
    """(rep, mis) token counts of one sentence pair (module docstring)."""
    hyp, ar = Counter(hypothesis.split()), Counter(ar_output.split())
    rep = sum(max(0, count - max(ar[word], 1)) for word, count in hyp.items())
    mis = sum(max(0, count - hyp[word]) for word, count in ar.items())
    return rep, mis


def rep_mis(hypotheses, ar_outputs):
    """Corpus-level {"rep": Rep, "mis": Mis} in percent for aligned lists of translations."""
    if len(hypotheses) != len(ar_outputs):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(ar_outputs)} AR outputs: they must translate the "
                         "same sentences")
    rep = mis = hyp_tokens = ar_tokens = 0
    for hypothesis, ar_output in zip(hypotheses, ar_outputs):
        sentence_rep, sentence_mis = sentence_counts(hypothesis, ar_output)
        rep, mis = rep + sentence_rep, mis + sentence_mis
        hyp_tokens += len(hypothesis.split())
        ar_tokens += len(ar_output.split())
    return {"rep": 100.0 * rep / max(hyp_tokens, 1), "mis": 100.0 * mis / max(ar_tokens, 1)}


def get_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ar-output", required=True, metavar="FILE",
                        help="the AR teacher's translations of the same sources (text or fairseq-generate output)")
    parser.add_argument("--hypotheses", required=True, metavar="FILE",
                        help="the system's translations (text or fairseq-generate output)")
    parser.add_argument("--field", choices=("H", "D"), default="H",
                        help="which lines of fairseq output to read: H (hypothesis) or D (detokenized)")
    parser.add_argument("--json", action="store_true", help="also print the result as a JSON object")
    return parser


def main(argv=None):
    args = get_parser().parse_args(argv)
    scores = rep_mis(read_translations(args.hypotheses, args.field), read_translations(args.ar_output, args.field))
    print(f"Rep {scores['rep']:.2f}\tMis {scores['mis']:.2f}")
    if args.json:
        print(json.dumps(scores))
    return scores


if __name__ == "__main__":
    main(sys.argv[1:])
