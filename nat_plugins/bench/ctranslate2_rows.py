"""The AR teacher decoded by CTranslate2: the production baseline rows of the benchmark.

Production users decode fairseq Transformers with CTranslate2 (a C++ inference engine), typically ~3x faster than
``fairseq-generate`` on a CPU, so a plugin decoder that only beats fairseq's Python ``SequenceGenerator`` may
still lose to it. With ``nat-benchmark --ctranslate2`` the teacher is converted once
(``ctranslate2.converters.FairseqConverter``, into ``OUT_DIR/ctranslate2-teacher``) and decoded on the same
device, threads, sentences and length limit as the other rows, beam and greedy at every compute type of
:func:`compute_types` (the run's precision and the production settings: int8 on CPU), timed by the same protocol
(:mod:`.schedule`); the rows are the benchmark's :class:`~.rows.Row` s (decoder calls are not
observable inside CTranslate2, so those stay empty).

Source subwords are the binarized test set's (EOS left to CTranslate2, which the converter configures to add it);
the length limit is fairseq's ``--max-len-a/--max-len-b`` from ``--generate-args`` (per batch: from its longest
source). Scores are length-normalised as fairseq's (``length_penalty`` 1).
"""

import argparse
import os
import shlex
from typing import Dict, List

import torch

from .measure import Output, length_limit
from .rows import BenchmarkError

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


def compute_types(use_cuda: bool, fp16: bool) -> List[str]:
    """CTranslate2's compute types of the rows: the run's precision first, then the production settings (int8 on
    CPU; float16 and int8_float16 on a GPU)."""
    if not use_cuda:
        return ["float32", "int8"]
    return ["float16", "int8_float16"] if fp16 else ["float32", "float16", "int8_float16"]


class CTranslate2Runner:
    """One CTranslate2 row (a compute type and beam size) timed by :func:`.schedule.run_rounds` like the fairseq
    rows: source subwords in off the clock, ``translate_batch`` and the best hypotheses' ids (target dictionary)
    out on it, detokenization off it."""

    generator_name = "ctranslate2.Translator"
    npd_samples = None

    def __init__(self, spec, translator, sources, source_lengths, tgt_dict, post_process, max_len_a, max_len_b):
        self.spec, self.translator = spec, translator
        self.beam = int(spec.args[spec.args.index("--beam") + 1])
        self.sources, self.source_lengths = sources, source_lengths
        self.tgt_dict, self.post_process = tgt_dict, post_process
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.length_limit = length_limit(max_len_a, max_len_b)
        self.outputs: Dict[int, Output] = {}

    def inputs(self, indices):
        longest = max(self.source_lengths[i] for i in indices)
        return indices, [self.sources[i] for i in indices], max(1, int(self.max_len_a * longest + self.max_len_b))

    def decode(self, inputs):
        _, sources, max_length = inputs
        results = self.translator.translate_batch(
            sources, beam_size=self.beam, max_decoding_length=max_length, length_penalty=1.0, return_scores=False
        )
        return [
            torch.tensor([self.tgt_dict.index(t) for t in result.hypotheses[0]], dtype=torch.long) for result in results
        ]

    def record(self, inputs, outputs):
        for index, ids in zip(inputs[0], outputs):
            self.outputs[index] = Output(self.tgt_dict.string(ids, self.post_process), len(ids) + 1)


def ctranslate2_runners(args, specs, task, dataset, use_cuda, threads) -> List[CTranslate2Runner]:
    """The CTranslate2 rows ``specs`` (:func:`.rows.ctranslate2_specs`) on the split ``dataset`` of the teacher's
    ``task``: one translator per compute type, ``inter_threads=1`` and ``intra_threads=threads`` (CPU)."""
    import ctranslate2

    try:
        model_dir = convert_teacher(
            args.teacher, args.data_bin, args.out_dir, args.user_dir, task.cfg.source_lang, task.cfg.target_lang
        )
    except CTranslate2Unavailable as err:
        raise BenchmarkError(str(err)) from err
    device = "cuda" if use_cuda else "cpu"
    src_dict = task.source_dictionary
    special = {src_dict.eos(), src_dict.pad(), src_dict.bos()}
    sources = [[src_dict[t] for t in dataset.src[i].tolist() if t not in special] for i in range(len(dataset))]
    source_lengths = [len(dataset.src[i]) for i in range(len(dataset))]  # EOS included, as fairseq's
    max_len_a, max_len_b = length_limits(args.generate_args)
    translators = {}
    runners = []
    for spec in specs:
        compute_type = spec.args[spec.args.index("--compute-type") + 1]
        if compute_type not in translators:
            if compute_type not in ctranslate2.get_supported_compute_types(device):
                raise BenchmarkError(f"--ctranslate2: this {device} has no CTranslate2 compute type {compute_type!r}")
            translators[compute_type] = ctranslate2.Translator(
                model_dir,
                device=device,
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=1 if use_cuda else threads,
            )
        runner = CTranslate2Runner(
            spec,
            translators[compute_type],
            sources,
            source_lengths,
            task.target_dictionary,
            args.post_process,
            max_len_a,
            max_len_b,
        )
        runners.append(runner)
    return runners
