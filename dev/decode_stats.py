"""Decoder calls and tokens per call of a fairseq-generate run, and for RecoverSAT its segments, segment by segment:
how often segment k is empty, deleted (it ends in DEL) or restarts the sentence (it is not the first and begins with
the first segment's first two tokens). These belong beside every BLEU of a parallel decoder: a RecoverSAT K=2 model
can gain BLEU by deleting its second segment and decoding like the AR teacher, one token per call
(docs/design-notes.md, *RecoverSAT: a second segment that restarts the sentence*).

    fairseq-generate $W/data-bin --user-dir nat_plugins --task translation_nat --gen-subset test --beam 1 \\
        --path $W/ckpt/recover-sat-2/checkpoint_last.pt --max-len-a 1.2 --max-len-b 10 --print-step \\
        [--print-segments] > gen.out
    python dev/decode_stats.py gen.out [--json PATH]

Reads the ``I-<id>`` lines (decoder calls, ``--print-step``), the ``P-<id>`` lines (one score per output token, EOS
included: the tokens counted, as the benchmark counts them) and the ``SEG-<id>`` lines (``--print-segments``:
segments joined by `` | ``, a deleted one keeping its ``<del>``) of fairseq-generate's output.
"""

import argparse
import json
import re
import sys
from collections import defaultdict

DEL = "<del>"
LINE = re.compile(r"^(SEG|I|P)-(\d+)\t(.*)$")


def read_generate_output(path: str) -> dict:
    """{sentence id: {"calls": int, "tokens": int[, "segments": [[token, ...], ...]]}} from fairseq-generate's
    output; an error when it lacks the ``I-`` lines."""
    sentences = defaultdict(dict)
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = LINE.match(line.rstrip("\n"))
            if not match:
                continue
            kind, sentence, text = match.group(1), int(match.group(2)), match.group(3)
            if kind == "SEG":
                sentences[sentence]["segments"] = [segment.split() for segment in text.split(" | ")]
            elif kind == "P":
                sentences[sentence]["tokens"] = len(text.split())
            else:
                sentences[sentence]["calls"] = int(text.split()[0])
    if not sentences or any("calls" not in s or "tokens" not in s for s in sentences.values()):
        sys.exit(f"decode_stats.py: {path} lacks I- or P- lines: decode with --print-step")
    return dict(sentences)


def decode_stats(sentences: dict) -> dict:
    """Mean decoder calls per sentence and output tokens (EOS included) per call; with segments, per segment
    position the share (%) of sentences whose segment there is empty, deleted or a restart."""
    n, calls = len(sentences), sum(s["calls"] for s in sentences.values())
    result = {
        "sentences": n,
        "calls_per_sentence": calls / n,
        "tokens_per_call": sum(s["tokens"] for s in sentences.values()) / calls,
    }
    if all("segments" in s for s in sentences.values()):
        counts = [
            {"empty": 0, "deleted": 0, "restarts": 0}
            for _ in range(max(len(s["segments"]) for s in sentences.values()))
        ]
        for sentence in sentences.values():
            segments = sentence["segments"]
            for k, segment in enumerate(segments):
                counts[k]["empty"] += not segment
                counts[k]["deleted"] += bool(segment) and segment[-1] == DEL
                counts[k]["restarts"] += k > 0 and len(segments[0]) >= 2 and segment[:2] == segments[0][:2]
        result["segments"] = [{key: 100.0 * value / n for key, value in count.items()} for count in counts]
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", help="fairseq-generate output with --print-step [--print-segments]")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    result = decode_stats(read_generate_output(args.generate_output))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(
        f"{result['calls_per_sentence']:.2f} decoder calls per sentence, {result['tokens_per_call']:.3f} output "
        f"tokens (EOS included) per call ({result['sentences']} sentences)"
    )
    if "segments" in result:
        print("\n| segment | empty % | deleted % | restarts the sentence % |\n|---:|---:|---:|---:|")
        for k, stats in enumerate(result["segments"], 1):
            print(f"| {k} | {stats['empty']:.1f} | {stats['deleted']:.1f} | {stats['restarts']:.1f} |")


if __name__ == "__main__":
    main()
