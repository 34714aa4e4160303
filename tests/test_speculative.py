"""Speculative decoding (Xia et al. 2023): the drafter's attention patterns, every cut's drafts in one training
pass, the criterion's targets and loss,
exact verification == the teacher's greedy decoding for every k and batch size whatever the drafter proposes, a
drafter that is always right emitting k+1 tokens per teacher call, relaxed verification, and a learning test on the
synthetic task."""

import copy
import logging
import math
import time
from argparse import Namespace

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary, data_utils
from fairseq.sequence_generator import SequenceGenerator

from nat_plugins.bench.measure import DraftingTimer
from nat_plugins.engine.block_call import IncrementalCache
from nat_plugins.engine.static_cache import StaticCache
from nat_plugins.systems.spec_drafter.decoding import SpecDrafterGenerator
from nat_plugins.systems.spec_drafter.loss import SpecDrafterLoss, every_cut_targets
from nat_plugins.systems.spec_drafter.masks import HIDDEN, draft_attention_mask, every_cut_attention_mask
from nat_plugins.systems.spec_drafter.model import states_before

from .test_blockwise import (
    LENGTH_AND_SCORE_OPTIONS,
    assert_same_hypotheses,
    check_options_matter,
    fairseq_greedy,
    next_tokens,
    record_accepted,
)
from .utils import (
    DRAFT_EVERY_STEP,
    SYNTHETIC_MODEL_SIZE,
    TINY_TRANSFORMER,
    RiggedFirstBlockMixin,
    assert_best_checkpoint_is_the_best_validation,
    generate_lines,
    hypotheses,
    log_file,
    random_batch,
    sub_batch,
    train_model,
    validations,
    with_task_options,
)

MAX_LEN_B = 14  # random models rarely stop: keep their outputs short (max_len_a = 0, so batch-1 == batched limits)
TINY_SIZES = [a for a in TINY_TRANSFORMER[2:] if a != "--share-all-embeddings"]


def build(task, arch_args, seed):
    args = options.parse_args_and_arch(
        options.get_training_parser(), ["unused-data", "--task", "translation_nat"] + list(arch_args)
    )
    torch.manual_seed(seed)
    return task.build_model(args).eval(), args


def save_checkpoint(model, args, path):
    """``model`` (built from ``args``) as a fairseq checkpoint at ``path``."""
    history = [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}, "num_updates": 0}]
    torch.save({"args": args, "model": model.state_dict(), "optimizer_history": history, "extra_state": {}}, path)


def random_teacher(task, seed, path, data=None, eos_boost=0.5, unk_boost=0.0):
    """A random 2-layer AR Transformer saved as a checkpoint at ``path``, whose greedy outputs vary in length and
    content (large learned positional embeddings, a random EOS direction of scale ``eos_boost``, as
    tests/test_blockwise.py, and one of scale ``unk_boost`` for unk); ``data``: the data directory its checkpoint names
    (target language ``tgt``)."""
    teacher, args = build(
        task, ["--arch", "transformer", "--decoder-layers", "2", "--decoder-learned-pos"] + TINY_SIZES, seed
    )
    dictionary = task.target_dictionary
    with torch.no_grad():
        teacher.decoder.embed_positions.weight.mul_(10)
        teacher.decoder.output_projection.weight[dictionary.eos()] += eos_boost * torch.randn(32)
        teacher.decoder.output_projection.weight[dictionary.unk()] += unk_boost * torch.randn(32)
    if data is not None:
        args.data, args.source_lang, args.target_lang = data, "src", "tgt"
    save_checkpoint(teacher, args, path)
    return teacher


def drafter(task, draft_size, seed, extra=()):
    return build(task, ["--arch", "spec_drafter", "--draft-size", str(draft_size)] + TINY_SIZES + list(extra), seed)[0]


def speculative(model, task, teacher_path, generator_class=SpecDrafterGenerator, **options):
    """The generator, drafting at every step unless ``max_drafting_sentences`` is given (the CPU default takes
    greedy steps while more than one sentence decodes)."""
    options.setdefault("max_drafting_sentences", math.inf)
    return generator_class(
        [model], with_task_options(task, spec_drafter_teacher=teacher_path, **options), Namespace(max_len_b=MAX_LEN_B)
    )


def greedy(teacher, task, sample):
    return SequenceGenerator([teacher], task.target_dictionary, beam_size=1, max_len_b=MAX_LEN_B).generate(
        [teacher], sample
    )


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


def test_every_cut_mask_gives_each_cut_its_prefix_and_its_own_queries():
    visible = (every_cut_attention_mask(3, 2, torch.zeros(1)) == 0).int().tolist()
    assert visible == [
        [1, 0, 0, 0, 0, 0, 0, 0, 0],  # prefix: causal, never a query
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 1, 0, 0, 0, 0],  # cut 0's queries: y_0 and each other
        [1, 0, 0, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 1, 0, 0],  # cut 1: y_0 y_1
        [1, 1, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 1, 1],  # cut 2: the whole prefix
        [1, 1, 1, 0, 0, 0, 0, 1, 1],
    ]


def drafts(model, sample, prefixes, **kwargs):
    encoder_out = model.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
    return model.decoder(prefixes, encoder_out=encoder_out, **kwargs)[0]


