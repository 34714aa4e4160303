"""Blockwise parallel decoding (Stern et al., 2018): head targets, identity first head, the criterion's head
sampling, verify-accept decoding (exact acceptance == greedy decoding of head 1 for every k, batch size and cache
mode; top-m acceptance; minimum block size; EOS inside a block) and a tiny train -> generate -> interactive run."""

import logging
import math
import os
import re
import subprocess
from argparse import Namespace

import pytest
import sacrebleu
import torch
from fairseq import options
from fairseq.data import data_utils
from fairseq.dataclass.configs import GenerationConfig
from fairseq.logging import metrics
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from fairseq.sequence_generator import SequenceGenerator

from nat_plugins.generators import verify_accept_loop
from nat_plugins.generators.verify_accept_loop import accepted_lengths
from nat_plugins.systems.blockwise.decoding import BlockwiseGenerator, parse_block_accept
from nat_plugins.systems.blockwise.heads import BlockHeads, block_targets
from nat_plugins.systems.blockwise.loss import BlockwiseLoss

from .utils import (
    DRAFT_EVERY_STEP,
    SYNTHETIC_MODEL_SIZE,
    TINY_TRANSFORMER,
    USER_DIR,
    RiggedFirstBlockMixin,
    console_script,
    generate_lines,
    hypotheses,
    interactive_lines,
    random_batch,
    sub_batch,
    train_model,
    with_task_options,
)

TINY_BLOCKWISE = ["--arch", "blockwise_transformer"] + TINY_TRANSFORMER[2:]
MAX_LEN_B = 14  # random models rarely stop: keep their outputs short (max_len_a = 0, so batch-1 == batched limits)


def build_model(task, block_size, seed=0, extra=(), arch_args=TINY_BLOCKWISE):
    """A model built through the task, as fairseq-train builds it (``block_size`` None: plain AR Transformer)."""
    block_args = [] if block_size is None else ["--block-size", str(block_size)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["unused-data", "--task", "translation_nat"] + block_args + list(arch_args) + list(extra)
    )
    torch.manual_seed(seed)
    return task.build_model(args).eval()


def random_model(task, block_size, seed, identity_first_head=False):
    """A random 2-layer model whose greedy outputs vary in length and content: large learned positional
    embeddings (random Transformers otherwise repeat one token) and a random EOS direction (so some stop early)."""
    extra = ["--decoder-layers", "2", "--decoder-learned-pos"]
    arch = [a for a in TINY_BLOCKWISE if a != "--share-all-embeddings"]
    model = build_model(
        task, block_size, seed, extra + (["--identity-first-head"] if identity_first_head else []), arch
    )
    with torch.no_grad():
        model.decoder.embed_positions.weight.mul_(10)
        model.decoder.output_projection.weight[task.target_dictionary.eos()] += 0.5 * torch.randn(32)
    return model


def verify_accept(model, task, sample, use_cache=True, **options):
    """Blockwise decoding of ``sample``, drafting at every step whatever the batch size (the CPU default takes
    greedy steps while more than one sentence decodes: tests/test_block_call.py)."""
    options.setdefault("max_drafting_sentences", math.inf)
    generator = BlockwiseGenerator(
        [model], with_task_options(task, **options), Namespace(beam=1, max_len_b=MAX_LEN_B), use_cache=use_cache
    )
    return generator.generate([model], sample)


def greedy(model, task, sample):
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_b=MAX_LEN_B)
    return generator.generate([model], sample)


# ----- model ----------------------------------------------------------------------------------------------------


def test_block_targets_shift_each_head_by_its_offset():
    pad, eos = 1, 2
    target = torch.tensor([[5, 6, 7, eos, pad], [8, eos, pad, pad, pad]])
    shifted = block_targets(target, block_size=3, pad=pad)
    assert shifted.shape == (2, 5, 3)
    assert shifted[..., 0].tolist() == target.tolist()  # head 1: y_{t+1}
    assert shifted[..., 1].tolist() == [[6, 7, eos, pad, pad], [eos, pad, pad, pad, pad]]
    assert shifted[..., 2].tolist() == [[7, eos, pad, pad, pad], [pad, pad, pad, pad, pad]]
    assert block_targets(target[:, :1], block_size=3, pad=pad).tolist() == [[[5, pad, pad]], [[8, pad, pad]]]


def test_block_heads_slices_equal_the_full_layer():
    torch.manual_seed(0)
    heads = BlockHeads(8, 16, block_size=4, identity_first_head=True, dropout=0.0, activation_dropout=0.0).eval()
    assert heads.fc1.out_features == 3 * 16 and [fc.out_features for fc in heads.fc2] == [8, 8, 8]  # heads 2..4 only
    x = torch.randn(2, 5, 8)
    everything = heads(x)
    assert everything.shape == (2, 5, 4, 8)
    assert torch.equal(heads(x, range(1))[..., 0, :], x)  # head 1 is the decoder output itself
    torch.testing.assert_close(heads(x, range(2, 4)), everything[..., 2:4, :])
    torch.testing.assert_close(heads(x, [3, 0]), everything[..., [3, 0], :])  # any heads, in the order asked
    hidden = torch.relu(heads.fc1(x))  # one hidden layer of (k-1)·d_ff shared by the heads (§6)
    torch.testing.assert_close(everything[..., 1, :] - x, heads.fc2[0](hidden))  # residual
    torch.testing.assert_close(everything[..., 3, :] - x, heads.fc2[2](hidden))
    for bad in (range(3, 5), [1, 1], []):
        with pytest.raises(ValueError, match="distinct head indices"):
            heads(x, bad)
    with pytest.raises(ValueError, match="--block-size"):
        BlockHeads(8, 16, block_size=0, identity_first_head=False, dropout=0.0, activation_dropout=0.0)


