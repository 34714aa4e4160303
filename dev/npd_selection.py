"""BLEU of noisy parallel decoding's selection rules over the same candidates (Gu et al., ICLR 2018, §4.1).

``fertility_nat`` NPD decodes S fertility sequences per sentence and keeps the candidate the AR teacher scores best
(the log-probability of its tokens and EOS: eq. 8's sum, or per token, the default). This script decodes the S
candidates exactly as :class:`~nat_plugins.systems.fertility_nat.decoding.FertilityNATGenerator` does (same
fertilities, dedup, decoding and teacher scores: a subclass that records them and returns the generator's own
output), in the benchmark's batches (``--batch-size`` sentences in the split's length order, ``--seed`` set before
every batch), and scores every selection rule on them with sacreBLEU (13a) against the raw references:

* ``argmax``: the argmax fertility sequence (candidate 0 of ``--candidates argmax_and_samples``);
* ``teacher (eq. 8)``: the teacher's log-probability sum (asserted equal to the generator's output with
  ``--npd-ranking sum``);
* ``teacher / (len+1)^a``: that sum divided by (length + 1) ** a, the hypothesis length with EOS in tokens, for each
  a of ``--lenpens`` (a = 1: ``--npd-ranking mean``, the generator's default; a: its ``--lenpen``);
* ``random``: one of the S sequences drawn uniformly (a duplicate stands for the candidate it repeats);
* ``oracle``: per sentence the candidate with the best sentence BLEU, the upper bound of any rescoring;
* ``teacher greedy``: the teacher's own greedy output (fairseq's SequenceGenerator, beam 1), for reference.

With every rule's length statistics (mean words, brevity penalty, system/reference length ratio) and the
candidates' (per-sentence length spread, distinct candidates, how often the teacher keeps the argmax one).

    OMP_NUM_THREADS=1 python dev/npd_selection.py $W/data-bin --path $W/ckpt/fertility-nat/checkpoint_last.pt \\
        --teacher $W/ckpt/teacher/checkpoint_best.pt --references $W/raw/test.de [--samples 10] [--json PATH]
"""

import argparse
import datetime
import json
import logging
import os
import statistics
import time
from types import SimpleNamespace
from unittest import mock

import numpy as np
import sacrebleu
import torch
from fairseq.sequence_generator import SequenceGenerator

import nat_plugins
from nat_plugins.bench.measure import generation_cfg, load_row, seed_everything
from nat_plugins.bench.rows import RowSpec
from nat_plugins.systems.fertility_nat import decoding as fertility_nat_decoding
from nat_plugins.systems.fertility_nat.decoding import FertilityNATGenerator, first_occurrences

logger = logging.getLogger("npd_selection")


class CandidateRecorder(FertilityNATGenerator):
    """The NPD generator unchanged, recording for the last batch every decoded candidate and its teacher score
    (eq. 8) and, per sentence, which of the S fertility sequences each one is (``slot_of``: the first slot with the
    same sequence, after the length limits, as the generator's dedup sees them)."""

    def generate(self, models, sample, **kwargs):
        self.record = {}
        with mock.patch.object(fertility_nat_decoding, "first_occurrences", self.recorded_first_occurrences):
            return super().generate(models, sample, **kwargs)

    def recorded_first_occurrences(self, candidates):
        same = candidates.unsqueeze(2).eq(candidates.unsqueeze(1)).all(dim=-1)  # B x S x S
        self.record["slot_of"] = same.long().argmax(dim=-1)  # argmax: the first equal slot
        return first_occurrences(candidates)

    def teacher_scores(self, src_tokens, src_lengths, tokens, lengths, order):
        scores = super().teacher_scores(src_tokens, src_lengths, tokens, lengths, order)
        self.record.update(tokens=tokens, lengths=lengths, order=order, scores=scores)
        return scores