def test_drafter_reads_only_its_prefix(toy_task):
    """Padding after a prefix (a batch of prefixes of other lengths) changes nothing; every prefix token and
    every query position matters; the k slots come from one pass."""
    model = drafter(toy_task, 3, seed=0)
    sample = random_batch(toy_task.target_dictionary, 2, seed=0)
    prefixes = torch.tensor([[2, 5, 6, 1, 1], [2, 7, 8, 9, 10]])
    logits = drafts(model, sample, prefixes)
    assert logits.shape == (2, 3, len(toy_task.target_dictionary))
    alone = drafts(model, sub_batch(sample, 0), prefixes[:1, :3])
    torch.testing.assert_close(logits[:1], alone, rtol=1e-5, atol=1e-5)
    garbage = prefixes.clone()
    garbage[0, 3:] = 12  # past prefix length 3, hidden by prefix_lengths
    hidden = drafts(model, sample, garbage, prefix_lengths=torch.tensor([3, 5]))
    torch.testing.assert_close(hidden, logits, rtol=0, atol=0)
    changed = prefixes.clone()
    changed[1, 1] = 11
    other = drafts(model, sample, changed)
    assert torch.equal(other[0], logits[0]) and not torch.allclose(other[1], logits[1])
    with pytest.raises(ValueError, match="--draft-size must be at least 1"):
        drafter(toy_task, 0, seed=0)


def test_the_training_pass_drafts_after_every_cut_what_decoding_drafts(toy_task):
    """The model's forward (training) gives, for every cut c of each sentence, the drafts of the decoding forward
    on the prefix y_0..y_c alone (the cuts past a sentence's end are never scored)."""
    model = drafter(toy_task, 3, seed=2)
    sample = random_batch(toy_task.target_dictionary, 2, seed=2)
    prev = torch.tensor([[2, 5, 6, 1, 1], [2, 7, 8, 9, 10]])
    logits, _ = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], prev)
    assert logits.shape == (2, 5 * 3, len(toy_task.target_dictionary))
    for row, length in enumerate([3, 5]):
        for c in range(length):
            cut = drafts(model, sub_batch(sample, row), prev[row : row + 1, : c + 1])
            torch.testing.assert_close(logits[row : row + 1, 3 * c : 3 * c + 3], cut, rtol=1e-5, atol=1e-5)
    scored = torch.zeros(2, 15, dtype=torch.bool)
    scored[0, :7] = scored[1, 4:] = True
    packed, _ = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], prev, logits_at=scored)
    torch.testing.assert_close(packed, logits[scored], rtol=1e-5, atol=1e-5)


# ----- criterion -------------------------------------------------------------------------------------------------


def test_every_cut_targets_are_the_next_k_tokens():
    pad, eos = 1, 2
    target = torch.tensor([[5, 6, 7, eos, pad], [8, eos, pad, pad, pad]])
    draft_target = every_cut_targets(target, 2, pad).view(2, 5, 2).tolist()
    assert draft_target[0] == [[5, 6], [6, 7], [7, eos], [eos, pad], [pad, pad]]
    assert draft_target[1] == [[8, eos], [eos, pad], [pad, pad], [pad, pad], [pad, pad]]


def test_loss_is_the_cross_entropy_of_the_scored_slots(toy_task):
    dictionary = toy_task.target_dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    model = drafter(toy_task, 3, seed=1)
    sample = random_batch(dictionary, 3, seed=1)
    targets = [torch.tensor([5, 6, 7, 8, eos]), torch.tensor([9, eos]), torch.tensor([10, 11, eos])]
    sample["target"] = data_utils.collate_tokens(targets, pad)
    sample["net_input"]["prev_output_tokens"] = data_utils.collate_tokens(targets, pad, eos, move_eos_to_beginning=True)
    sample["ntokens"] = 10
    criterion = SpecDrafterLoss(toy_task, label_smoothing=0.0, sentence_avg=False)
    loss, sample_size, log = criterion(model, sample)
    draft_target = every_cut_targets(sample["target"], 3, pad)
    logits, _ = model(**sample["net_input"])
    lprobs = torch.log_softmax(logits, dim=-1)
    scored = draft_target.ne(pad)
    assert int(scored.sum()) == (3 + 3 + 3 + 2 + 1) + (2 + 1) + (3 + 2 + 1)
    nll = -lprobs.gather(-1, draft_target.unsqueeze(-1)).squeeze(-1)[scored].sum()
    assert sample_size == log["predicted"] == int(scored.sum())
    assert float(loss) == pytest.approx(float(nll), rel=1e-5)
    correct = lprobs.argmax(-1).eq(draft_target) & scored
    assert log["correct"] == int(correct.sum()) and log["cuts"] == 10
    assert log["leading_correct"] == int(correct.view(3, 5, 3).long().cumprod(dim=2).sum())


# ----- speculative decoding ----------------------------------------------------------------------------------------


class ReferenceDrafter(SpecDrafterGenerator):
    """Drafts the teacher's greedy output (``reference``: B x L, y_1.. then EOS), each token replaced by a random one
    with probability ``noise``; follows the sentences through the batch's reorders."""

    reference, noise = None, 0.0

    def start(self, sample, encoder_out):
        self.rows = torch.arange(sample["net_input"]["src_tokens"].size(0))
        return super().start(sample, encoder_out)

    def reorder(self, keep):
        super().reorder(keep)
        self.rows = self.rows[keep]

    def propose(self, first, features, tokens, last, max_len):
        k = self.call_width - 1
        index = (last + 1).unsqueeze(1) + torch.arange(k)  # y_{j+2..j+k+1} sits at column j+1.. of the reference
        drafts = self.reference[self.rows].gather(1, index.clamp(max=self.reference.size(1) - 1))
        noisy = torch.rand(drafts.shape) < self.noise
        return torch.where(noisy, torch.randint(self.tgt_dict.nspecial, len(self.tgt_dict), drafts.shape), drafts)