def test_checkpoints_with_one_output_matrix_load_into_per_head_layers(toy_task):
    """Checkpoints written when fc2 was one (k·d)-row matrix load through fairseq's state-dict upgrade."""
    model = build_model(toy_task, 3, extra=["--identity-first-head"])
    state = model.state_dict()
    prefix = "decoder.block_heads.fc2"
    for kind in ("weight", "bias"):
        state[f"{prefix}.{kind}"] = torch.cat([state.pop(f"{prefix}.{i}.{kind}") for i in range(2)])
    reloaded = build_model(toy_task, 3, seed=1, extra=["--identity-first-head"])
    reloaded.load_state_dict(state)  # fairseq's load_state_dict upgrades first
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_identity_first_head_with_frozen_base_is_the_base_model(toy_task):
    base = build_model(toy_task, None, arch_args=TINY_TRANSFORMER)
    model = build_model(toy_task, 3, extra=["--identity-first-head", "--freeze-base"])
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("decoder.block_heads.") for name in missing)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "decoder.block_heads.fc1.weight",
        "decoder.block_heads.fc1.bias",
    } | {f"decoder.block_heads.fc2.{i}.{kind}" for i in range(2) for kind in ("weight", "bias")}
    assert model.trainable_heads == range(1, 3)

    sample = random_batch(toy_task.target_dictionary, 4, seed=0)
    prev = torch.randint(4, 28, (4, 6))
    base_logits, _ = base(**sample["net_input"], prev_output_tokens=prev)
    head_logits, _ = model(**sample["net_input"], prev_output_tokens=prev, heads=range(3))
    assert torch.equal(head_logits[:, :, 0], base_logits)
    assert torch.equal(model(**sample["net_input"], prev_output_tokens=prev)[0], base_logits)  # fairseq's contract
    assert not torch.allclose(head_logits[:, :, 1], base_logits)


def test_bad_model_options_are_refused(toy_task):
    with pytest.raises(ValueError, match="--block-size must be at least 1"):
        build_model(toy_task, 0)
    with pytest.raises(ValueError, match="leaves nothing to train"):
        build_model(toy_task, 1, extra=["--identity-first-head", "--freeze-base"])


# ----- criterion -------------------------------------------------------------------------------------------------


def training_sample(dictionary, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = [5, 3, 7, 1]
    targets = [
        torch.cat(
            [
                torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator),
                torch.tensor([dictionary.eos()]),
            ]
        )
        for n in lengths
    ]
    sample = random_batch(dictionary, len(lengths), seed)
    sample["net_input"]["prev_output_tokens"] = data_utils.collate_tokens(
        targets, dictionary.pad(), dictionary.eos(), move_eos_to_beginning=True
    )
    sample["target"] = data_utils.collate_tokens(targets, dictionary.pad())
    sample["ntokens"] = sum(n + 1 for n in lengths)
    return sample, [n + 1 for n in lengths]


def criterion_for(task, head_sampling="mean", other_heads_weight=0.1, label_smoothing=0.1, **kwargs):
    return BlockwiseLoss(
        task,
        label_smoothing=label_smoothing,
        head_sampling=head_sampling,
        sentence_avg=False,
        seed=1,
        other_heads_weight=other_heads_weight,
        **kwargs,
    )


def own_parameters(model, head):
    """The parameters only 0-based ``head`` uses: its output layer (none for an identity head 1)."""
    block_heads = model.decoder.block_heads
    if block_heads.identity_first_head and head == 0:
        return []
    return list(block_heads.fc2[head - int(block_heads.identity_first_head)].parameters())


def scored_heads(log, block_size):
    return [h for h in range(block_size) if log[f"h{h + 1}_ntokens"] > 0]