def sentence_candidates(record, bsz, samples):
    """Per sentence of the batch: its distinct candidates as (tokens, teacher score) in the generator's order, and
    for each of the S slots the index of its candidate."""
    slot_of = record.get("slot_of", torch.zeros(bsz, samples, dtype=torch.long))
    distinct = slot_of.eq(torch.arange(samples)).view(-1)
    rank = (distinct.long().cumsum(0) - 1).view(bsz, samples)  # row among the decoded candidates of every slot
    order = record["order"] if record["order"] is not None else torch.arange(bsz)
    first_row = torch.searchsorted(order, torch.arange(bsz))
    tokens, lengths, scores = record["tokens"], record["lengths"].tolist(), record["scores"].tolist()
    out = []
    for b in range(bsz):
        rows = [int(r) for r in rank[b].gather(0, slot_of[b]).unique()]
        cands = [(tokens[r, : lengths[r]], scores[r]) for r in rows]
        slots = [int(rank[b, slot_of[b, i]]) - int(first_row[b]) for i in range(samples)]
        out.append((cands, slots))
    return out


def first_best(values):
    """Index of the first maximum (the generator's tie rule: the earlier candidate)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def bleu_of(hyps, refs):
    """sacreBLEU corpus BLEU (13a) of detokenized ``hyps`` with its brevity penalty and lengths."""
    bleu = sacrebleu.metrics.BLEU().corpus_score(hyps, [refs])
    return {
        "bleu": bleu.score,
        "bp": bleu.bp,
        "sys_len": bleu.sys_len,
        "ref_len": bleu.ref_len,
        "length_ratio": bleu.sys_len / bleu.ref_len,
        "mean_words": statistics.fmean(len(h.split()) for h in hyps),
    }


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_bin", help="fairseq data-bin directory of the checkpoints")
    parser.add_argument("--path", required=True, help="fertility_nat checkpoint")
    parser.add_argument("--teacher", required=True, help="AR teacher checkpoint that rescores the candidates")
    parser.add_argument("--references", required=True, help="raw reference file of the split, data-bin order")
    parser.add_argument("--gen-subset", default="test", help="data-bin split to decode (default: test)")
    parser.add_argument("--source-lang", "-s", default=None, help="source language (default: from the data-bin)")
    parser.add_argument("--target-lang", "-t", default=None, help="target language (default: from the data-bin)")
    parser.add_argument("--samples", type=int, default=10, help="S, fertility sequences per sentence (default: 10)")
    parser.add_argument(
        "--candidates",
        default="argmax_and_samples",
        choices=["argmax_and_samples", "samples"],
        help="--npd-candidates: the argmax sequence and S-1 samples (default), or S samples",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed set before every batch, as the benchmark (default: 1)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: 64)")
    parser.add_argument("--max-len-a", type=float, default=1.2, help="fairseq --max-len-a (default: 1.2)")
    parser.add_argument("--max-len-b", type=int, default=10, help="fairseq --max-len-b (default: 10)")
    parser.add_argument(
        "--post-process", default="sentencepiece", help="fairseq --post-process (default: sentencepiece)"
    )
    parser.add_argument(
        "--user-dir",
        default=os.path.dirname(os.path.abspath(nat_plugins.__file__)),
        help="fairseq --user-dir (default: the installed nat_plugins package)",
    )
    parser.add_argument(
        "--lenpens",
        type=lambda text: [float(a) for a in text.split(",")],
        default=[1.0],
        help="comma-separated exponents a of the length-normalised rules (default: 1, the generator's default)",
    )
    parser.add_argument("--max-batches", type=int, help="decode only the first N batches (a smoke test)")
    parser.add_argument("--no-teacher-greedy", action="store_true", help="skip decoding the teacher's greedy output")
    parser.add_argument("--compare-hyps", help="a hyp file (the benchmark's NPD row): count lines differing from ours")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    return parser.parse_args()


def main():
    args = parse_args()
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.INFO)
    torch.set_num_threads(1)
    started = datetime.datetime.now()
    S = args.samples
    with open(args.references, encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]

    # fairseq-generate's configuration of the benchmark's NPD row, then the recording copy of its generator
    harness = SimpleNamespace(
        **vars(args), fp16=False, generate_args=f"--max-len-a {args.max_len_a} --max-len-b {args.max_len_b}"
    )
    row_args = ["--beam", "1", "--fertility-decoding", "npd", "--npd-samples", str(S)]
    row_args += ["--npd-candidates", args.candidates, "--npd-teacher", args.teacher, "--npd-ranking", "sum"]
    spec = RowSpec(f"NAT, NPD S={S}", args.path, row_args)
    cfg = generation_cfg(harness, spec, use_cuda=False)
    row = load_row(cfg, spec)
    generation = row.generation
    generator = CandidateRecorder(generation.models, generation.task, cfg.generation)
    dataset = generation.dataset
    if len(dataset) != len(references):
        raise SystemExit(f"{args.references}: {len(references)} lines, split {args.gen_subset}: {len(dataset)}")
    teacher_greedy = None
    if not args.no_teacher_greedy:
        teacher_greedy = SequenceGenerator(
            [generator.teacher.model], generation.task.target_dictionary, beam_size=1,
            max_len_a=args.max_len_a, max_len_b=args.max_len_b,
        )  # fmt: skip

    # decode: every sentence's distinct candidates (text, tokens, teacher score) and its S slots
    order = dataset.ordered_indices().tolist()
    batches = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)][: args.max_batches]
    cands, slots, npd_out, greedy_out = {}, {}, {}, {}
    clock = time.perf_counter()
    for n, batch in enumerate(batches, 1):
        sample = dataset.collater([dataset[i] for i in batch])
        seed_everything(args.seed)
        hypos = generation.task.inference_step(generator, generation.models, sample)
        per_sentence = sentence_candidates(generator.record, len(hypos), S)
        for sid, nbest, (sent_cands, sent_slots) in zip(sample["id"].tolist(), hypos, per_sentence):
            cands[sid] = [(row.to_text(tokens), int(tokens.numel()), score, tokens) for tokens, score in sent_cands]
            slots[sid] = sent_slots
            npd_out[sid] = nbest[0]["tokens"][:-1]  # the generator's output without its EOS
        if teacher_greedy is not None:
            for sid, nbest in zip(sample["id"].tolist(), generation.task.inference_step(teacher_greedy, [], sample)):
                greedy_out[sid] = row.to_text(nbest[0]["tokens"])
        logger.info(
            "batch %d/%d: %d sentences, %.1f s",
            n,
            len(batches),
            sum(map(len, batches[:n])),
            time.perf_counter() - clock,
        )
    decode_seconds = time.perf_counter() - clock
    ids = sorted(cands)
    refs = [references[i] for i in ids]

    # the selection rules: per sentence an index into its candidates
    rng = np.random.default_rng(args.seed)
    choice = {}
    if args.candidates == "argmax_and_samples":
        choice["argmax"] = {i: 0 for i in ids}
    choice["teacher (eq. 8)"] = {i: first_best([c[2] for c in cands[i]]) for i in ids}
    for a in args.lenpens:
        choice[f"teacher / (len+1)^{a:g}"] = {i: first_best([c[2] / (c[1] + 1) ** a for c in cands[i]]) for i in ids}
    choice["random"] = {i: slots[i][rng.integers(S)] for i in ids}
    choice["oracle (sentence BLEU)"] = {
        i: first_best([sacrebleu.sentence_bleu(c[0], [references[i]]).score for c in cands[i]]) for i in ids
    }
    for i in ids:  # the teacher rule is the generator's own NPD output
        assert torch.equal(cands[i][choice["teacher (eq. 8)"][i]][3], npd_out[i]), f"sentence {i}: not the generator's"

    hyps = {rule: [cands[i][picked[i]][0] for i in ids] for rule, picked in choice.items()}
    if teacher_greedy is not None:
        hyps["teacher greedy (AR)"] = [greedy_out[i] for i in ids]
    results = {rule: bleu_of(h, refs) for rule, h in hyps.items()}
    for rule, picked in choice.items():
        for other in ("argmax", "teacher (eq. 8)"):  # how often the rule keeps the same candidate as these
            if other in choice:
                results[rule][f"same_as_{other}"] = statistics.fmean(picked[i] == choice[other][i] for i in ids)

    words = {i: [len(c[0].split()) for c in cands[i]] for i in ids}
    teacher = choice["teacher (eq. 8)"]
    moved = [i for i in ids if teacher[i] != 0]
    stats = {
        "sentences": len(ids),
        "reference_mean_words": statistics.fmean(len(r.split()) for r in refs),
        "candidates_mean_words": statistics.fmean(statistics.fmean(w) for w in words.values()),
        "mean_distinct_candidates": statistics.fmean(len(c) for c in cands.values()),
        "frac_2plus_distinct_fertilities": statistics.fmean(len(c) >= 2 for c in cands.values()),
        "frac_2plus_distinct_texts": statistics.fmean(len({c[0] for c in cands[i]}) >= 2 for i in ids),
        "mean_length_spread_words": statistics.fmean(max(w) - min(w) for w in words.values()),
        "mean_length_spread_tokens": statistics.fmean(
            max(c[1] for c in cs) - min(c[1] for c in cs) for cs in cands.values()
        ),
    }
    if args.candidates == "argmax_and_samples":
        stats["frac_teacher_picks_argmax"] = 1 - len(moved) / len(ids)
        stats["teacher_vs_argmax_when_different"] = {
            "sentences": len(moved),
            "shorter": sum(words[i][teacher[i]] < words[i][0] for i in moved),
            "same_length": sum(words[i][teacher[i]] == words[i][0] for i in moved),
            "longer": sum(words[i][teacher[i]] > words[i][0] for i in moved),
        }
    varied = [i for i in ids if len(set(words[i])) > 1]
    stats["frac_teacher_picks_shortest"] = statistics.fmean(words[i][teacher[i]] == min(words[i]) for i in varied)
    stats["frac_teacher_picks_longest"] = statistics.fmean(words[i][teacher[i]] == max(words[i]) for i in varied)
    stats["sentences_with_varied_lengths"] = len(varied)
    if args.compare_hyps:
        with open(args.compare_hyps, encoding="utf-8") as f:
            theirs = [line.rstrip("\n") for line in f]
        stats["lines_differing_from_compare_hyps"] = sum(a != theirs[i] for a, i in zip(hyps["teacher (eq. 8)"], ids))

    print(f"\nNPD selection rules, S={S} ({args.candidates}), seed {args.seed}, {args.gen_subset}: {len(ids)} "
          f"sentences, decoded in {decode_seconds:.0f} s, {started:%Y-%m-%d %H:%M}\n")  # fmt: skip
    print("| rule | BLEU | BP | sys/ref length | mean words | = argmax pick | = teacher pick |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rule, r in results.items():
        same = [f"{100 * r[key]:.1f}%" if key in r else "" for key in ("same_as_argmax", "same_as_teacher (eq. 8)")]
        print(
            f"| {rule} | {r['bleu']:.2f} | {r['bp']:.3f} | {r['length_ratio']:.3f} | {r['mean_words']:.2f} | "
            f"{same[0]} | {same[1]} |"
        )
    print(f"| reference | | | | {stats['reference_mean_words']:.2f} | | |\n")
    for key, value in stats.items():
        print(f"- {key}: {value:.4f}" if isinstance(value, float) else f"- {key}: {value}")
    if args.json:
        meta = {"date": started.isoformat(timespec="seconds"), "args": vars(args), "decode_seconds": decode_seconds}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rules": results, "stats": stats}, f, indent=1)


if __name__ == "__main__":
    main()
