"""RecoverSAT's segments, segment by segment: how often segment k is empty, deleted (it ends in DEL) or restarts the
sentence (it is not the first and begins with the first segment's first two tokens), and the decoder calls per
sentence. These belong beside every RecoverSAT BLEU: a K=2 model can gain BLEU by deleting its second segment and
decoding like the AR teacher, one token per call (docs/results.md, *SAT: a group's positions stop agreeing*).

    fairseq-generate $W/data-bin --user-dir nat_plugins --task translation_nat --gen-subset test --beam 1 \\
        --path $W/ckpt/recover-sat-2/checkpoint_last.pt --max-len-a 1.2 --max-len-b 10 --print-step \\
        --print-segments > gen.out
    python dev/segment_stats.py gen.out [--json PATH]

Reads the ``SEG-<id>`` lines (segments joined by `` | ``, a deleted one keeping its ``<del>``; the output tokens are
those of the segments kept) and the ``I-<id>`` lines (decoder calls, ``--print-step``) of fairseq-generate's output.
"""

import argparse
import json
import re
import sys
from collections import defaultdict

DEL = "<del>"
LINE = re.compile(r"^(SEG|I)-(\d+)\t(.*)$")


def read_generate_output(path: str) -> dict:
    """{sentence id: {"segments": [[token, ...], ...], "calls": int}} from fairseq-generate's output."""
    sentences = defaultdict(dict)
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = LINE.match(line.rstrip("\n"))
            if not match:
                continue
            kind, sentence, text = match.group(1), int(match.group(2)), match.group(3)
            if kind == "SEG":
                sentences[sentence]["segments"] = [segment.split() for segment in text.split(" | ")]
            else:
                sentences[sentence]["calls"] = int(text.split()[0])
    missing = [i for i, s in sentences.items() if "segments" not in s]
    if not sentences or missing:
        sys.exit(
            f"segment_stats.py: {path} has no SEG- line for {len(missing) or 'any'} sentences: decode with "
            "--print-segments (and --print-step for the decoder calls)"
        )
    return dict(sentences)


def segment_stats(sentences: dict) -> dict:
    """Per segment position: the share (%) of sentences whose segment there is empty, deleted or a restart; and the
    mean decoder calls per sentence and output tokens (EOS not counted) per call (when the ``I-`` lines are
    there)."""
    num_segments = max(len(s["segments"]) for s in sentences.values())
    counts = [{"empty": 0, "deleted": 0, "restarts": 0} for _ in range(num_segments)]
    for sentence in sentences.values():
        segments = sentence["segments"]
        for k, segment in enumerate(segments):
            counts[k]["empty"] += not segment
            counts[k]["deleted"] += bool(segment) and segment[-1] == DEL
            counts[k]["restarts"] += k > 0 and len(segments[0]) >= 2 and segment[:2] == segments[0][:2]
    n = len(sentences)
    result = {
        "sentences": n,
        "segments": [{key: 100.0 * value / n for key, value in count.items()} for count in counts],
    }
    if all("calls" in s for s in sentences.values()):
        calls = sum(s["calls"] for s in sentences.values())
        kept = [segment for s in sentences.values() for segment in s["segments"] if segment[-1:] != [DEL]]
        result["calls_per_sentence"] = calls / n
        result["tokens_per_call"] = sum(len(segment) for segment in kept) / calls
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", help="fairseq-generate output with --print-segments [--print-step]")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    result = segment_stats(read_generate_output(args.generate_output))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print("| segment | empty % | deleted % | restarts the sentence % |\n|---:|---:|---:|---:|")
    for k, stats in enumerate(result["segments"], 1):
        print(f"| {k} | {stats['empty']:.1f} | {stats['deleted']:.1f} | {stats['restarts']:.1f} |")
    if "calls_per_sentence" in result:
        print(
            f"\n{result['calls_per_sentence']:.2f} decoder calls per sentence, "
            f"{result['tokens_per_call']:.2f} output tokens per call ({result['sentences']} sentences)"
        )


if __name__ == "__main__":
    main()
