"""Speculative decoding (Xia et al. 2023): the drafter's attention pattern, the criterion's cut points and loss,
exact verification == the teacher's greedy decoding for every k and batch size whatever the drafter proposes, a
drafter that is always right emitting k+1 tokens per teacher call, relaxed verification, and a learning test on the
synthetic task."""

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary, data_utils

from nat_plugins.criterions.spec_drafter_loss import SpecDrafterLoss, draft_examples
from nat_plugins.models.spec_drafter import HIDDEN, draft_attention_mask
from nat_plugins.tasks.translation_nat import TranslationNATConfig, TranslationNATTask

from .utils import TINY_TRANSFORMER

MAX_LEN_B = 14  # random models rarely stop: keep their outputs short (max_len_a = 0, so batch-1 == batched limits)
TINY_SIZES = [a for a in TINY_TRANSFORMER[2:] if a != "--share-all-embeddings"]


@pytest.fixture(scope="module")
def toy_task():
    dictionary = Dictionary()
    for i in range(24):
        dictionary.add_symbol(f"w{i}")
    return TranslationNATTask(TranslationNATConfig(), dictionary, dictionary)


def build(task, arch_args, seed):
    args = options.parse_args_and_arch(
        options.get_training_parser(), ["unused-data", "--task", "translation_nat"] + list(arch_args)
    )
    torch.manual_seed(seed)
    return task.build_model(args).eval(), args


def drafter(task, draft_size, seed, extra=()):
    return build(task, ["--arch", "spec_drafter", "--draft-size", str(draft_size)] + TINY_SIZES + list(extra), seed)[0]


def random_batch(dictionary, size, seed):
    generator = torch.Generator().manual_seed(seed)
    sources = [
        torch.cat(
            [
                torch.randint(dictionary.nspecial, len(dictionary), (int(n),), generator=generator),
                torch.tensor([dictionary.eos()]),
            ]
        )
        for n in torch.randint(2, 9, (size,), generator=generator)
    ]
    src_tokens = data_utils.collate_tokens(sources, dictionary.pad(), left_pad=True)
    return {"net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor([len(s) for s in sources])}}


def sub_batch(sample, index):
    length = int(sample["net_input"]["src_lengths"][index])
    return {
        "net_input": {
            "src_tokens": sample["net_input"]["src_tokens"][index : index + 1, -length:],
            "src_lengths": sample["net_input"]["src_lengths"][index : index + 1],
        }
    }


# ----- model ----------------------------------------------------------------------------------------------------


def test_attention_mask_prefix_causal_queries_see_everything():
    mask = draft_attention_mask(3, 2, torch.zeros(1))
    visible = (mask == 0).int().tolist()
    assert visible == [
        [1, 0, 0, 0, 0],  # prefix: causal, never a query
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1],  # queries: the prefix and each other
        [1, 1, 1, 1, 1],
    ]
    assert set(mask.unique().tolist()) == {0.0, HIDDEN}