@pytest.mark.parametrize("head_sampling", ["random", "first-plus-random", "mean"])
@pytest.mark.parametrize("extra", [[], ["--identity-first-head"], ["--identity-first-head", "--freeze-base"]])
def test_head_sampling_is_deterministic_and_unscored_heads_get_no_gradient(toy_task, extra, head_sampling):
    """Heads are drawn from (seed, update); head 1 is in every update when the base trains (first-plus-random,
    mean); a head the update does not score has ``grad is None`` (so fairseq's Adam skips it), every scored one
    has a gradient."""
    model = build_model(toy_task, 4, extra=extra).train()
    criterion = criterion_for(toy_task, head_sampling, other_heads_weight=0.5)
    sample, lengths = training_sample(toy_task.target_dictionary)
    base_trains = "--freeze-base" not in extra
    drawn = set()
    for update in range(40):
        model.set_num_updates(update)
        model.zero_grad(set_to_none=True)
        loss, sample_size, log = criterion(model, sample)
        heads = scored_heads(log, 4)
        assert scored_heads(criterion(model, sample)[2], 4) == heads  # same update, same heads
        expected_count = {"random": 1, "first-plus-random": 1 + base_trains, "mean": len(model.trainable_heads)}
        assert len(heads) == expected_count[head_sampling]
        assert (0 in heads) == (base_trains and head_sampling != "random" or heads == [0])
        drawn.update(heads)
        weights = {h: 1.0 if h == 0 else 0.5 for h in heads}
        assert sample_size == pytest.approx(sum(weights[h] * sum(max(n - h, 0) for n in lengths) for h in heads))
        loss.backward()
        for head in range(4):
            assert all((p.grad is not None) == (head in heads) for p in own_parameters(model, head))
        uses_layer = any(h > 0 or not model.decoder.block_heads.identity_first_head for h in heads)
        assert (model.decoder.block_heads.fc1.weight.grad is not None) == uses_layer
        if base_trains:
            assert model.decoder.embed_tokens.weight.grad is not None
    assert drawn == set(model.trainable_heads)


@pytest.mark.parametrize("head", [0, 2])
def test_an_update_that_does_not_score_a_head_leaves_it_bit_identical(toy_task, head):
    """fairseq's Adam (momentum and weight decay) after an update that scores one head only: the other heads'
    own parameters stay bit for bit, even with momentum from an earlier update of every head. When head 1 — the
    decoder output itself under --identity-first-head — is the only one scored, the whole new layer stays put."""
    model = build_model(toy_task, 4, extra=["--identity-first-head"]).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = FairseqAdam(FairseqAdamConfig(lr=[0.01], weight_decay=0.1, adam_betas="(0.9, 0.98)"), params)
    sample, _ = training_sample(toy_task.target_dictionary)

    def update(criterion, num_updates):
        model.set_num_updates(num_updates)
        optimizer.zero_grad()
        loss, _, log = criterion(model, sample)
        loss.backward()
        optimizer.step()
        return scored_heads(log, 4)

    assert update(criterion_for(toy_task, "mean"), 0) == [0, 1, 2, 3]  # every head gets Adam state
    random_head = criterion_for(toy_task, "random")

    def draws(num_updates):
        model.set_num_updates(num_updates)
        return random_head.heads_to_score(model)

    num_updates = next(u for u in range(1, 100) if draws(u) == [head])
    block_heads = {n: p.clone() for n, p in model.decoder.block_heads.named_parameters()}
    trunk = model.decoder.layers[0].fc1.weight.clone()
    assert update(random_head, num_updates) == [head]
    assert not torch.equal(trunk, model.decoder.layers[0].fc1.weight)
    for other in range(4):
        for p in own_parameters(model, other):
            before = next(block_heads[n] for n, q in model.decoder.block_heads.named_parameters() if q is p)
            assert torch.equal(before, p) == (other != head)
    if head == 0:
        assert all(torch.equal(block_heads[n], p) for n, p in model.decoder.block_heads.named_parameters())


@pytest.mark.parametrize("weight", [1.0, 0.25])
def test_loss_is_the_weighted_mean_over_every_head_on_shifted_targets(toy_task, weight):
    model = build_model(toy_task, 3)
    criterion = criterion_for(toy_task, "mean", other_heads_weight=weight, label_smoothing=0.0)
    sample, lengths = training_sample(toy_task.target_dictionary)
    with torch.no_grad():
        loss, sample_size, log = criterion(model, sample)  # model.eval(): validation scores every head
        logits, _ = model(**sample["net_input"], heads=range(3))
        scored = block_targets(sample["target"], 3, toy_task.target_dictionary.pad()).ne(
            toy_task.target_dictionary.pad()
        )
        packed, _ = model(**sample["net_input"], heads=range(3), logits_at=scored)  # what the criterion projects
    assert 0 < scored.sum() < scored.numel() and torch.allclose(packed, logits[scored], atol=1e-5)
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    pad = toy_task.target_dictionary.pad()
    total = total_nll = tokens = 0.0
    for head in range(3):
        target = sample["target"][:, head:]
        nll = -lprobs[:, : target.size(1), head].gather(-1, target.unsqueeze(-1)).squeeze(-1)
        nll = nll.masked_fill(target.eq(pad), 0.0).sum()
        head_weight = 1.0 if head == 0 else weight
        total += head_weight * float(nll)
        total_nll += float(nll)
        tokens += head_weight * sum(max(n - head, 0) for n in lengths)
        assert log[f"h{head + 1}_ntokens"] == sum(max(n - head, 0) for n in lengths)
        assert float(log[f"h{head + 1}_nll"]) == pytest.approx(float(nll), rel=1e-5)
    assert float(loss) == pytest.approx(total, rel=1e-5) and sample_size == pytest.approx(tokens)
    assert float(log["nll_loss"]) == pytest.approx(total_nll, rel=1e-5)
    with metrics.aggregate() as aggregated:
        BlockwiseLoss.reduce_metrics([log, log])
    values = aggregated.get_smoothed_values()
    assert {"loss", "nll_loss", "ppl", "nll_h1", "acc_h3", "accepted_block"} <= set(values)


