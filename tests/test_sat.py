"""Semi-Autoregressive Transformer (Wang et al., 2018): relaxed mask, inputs shifted by K, K=1 == fairseq's
Transformer, group decoding invariants (incremental == full recomputation, batch-1 == batched, EOS inside a
group), tiny train -> generate -> interactive runs and a learning test on the synthetic task."""

import math
import os
from argparse import Namespace

import pytest
import sacrebleu
import torch
from fairseq import options, tasks, utils
from fairseq.data import data_utils
from fairseq.sequence_generator import SequenceGenerator
from fairseq.sequence_scorer import SequenceScorer

from nat_plugins.modules.grouped_decoder import relaxed_causal_mask
from nat_plugins.systems.sat.decoding import SATGenerator

from .utils import (
    SYNTHETIC_MODEL_SIZE,
    TINY_TRANSFORMER,
    USER_DIR,
    generate_lines,
    hypotheses,
    interactive_lines,
    random_batch,
    train_model,
)

TINY_SAT = ["--arch", "sat_transformer"] + TINY_TRANSFORMER[2:]
NUM_SENTENCES = 16


def build_sat(data_bin, task, group_size, extra=()):
    """A tiny SAT model built through the task, as fairseq-train builds it."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data_bin, "--task", "translation_nat", "--group-size", str(group_size)] + TINY_SAT + list(extra)
    )
    return task.build_model(args).eval()


def batch(task, indices):
    dataset = task.dataset("test")
    return dataset.collater([dataset[i] for i in indices])


def decode(model, task, sample, **gen_args):
    return SATGenerator([model], task, Namespace(**gen_args)).generate([model], sample)


def by_id(sample, hypos):
    return {sample_id: hyps for sample_id, hyps in zip(sample["id"].tolist(), hypos)}


def test_relaxed_mask_is_figure_4_of_the_paper():
    visible = relaxed_causal_mask(6, 2).eq(0).int()
    assert visible.tolist() == [
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
    ]
    causal = torch.triu(utils.fill_with_neg_inf(torch.zeros(5, 5)), 1)
    assert torch.equal(relaxed_causal_mask(5, 1), causal)
    with pytest.raises(ValueError, match="K must be >= 1"):
        relaxed_causal_mask(4, 0)


def test_decoder_inputs_are_targets_shifted_by_k(dummy_data_bin, teacher):
    _, task = teacher
    eos, pad = task.target_dictionary.eos(), task.target_dictionary.pad()
    # fairseq's prev_output_tokens for targets "a b c d EOS" and "e f EOS"
    prev = torch.tensor([[eos, 10, 11, 12, 13], [eos, 20, 21, pad, pad]])
    model = build_sat(dummy_data_bin, task, 2)
    assert model.decoder.group_inputs(prev).tolist() == [
        [eos, eos, 10, 11, 12, 13],  # y_{t-2}; length rounded up to whole groups
        [eos, eos, 20, 21, pad, pad],
    ]
    model.decoder.group_size = 3
    assert model.decoder.group_inputs(prev).tolist() == [[eos, eos, eos, 10, 11, 12], [eos, eos, eos, 20, 21, pad]]
    # the training forward is cut back to the target length
    sample = batch(task, range(4))
    logits, _ = model(**sample["net_input"])
    assert logits.shape[:2] == sample["target"].shape


def test_bad_options_are_refused(dummy_data_bin, teacher):
    model, task = teacher
    with pytest.raises(ValueError, match="--group-size must be >= 1"):
        build_sat(dummy_data_bin, task, 0)
    with pytest.raises(ValueError, match="--group-size 2000 is larger than the decoder's 1024 positions"):
        build_sat(dummy_data_bin, task, 2000)
    sat = build_sat(dummy_data_bin, task, 2)
    with pytest.raises(ValueError, match="--sampling"):
        SATGenerator([sat], task, Namespace(sampling=True))
    with pytest.raises(ValueError, match="--beam must be >= 1"):
        SATGenerator([sat], task, Namespace(beam=0))
    with pytest.raises(ValueError, match="ensemble"):
        SATGenerator([sat, sat], task, Namespace())
    # the generator of fairseq-generate; --score-reference: fairseq's scorer through the model's forward
    assert isinstance(task.build_generator([sat], Namespace(beam=1)), SATGenerator)
    assert isinstance(task.build_generator([sat], Namespace(score_reference=True)), SequenceScorer)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("max_len_b", [200, 6])
def test_k1_is_fairseqs_transformer(dummy_data_bin, teacher, tiny_teacher, beam, max_len_b):
    """Same weights, K=1: the same training forward and token-identical greedy/beam output (incl. max length)."""
    model, task = teacher
    sat = build_sat(dummy_data_bin, task, 1, ["--init-from-ar", tiny_teacher])
    sample = batch(task, range(NUM_SENTENCES))
    assert torch.equal(sat(**sample["net_input"])[0], model(**sample["net_input"])[0])

    reference = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=max_len_b)
    expected = reference.generate([model], sample)
    got = decode(sat, task, sample, beam=beam, max_len_b=max_len_b)
    for ref_hyps, hyps in zip(expected, got):
        assert [h["tokens"].tolist() for h in hyps] == [h["tokens"].tolist() for h in ref_hyps]
        for h, ref in zip(hyps, ref_hyps):
            assert h["score"].item() == pytest.approx(ref["score"].item(), abs=1e-4)
            assert torch.allclose(h["positional_scores"], ref["positional_scores"], atol=1e-4)
            assert h["steps"] >= len(h["tokens"])  # K=1: one decoder call per token (greedy: exactly)
            assert beam > 1 or h["steps"] == len(h["tokens"])


def random_ar_and_sat_k1(task, seed):
    """A random AR Transformer and an SAT with K = 1 and its weights, built through ``task`` (no data), whose EOS
    logit is 0 among random ones: greedy search never ends a sentence before the maximum length."""
    models = []
    for arch in (["--arch", "transformer"], ["--arch", "sat_transformer", "--group-size", "1"]):
        args = options.parse_args_and_arch(
            options.get_training_parser(), ["unused-data", "--task", "translation_nat"] + arch + TINY_SAT[2:]
        )
        torch.manual_seed(seed)
        models.append(task.build_model(args).eval())
    ar, sat = models
    with torch.no_grad():
        ar.decoder.output_projection.weight[task.target_dictionary.eos()] = 0
    sat.load_state_dict(ar.state_dict())
    return ar, sat


@pytest.mark.parametrize("beam", [1, 3])
def test_k1_is_fairseqs_search_where_the_batch_length_limit_binds(toy_task, beam):
    """``--max-len-a 1.2`` (the recipes' decoding, at batch 64) on sources of 3 to 9 tokens: fairseq limits every
    sentence of a batch to ``--max-len-a`` × the batch's padded source length + ``--max-len-b``, and so does SAT with
    K = 1, token for token (each sentence's own source length used to limit it: shorter outputs)."""
    ar, sat = random_ar_and_sat_k1(toy_task, seed=0)
    sample = random_batch(toy_task.target_dictionary, 12, seed=0)
    src_tokens, src_lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    length_options = dict(max_len_a=1.2, max_len_b=2)
    limit = int(1.2 * src_tokens.size(1) + 2)
    assert min(int(1.2 * n + 2) for n in src_lengths.tolist()) < limit  # the sentences' own limits differ
    expected = SequenceGenerator([ar], toy_task.target_dictionary, beam_size=beam, **length_options).generate(
        [ar], sample
    )
    got = decode(sat, toy_task, sample, beam=beam, **length_options)
    for ref_hyps, hyps in zip(expected, got):
        assert [h["tokens"].tolist() for h in hyps] == [h["tokens"].tolist() for h in ref_hyps]
        for h, ref in zip(hyps, ref_hyps):
            assert torch.allclose(h["positional_scores"], ref["positional_scores"], atol=1e-4)
            assert h["score"].item() == pytest.approx(ref["score"].item(), abs=1e-4)
    assert max(len(hyps[0]["tokens"]) for hyps in got) == limit + 1  # the limit binds (EOS included)
    if beam == 1:
        assert all(len(hyps[0]["tokens"]) == limit + 1 for hyps in got)


def check_incremental_equals_full(sat, task, group_size, beam):
    """Every hypothesis's positional scores are what the training-time forward gives it; greedy picks argmaxes."""
    pad, eos = task.target_dictionary.pad(), task.target_dictionary.eos()
    sample = batch(task, range(NUM_SENTENCES))
    max_len = 12
    hypos = decode(sat, task, sample, beam=beam, max_len_b=max_len)
    best = [hyps[0] for hyps in hypos]
    target = data_utils.collate_tokens([h["tokens"] for h in best], pad)
    prev = data_utils.collate_tokens([h["tokens"] for h in best], pad, eos, move_eos_to_beginning=True)
    lprobs = sat.get_normalized_probs(
        sat(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], prev), log_probs=True
    )
    full_scores = lprobs.gather(2, target.unsqueeze(2)).squeeze(2)
    for i, h in enumerate(best):
        length = len(h["tokens"])
        assert torch.allclose(full_scores[i, :length], h["positional_scores"], atol=1e-4)
        assert h["steps"] >= math.ceil(length / group_size)  # one call per group (greedy: exactly)
        assert beam > 1 or h["steps"] == math.ceil(length / group_size)
    if beam == 1:
        lprobs[:, :, pad] = -math.inf
        free = torch.arange(target.size(1)) < max_len  # positions not forced to EOS by the maximum length
        picked = target.ne(pad) & free.unsqueeze(0)
        assert torch.equal(lprobs.argmax(2)[picked], target[picked])


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("group_size", [2, 3])
def test_incremental_decoding_equals_full_recomputation(dummy_data_bin, teacher, tiny_teacher, group_size, beam):
    _, task = teacher
    sat = build_sat(dummy_data_bin, task, group_size, ["--init-from-ar", tiny_teacher])
    check_incremental_equals_full(sat, task, group_size, beam)


SLOT_OPTIONS = ["--group-slot-embedding", "--group-repeat-bias"]
SLOT_PARAMETERS = {"decoder.embed_group_slots.weight", "decoder.group_repeat_bias"}


def test_slot_options_start_as_the_papers_model(dummy_data_bin, teacher, tiny_teacher):
    """--group-slot-embedding / --group-repeat-bias (beyond the paper) add parameters only when on, all zero: from
    the same AR weights the model computes what the paper's does; a checkpoint's options written before they
    existed (absent from its args) build the paper's model, with the parameters of old checkpoints."""
    _, task = teacher
    sample = batch(task, range(NUM_SENTENCES))
    paper = build_sat(dummy_data_bin, task, 2, ["--init-from-ar", tiny_teacher])
    slots = build_sat(dummy_data_bin, task, 2, ["--init-from-ar", tiny_teacher] + SLOT_OPTIONS)
    assert set(slots.state_dict()) - set(paper.state_dict()) == SLOT_PARAMETERS
    assert not set(paper.state_dict()) & SLOT_PARAMETERS
    assert torch.allclose(slots(**sample["net_input"])[0], paper(**sample["net_input"])[0], atol=1e-5)

    args = options.parse_args_and_arch(
        options.get_training_parser(), [dummy_data_bin, "--task", "translation_nat", "--group-size", "2"] + TINY_SAT
    )
    del args.group_slot_embedding, args.group_repeat_bias  # as in a checkpoint written before the options
    assert set(task.build_model(args).state_dict()) == set(paper.state_dict())


@pytest.mark.parametrize("beam", [1, 3])
def test_incremental_decoding_equals_full_recomputation_with_slot_options(dummy_data_bin, teacher, tiny_teacher, beam):
    """The slot embedding and the repeat bias of slot k on the token of slot k-1 (non-zero here) are the same in group
    decoding's incremental calls (greedy: slot by slot; beam: each hypothesis's token) as in the training-time forward
    on the chosen tokens (K=3: two biased slots)."""
    _, task = teacher
    sat = build_sat(dummy_data_bin, task, 3, ["--init-from-ar", tiny_teacher] + SLOT_OPTIONS)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in sat.named_parameters():
            if name in SLOT_PARAMETERS:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    assert sat.decoder.group_repeat_bias.abs().min() > 0
    check_incremental_equals_full(sat, task, 3, beam)


@pytest.mark.parametrize("beam", [1, 3])
def test_batch_of_one_equals_batched(dummy_data_bin, teacher, tiny_teacher, beam):
    _, task = teacher
    sat = build_sat(dummy_data_bin, task, 3, ["--init-from-ar", tiny_teacher])
    # --max-len-a 0: the same maximum length in any batch (fairseq's rule scales --max-len-a by the batch's padded
    # source length)
    options = dict(beam=beam, max_len_a=0, max_len_b=7)
    sample = batch(task, range(NUM_SENTENCES))
    batched = by_id(sample, decode(sat, task, sample, **options))
    for i in range(NUM_SENTENCES):
        single = decode(sat, task, batch(task, [i]), **options)[0]
        assert [h["tokens"].tolist() for h in single] == [h["tokens"].tolist() for h in batched[i]]
        assert [h["steps"] for h in single] == [h["steps"] for h in batched[i]]
        for h, b in zip(single, batched[i]):
            assert torch.allclose(h["positional_scores"], b["positional_scores"], atol=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_eos_inside_a_group_ends_the_hypothesis(dummy_data_bin, teacher, tiny_teacher, monkeypatch, beam):
    """K=3 and a decoder that puts EOS at the middle position of its second call: every hypothesis is
    positions 0..3 plus EOS at position 4 (2 decoder calls); position 5 of that group is dropped."""
    _, task = teacher
    eos = task.target_dictionary.eos()
    sat = build_sat(dummy_data_bin, task, 3, ["--init-from-ar", tiny_teacher])
    output_layer, calls = sat.decoder.output_layer, []

    def eos_at_position_4(features):
        logits = output_layer(features)
        logits[:, :, eos] = -1e4
        if len(calls) == 1:
            logits[:, 1, eos] = 1e4
        calls.append(features.size(1))
        return logits

    monkeypatch.setattr(sat.decoder, "output_layer", eos_at_position_4)
    hypos = decode(sat, task, batch(task, range(NUM_SENTENCES)), beam=beam)
    assert calls == [3, 3]  # one decoder call per group of K=3 positions
    for hyps in hypos:
        assert len(hyps) == beam
        for h in hyps:
            assert len(h["tokens"]) == 5 and h["tokens"][4] == eos and eos not in h["tokens"][:4].tolist()
            assert h["steps"] == 2


@pytest.mark.parametrize("group_size", [1, 2, 3])
def test_train_generate_interactive(dummy_data_bin, dummy_raw, tiny_teacher, tmp_path, group_size):
    checkpoint = train_model(
        dummy_data_bin,
        str(tmp_path / "sat"),
        TINY_SAT
        + [
            "--task",
            "translation_nat",
            "--criterion",
            "label_smoothed_cross_entropy",
            "--label-smoothing",
            "0.1",
            "--group-size",
            str(group_size),
            "--init-from-ar",
            tiny_teacher,
        ],
        max_update=8,
    )
    for beam in (1, 2):
        lines = generate_lines(
            dummy_data_bin, checkpoint, ["--task", "translation_nat", "--beam", str(beam), "--print-step"]
        )
        hyps = hypotheses(lines)
        assert sorted(hyps) == list(range(40))
        steps = {int(line.split("\t")[0][2:]): int(line.split("\t")[1]) for line in lines if line.startswith("I-")}
        if beam == 1:  # one decoder call per group, up to the group holding EOS
            assert all(steps[i] == math.ceil((len(hyps[i].split()) + 1) / group_size) for i in hyps)

    with open(os.path.join(dummy_raw, "test.src")) as f:
        sources = [next(f).strip() for _ in range(3)]
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(sources) + "\n")
    inter = hypotheses(
        interactive_lines(dummy_data_bin, checkpoint, str(input_file), ["--task", "translation_nat", "--beam", "2"])
    )
    assert [inter[i] for i in range(3)] == [hyps[i] for i in range(3)]


# ----- learning test on the synthetic task (tests/utils.py: synthetic_translation) -------------------------------
SAT_LEARNING_UPDATES = 600
# the recipe of the learning test: from the teacher (every matching parameter, the default), on its distilled
# targets, small batches (the number of updates matters more than their size), lr 3e-3 decayed linearly to 0, with
# the slot options of the Multi30k recipe (examples/multi30k/sat.sh; beyond the paper, against the stutter)
SAT_LEARNING_ARGS = (
    ["--arch", "sat_transformer", "--group-size", "2"]
    + SYNTHETIC_MODEL_SIZE
    + SLOT_OPTIONS
    + [
        "--task",
        "translation_nat",
        "--use-distilled",
        "target",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--dropout",
        "0",
        "--max-tokens",
        "500",
        "--adam-betas",
        "(0.9, 0.98)",
        "--lr",
        "0.003",
        "--lr-scheduler",
        "polynomial_decay",
        "--warmup-updates",
        "10",
        "--total-num-update",
        str(SAT_LEARNING_UPDATES),
        "--disable-validation",
    ]
)


def repeated_group_rate(lines, group_size):
    """Fraction of the complete groups (output positions [iK, iK + K)) whose K tokens are all the same token:
    the SAT stutter ("t16 t16 t24 t24"); ~0.03 in the synthetic references (a source word repeated)."""
    groups = [
        words[i : i + group_size]
        for words in (line.split() for line in lines)
        for i in range(0, len(words) - group_size + 1, group_size)
    ]
    return sum(len(set(group)) == 1 for group in groups) / len(groups)


def test_repeated_group_rate_on_fixed_lines():
    assert repeated_group_rate(["a a b c d d e", "f f"], 2) == pytest.approx(3 / 4)  # the trailing "e" is no group
    assert repeated_group_rate(["a b b c"], 2) == 0.0  # a repeat across groups is no stuttering group
    assert repeated_group_rate(["a a a b b c"], 3) == pytest.approx(1 / 2)


def corpus_bleu(lines, references):
    return sacrebleu.corpus_bleu(lines, [references]).score


def untrained_sat_lines(data_bin, teacher, split="test"):
    """Greedy group decoding of ``split`` by a SAT K=2 just initialised from ``teacher`` (no training)."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            data_bin,
            "--user-dir",
            USER_DIR,
            "--task",
            "translation_nat",
            "--init-from-ar",
            teacher,
        ]
        + SAT_LEARNING_ARGS[:4]
        + SYNTHETIC_MODEL_SIZE,
    )
    task = tasks.setup_task(args)
    task.load_dataset(split)
    model = task.build_model(args).eval()
    dataset = task.dataset(split)
    lines = [None] * len(dataset)
    for start in range(0, len(dataset), 50):
        sample = dataset.collater([dataset[i] for i in range(start, min(start + 50, len(dataset)))])
        for sample_id, hyps in by_id(sample, decode(model, task, sample, beam=1)).items():
            lines[sample_id] = task.target_dictionary.string(hyps[0]["tokens"])
    return lines


@pytest.fixture(scope="module")
def learned_sat(synthetic_teacher, tmp_path_factory):
    """The learning tests' SAT K=2: initialised from the synthetic teacher, trained ``SAT_LEARNING_UPDATES`` on its
    distilled targets, decoded greedily on the test set. Returns ``{sat, references, teacher}``: sentence lists in
    test-set order (SAT and teacher outputs, references)."""
    teacher, data_bin = synthetic_teacher
    teacher_lines = generate_lines(data_bin, teacher, ["--task", "translation_nat", "--beam", "1"])
    references = {int(line[2:].split("\t", 1)[0]): line.split("\t", 1)[1] for line in teacher_lines if line[:2] == "T-"}
    checkpoint = train_model(
        data_bin,
        str(tmp_path_factory.mktemp("learned-sat")),
        SAT_LEARNING_ARGS + ["--init-from-ar", teacher],
        max_update=SAT_LEARNING_UPDATES,
    )
    sat = hypotheses(generate_lines(data_bin, checkpoint, ["--task", "translation_nat", "--beam", "1"]))
    ids, teacher_hypotheses = sorted(references), hypotheses(teacher_lines)
    return {
        name: [lines[i] for i in ids]
        for name, lines in (("sat", sat), ("references", references), ("teacher", teacher_hypotheses))
    }


def test_sat_k2_learns_from_the_teacher(synthetic_teacher, learned_sat):
    """SAT K=2 with the slot options, initialised from the synthetic teacher and trained 600 updates on its distilled
    targets.

    Measured (2-core CPU, shared with other jobs; ~12 s of training; seeds 1-6): teacher greedy 80.9 BLEU; SAT K=2
    greedy 84.0-88.6 BLEU (1.04-1.10 of the teacher; threshold 0.95), 0.019-0.036 of its 2-token groups are one
    token repeated (bound 0.3 here, against regressions; the stutter guard is the next test). The paper's model
    (no slot options): 77.7 and 74.1 BLEU, 0.19 and 0.22 repeated (seeds 1, 2). The untrained SAT (the copied AR
    decoder predicts the successor of its input; the slot options start at zero) repeats 0.94 of its groups."""
    teacher, data_bin = synthetic_teacher
    assert repeated_group_rate(untrained_sat_lines(data_bin, teacher), 2) > 0.8
    teacher_bleu = corpus_bleu(learned_sat["teacher"], learned_sat["references"])
    sat_bleu = corpus_bleu(learned_sat["sat"], learned_sat["references"])
    assert sat_bleu >= 0.95 * teacher_bleu, (sat_bleu, teacher_bleu)
    assert repeated_group_rate(learned_sat["sat"], 2) < 0.3, learned_sat["sat"][:5]


def test_sat_k2_stutters_at_most_twice_as_often_as_its_training_targets(synthetic_teacher, learned_sat):
    """Stutter guard: in the learning test's SAT K=2 output, position 2 of a group equals position 1 at most twice as
    often as in the (distilled) training targets it was trained on.

    Measured with --group-slot-embedding --group-repeat-bias (seeds 1-6): 0.019-0.036 against 0.026 in the targets
    (bound 0.053; on the validation sources 0.035-0.043, references 0.032). Without them (the paper's model) 0.19,
    0.16 after 1200 updates; the slot embedding alone 0.09-0.13 (docs/design-notes.md)."""
    _teacher, data_bin = synthetic_teacher
    with open(os.path.join(data_bin, "train.kd.tgt.txt")) as f:
        target_rate = repeated_group_rate(f.read().splitlines(), 2)
    sat_rate = repeated_group_rate(learned_sat["sat"], 2)
    assert sat_rate <= 2 * target_rate, (sat_rate, target_rate, learned_sat["sat"][:5])