class CheckedDrafter(SpecDrafterGenerator):
    """Checks every draft of the cached drafter against the drafter reading the whole prefix without a cache (a
    ``--read-teacher-states`` drafter with the teacher's states computed by fairseq's decoder on that prefix,
    teacher-forced)."""

    checked = 0

    def start(self, sample, encoder_out):
        self.sample_rows = dict(sample["net_input"])
        return super().start(sample, encoder_out)

    def reorder(self, keep):
        super().reorder(keep)
        self.sample_rows = {name: value[keep] for name, value in self.sample_rows.items()}

    def propose(self, first, features, tokens, last, max_len):
        drafts = super().propose(first, features, tokens, last, max_len)
        prefix_lengths = last + 2
        states = None
        if self.reads_teacher_states:
            teacher = self.teacher.model
            encoder_out = teacher.encoder(self.sample_rows["src_tokens"], src_lengths=self.sample_rows["src_lengths"])
            prefix = tokens.masked_fill(torch.arange(tokens.size(1)) >= prefix_lengths.unsqueeze(1), self.pad)
            states = states_before(teacher.decoder(prefix, encoder_out=encoder_out, features_only=True)[0])
        logits, _ = self.model.decoder(
            tokens, encoder_out=self.drafter.encoder_out, prefix_lengths=prefix_lengths, teacher_states=states
        )
        logits[..., self.pad] = -math.inf
        # the drafts are the argmax of the uncached logits (up to floating-point ties)
        torch.testing.assert_close(logits.gather(-1, drafts.unsqueeze(-1)).squeeze(-1), logits.amax(-1))
        self.checked += drafts.size(0)
        return drafts


@pytest.mark.parametrize("cache", ["static", "fairseq"])
def test_the_cached_drafter_drafts_what_the_whole_prefix_gives(toy_task, tmp_path, cache):
    """The drafter's cache gives the drafts of a forward over the whole prefix: the static step's buffers (new prefix
    tokens at their positions, the queries after them, overwritten by the next call) and, for decoders the static
    step does not run, fairseq's (new prefix tokens and queries appended, the queries rolled back); batch 8
    (sentences leave as they end) and each sentence alone."""
    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 0, path)
    sample = random_batch(toy_task.target_dictionary, 8, 0)
    model = drafter(toy_task, 3, 4)
    generator = speculative(model, toy_task, path, CheckedDrafter)
    made = []  # the drafter caches the batches made
    new_cache = generator.new_drafter_cache
    if cache == "fairseq":
        new_cache = lambda max_len: IncrementalCache(generator.drafter_decoder)  # noqa: E731
    generator.new_drafter_cache = lambda max_len: made.append(new_cache(max_len)) or made[-1]
    generator.generate([model], sample)
    assert len(made) == 1 and isinstance(made[0], StaticCache if cache == "static" else IncrementalCache)
    for i in range(8):
        generator.generate([model], sub_batch(sample, i))
    assert generator.checked > 16


@pytest.mark.parametrize("cache", ["static", "fairseq"])
def test_a_drafter_reading_the_teachers_states_gets_the_states_before_each_prefix_token(toy_task, tmp_path, cache):
    """``--read-teacher-states``: the states the loop keeps from the teacher's calls (the first after BOS, each
    verified block's, rejected drafts' overwritten later) are, for every prefix token, the teacher's output at the
    position before it, as fairseq's decoder computes them on the prefix: the drafts equal the forward over the whole
    prefix with those states (batch 8 and each sentence alone, both caches), and the output is the teacher's greedy
    output. The states matter: the same drafter reading zeros drafts otherwise."""
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 1, path)
    sample = random_batch(toy_task.target_dictionary, 8, 1)
    reference = greedy(teacher, toy_task, sample)
    model = drafter(toy_task, 3, 4, ["--read-teacher-states"])
    with torch.no_grad():
        model.decoder.state_projection.weight.normal_(std=0.5)  # trained: not the zeros it starts from
    generator = speculative(model, toy_task, path, CheckedDrafter)
    if cache == "fairseq":
        generator.new_drafter_cache = lambda max_len: IncrementalCache(generator.drafter_decoder)
    hypos = generator.generate([model], sample)
    hypos += [generator.generate([model], sub_batch(sample, i))[0] for i in range(8)]
    for i, (hypo,) in enumerate(hypos):
        assert hypo["tokens"].tolist() == reference[i % 8][0]["tokens"].tolist()
    assert generator.checked > 16
    prefix = torch.tensor([[2, 5, 6, 7]])
    encoder_out = model.encoder(**sub_batch(sample, 0)["net_input"])
    states = torch.randn(1, 4, 32)
    with_states = model.decoder(prefix, encoder_out=encoder_out, teacher_states=states)[0]
    with_zeros = model.decoder(prefix, encoder_out=encoder_out, teacher_states=torch.zeros_like(states))[0]
    assert not torch.allclose(with_states, with_zeros)
    with pytest.raises(ValueError, match="reads the teacher's decoder states"):
        model.decoder(prefix, encoder_out=encoder_out)


