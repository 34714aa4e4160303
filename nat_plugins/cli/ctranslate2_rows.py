"""The AR teacher decoded by CTranslate2: the production baseline rows of the benchmark.

Production users decode fairseq Transformers with CTranslate2 (a C++ inference engine), typically ~3x faster than
``fairseq-generate`` on a CPU, so a plugin decoder that only beats fairseq's Python ``SequenceGenerator`` may
still lose to it. With ``nat-benchmark --ctranslate2`` the teacher is converted once
(``ctranslate2.converters.FairseqConverter``, into ``OUT_DIR/ctranslate2-teacher``) and decoded on the same
device, threads, precision, sentences and length limit as the other rows; the rows are the benchmark's
:class:`~.bench.rows.Row` s with the same BLEU, latency and throughput measurements (decoder calls are not
observable inside CTranslate2, so those stay empty).

Source subwords are the binarized test set's (EOS left to CTranslate2, which the converter configures to add it);
the length limit is fairseq's ``--max-len-a/--max-len-b`` from ``--generate-args`` (per batch: from its longest
source). Scores are length-normalised as fairseq's (``length_penalty`` 1).
"""

import argparse
import os
import shlex
import time

import torch

from .bench.measure import Batch1, length_limit, make_row
from .bench.rows import CT2_BEAM, BenchmarkError, ctranslate2_specs
from .decoding import progress

CONVERTED_DIR = "ctranslate2-teacher"


class CTranslate2Unavailable(RuntimeError):
    """ctranslate2 is not installed or cannot convert the teacher."""


def length_limits(generate_args):
    """fairseq's ``--max-len-a``/``--max-len-b`` (defaults 0 and 200) from a ``--generate-args`` string."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--max-len-a", type=float, default=0.0)
    parser.add_argument("--max-len-b", type=int, default=200)
    known, _ = parser.parse_known_args(shlex.split(generate_args or ""))
    return known.max_len_a, known.max_len_b


def convert_teacher(teacher, data_bin, out_dir, user_dir, source_lang=None, target_lang=None):
    """Convert the fairseq teacher checkpoint once (re-used when already there); returns the model directory."""
    try:
        import ctranslate2
    except ImportError as err:
        raise CTranslate2Unavailable(
            "--ctranslate2 needs the ctranslate2 package: `pip install ctranslate2` (run_scripts/setup_env.sh "
            "installs it)"
        ) from err
    model_dir = os.path.join(out_dir, CONVERTED_DIR)
    stamp = os.path.join(model_dir, "converted_from.txt")
    source = f"{os.path.abspath(teacher)} {os.path.getmtime(teacher)}"
    if os.path.exists(stamp) and open(stamp, encoding="utf-8").read() == source:
        return model_dir
    converter = ctranslate2.converters.FairseqConverter(
        teacher, data_bin, source_lang=source_lang, target_lang=target_lang, user_dir=user_dir
    )
    try:
        converter.convert(model_dir, force=True)
    except (ValueError, NotImplementedError) as err:
        raise CTranslate2Unavailable(f"CTranslate2 cannot convert the teacher {teacher!r}: {err}") from err
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(source)
    return model_dir


class CTranslate2Teacher:
    """Decodes the binarized split with the converted teacher and measures it like a benchmark row."""

    def __init__(self, model_dir, dataset, src_dict, tgt_dict, post_process, use_cuda, fp16, generate_args):
        import ctranslate2

        device = "cuda" if use_cuda else "cpu"
        compute_type = "float16" if fp16 else "float32"
        threads = 1 if use_cuda else torch.get_num_threads()
        self.translator = ctranslate2.Translator(
            model_dir, device=device, compute_type=compute_type, inter_threads=1, intra_threads=threads
        )
        self.tgt_dict = tgt_dict
        self.post_process = post_process
        self.max_len_a, self.max_len_b = length_limits(generate_args)
        special = {src_dict.eos(), src_dict.pad(), src_dict.bos()}
        self.sources = [[src_dict[t] for t in dataset.src[i].tolist() if t not in special] for i in range(len(dataset))]
        self.source_lengths = [len(dataset.src[i]) for i in range(len(dataset))]  # EOS included, as fairseq's

    def translate(self, indices, beam):
        """Translate the sentences ``indices`` in one batch; returns (texts, seconds)."""
        longest = max(self.source_lengths[i] for i in indices)
        max_length = max(1, int(self.max_len_a * longest + self.max_len_b))
        start = time.perf_counter()
        results = self.translator.translate_batch(
            [self.sources[i] for i in indices],
            beam_size=beam,
            max_decoding_length=max_length,
            length_penalty=1.0,
            return_scores=False,
        )
        seconds = time.perf_counter() - start
        texts = []
        for result in results:
            ids = torch.tensor([self.tgt_dict.index(t) for t in result.hypotheses[0]], dtype=torch.long)
            texts.append(self.tgt_dict.string(ids, self.post_process))
        return texts, seconds

    def measure(self, beam, num_latency, warmup, batch_size, desc):
        """Batch-1 latency over sentences ``warmup..num_latency-1``, then the throughput pass in length-sorted
        batches; returns (hypotheses in sentence order, seconds of the throughput pass, :class:`Batch1`)."""
        batch1 = Batch1([], [])
        for index in progress(range(num_latency), f"{desc}: batch 1"):
            _, seconds = self.translate([index], beam)
            if index >= warmup:
                batch1.ids.append(index)
                batch1.latency_ms.append(1000 * seconds)
        order = sorted(range(len(self.sources)), key=lambda i: self.source_lengths[i])
        hyps, total = [None] * len(order), 0.0
        for start in progress(range(0, len(order), batch_size), f"{desc}: throughput"):
            indices = order[start : start + batch_size]
            texts, seconds = self.translate(indices, beam)
            total += seconds
            for i, text in zip(indices, texts):
                hyps[i] = text
        return hyps, total, batch1


def ctranslate2_rows(args, task, dataset, references, num_latency, use_cuda):
    """The teacher's beam and greedy rows decoded by CTranslate2 on the split ``dataset`` of the teacher's ``task``."""
    try:
        model_dir = convert_teacher(
            args.teacher, args.data_bin, args.out_dir, args.user_dir, task.cfg.source_lang, task.cfg.target_lang
        )
    except CTranslate2Unavailable as err:
        raise BenchmarkError(str(err)) from err
    decoder = CTranslate2Teacher(
        model_dir,
        dataset,
        task.source_dictionary,
        task.target_dictionary,
        args.post_process,
        use_cuda,
        args.fp16,
        args.generate_args,
    )
    rows = []
    for spec in ctranslate2_specs(args.teacher, args.teacher_beam):
        beam = args.teacher_beam if spec.role == CT2_BEAM else 1
        hyps, seconds, batch1 = decoder.measure(beam, num_latency, args.warmup, args.batch_size, spec.name)
        rows.append(
            make_row(
                spec,
                hyps,
                references,
                seconds,
                batch1,
                "ctranslate2.Translator",
                length_limit(decoder.max_len_a, decoder.max_len_b),
            )
        )
    return rows