def test_validation_logs_the_mean_accepted_block_of_exact_verify_accept(toy_task):
    """``accepted_block`` = tokens (EOS included) / decoder calls of exact verify-accept decoding over the whole
    validation set — the quantity fairseq-generate reports — combined over batches by their calls; k=1 gives 1."""
    dictionary = toy_task.target_dictionary
    logs, tokens, steps = [], 0, 0
    for seed in range(2):
        model = random_model(toy_task, 3, seed=3)
        sample, _ = training_sample(dictionary, seed=seed)
        with torch.no_grad():
            log = criterion_for(toy_task)(model, sample)[2]
        hypos = BlockwiseGenerator([model], toy_task, Namespace(beam=1), draft_every_step=True).generate(
            [model], sample
        )
        assert log["block_tokens"] == sum(len(h[0]["tokens"]) for h in hypos)
        assert log["block_steps"] == sum(h[0]["steps"] for h in hypos)
        logs.append(log)
        tokens, steps = tokens + log["block_tokens"], steps + log["block_steps"]
    assert tokens > steps  # blocks of more than one token were accepted
    with metrics.aggregate() as aggregated:
        for log in logs:  # fairseq's validation reduces batch by batch
            BlockwiseLoss.reduce_metrics([log])
    assert aggregated.get_smoothed_values()["accepted_block"] == pytest.approx(tokens / steps, abs=1e-3)

    single = random_model(toy_task, 1, seed=3)
    with torch.no_grad():
        log = criterion_for(toy_task)(single, training_sample(dictionary)[0])[2]
    assert log["block_tokens"] == log["block_steps"] > 0  # greedy decoding: one token per call
    with torch.no_grad():
        train_log = criterion_for(toy_task)(model.train(), sample)[2]
    assert "block_steps" not in train_log  # decoding happens in validation only


def test_bad_criterion_options_are_refused(toy_task):
    with pytest.raises(ValueError, match="--other-heads-weight must be positive"):
        criterion_for(toy_task, other_heads_weight=0.0)
    for sampling in ("random", "first-plus-random"):
        for backend, find_unused in (("legacy_ddp", True), ("pytorch_ddp", False), ("c10d", False)):
            with pytest.raises(ValueError, match="--ddp-backend pytorch_ddp --find-unused-parameters"):
                criterion_for(
                    toy_task,
                    sampling,
                    distributed_world_size=2,
                    ddp_backend=backend,
                    find_unused_parameters=find_unused,
                )
        criterion_for(
            toy_task, sampling, distributed_world_size=2, ddp_backend="pytorch_ddp", find_unused_parameters=True
        )
        criterion_for(toy_task, sampling, distributed_world_size=1, ddp_backend="legacy_ddp")
    criterion_for(toy_task, "mean", distributed_world_size=2, ddp_backend="legacy_ddp")


# ----- verify-accept decoding ------------------------------------------------------------------------------------


def test_acceptance_rules_on_a_rigged_example():
    eos = 2
    # rows: p1's log-probabilities for y_{j+2}, y_{j+3}, y_{j+4}; proposals ŷ_{j+1..j+4} = 5, 7, 9, 4
    lprobs = torch.full((3, 10), -10.0)
    lprobs[0, [6, 7]] = torch.tensor([-0.5, -1.0])  # ŷ_{j+2} = 7 is p1's 2nd choice
    lprobs[1, [9, 3]] = torch.tensor([-0.25, -3.0])  # ŷ_{j+3} = 9 is the argmax
    lprobs[2, [8, 3, 4]] = torch.tensor([-0.5, -1.0, -2.0])  # ŷ_{j+4} = 4 is 3rd
    proposals = torch.tensor([[5, 7, 9, 4]])

    def accept(top_m=1, min_block_size=1, props=proposals):
        accepted, finished, scores = accepted_lengths(props, lprobs.unsqueeze(0), top_m, min_block_size, eos)
        return int(accepted), bool(finished)

    assert accept() == (1, False)  # exact: only p1's own argmax ŷ_{j+1}
    assert accept(top_m=2) == (3, False)
    assert accept(top_m=3) == (4, False)
    assert accept(min_block_size=3) == (3, False)
    assert accept(top_m=3, min_block_size=2) == (4, False)
    with_eos = torch.tensor([[5, 7, eos, 4]])
    lprobs[1, eos] = 0.0
    assert accept(top_m=2, props=with_eos) == (3, True)  # the block stops after EOS
    assert accept(min_block_size=4, props=with_eos) == (3, True)
    assert accept(props=torch.tensor([[eos, 7, 9, 4]])) == (1, True)
    scores = accepted_lengths(proposals, lprobs.unsqueeze(0), 1, 1, eos)[2]
    assert scores.tolist() == [[-1.0, -0.25, -2.0]]
    # a tolerance τ (speculative decoding's relaxed verification): also at most τ below the row's best; ŷ_{j+2} is 0.5
    # below, ŷ_{j+4} 1.5
    lprobs[1, eos] = -10.0

    def within(tolerance, top_m=3):
        return int(accepted_lengths(proposals, lprobs.unsqueeze(0), top_m, 1, eos, tolerance)[0])

    assert [within(tolerance) for tolerance in (0.4, 0.5, 1.0, 1.5, math.inf)] == [1, 3, 3, 4, 4]
    assert within(math.inf, top_m=2) == 3 and within(0.4, top_m=10) == 1  # both rules apply