def test_the_loss_of_a_drafter_reading_the_teachers_states(toy_task, tmp_path):
    """The criterion feeds the drafter the teacher's (``--spec-drafter-teacher``) states before each target token
    (zero before BOS), teacher-forced on the target; without that option it says which to pass."""
    dictionary = toy_task.target_dictionary
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 0, path)
    model = drafter(toy_task, 2, 1, ["--read-teacher-states"])
    with torch.no_grad():
        model.decoder.state_projection.weight.normal_(std=0.5)
    sample = random_batch(dictionary, 2, seed=3)
    targets = [torch.tensor([5, 6, 7, dictionary.eos()]), torch.tensor([9, dictionary.eos()])]
    sample["target"] = data_utils.collate_tokens(targets, dictionary.pad())
    sample["net_input"]["prev_output_tokens"] = data_utils.collate_tokens(
        targets, dictionary.pad(), dictionary.eos(), move_eos_to_beginning=True
    )
    sample["ntokens"] = 6
    with pytest.raises(ValueError, match="--spec-drafter-teacher TEACHER_CKPT"):
        SpecDrafterLoss(toy_task, label_smoothing=0.0, sentence_avg=False)(model, sample)
    task = with_task_options(toy_task, spec_drafter_teacher=path)
    loss, _, _ = SpecDrafterLoss(task, label_smoothing=0.0, sentence_avg=False)(model, sample)
    net_input = sample["net_input"]
    encoder_out = teacher.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    features = teacher.decoder(net_input["prev_output_tokens"], encoder_out=encoder_out, features_only=True)[0]
    states = states_before(features)
    assert torch.equal(states[:, 0], torch.zeros_like(states[:, 0]))
    assert torch.equal(states[:, 1:], features[:, :-1])
    logits, _ = model(**net_input, teacher_states=states)
    draft_target = every_cut_targets(sample["target"], 2, dictionary.pad())
    scored = draft_target.ne(dictionary.pad())
    nll = -torch.log_softmax(logits, -1).gather(-1, draft_target.unsqueeze(-1)).squeeze(-1)[scored].sum()
    assert float(loss) == pytest.approx(float(nll), rel=1e-5)


@pytest.mark.parametrize("limit", [0, 20, None])
def test_a_batch_of_64_takes_greedy_teacher_steps_until_few_sentences_are_left(toy_task, tmp_path, limit):
    """``--max-drafting-sentences``: batch 64, plain greedy teacher steps while more than ``limit`` sentences decode
    (None: the CPU default), then drafts: the teacher's greedy output (SequenceGenerator, batch 64) with its scores;
    the cached drafter, which first reads every token the greedy steps emitted, drafts what the whole prefix gives;
    drafter calls = the teacher calls that verified drafts (this teacher's outputs: 2 to 15 tokens, 18 sentences
    longer than 10)."""
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 2, path)
    sample = random_batch(toy_task.target_dictionary, 64, 2)
    reference = greedy(teacher, toy_task, sample)
    model = drafter(toy_task, 3, 4)
    generator = speculative(model, toy_task, path, CheckedDrafter, max_drafting_sentences=limit)
    hypos = [h[0] for h in generator.generate([model], sample)]
    for hypo, (expected, *_) in zip(hypos, reference):
        assert hypo["tokens"].tolist() == expected["tokens"].tolist()
        torch.testing.assert_close(hypo["positional_scores"], expected["positional_scores"], rtol=1e-4, atol=1e-4)
    drafting = sum(hypo["drafter_steps"] for hypo in hypos)
    assert drafting == generator.checked  # one drafter call per sentence and drafting step
    if limit == 0:
        assert drafting == 0 and all(hypo["steps"] == len(hypo["tokens"]) for hypo in hypos)
    elif limit == 20:
        assert 0 < drafting < sum(hypo["steps"] for hypo in hypos)


class SlowDrafter(SpecDrafterGenerator):
    """Every drafter call takes at least 20 ms more."""

    def propose(self, *args, **kwargs):
        time.sleep(0.02)
        return super().propose(*args, **kwargs)


def test_the_benchmark_times_the_drafting_calls_from_outside_the_loop(toy_task, tmp_path):
    """The benchmark splits a batch-1 sentence's time into drafting and verifying with its own timer around the
    generator's ``propose`` (:class:`~nat_plugins.bench.measure.DraftingTimer`; the loop measures nothing): the host
    time of the sentence's drafter calls (20 ms each here, at least), none for greedy steps only; over a batch, that of
    the batch's drafter calls (as many as the sentence that ends last took part in). Leaving the timer restores the
    generator's own ``propose``."""
    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 2, path)
    model = drafter(toy_task, 3, 4)
    sample = random_batch(toy_task.target_dictionary, 8, 2)
    for limit in (None, 0):
        generator = speculative(model, toy_task, path, SlowDrafter, max_drafting_sentences=limit)
        with DraftingTimer(generator) as timer:
            for i in range(3):
                timer.reset()
                (hypo,) = generator.generate([model], sub_batch(sample, i))[0]
                calls = hypo["drafter_steps"]
                assert (calls > 0) == (limit is None) and "drafting_seconds" not in hypo
                assert 0.02 * calls <= timer.seconds < 0.02 * calls + 0.5
            timer.reset()
            calls = max(h[0]["drafter_steps"] for h in generator.generate([model], sample))
            assert 0.02 * calls <= timer.seconds < 0.02 * calls + 0.5
        assert "propose" not in vars(generator)


