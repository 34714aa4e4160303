"""Property-based tests (hypothesis) of every plugin generator on small random models and random source batches
(1..16 sentences of 1..50 tokens, EOS included, left-padded as fairseq batches them): no exception, every output
within its length limit and ending in EOS, no pad, EOS (fairseq's start symbol too) or DEL inside an output, a
sentence decoded alone gives its batched output (fp32; the first, middle and last sentences of each batch), and
``hypo["steps"]`` (+ ``drafter_steps``) equals the decoder calls the generator made (counted by hooks on the first
layer of every decoder stack, the teachers' included).
``<s>`` (``Dictionary.bos()``, never a decoder input in fairseq) is an ordinary symbol here, as in fairseq's
``SequenceGenerator``, whose rules the plugin decoders follow so that K = 1 and exact acceptance equal it token for
token. ``derandomize=True``: every run draws the same examples, so CI is reproducible; ``NAT_FUZZ_EXAMPLES=N``
draws N examples per decoding instead of 6."""

import functools
import math
import os
from argparse import Namespace

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary, data_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nat_plugins.bench.measure import DecoderPassCounter, auxiliary_models
from nat_plugins.systems.recover_sat.segments import DEL_SYMBOL
from nat_plugins.tasks.translation_nat import TranslationNATConfig, TranslationNATTask

from .utils import TINY_TRANSFORMER, with_task_options

VOCAB = 24
SEEDS = 3  # random models per system (built once each)
FUZZ = settings(
    max_examples=int(os.environ.get("NAT_FUZZ_EXAMPLES", 6)),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NO_SHARING = [a for a in TINY_TRANSFORMER[2:] if a != "--share-all-embeddings"]
SYSTEMS = {
    "teacher": ["--arch", "transformer"],
    "sat": ["--arch", "sat_transformer", "--group-size", "3"],
    "recover_sat": ["--arch", "recover_sat", "--num-segments", "3"],
    "blockwise": ["--arch", "blockwise_transformer", "--block-size", "3"],
    "fertility_nat": ["--arch", "fertility_nat", "--share-all-embeddings"],
    "nad_ad": ["--arch", "nad_ad_transformer"],
    "spec_drafter": ["--arch", "spec_drafter", "--draft-size", "3"],
}
# (system, beam, task options): every generator and decoding mode
DECODINGS = [
    ("sat", 1, {}),
    ("sat", 3, {}),
    ("recover_sat", 1, {}),
    ("blockwise", 1, {}),
    ("blockwise", 1, {"block_accept": "topk:3", "min_block_size": 2}),
    ("fertility_nat", 1, {}),
    ("fertility_nat", 1, {"fertility_decoding": "average"}),
    ("fertility_nat", 1, {"fertility_decoding": "npd", "npd_samples": 1, "npd_teacher": "TEACHER"}),
    ("nad_ad", 1, {}),
    ("nad_ad", 3, {}),
    ("spec_drafter", 1, {"spec_drafter_teacher": "TEACHER"}),
    ("spec_drafter", 1, {"spec_drafter_teacher": "TEACHER", "spec_drafter_verify": "relaxed"}),
]


def toy_task():
    dictionary = Dictionary()
    for i in range(VOCAB):
        dictionary.add_symbol(f"w{i}")
    return TranslationNATTask(TranslationNATConfig(), dictionary, dictionary)


@functools.lru_cache(maxsize=None)
def random_model(system, seed):
    """``(model args, task, model)``: a random tiny model (its own task: RecoverSAT adds DEL to the dictionary)
    whose greedy outputs vary in length: large positional embeddings and a random EOS direction, as in
    tests/test_blockwise.py."""
    task = toy_task()
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["unused-data", "--task", "translation_nat", "--decoder-learned-pos"] + NO_SHARING + SYSTEMS[system],
    )
    torch.manual_seed(seed)
    model = task.build_model(args).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("embed_positions.weight"):
                parameter.mul_(10)
        if hasattr(model.decoder, "output_projection"):
            model.decoder.output_projection.weight[task.target_dictionary.eos()] += torch.randn(32)
    return args, task, model