@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_exact_acceptance_is_greedy_decoding_of_head_1(toy_task, block_size):
    """The paper's guarantee, as a property over random models: any k, batch 8 and batch 1, cache on and off."""
    accepted_more_than_one = stopped_early = 0
    for seed in range(5):
        model = random_model(toy_task, block_size, seed, identity_first_head=seed % 2 == 1)
        sample = random_batch(toy_task.target_dictionary, 8, seed)
        assert type(model.decoder.output_projection) is torch.nn.Linear  # the reference: fairseq's F.linear layers
        reference = greedy(model, toy_task, sample)
        for use_cache in (True, False):
            batched = verify_accept(model, toy_task, sample, use_cache=use_cache)
            for i in range(8):
                alone = verify_accept(model, toy_task, sub_batch(sample, i), use_cache=use_cache)[0][0]
                for hypo in (batched[i][0], alone):
                    assert hypo["tokens"].tolist() == reference[i][0]["tokens"].tolist()
                    torch.testing.assert_close(
                        hypo["positional_scores"], reference[i][0]["positional_scores"], rtol=1e-4, atol=1e-4
                    )
                    assert float(hypo["score"]) == pytest.approx(float(reference[i][0]["score"]), abs=1e-4)
                    assert hypo["steps"] <= len(hypo["tokens"])  # never more decoder calls than greedy
                    assert hypo["mean_accepted_block"] == len(hypo["tokens"]) / hypo["steps"]
                assert alone["steps"] == batched[i][0]["steps"]
        lengths = [len(h[0]["tokens"]) for h in batched]
        stopped_early += sum(n <= MAX_LEN_B for n in lengths)
        accepted_more_than_one += sum(h[0]["steps"] < len(h[0]["tokens"]) for h in batched)
    assert stopped_early > 0  # some outputs end on their own EOS, inside a block for k > 1
    if block_size == 1:
        assert accepted_more_than_one == 0
    else:
        assert accepted_more_than_one > 0  # the multi-token path was exercised


@pytest.mark.parametrize("block_accept,min_block_size", [("topk:3", 1), ("exact", 2), ("topk:100", 1)])
def test_approximate_acceptance_invariants(toy_task, block_accept, min_block_size):
    block_size = 4
    everything = block_accept == "topk:100"  # more than the vocabulary: every proposal is accepted
    for seed in range(3):
        model = random_model(toy_task, block_size, seed)
        sample = random_batch(toy_task.target_dictionary, 8, seed)
        options = dict(block_accept=block_accept, min_block_size=min_block_size)
        batched = verify_accept(model, toy_task, sample, **options)
        uncached = verify_accept(model, toy_task, sample, use_cache=False, **options)
        for i, hyps in enumerate(batched):
            hypo = hyps[0]
            alone = verify_accept(model, toy_task, sub_batch(sample, i), **options)[0][0]
            assert hypo["tokens"].tolist() == alone["tokens"].tolist() == uncached[i][0]["tokens"].tolist()
            length = len(hypo["tokens"])
            assert hypo["tokens"][-1] == toy_task.target_dictionary.eos() and length <= MAX_LEN_B + 1
            # each call after the first accepts >= min_block_size tokens (all k with topk:|V|) until EOS
            per_call = block_size if everything else min_block_size
            assert hypo["steps"] <= 1 + math.ceil(length / per_call)
            if everything:
                assert hypo["steps"] >= math.ceil(length / block_size)


def next_tokens(model, sample, prefix):
    """``model``'s next tokens after ``prefix`` (BOS first) for the one sentence of ``sample``, best first, and their
    log-probabilities, ranked as the verifier ranks them at output position ``len(prefix) - 1`` (never pad; EOS not
    at position 0, fairseq's --min-len 1)."""
    dictionary = model.decoder.dictionary
    with torch.no_grad():
        logits, _ = model(**sample["net_input"], prev_output_tokens=torch.tensor([prefix]))
    lprobs = torch.log_softmax(logits[0, -1].float(), dim=-1)
    lprobs[dictionary.pad()] = -math.inf
    if len(prefix) == 1:
        lprobs[dictionary.eos()] = -math.inf
    values, tokens = lprobs.sort(descending=True)
    return tokens.tolist(), values.tolist()


def record_accepted(monkeypatch):
    """The verify-accept loop's accepted lengths (B,) of every step, as lists, in the returned list."""
    steps = []

    def recorded(*args, **kwargs):
        result = accepted_lengths(*args, **kwargs)
        steps.append(result[0].tolist())
        return result

    monkeypatch.setattr(verify_accept_loop, "accepted_lengths", recorded)
    return steps


class RiggedFirstBlock(RiggedFirstBlockMixin, BlockwiseGenerator):
    """Proposes ``first_block`` (the k-1 drafts after ŷ_{j+1}) at the first step, the heads' drafts after."""