def test_a_drafter_with_the_teachers_encoder_shares_it_at_decoding(toy_task, tmp_path):
    """``--freeze-encoder``: only the decoder layers and the mask embedding train, and decoding runs the teacher's
    encoder for both models and reads the teacher's vocabulary matrices; the drafts (hence the teacher calls) are
    those of a copy of the drafter that keeps its own encoder and matrices."""
    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 0, path)
    sample = random_batch(toy_task.target_dictionary, 8, 0)
    model = drafter(toy_task, 3, 5, ["--decoder-learned-pos", "--init-from-ar", path, "--freeze-encoder"])
    assert not any(parameter.requires_grad for parameter in model.encoder.parameters())
    assert all(parameter.requires_grad for parameter in model.decoder.layers.parameters())
    assert model.decoder.mask_embedding.requires_grad
    own_copy = copy.deepcopy(model)

    shared = speculative(model, toy_task, path)
    hypos = shared.generate([model], sample)
    assert shared.same_encoder
    for name in ("embed_tokens", "output_projection"):
        assert getattr(model.decoder, name).weight is getattr(shared.teacher.model.decoder, name).weight
    separate = speculative(own_copy, toy_task, path)
    separate.same_encoder = False  # as for a drafter whose encoder was trained
    reference = separate.generate([own_copy], sample)
    assert [(h[0]["tokens"].tolist(), h[0]["steps"]) for h in hypos] == [
        (h[0]["tokens"].tolist(), h[0]["steps"]) for h in reference
    ]
    other = speculative(drafter(toy_task, 3, 6), toy_task, path)  # its own random encoder: nothing shared
    other.generate([other.model], sample)
    assert other.same_encoder is False
    with pytest.raises(ValueError, match="--freeze-encoder keeps the teacher's encoder: it needs --init-from-ar"):
        drafter(toy_task, 3, 5, ["--freeze-encoder"])


def reference_tokens(reference, eos, width):
    rows = [h[0]["tokens"] for h in reference]
    return torch.stack([torch.cat([r, r.new_full((width - len(r),), eos)]) for r in rows])


@pytest.mark.parametrize("draft_size", [1, 2, 4, 8])
def test_exact_verification_is_the_teachers_greedy_decoding(toy_task, tmp_path, draft_size):
    """The guarantee does not depend on the drafter: an untrained one (every k, batch 8 and each sentence alone) and
    one that drafts the teacher's own output with random errors (so sentences of a batch accept different
    numbers of drafts) both print SequenceGenerator's greedy output with its scores."""
    accepted_drafts = 0
    for seed in range(2):
        path = str(tmp_path / f"teacher{seed}.pt")
        teacher = random_teacher(toy_task, seed, path)
        sample = random_batch(toy_task.target_dictionary, 8, seed)
        reference = greedy(teacher, toy_task, sample)
        untrained = drafter(toy_task, draft_size, seed + 10)
        noisy = speculative(untrained, toy_task, path, ReferenceDrafter)
        noisy.reference = reference_tokens(reference, toy_task.target_dictionary.eos(), MAX_LEN_B + draft_size + 3)
        noisy.noise = 0.3
        generator = speculative(untrained, toy_task, path)
        runs = [generator.generate([untrained], sample), noisy.generate([untrained], sample)]
        runs.append([generator.generate([untrained], sub_batch(sample, i))[0] for i in range(8)])
        for hypos in runs:
            for i, hypo in enumerate(h[0] for h in hypos):
                assert hypo["tokens"].tolist() == reference[i][0]["tokens"].tolist()
                torch.testing.assert_close(
                    hypo["positional_scores"], reference[i][0]["positional_scores"], rtol=1e-4, atol=1e-4
                )
                assert float(hypo["score"]) == pytest.approx(float(reference[i][0]["score"]), abs=1e-4)
                assert hypo["drafter_steps"] == hypo["steps"] <= len(hypo["tokens"])
                assert hypo["mean_accepted_tokens"] == len(hypo["tokens"]) / hypo["steps"]
        accepted_drafts += sum(len(h[0]["tokens"]) - h[0]["steps"] for h in runs[1])
    assert accepted_drafts > 0  # the multi-token path was exercised


@pytest.mark.parametrize("draft_size", [1, 3])
def test_a_drafter_that_is_always_right_emits_k_plus_1_tokens_per_teacher_call(toy_task, tmp_path, draft_size):
    """The first teacher call accepts the k drafts after BOS, every later one ŷ and all k drafts: ceil(n/(k+1))
    calls for n tokens (EOS included) — the teacher's choice of the token after each accepted block counts."""
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 0, path)
    sample = random_batch(toy_task.target_dictionary, 8, 0)
    reference = greedy(teacher, toy_task, sample)
    model = drafter(toy_task, draft_size, 1)
    rigged = speculative(model, toy_task, path, ReferenceDrafter)
    rigged.reference = reference_tokens(reference, toy_task.target_dictionary.eos(), MAX_LEN_B + draft_size + 3)
    for i, (hypo,) in enumerate(rigged.generate([model], sample)):
        n = len(reference[i][0]["tokens"])
        assert hypo["tokens"].tolist() == reference[i][0]["tokens"].tolist()
        assert hypo["steps"] == math.ceil(n / (draft_size + 1))


def test_relaxed_verification(toy_task, tmp_path):
    """Relaxed verification (top-β within τ): β = |V| and τ = ∞ accept every draft (ceil(n/(k+1)) teacher calls);
    τ = 0 accepts only the teacher's best token, i.e. exact verification; outputs do not depend on the batch."""
    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 1, path)
    sample = random_batch(toy_task.target_dictionary, 8, 1)
    model = drafter(toy_task, 3, 2)
    vocabulary = len(toy_task.target_dictionary)

    def relaxed(beta, tau):
        return speculative(
            model, toy_task, path, spec_drafter_verify="relaxed", spec_drafter_beta=beta, spec_drafter_tau=tau
        )

    everything = [h[0] for h in relaxed(vocabulary, math.inf).generate([model], sample)]
    for hypo in everything:
        n = len(hypo["tokens"])
        assert hypo["tokens"][-1] == toy_task.target_dictionary.eos() and n <= MAX_LEN_B + 1
        assert hypo["steps"] == math.ceil(n / 4)
    exact = speculative(model, toy_task, path).generate([model], sample)
    exactly = relaxed(vocabulary, 0.0).generate([model], sample)
    assert [h[0]["tokens"].tolist() for h in exactly] == [h[0]["tokens"].tolist() for h in exact]
    top3 = relaxed(3, 1.0)
    batched = top3.generate([model], sample)
    for i in range(8):
        assert top3.generate([model], sub_batch(sample, i))[0][0]["tokens"].tolist() == batched[i][0]["tokens"].tolist()
    with pytest.raises(ValueError, match="--spec-drafter-beta >= 1"):
        relaxed(0, 1.0)