def test_drafter_reads_only_its_prefix(toy_task):
    """Padding after a prefix (a batch of prefixes of other lengths) changes nothing; every prefix token and
    every query position matters; the k slots come from one pass."""
    model = drafter(toy_task, 3, seed=0)
    sample = random_batch(toy_task.target_dictionary, 2, seed=0)
    src = sample["net_input"]
    prefixes = torch.tensor([[2, 5, 6, 1, 1], [2, 7, 8, 9, 10]])
    logits, _ = model(src["src_tokens"], src["src_lengths"], prefixes)
    assert logits.shape == (2, 3, len(toy_task.target_dictionary))
    alone, _ = model(**sub_batch(sample, 0)["net_input"], prefix_tokens=prefixes[:1, :3])
    torch.testing.assert_close(logits[:1], alone, rtol=1e-5, atol=1e-5)
    garbage = prefixes.clone()
    garbage[0, 3:] = 12  # past prefix length 3, hidden by prefix_lengths
    hidden, _ = model(src["src_tokens"], src["src_lengths"], garbage, prefix_lengths=torch.tensor([3, 5]))
    torch.testing.assert_close(hidden, logits, rtol=0, atol=0)
    changed = prefixes.clone()
    changed[1, 1] = 11
    other, _ = model(src["src_tokens"], src["src_lengths"], changed)
    assert torch.equal(other[0], logits[0]) and not torch.allclose(other[1], logits[1])
    # the same sentences cut twice (rows r·B + b): the encoder runs once, each row is drafted for its prefix
    twice, _ = model(src["src_tokens"], src["src_lengths"], torch.cat([prefixes, changed]))
    torch.testing.assert_close(twice, torch.cat([logits, other]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="--draft-size must be at least 1"):
        drafter(toy_task, 0, seed=0)


# ----- criterion -------------------------------------------------------------------------------------------------


def test_cut_points_give_prefixes_and_the_next_k_targets():
    pad, eos = 1, 2
    target = torch.tensor([[5, 6, 7, eos, pad], [8, eos, pad, pad, pad]])
    prev = torch.tensor([[eos, 5, 6, 7, pad], [eos, 8, pad, pad, pad]])
    seen = [set(), set()]
    torch.manual_seed(0)
    for _ in range(40):
        prefix, lengths, draft_target = draft_examples(target, prev, 3, 2, pad)
        assert prefix.size(0) == lengths.size(0) == draft_target.size(0) == 6
        for row in range(6):
            sentence, cut = row % 2, int(lengths[row]) - 1
            n = int(target[sentence].ne(pad).sum())
            assert 0 <= cut < n  # at least y_{c+1} (EOS at the latest) is a target
            assert prefix[row, : cut + 1].tolist() == prev[sentence, : cut + 1].tolist()
            assert prefix[row, cut + 1 :].eq(pad).all()
            expected = target[sentence, cut : cut + 2].tolist()
            assert draft_target[row].tolist() == expected + [pad] * (2 - len(expected))
            seen[sentence].add(cut)
    assert seen == [{0, 1, 2, 3}, {0, 1}]  # every cut point is drawn


def test_loss_is_the_cross_entropy_of_the_scored_slots(toy_task):
    dictionary = toy_task.target_dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    model = drafter(toy_task, 3, seed=1)
    sample = random_batch(dictionary, 3, seed=1)
    targets = [torch.tensor([5, 6, 7, 8, eos]), torch.tensor([9, eos]), torch.tensor([10, 11, eos])]
    sample["target"] = data_utils.collate_tokens(targets, pad)
    sample["net_input"]["prev_output_tokens"] = data_utils.collate_tokens(targets, pad, eos, move_eos_to_beginning=True)
    sample["ntokens"] = 10
    criterion = SpecDrafterLoss(toy_task, label_smoothing=0.0, cuts_per_sentence=2, sentence_avg=False)
    torch.manual_seed(3)
    loss, sample_size, log = criterion(model, sample)
    torch.manual_seed(3)
    prefix, lengths, draft_target = draft_examples(
        sample["target"], sample["net_input"]["prev_output_tokens"], 2, 3, pad
    )
    logits, _ = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], prefix, lengths)
    lprobs = torch.log_softmax(logits, dim=-1)
    scored = draft_target.ne(pad)
    nll = -lprobs.gather(-1, draft_target.unsqueeze(-1)).squeeze(-1)[scored].sum()
    assert sample_size == log["predicted"] == int(scored.sum())
    assert float(loss) == pytest.approx(float(nll), rel=1e-5)
    correct = lprobs.argmax(-1).eq(draft_target) & scored
    assert log["correct"] == int(correct.sum()) and log["cuts"] == 6
    assert log["leading_correct"] == int(correct.long().cumprod(dim=1).sum())
    with pytest.raises(ValueError, match="--cuts-per-sentence"):
        SpecDrafterLoss(toy_task, label_smoothing=0.0, cuts_per_sentence=0, sentence_avg=False)