def test_top_m_acceptance_and_min_block_size_on_a_rigged_block(toy_task, monkeypatch):
    """The first block after y_1 proposes p1's 2nd-best token, then its best, then its 3rd best (each given the
    proposals before): exact acceptance keeps y_1 alone, topk:2 the first two proposals too, topk:3 all three;
    --min-block-size 3 keeps three whatever the verification."""
    model = random_model(toy_task, 4, seed=0, identity_first_head=True)
    sample = sub_batch(random_batch(toy_task.target_dictionary, 1, seed=0), 0)
    bos = eos = toy_task.target_dictionary.eos()
    y1 = next_tokens(model, sample, [bos])[0][0]
    d2 = next_tokens(model, sample, [bos, y1])[0][1]
    d3 = next_tokens(model, sample, [bos, y1, d2])[0][0]
    d4 = next_tokens(model, sample, [bos, y1, d2, d3])[0][2]
    assert eos not in (d2, d3, d4)
    accepted = record_accepted(monkeypatch)
    for block_accept, min_block_size, expected in (
        ("exact", 1, 1),
        ("topk:2", 1, 3),
        ("topk:3", 1, 4),
        ("exact", 3, 3),
    ):
        task = with_task_options(toy_task, block_accept=block_accept, min_block_size=min_block_size)
        generator = RiggedFirstBlock([model], task, Namespace(beam=1, max_len_b=MAX_LEN_B))
        generator.first_block = [d2, d3, d4]
        accepted.clear()
        generator.generate([model], sample)
        assert accepted[0] == [expected], (block_accept, min_block_size)


# fairseq generation options every exact decoder must follow as SequenceGenerator does: a length limit that grows with
# the batch's padded source length, a minimum length, an unk penalty and a length penalty on the score
LENGTH_AND_SCORE_OPTIONS = {"max_len_a": 0.8, "max_len_b": 2, "min_len": 4, "unkpen": 1.5, "lenpen": 0.6}


def fairseq_greedy(model, task, sample, options):
    """SequenceGenerator with beam 1 under fairseq-generate's options ``options``."""
    generator = SequenceGenerator(
        [model],
        task.target_dictionary,
        beam_size=1,
        max_len_a=options.get("max_len_a", 0),
        max_len_b=options.get("max_len_b", 200),
        min_len=options.get("min_len", 1),
        unk_penalty=options.get("unkpen", 0),
        len_penalty=options.get("lenpen", 1),
    )
    return generator.generate([model], sample)


def assert_same_hypotheses(ours, theirs):
    for mine, reference in zip(ours, theirs):
        assert mine[0]["tokens"].tolist() == reference[0]["tokens"].tolist()
        torch.testing.assert_close(
            mine[0]["positional_scores"], reference[0]["positional_scores"], rtol=1e-4, atol=1e-4
        )
        assert float(mine[0]["score"]) == pytest.approx(float(reference[0]["score"]), abs=1e-4)


def check_options_matter(decode, sample):
    """Each option of :data:`LENGTH_AND_SCORE_OPTIONS` changes what ``decode(options)`` (hypotheses) gives for
    ``sample``, so that comparing those with fairseq's covers it: --min-len, --unkpen and --lenpen change tokens or
    scores when left out, and the length limit follows the batch's padded source length."""

    def outputs(options):
        return [(h[0]["tokens"].tolist(), round(float(h[0]["score"]), 4)) for h in decode(options)]

    full = outputs(LENGTH_AND_SCORE_OPTIONS)
    for name in ("min_len", "unkpen", "lenpen"):
        assert outputs({k: v for k, v in LENGTH_AND_SCORE_OPTIONS.items() if k != name}) != full, name
    lengths = [len(tokens) - 1 for tokens, _ in full]
    limit = int(LENGTH_AND_SCORE_OPTIONS["max_len_a"] * sample["net_input"]["src_tokens"].size(1) + 2)
    assert LENGTH_AND_SCORE_OPTIONS["max_len_b"] < max(lengths) <= limit


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_acceptance_follows_fairseqs_length_unk_and_score_options(toy_task, seed):
    """--max-len-a > 0 on a batch of mixed source lengths (one limit for the batch, from its padded length, as in
    SequenceGenerator), --min-len, --unkpen and --lenpen: exact acceptance prints SequenceGenerator's beam-1
    hypotheses and scores, on models where each option changes the output (unk and EOS made likely)."""
    dictionary = toy_task.target_dictionary
    model = random_model(toy_task, 3, seed, identity_first_head=True)
    with torch.no_grad():
        model.decoder.output_projection.weight[dictionary.unk()] += torch.randn(32)
        model.decoder.output_projection.weight[dictionary.eos()] += torch.randn(32)
    sample = random_batch(dictionary, 8, seed)

    def decode(options):
        return BlockwiseGenerator([model], toy_task, Namespace(beam=1, **options)).generate([model], sample)

    assert_same_hypotheses(
        decode(LENGTH_AND_SCORE_OPTIONS), fairseq_greedy(model, toy_task, sample, LENGTH_AND_SCORE_OPTIONS)
    )
    check_options_matter(decode, sample)