class RiggedFirstBlock(RiggedFirstBlockMixin, SpecDrafterGenerator):
    """Drafts ``first_block`` (k drafts after BOS) at the first step, the drafter's drafts after."""


def test_relaxed_verification_on_a_rigged_block(toy_task, tmp_path, monkeypatch):
    """The first block drafts the teacher's 2nd-best token, then its best, then its 3rd best (each given the drafts
    before). β decides (τ = ∞): β = 1 accepts no draft, 2 the first two, 3 all three. τ decides (β = 3): a τ between
    the 2nd-best and the 3rd-best drafts' distances to their row's best keeps the drafts before the farther one, a τ
    below both keeps none. Exact verification accepts none."""
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 0, path)
    sample = sub_batch(random_batch(toy_task.target_dictionary, 1, seed=0), 0)
    bos = eos = toy_task.target_dictionary.eos()
    tokens, values = next_tokens(teacher, sample, [bos])
    d1, gap1 = tokens[1], values[0] - values[1]
    d2 = next_tokens(teacher, sample, [bos, d1])[0][0]
    tokens, values = next_tokens(teacher, sample, [bos, d1, d2])
    d3, gap3 = tokens[2], values[0] - values[2]
    assert eos not in (d1, d2, d3) and abs(gap1 - gap3) > 1e-3
    model = drafter(toy_task, 3, 0)
    accepted = record_accepted(monkeypatch)
    cases = [
        ({}, 0),
        ({"spec_drafter_beta": 1, "spec_drafter_tau": math.inf}, 0),
        ({"spec_drafter_beta": 2, "spec_drafter_tau": math.inf}, 2),
        ({"spec_drafter_beta": 3, "spec_drafter_tau": math.inf}, 3),
        ({"spec_drafter_beta": 3, "spec_drafter_tau": (gap1 + gap3) / 2}, 2 if gap1 < gap3 else 0),
        ({"spec_drafter_beta": 3, "spec_drafter_tau": min(gap1, gap3) / 2}, 0),
    ]
    for relaxed, drafts_accepted in cases:
        verify = {"spec_drafter_verify": "relaxed"} if relaxed else {}
        generator = speculative(model, toy_task, path, RiggedFirstBlock, **verify, **relaxed)
        generator.first_block = [d1, d2, d3]
        accepted.clear()
        generator.generate([model], sample)
        assert accepted[0] == [1 + drafts_accepted], relaxed  # BOS's slot and the accepted drafts


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_verification_follows_fairseqs_length_unk_and_score_options(toy_task, tmp_path, seed):
    """--max-len-a > 0 on a batch of mixed source lengths, --min-len, --unkpen and --lenpen (tests/test_blockwise.py's
    set): exact verification prints the teacher's SequenceGenerator beam-1 hypotheses and scores, on a teacher where
    each option changes the output."""
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, seed, path, eos_boost=1.0, unk_boost=1.0)
    sample = random_batch(toy_task.target_dictionary, 8, seed)
    model = drafter(toy_task, 3, seed)

    def decode(options):
        task = with_task_options(toy_task, spec_drafter_teacher=path)
        return SpecDrafterGenerator([model], task, Namespace(beam=1, **options)).generate([model], sample)

    assert_same_hypotheses(
        decode(LENGTH_AND_SCORE_OPTIONS), fairseq_greedy(teacher, toy_task, sample, LENGTH_AND_SCORE_OPTIONS)
    )
    check_options_matter(decode, sample)


def test_decoding_options_are_checked(toy_task, tmp_path):
    path = str(tmp_path / "teacher.pt")
    teacher = random_teacher(toy_task, 0, path)
    model = drafter(toy_task, 2, 0)
    with pytest.raises(ValueError, match="--spec-drafter-teacher PATH"):
        speculative(model, toy_task, None)
    with pytest.raises(FileNotFoundError, match="--spec-drafter-teacher"):
        speculative(model, toy_task, str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="needs a spec_drafter checkpoint"):
        speculative(teacher, toy_task, path)
    with pytest.raises(ValueError, match="--nbest 2 is not supported"):
        SpecDrafterGenerator([model], with_task_options(toy_task, spec_drafter_teacher=path), Namespace(nbest=2))
    with pytest.raises(
        ValueError, match=r"speculative decoding \(spec_drafter\) emits one greedy .*: pass --beam 1 \(got 4\)"
    ):
        SpecDrafterGenerator([model], with_task_options(toy_task, spec_drafter_teacher=path), Namespace(beam=4))
    with pytest.raises(ValueError, match="--int8-drafts runs the drafter's decoder on the CPU in float32.*bfloat16"):
        speculative(drafter(toy_task, 2, 0).bfloat16(), toy_task, path, int8_drafts=True)
    with pytest.raises(ValueError, match="--max-drafting-sentences needs exact acceptance"):
        speculative(model, toy_task, path, spec_drafter_verify="relaxed", max_drafting_sentences=8)
    with pytest.raises(ValueError, match="--max-drafting-sentences needs .* a value >= 0, got -1"):
        speculative(model, toy_task, path, max_drafting_sentences=-1)


