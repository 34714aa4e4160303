"""The shared verify-accept machinery (nat_plugins/generators/verify_accept_loop.py and the decoder helpers of
nat_plugins/engine/block_call.py) on a plain fairseq ``transformer`` verifier, as speculative decoding uses it:
exact acceptance == the verifier's greedy decoding whatever the drafts (batched and alone, cache on and off), and
drafts that are always right are accepted k per call."""

import math
from argparse import Namespace

import pytest
import torch
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.sequence_generator import SequenceGenerator

from nat_plugins.engine.block_call import (
    cached_length,
    decoder_block_features,
    rollback_cache,
    target_position_embeddings,
)
from nat_plugins.generators.verify_accept_loop import VerifyAcceptLoop

from .test_blockwise import MAX_LEN_B, build_model, greedy
from .utils import TINY_TRANSFORMER, random_batch, sub_batch


def random_transformer(task, seed):
    """A random 2-layer plain ``transformer`` whose greedy outputs vary (see test_blockwise.random_model)."""
    arch = [a for a in TINY_TRANSFORMER if a != "--share-all-embeddings"]
    model = build_model(task, None, seed, ["--decoder-layers", "2", "--decoder-learned-pos"], arch)
    with torch.no_grad():
        model.decoder.embed_positions.weight.mul_(10)
        model.decoder.output_projection.weight[task.target_dictionary.eos()] += 0.5 * torch.randn(32)
    return model


class RandomDrafts(VerifyAcceptLoop):
    """Drafts drawn at random from the vocabulary (an untrained drafter)."""

    def propose(self, first, features, tokens, last, max_len):
        high = len(self.tgt_dict)
        return torch.randint(self.tgt_dict.nspecial, high, (first.size(0), self.call_width - 1), generator=self.rng)


class OracleDrafts(VerifyAcceptLoop):
    """Drafts copied from the verifier's greedy output (``reference``: one token tensor per sentence)."""

    def start(self, sample, encoder_out):
        width = max(len(r) for r in self.reference) + self.call_width + 1
        self.target = torch.full((len(self.reference), width), self.eos)
        for row, tokens in enumerate(self.reference):
            self.target[row, 1 : len(tokens) + 1] = tokens  # target[:, t] = y_t
        self.rows = torch.arange(len(self.reference))

    def reorder(self, keep):
        self.rows = self.rows[keep]

    def propose(self, first, features, tokens, last, max_len):
        assert torch.equal(tokens.gather(1, (last + 1).unsqueeze(1)).squeeze(1), first)
        index = last.unsqueeze(1) + torch.arange(2, self.call_width + 1)
        return self.target[self.rows].gather(1, index)


def decode(generator_class, model, task, sample, block_size, use_cache=True, **attributes):
    generator = generator_class(
        [model],
        task,
        Namespace(beam=1, max_len_b=MAX_LEN_B),
        verifier=model,
        call_width=block_size,
        use_cache=use_cache,
    )
    for name, value in attributes.items():
        setattr(generator, name, value)
    return generator.generate([model], sample)


@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_exact_acceptance_with_random_drafts_is_the_plain_transformers_greedy_output(toy_task, block_size):
    for seed in range(3):
        model = random_transformer(toy_task, seed)
        sample = random_batch(toy_task.target_dictionary, 6, seed)
        reference = greedy(model, toy_task, sample)
        for use_cache in (True, False):
            rng = torch.Generator().manual_seed(seed)
            batched = decode(RandomDrafts, model, toy_task, sample, block_size, use_cache, rng=rng)
            for i in range(6):
                alone = decode(RandomDrafts, model, toy_task, sub_batch(sample, i), block_size, use_cache, rng=rng)
                for hypo in (batched[i][0], alone[0][0]):
                    assert hypo["tokens"].tolist() == reference[i][0]["tokens"].tolist()
                    torch.testing.assert_close(
                        hypo["positional_scores"], reference[i][0]["positional_scores"], rtol=1e-4, atol=1e-4
                    )


