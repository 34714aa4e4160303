"""The base every plugin decoder shares (nat_plugins/generators/base.py), on fixed tensors: fairseq's generation
options and their defaults, the option check, SequenceGenerator's length/pad/unk rules and score normalisation."""

import math
from argparse import Namespace

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary

from nat_plugins.generators.base import PluginGenerator

from .utils import TINY_TRANSFORMER, random_batch

NO_MODEL = torch.nn.Module()  # the options' tests need no layers


class Toy(PluginGenerator):
    name = "toy decoding"


@pytest.fixture(scope="module")
def task():
    dictionary = Dictionary()
    for i in range(4):
        dictionary.add_symbol(f"w{i}")
    return Namespace(target_dictionary=dictionary)


def test_options_and_their_defaults(task):
    toy = Toy([NO_MODEL], task, Namespace(max_len_a=1.5, max_len_b=3, lenpen=0.5, unnormalized=True))
    assert (toy.beam_size, toy.max_len_a, toy.max_len_b, toy.min_len) == (1, 1.5, 3, 1)
    assert (toy.len_penalty, toy.unk_penalty, toy.temperature, toy.normalize_scores) == (0.5, 0, 1.0, False)
    # max_len_a * source length + max_len_b, capped by the decoder's positions
    assert toy.max_lengths(torch.tensor([1, 4, 10]), cap=12).tolist() == [4, 9, 12]
    with pytest.raises(ValueError, match="--min-len 5 is larger than the maximum length 4"):
        Toy([NO_MODEL], task, Namespace(min_len=5, max_len_b=4)).check_min_len(torch.tensor([6, 4]))
    with pytest.raises(ValueError, match="toy decoding .*: pass --beam 1 \\(got 3\\)"):
        Toy([NO_MODEL], task, Namespace(beam=3)).require_greedy("is greedy")


@pytest.mark.parametrize(
    "options,message",
    [
        ({"sampling": True}, "--sampling True is not supported by toy decoding"),
        ({"prefix_size": 2}, "--prefix-size 2 is not supported"),
        ({"constraints": "ordered"}, "--constraints ordered is not supported"),
        ({"score_reference": True}, "--score-reference True is not supported"),
        ({"temperature": 0.0}, "--temperature must be > 0"),
    ],
)
def test_refused_options(task, options, message):
    with pytest.raises(ValueError, match=message):
        Toy([NO_MODEL], task, Namespace(**options))


def test_prefix_tokens_and_constraints_are_refused(task):
    """Given to ``generate`` rather than as options (the hub's ``inference_step_args``), they are refused too."""
    toy = Toy([NO_MODEL], task, Namespace())
    toy.refuse_search_inputs(None, None)
    with pytest.raises(ValueError, match="prefix_tokens .*--prefix-size.* are not supported by toy decoding"):
        toy.refuse_search_inputs(prefix_tokens=torch.tensor([[5]]))
    with pytest.raises(ValueError, match="constraints .*--constraints.* are not supported by toy decoding"):
        toy.refuse_search_inputs(constraints=torch.tensor([[1, 5, 0]]))


SEARCH_INPUTS = [
    ({"prefix_tokens": torch.tensor([[5]])}, "prefix_tokens .*--prefix-size.* are not supported by"),
    ({"constraints": torch.tensor([[1, 5, 0]])}, "constraints .*--constraints.* are not supported by"),
    ({"bos_token": 5}, "a bos_token .* is not supported by"),
]


def test_generate_refuses_search_inputs_before_decoding(task):
    toy = Toy([NO_MODEL], task, Namespace())
    for inputs, message in SEARCH_INPUTS:
        with pytest.raises(ValueError, match=f"{message} toy decoding: decode without it"):
            toy.generate([NO_MODEL], {}, **inputs)
    with pytest.raises(NotImplementedError):
        toy.generate([NO_MODEL], {}, prefix_tokens=None, constraints=None)


@pytest.mark.parametrize(
    "arch, beam, name",
    [
        (["sat_transformer", "--group-size", "2"], 1, "SAT group decoding"),
        (["sat_transformer", "--group-size", "2"], 2, "SAT group decoding"),  # fairseq's beam search inside
        (["recover_sat", "--num-segments", "2"], 1, "RecoverSAT segment decoding"),
        (["fertility_nat"], 1, "fertility_nat decoding"),
    ],
)
def test_plugin_generators_refuse_search_inputs_given_to_generate(toy_task, arch, beam, name):
    """Called directly (not through the task's inference_step), the SAT, RecoverSAT and NAT decoders refuse prefix
    tokens, constraints and another start symbol: they used to drop them without a word."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["unused-data", "--task", "translation_nat", "--arch"] + arch + TINY_TRANSFORMER[2:],
    )
    model = toy_task.build_model(args).eval()
    generator = toy_task.build_generator([model], Namespace(beam=beam, max_len_b=5))
    sample = random_batch(toy_task.source_dictionary, 2, seed=0)
    assert len(generator.generate([model], sample, prefix_tokens=None, constraints=None)) == 2
    for inputs, message in SEARCH_INPUTS:
        with pytest.raises(ValueError, match=f"{message} {name}"):
            generator.generate([model], sample, **inputs)


def test_one_model_only(task):
    with pytest.raises(ValueError, match="toy decoding decodes one model, got an ensemble of 2"):
        Toy([None, None], task, Namespace())


def test_sequence_generator_rules(task):
    dictionary = task.target_dictionary
    pad, unk, eos = dictionary.pad(), dictionary.unk(), dictionary.eos()
    toy = Toy([NO_MODEL], task, Namespace(min_len=2, unkpen=0.5))
    scores = torch.zeros(4, len(dictionary))
    scores[:, eos] = -1.0
    position = torch.tensor([0, 2, 3, 4])  # position 0: EOS too early; 3 and 4: at or past max_len 3
    toy.constrain(scores, position, max_len=3)
    assert (scores[:, pad] == -math.inf).all() and scores[1, unk] == -0.5
    assert scores[0, eos] == -math.inf and scores[1, eos] == -1.0
    for row in (2, 3):  # only EOS, with its own score
        assert scores[row, eos] == -1.0 and (scores[row].eq(-math.inf).sum() == len(dictionary) - 1)
    # a forced position keeps EOS even where EOS would be too early (RecoverSAT's later segments, max_len < min_len)
    early = torch.zeros(1, len(dictionary))
    toy.constrain(early, torch.tensor([0]), max_len=0)
    assert early[0, eos] == 0 and early[0].eq(-math.inf).sum() == len(dictionary) - 1


def test_hypothesis_format_and_normalisation(task):
    eos = task.target_dictionary.eos()
    tokens, positional = torch.tensor([5, 6, eos]), torch.tensor([-1.0, -2.0, -3.0])
    hypo = Toy([NO_MODEL], task, Namespace(lenpen=2)).hypothesis(tokens, positional, steps=2, extra=7)
    assert hypo["score"] == pytest.approx(-6.0 / 9) and hypo["steps"] == 2 and hypo["extra"] == 7
    assert hypo["attention"] is None and hypo["alignment"] is None and hypo["positional_scores"] is positional
    assert Toy([NO_MODEL], task, Namespace(unnormalized=True)).hypothesis(tokens, positional, 1)["score"] == -6.0