def test_decoding_options_are_checked(toy_task):
    model = random_model(toy_task, 2, seed=0)
    assert parse_block_accept("exact") == 1 and parse_block_accept("topk:5") == 5
    for bad in ("topk:0", "topk", "top:3", "greedy"):
        with pytest.raises(ValueError, match="--block-accept"):
            parse_block_accept(bad)
    with pytest.raises(ValueError, match=r"--min-block-size must be between 1 and the model's --block-size \(2\)"):
        BlockwiseGenerator([model], with_task_options(toy_task, min_block_size=3), Namespace(beam=1))
    with pytest.raises(ValueError, match="ensemble"):
        BlockwiseGenerator([model, model], toy_task, Namespace(beam=1))
    with pytest.raises(ValueError, match="--nbest 2 is not supported"):
        BlockwiseGenerator([model], toy_task, Namespace(nbest=2))
    # fairseq's default --beam is 5: forgetting --beam 1 is an error, not greedy output and a log line
    with pytest.raises(
        ValueError,
        match=r"verify-accept decoding \(blockwise_transformer\) emits one greedy .*: pass --beam 1 \(got 5\)",
    ):
        BlockwiseGenerator([model], toy_task, GenerationConfig())
    with pytest.raises(ValueError, match="--int8-drafts needs a model trained with --identity-first-head"):
        BlockwiseGenerator([model], with_task_options(toy_task, int8_drafts=True), Namespace(beam=1))
    generator = BlockwiseGenerator([model], toy_task, Namespace(beam=1))
    with pytest.raises(ValueError, match="prefix_tokens .* are not supported by verify-accept decoding"):
        generator.generate([model], random_batch(toy_task.target_dictionary, 2, 0), prefix_tokens=torch.tensor([[5]]))


# ----- end to end ------------------------------------------------------------------------------------------------