@pytest.mark.parametrize("arch", ["nad_ad_transformer", "blockwise_transformer", "sat_transformer"])
def test_a_teacher_the_verifier_does_not_reproduce_is_refused(toy_task, tmp_path, arch):
    """The verifier recomputes fairseq's Transformer decoder layer by layer: an Encoder-NAD-AD teacher (its layers'
    NAD-AD attention would be skipped), a blockwise one (head 1 may pass the heads' layer) or a SAT one (other
    decoder inputs) would be verified as another model, so they are refused."""
    teacher, args = build(toy_task, ["--arch", arch] + TINY_SIZES, 0)
    path = str(tmp_path / "teacher.pt")
    save_checkpoint(teacher, args, path)
    message = f"--spec-drafter-teacher .* is a {arch} checkpoint .*not an autoregressive .*--arch transformer"
    with pytest.raises(ValueError, match=message):
        speculative(drafter(toy_task, 2, 0), toy_task, path)


def test_a_teacher_trained_with_another_target_dictionary_is_refused(toy_task, tmp_path, caplog):
    """The teacher's checkpoint names its data directory: a target dictionary there of the task's size but other
    symbols is refused; the task's own is accepted; a checkpoint whose directory is gone is accepted with a
    warning."""
    model = drafter(toy_task, 2, 0)
    symbols = toy_task.target_dictionary.symbols[toy_task.target_dictionary.nspecial :]
    for name, order in (("same", symbols), ("other", [symbols[1], symbols[0]] + symbols[2:])):
        data = tmp_path / name
        data.mkdir()
        dictionary = Dictionary()
        for symbol in order:
            dictionary.add_symbol(symbol)
        dictionary.save(str(data / "dict.tgt.txt"))
        toy_task.source_dictionary.save(str(data / "dict.src.txt"))
        random_teacher(toy_task, 0, str(data / "teacher.pt"), data=str(data))
    with caplog.at_level(logging.WARNING):
        speculative(model, toy_task, str(tmp_path / "same" / "teacher.pt"))
    assert "cannot check" not in caplog.text
    with pytest.raises(
        ValueError,
        match="--spec-drafter-teacher .* was trained with the target dictionary .*other/dict"
        ".tgt.txt, which is not this data-bin's .*trained on this data-bin",
    ):
        speculative(model, toy_task, str(tmp_path / "other" / "teacher.pt"))
    random_teacher(toy_task, 0, str(tmp_path / "moved.pt"), data=str(tmp_path / "gone"))
    with caplog.at_level(logging.WARNING):
        speculative(model, toy_task, str(tmp_path / "moved.pt"))
    assert "cannot check that the teacher was trained with this data-bin's target dictionary" in caplog.text


@pytest.mark.parametrize("arch", ["sat_transformer", "transformer"])
def test_speculative_options_are_refused_for_other_models(toy_task, tmp_path, arch):
    """The speculative options are decoding options of spec_drafter checkpoints only: on any other model (an SAT
    student, the AR teacher itself) the task refuses them rather than decoding without them."""
    model, _args = build(toy_task, ["--arch", arch] + TINY_SIZES, 0)
    path = str(tmp_path / "teacher.pt")
    random_teacher(toy_task, 0, path)
    for task_options, given in (
        ({"spec_drafter_verify": "relaxed"}, "--spec-drafter-verify relaxed"),
        ({"spec_drafter_teacher": path}, f"--spec-drafter-teacher {path}"),
        ({"spec_drafter_beta": 5}, "--spec-drafter-beta 5"),
        ({"spec_drafter_tau": 2.0}, "--spec-drafter-tau 2.0"),
    ):
        with pytest.raises(
            ValueError, match=f"{given} is a decoding option of spec_drafter models; this checkpoint is a {arch} model"
        ):
            with_task_options(toy_task, **task_options).build_generator([model], Namespace(beam=1))


# ----- learning (the synthetic task of tests/utils.py, from the synthetic_teacher fixture) --------------------------


@pytest.mark.parametrize("reads_states, threshold", [(False, 1.6), (True, 1.9)], ids=["plain", "teacher-states"])
def test_drafter_learns_to_draft_the_teachers_output(synthetic_teacher, tmp_path, reads_states, threshold):
    """A 1-layer drafter (k=4) initialised from the synthetic teacher, trained 100 updates on its distilled outputs:
    exact verification prints the teacher's greedy output with fewer teacher calls. Measured (2026-11-24): 1.85 tokens
    (EOS included) per teacher call with 2 random cut points per sentence, 1.81 with every cut point in one pass (the
    criterion since 2026-11-25); greedy decoding and an untrained drafter give ~1.0. Threshold 1.6. Reading the
    teacher's states (``--read-teacher-states``, 2026-11-29): 2.02 (the plain drafter 1.81 in the same run), threshold
    1.9: the states must pay. Takes ~40 s on the 2 cores (the
    teacher fixture excluded)."""
    teacher, data_bin = synthetic_teacher
    states = ["--read-teacher-states", "--spec-drafter-teacher", teacher] if reads_states else []
    checkpoint = train_model(
        data_bin,
        str(tmp_path / "drafter"),
        ["--arch", "spec_drafter"]
        + SYNTHETIC_MODEL_SIZE
        + [
            "--decoder-layers",
            "1",
            "--draft-size",
            "4",
            "--task",
            "translation_nat",
            "--init-from-ar",
            teacher,
            "--use-distilled",
            "target",
            "--criterion",
            "spec_drafter_loss",
            "--label-smoothing",
            "0.1",
            "--max-tokens",
            "2000",
            "--lr",
            "0.002",
            "--lr-scheduler",
            "fixed",
            "--dropout",
            "0",
            "--disable-validation",
            *states,
        ],
        max_update=100,
    )

    def decode(path, extra=()):
        lines = generate_lines(
            data_bin, path, ["--task", "translation_nat", "--beam", "1", "--gen-subset", "test", *extra]
        )  # the drafter's rows draft at every step: what it proposes, whatever the batch size
        tokens = sum(len(line.split("\t")[1].split()) for line in lines if line.startswith("P-"))
        steps = sum(int(line.split("\t")[1]) for line in lines if line.startswith("I-"))
        return hypotheses(lines), tokens / steps if steps else None

    teacher_hypos, _ = decode(teacher)
    drafting = ["--spec-drafter-teacher", teacher, "--print-step", "--max-drafting-sentences", str(DRAFT_EVERY_STEP)]
    hypos, per_call = decode(checkpoint, drafting)
    assert hypos == teacher_hypos
    assert per_call >= threshold, f"{per_call:.2f} tokens per teacher call (threshold {threshold})"
    # an int8 drafter drafts a little differently, and the output is still the teacher's
    hypos, int8_per_call = decode(checkpoint, drafting + ["--int8-drafts"])
    assert hypos == teacher_hypos
    assert int8_per_call >= per_call - 0.1, f"{int8_per_call:.2f} tokens per teacher call (fp32 {per_call:.2f})"