@functools.lru_cache(maxsize=None)
def teacher_checkpoint(directory):
    """A random AR teacher of the toy dictionary, saved as a fairseq checkpoint (``--npd-teacher``,
    ``--spec-drafter-teacher``)."""
    args, _task, model = random_model("teacher", 0)
    path = os.path.join(directory, "teacher.pt")
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {}}]
    state = {"args": args, "model": model.state_dict(), "optimizer_history": history, "extra_state": {"epoch": 0}}
    torch.save(state, path)
    return path


def batches():
    """A batch as fairseq collates it (left-padded sources, EOS last) and the source lengths, EOS included."""
    return st.lists(st.integers(1, 50), min_size=1, max_size=16).flatmap(
        lambda lengths: st.tuples(
            st.just(lengths), st.lists(st.integers(4, VOCAB + 3), min_size=sum(lengths), max_size=sum(lengths))
        )
    )


def collate(lengths, words, eos, pad):
    sources, start = [], 0
    for n in lengths:
        sources.append(torch.tensor(words[start : start + n - 1] + [eos]))
        start += n - 1
    src_tokens = data_utils.collate_tokens(sources, pad, left_pad=True)
    return {"net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor(lengths)}}


def single(sample, index):
    length = int(sample["net_input"]["src_lengths"][index])
    return {
        "net_input": {
            "src_tokens": sample["net_input"]["src_tokens"][index : index + 1, -length:],
            "src_lengths": sample["net_input"]["src_lengths"][index : index + 1],
        }
    }


def pass_counter(model, generator):
    """Counts the decoder passes ``hypo["steps"]`` reports: runs of any decoder layer stack of the model (NAD-AD's
    NAD included), however entered, plus NPD's teacher rescoring pass (the benchmark's counter)."""
    return DecoderPassCounter([model], auxiliary_models(generator, [model]))


@pytest.mark.parametrize("system, beam, task_options", DECODINGS, ids=lambda v: str(v))
@FUZZ
@given(seed=st.integers(0, SEEDS - 1), batch=batches(), max_len_b=st.integers(1, 40))
def test_generators_on_random_models_and_batches(tmp_path_factory, system, beam, task_options, seed, batch, max_len_b):
    _args, task, model = random_model(system, seed)
    task_options = {
        name: teacher_checkpoint(str(tmp_path_factory.getbasetemp())) if value == "TEACHER" else value
        for name, value in task_options.items()
    }
    generator = with_task_options(task, **task_options).build_generator(
        [model], Namespace(beam=beam, max_len_a=0, max_len_b=max_len_b)
    )
    dictionary = task.target_dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    forbidden = {pad, eos} | ({dictionary.index(DEL_SYMBOL)} if DEL_SYMBOL in dictionary else set())
    lengths, words = batch
    sample = collate(lengths, words, eos, pad)

    with pass_counter(model, generator) as counter:
        batched = generator.generate([model], sample)
    assert len(batched) == len(lengths)
    assert max(passes(hypos[0]) for hypos in batched) == counter.passes  # sentences leave the batch when done
    limit = max_len_b
    if system == "recover_sat":  # each segment has its own limit (recover_sat_decoding.py)
        limit = generator.num_segments * generator.segment_max_len(sample["net_input"]["src_tokens"].size(1))
    for hypos in batched:
        for hypo in hypos:
            tokens = hypo["tokens"].tolist()
            assert tokens[-1] == eos and not forbidden & set(tokens[:-1]), tokens
            assert len(tokens) - 1 <= limit
            assert math.isfinite(float(hypo["score"]))
    for index in sorted({0, len(lengths) // 2, len(lengths) - 1}):
        hypos = batched[index]
        with pass_counter(model, generator) as counter:
            alone = generator.generate([model], single(sample, index))[0]
        assert [h["tokens"].tolist() for h in alone] == [h["tokens"].tolist() for h in hypos]
        assert passes(alone[0]) == counter.passes
        limit_on = getattr(generator, "drafting_limit_on", None)  # a verify-accept loop's (None: drafts every step)
        if limit_on is None or limit_on(sample["net_input"]["src_tokens"].device) is None:
            assert passes(alone[0]) == passes(hypos[0])  # a sentence's calls do not depend on its batch


def passes(hypo):
    """Decoder passes a hypothesis reports: ``steps``, plus ``drafter_steps`` of speculative decoding (whose
    ``steps`` are the teacher's calls)."""
    return hypo["steps"] + hypo.get("drafter_steps", 0)