def test_train_generate_interactive(dummy_data_bin, dummy_raw, tiny_teacher, tmp_path):
    """Frozen teacher + identity first head: exact verify-accept prints the teacher's greedy translations."""
    checkpoint = train_model(
        dummy_data_bin,
        str(tmp_path / "blockwise"),
        TINY_BLOCKWISE
        + [
            "--task",
            "translation_nat",
            "--block-size",
            "3",
            "--identity-first-head",
            "--freeze-base",
            "--init-from-ar",
            tiny_teacher,
            "--criterion",
            "blockwise_loss",
            "--label-smoothing",
            "0.1",
            "--eval-bleu",
            "--eval-bleu-args",
            '{"beam": 1}',
            "--lr",
            "0.005",
        ],
        max_update=30,
    )
    teacher = hypotheses(generate_lines(dummy_data_bin, tiny_teacher, ["--task", "translation_nat", "--beam", "1"]))
    lines = generate_lines(dummy_data_bin, checkpoint, ["--task", "translation_nat", "--beam", "1", "--print-step"])
    assert hypotheses(lines) == teacher
    steps = {int(line.split("\t")[0][2:]): int(line.split("\t")[1]) for line in lines if line.startswith("I-")}
    assert sorted(steps) == list(range(40))

    relaxed = generate_lines(
        dummy_data_bin,
        checkpoint,
        ["--task", "translation_nat", "--beam", "1", "--block-accept", "topk:2", "--min-block-size", "2"],
    )
    assert sorted(hypotheses(relaxed)) == list(range(40))
    with pytest.raises(ValueError, match="--min-block-size"):
        generate_lines(dummy_data_bin, checkpoint, ["--task", "translation_nat", "--min-block-size", "4"])

    with open(os.path.join(dummy_raw, "test.src")) as f:
        sources = [next(f).strip() for _ in range(3)]
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(sources) + "\n")
    inter = hypotheses(
        interactive_lines(dummy_data_bin, checkpoint, str(input_file), ["--task", "translation_nat", "--beam", "1"])
    )
    assert [inter[i] for i in range(3)] == [teacher[i] for i in range(3)]

    # fairseq-generate without --task translation_nat must refuse, saying what to add: with --user-dir the model's
    # check does it; without it, unpickling the checkpoint imports the plugin (under torch's full unpickler)
    generate = [console_script("fairseq-generate"), dummy_data_bin, "--path", checkpoint, "--cpu", "--beam", "1"]
    for extra, env in (["--user-dir", USER_DIR], {}), ([], {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
        run = subprocess.run(generate + extra, capture_output=True, text=True, env={**os.environ, **env})
        assert run.returncode != 0
        assert "run fairseq with `--user-dir nat_plugins --task translation_nat`" in run.stderr, run.stderr[-2000:]


# ----- learning (the synthetic task of tests/utils.py, from the synthetic_teacher fixture) --------------------------

LEARNING_BLOCKWISE = (
    ["--arch", "blockwise_transformer"]
    + SYNTHETIC_MODEL_SIZE
    + [
        "--task",
        "translation_nat",
        "--criterion",
        "blockwise_loss",
        "--label-smoothing",
        "0.1",
        "--block-size",
        "4",
        "--identity-first-head",
        "--use-distilled",
        "target",
        "--max-tokens",
        "2000",
        "--lr-scheduler",
        "fixed",
        "--dropout",
        "0",
    ]
)


def decode(data_bin, checkpoint, subset="test", blockwise=True, extra=()):
    """Exact verify-accept (``blockwise``) or the teacher's greedy decoding of ``subset``: hypotheses by id, BLEU
    against the references, and (blockwise) the mean accepted block: tokens incl. EOS per decoder call, from
    ``--print-step``, drafting at every step (what the heads propose, whatever the batch size)."""
    lines = generate_lines(
        data_bin,
        checkpoint,
        ["--task", "translation_nat", "--beam", "1", "--gen-subset", subset]
        + ["--print-step", "--max-drafting-sentences", str(DRAFT_EVERY_STEP)] * blockwise
        + list(extra),
    )
    hypos = hypotheses(lines)
    references = {int(key[2:]): text for key, text in (line.split("\t", 1) for line in lines if line.startswith("T-"))}
    ids = sorted(references)
    bleu = sacrebleu.corpus_bleu([hypos[i] for i in ids], [[references[i] for i in ids]]).score
    tokens = sum(len(line.split("\t")[1].split()) for line in lines if line.startswith("P-"))
    steps = sum(int(line.split("\t")[1]) for line in lines if line.startswith("I-"))
    return hypos, bleu, tokens / steps if steps else None


@pytest.fixture(scope="module")
def frozen_heads(synthetic_teacher, tmp_path_factory):
    """Stage 1 (the frozen recipe): heads 2..4 on the teacher, trained on its distilled outputs, mean over the
    heads, 120 updates at lr 0.01 without dropout (the trunk's features as decoding sees them)."""
    teacher, data_bin = synthetic_teacher
    save_dir = str(tmp_path_factory.mktemp("blockwise-frozen"))
    return train_model(
        data_bin,
        save_dir,
        LEARNING_BLOCKWISE
        + [
            "--freeze-base",
            "--init-from-ar",
            teacher,
            "--head-sampling",
            "mean",
            "--lr",
            "0.01",
            "--disable-validation",
        ],
        max_update=120,
    )


def test_frozen_heads_propose_the_teachers_greedy_output(synthetic_teacher, frozen_heads):
    """Frozen base, identity first head, k=4: exact acceptance prints the teacher's greedy output, and the heads
    learnt to propose it. Measured: mean accepted block 1.64 (120 updates; ``random`` head sampling: 1.46);
    threshold 1.5 (the issue's bar). ~23 s with the frozen stage (20 s), on 2 busy cores."""
    teacher, data_bin = synthetic_teacher
    teacher_hypos, _, _ = decode(data_bin, teacher, blockwise=False)
    hypos, _, block = decode(data_bin, frozen_heads)
    assert hypos == teacher_hypos
    assert block >= 1.5
    # heads 2..4 with int8 weights draft a little differently, and the output is still the teacher's
    hypos, _, int8_block = decode(data_bin, frozen_heads, extra=["--int8-drafts"])
    assert hypos == teacher_hypos
    assert int8_block >= block - 0.1, (int8_block, block)


@pytest.mark.parametrize("head_sampling", ["first-plus-random", "mean"])
def test_fine_tuned_blockwise_keeps_the_teachers_bleu(synthetic_teacher, frozen_heads, tmp_path, caplog, head_sampling):
    """Stage 2: every parameter fine-tuned from the frozen stage, 60 updates at lr 5e-4, heads 2..4 weighted 0.1,
    with the recipe's ``first-plus-random`` head sampling and with ``mean``. Measured: BLEU 78.9 and 84.5 vs the
    teacher's greedy 80.9, mean accepted block 1.71 and 1.81; the threshold is the teacher's BLEU - 3, which the
    collapse of the old recipes fails (same run with ``random`` head sampling: 73.7; ``mean`` with weight 1: 76.2;
    ``random`` from the teacher in one stage: 10.8). Mean accepted block >= 1.5. The validation's
    ``accepted_block`` is the mean accepted block fairseq-generate reports on the validation set. ~15 s each on 2
    busy cores."""
    teacher, data_bin = synthetic_teacher
    caplog.set_level(logging.INFO)
    checkpoint = train_model(
        data_bin,
        str(tmp_path / "finetuned"),
        LEARNING_BLOCKWISE
        + [
            "--finetune-from-model",
            frozen_heads,
            "--head-sampling",
            head_sampling,
            "--other-heads-weight",
            "0.1",
            "--lr",
            "0.0005",
            "--validate-interval",
            "1000",  # validate once, at the end
        ],
        max_update=60,
    )
    _, teacher_bleu, _ = decode(data_bin, teacher, blockwise=False)
    _, bleu, block = decode(data_bin, checkpoint)
    assert bleu >= teacher_bleu - 3, (bleu, teacher_bleu)
    assert block >= 1.5, block

    logged = [
        float(m.group(1))
        for r in caplog.records
        if "valid on 'valid' subset" in r.getMessage()
        for m in [re.search(r"accepted_block ([0-9.]+)", r.getMessage())]
        if m
    ]
    assert len(logged) == 1
    assert logged[0] == pytest.approx(decode(data_bin, checkpoint, subset="valid")[2], abs=1e-3)