def test_a_drafter_validates_through_speculative_decoding_with_eval_bleu(dummy_data_bin, tiny_teacher, tmp_path):
    """The GPU preset's drafter recipe validates with ``--eval-bleu`` through speculative decoding, whose teacher is
    loaded into the drafter's task: that teacher (itself trained with ``--eval-bleu``) gets no validation generator
    of its own, which would be built with the drafter's ``--spec-drafter-teacher`` and refused. The best checkpoint is
    the one with the most accepted drafts (``--best-checkpoint-metric accepted_drafts``): 3 epochs of one update each
    (``--max-tokens 4000``) at the learning rates 0.003, 0.003, then 0.03, which unlearns drafting, put the best
    validation in the middle (measured accepted drafts: 0.813, 0.912, 0.431). Takes ~3 s besides the teacher."""
    save_dir = tmp_path / "drafter"
    save_dir.mkdir()
    log = str(save_dir / "train.log")
    with log_file(log):
        train_model(
            dummy_data_bin,
            str(save_dir),
            ["--arch", "spec_drafter"]
            + TINY_TRANSFORMER[2:]
            + [
                "--draft-size",
                "2",
                "--task",
                "translation_nat",
                "--init-from-ar",
                tiny_teacher,
                "--criterion",
                "spec_drafter_loss",
                "--spec-drafter-teacher",
                tiny_teacher,
                "--eval-bleu",
                "--eval-bleu-args",
                '{"beam": 1}',
                "--best-checkpoint-metric",
                "accepted_drafts",
                "--maximize-best-checkpoint-metric",
                "--max-tokens",
                "4000",
                "--max-epoch",
                "3",
                "--lr",
                "0.003,0.003,0.03",
            ],
            max_update=100,
        )
    accepted = assert_best_checkpoint_is_the_best_validation(str(save_dir), "accepted_drafts", log)
    assert [updates for updates, _ in accepted] == [1, 2, 3], accepted
    assert accepted[1][1] > max(accepted[0][1], accepted[2][1]), accepted  # the best is neither the first nor the last
    assert len(validations(log, "bleu")) == 3  # every validation decoded (speculative decoding, --eval-bleu)


def test_the_deprecated_option_names_still_work_and_say_so(toy_task, caplog):
    """--speculative-teacher/-verify/-beta/-tau, the options' names before they took the system's: fairseq's parser
    still accepts them, they set the same verification (with a warning naming the new option), and the two names of
    one option given different values are refused."""
    from nat_plugins.systems.spec_drafter.decoding import DEPRECATED_OPTIONS, SpecDrafterDecodingConfig

    parser = options.get_generation_parser(default_task="translation_nat")
    old = ["--speculative-teacher", "T.pt", "--speculative-verify", "relaxed", "--speculative-beta", "2"]
    args = options.parse_args_and_arch(parser, ["DATA", "--task", "translation_nat", *old, "--speculative-tau", "0.5"])
    new = ["--spec-drafter-teacher", "T.pt", "--spec-drafter-verify", "relaxed", "--spec-drafter-beta", "2"]
    current = options.parse_args_and_arch(
        options.get_generation_parser(default_task="translation_nat"),
        ["DATA", "--task", "translation_nat", *new, "--spec-drafter-tau", "0.5"],
    )
    with caplog.at_level(logging.WARNING):
        assert SpecDrafterDecodingConfig.parsed(args) == SpecDrafterDecodingConfig.parsed(current) == ("T.pt", 2, 0.5)
    warned = [record.getMessage() for record in caplog.records]
    for old_name, new_name in DEPRECATED_OPTIONS.items():
        flag, new_flag = "--" + old_name.replace("_", "-"), "--" + new_name.replace("_", "-")
        assert f"{flag} is deprecated: use {new_flag} (the same option)" in warned
    disagree = with_task_options(toy_task, spec_drafter_teacher="A.pt", speculative_teacher="B.pt")
    with pytest.raises(ValueError, match="--speculative-teacher B.pt and --spec-drafter-teacher A.pt disagree"):
        SpecDrafterDecodingConfig.parsed(disagree.cfg)
    with pytest.raises(ValueError, match="--speculative-verify 'sometimes': choose exact or relaxed"):
        SpecDrafterDecodingConfig.parsed(with_task_options(toy_task, speculative_verify="sometimes").cfg)