@pytest.mark.parametrize("block_size", [2, 3])
def test_drafts_that_are_always_right_are_accepted_k_per_call(toy_task, block_size):
    model = random_transformer(toy_task, seed=1)
    sample = random_batch(toy_task.target_dictionary, 6, seed=1)
    reference = [h[0]["tokens"] for h in greedy(model, toy_task, sample)]
    hypos = decode(
        OracleDrafts, model, toy_task, sample, block_size, reference=reference, max_drafting_sentences=math.inf
    )
    for hyps, tokens in zip(hypos, reference):
        assert hyps[0]["tokens"].tolist() == tokens.tolist()
        # the first call gives y_1; then every call accepts k tokens until EOS, which may be a call's argmax
        assert hyps[0]["steps"] == 1 + -(-(len(tokens) - 1) // block_size)
    assert any(len(tokens) > block_size + 1 for tokens in reference)


def test_rolled_back_batched_cache_is_compact_and_equals_recomputation(toy_task):
    """Sentences that accept different numbers of new slots: each row keeps its accepted prefix first, the cache is
    as long as the longest prefix, the mask hides the rest of shorter rows, and every call sees exactly the accepted
    prefixes (its features equal a full recomputation of them)."""
    model = random_transformer(toy_task, seed=0)
    sample = random_batch(toy_task.target_dictionary, 3, seed=0)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    tokens = torch.randint(4, 28, (3, 12), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = toy_task.target_dictionary.eos()  # BOS
    lengths = torch.ones(3, dtype=torch.long)  # slots each sentence keeps: BOS, then its accepted tokens
    cache = {}
    decoder_block_features(model.decoder, tokens[:, :1], torch.zeros(3, 1, dtype=torch.long), encoder_out, cache)
    for accepted in ([1, 3, 2], [2, 1, 3], [3, 3, 1]):
        positions = lengths.unsqueeze(1) + torch.arange(3)
        features = decoder_block_features(model.decoder, tokens.gather(1, positions), positions, encoder_out, cache)
        for row in range(3):
            prefix = tokens[row : row + 1, : int(lengths[row]) + 3]
            row_encoder_out = model.encoder.reorder_encoder_out(encoder_out, torch.tensor([row]))
            full, _ = model.decoder(prefix, encoder_out=row_encoder_out, features_only=True)
            torch.testing.assert_close(features[row], full[0, -3:], rtol=1e-5, atol=1e-5)
        rollback_cache(model.decoder, cache, 3, torch.tensor(accepted))
        lengths += torch.tensor(accepted)
        assert cached_length(model.decoder, cache) == int(lengths.max())
        for layer in model.decoder.layers:
            mask = layer.self_attn._get_input_buffer(cache)["prev_key_padding_mask"]
            assert mask.tolist() == [[float(s >= n) for s in range(int(lengths.max()))] for n in lengths.tolist()]


def test_the_sinusoidal_table_follows_the_positions_device(toy_task):
    """Upstream fairseq 0.12 keeps the sinusoidal table in a plain attribute (fairseq-fixed: a buffer), on the CPU
    until its own forward moves it: the block call moves it to the positions' device (here the meta device, the other
    device a CPU test has) and keeps it there, as that forward does."""
    model = build_model(toy_task, None, 0, (), [a for a in TINY_TRANSFORMER if a != "--share-all-embeddings"])
    embed = model.decoder.embed_positions
    assert isinstance(embed, SinusoidalPositionalEmbedding)
    table = embed._buffers.pop("weights")
    embed.weights = table  # upstream's layout
    positions = torch.arange(3, device="meta").unsqueeze(0)
    embedded = target_position_embeddings(model.decoder, positions)
    assert embedded.device == positions.device and embedded.shape == (1, 3, 32)
    assert embed.weights.device == positions.device


def test_a_floating_point_near_tie_is_where_fairseqs_greedy_output_may_differ(toy_task):
    """The claim's boundary, on a rigged near-tie: tokens A < B get logits 8 and the float below (4.8e-7 apart), above
    every other token. Exact acceptance emits the argmax of the verifier's logits, A, at every position. fairseq's
    greedy search ranks log-probability + running score in fp32 with topk: it picks A wherever those two values
    differ and either token where they round equal (once the running score is large enough), after which the outputs
    may differ. The test asserts both rules, that such ties happen here, and that the outputs agree up to the first."""
    a, b = 10, 20
    model = random_transformer(toy_task, seed=0)
    original = model.decoder.output_layer

    def rigged(features):
        logits = original(features)
        logits[..., a] = 8.0
        logits[..., b] = torch.tensor(8.0).nextafter(torch.tensor(0.0))
        return logits

    model.decoder.output_layer = rigged
    sample = sub_batch(random_batch(toy_task.target_dictionary, 1, seed=0), 0)
    ours = decode(RandomDrafts, model, toy_task, sample, 3, rng=torch.Generator().manual_seed(0))[0][0]
    assert ours["tokens"].tolist() == [a] * MAX_LEN_B + [toy_task.target_dictionary.eos()]

    fairseq = SequenceGenerator([model], toy_task.target_dictionary, beam_size=1, max_len_b=MAX_LEN_B)
    ranked = []  # per step: fairseq's fp32 ranking values of A and B, and its pick
    step = fairseq.search.step

    def recording_step(index, lprobs, scores, *args, **kwargs):
        values = lprobs[0, 0] if index == 0 else lprobs[0, 0] + scores[0, 0, index - 1]
        picked = step(index, lprobs, scores, *args, **kwargs)
        ranked.append((float(values[a]), float(values[b]), int(picked[1][0, 0])))
        return picked

    fairseq.search.step = recording_step
    theirs = fairseq.generate([model], sample)[0][0]["tokens"].tolist()
    ties = [i for i, (value_a, value_b, _) in enumerate(ranked[:MAX_LEN_B]) if value_a == value_b]
    for value_a, value_b, picked in ranked[:MAX_LEN_B]:
        assert value_a >= value_b and picked in ((a, b) if value_a == value_b else (a,))
    assert ties, "no fp32 tie: the rigged near-tie no longer exercises the boundary"
    assert theirs[: ties[0]] == ours["tokens"].tolist()[: ties[0]]


@pytest.mark.parametrize("limit", [0, 12, None, math.inf])
def test_a_batch_of_64_takes_greedy_steps_until_few_sentences_are_left(toy_task, limit):
    """``max_drafting_sentences``: batch 64, greedy steps while more than ``limit`` sentences decode (None: the CPU
    default, 1), then drafts (this model's outputs: 3 to 15 tokens, 8 sentences at the length limit). Random drafts:
    fairseq's greedy output (SequenceGenerator, batch 64) token for token. Drafts that are always right: one call per
    token with greedy steps only (0), ceil((n-1)/k) + 1 calls when drafting at every step (inf), and in between the
    sentences that end among the last ``limit`` save calls."""
    model = random_transformer(toy_task, seed=2)
    sample = random_batch(toy_task.target_dictionary, 64, seed=2)
    reference = greedy(model, toy_task, sample)
    tokens = [h[0]["tokens"] for h in reference]
    rng = torch.Generator().manual_seed(2)
    random_drafts = decode(RandomDrafts, model, toy_task, sample, 3, rng=rng, max_drafting_sentences=limit)
    assert [h[0]["tokens"].tolist() for h in random_drafts] == [t.tolist() for t in tokens]
    oracle = decode(OracleDrafts, model, toy_task, sample, 3, reference=tokens, max_drafting_sentences=limit)
    assert [h[0]["tokens"].tolist() for h in oracle] == [t.tolist() for t in tokens]
    steps = [h[0]["steps"] for h in oracle]
    greedy_steps = [len(t) for t in tokens]
    drafting_steps = [1 + -(-(len(t) - 1) // 3) for t in tokens]
    if limit == 0:
        assert steps == greedy_steps and all(h[0]["drafting_steps"] == 0 for h in oracle)
    elif limit == math.inf:
        assert steps == drafting_steps
    else:
        assert all(d <= s <= g for d, s, g in zip(drafting_steps, steps, greedy_steps))
        assert limit is None or sum(drafting_steps) < sum(steps) < sum(greedy_steps)
    assert all(h[0]["drafting_steps"] <= h[0]["steps"] for h in oracle)
