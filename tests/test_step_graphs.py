"""The static step on the bank's bucketed buffers and its CUDA graphs (nat_plugins/engine/step_graphs.py), run on the
CPU: the bank path is switched on there and a graph is replaced by its definition (a replay runs the captured call
again on the graph's own input and output tensors: what a CUDA graph replays, the same kernels on the same
addresses), so that what the graphs depend on is checked wherever the suite runs: new inputs copied into the graph's
tensors before each replay, the batch's rows kept in the first rows of the buffers as sentences leave (moved to fewer
rows at each power of two), padded slots, source positions and rows never seen, sets and graphs shared by later
batches of the same buckets and dropped with new weights, a failed capture run eagerly. Every decoder on it prints
fairseq's greedy output (up to near-ties, tests/test_gpu.py's rule). The real graphs: tests/test_gpu.py (CUDA)."""

from argparse import Namespace

import torch

from nat_plugins.engine import step_graphs
from nat_plugins.engine.config import CUDA_GRAPHS_ENV, STATE
from nat_plugins.engine.static_cache import StaticCache
from nat_plugins.generators.verify_accept_loop import GreedyLoop

from .test_block_call import random_transformer
from .test_gpu import (
    MAX_LEN_B,
    ReferenceDrafter,
    blockwise_cases,
    check_exact_decoder,
    check_graphs_print_the_eager_output,
    speculative_cases,
)
from .test_static_cache import check_steps_see_the_accepted_prefixes, full_features
from .utils import random_batch


def graphs(decoder):
    """Every graph of ``decoder``'s bank (None: a failed capture), by buffer shape and call shape."""
    _version, sets = STATE.banks[decoder]
    return {(shape, key): graph for shape, found in sets.items() for b in found for key, graph in b.graphs.items()}


def test_the_banked_step_sees_exactly_the_accepted_prefixes(toy_task, graphs_on_the_cpu):
    """Blocks of 3 new tokens per sentence, of which each keeps a different number, on a batch of 5 that leaves 3,
    then 1 sentence: every call's features equal fairseq's decoder on the accepted prefix + the block, replayed from
    graphs on buffers of 8, then 4, then 1 rows, 32 slots and 16 source positions (the rows, slots and positions past
    the batch's never seen)."""
    model = random_transformer(toy_task, seed=0).eval()
    shapes, calls = [], []

    def after_call(cache, features):
        shapes.append((cache.keys[0].size(0), cache.keys[0].size(2), cache.encoder_bias.size(-1)))
        calls.append((graphs_on_the_cpu.replays, features, features.clone()))
        # a call's features are the caller's: the next replay leaves them
        assert all(torch.equal(earlier, copy) for _, earlier, copy in calls)

    accepted_per_step = ([1, 3, 2, 1, 2], [2, 1, 3, 2, 1], [3, 3, 1], [2, 2, 1], [1], [3])
    check_steps_see_the_accepted_prefixes(toy_task, model, accepted_per_step, {2: [4, 0, 2], 4: [1]}, after_call)
    assert [replays for replays, _, _ in calls] == list(range(2, 8))  # every call replayed (BOS's first)
    assert shapes == [(8, 32, 16)] * 2 + [(4, 32, 16)] * 2 + [(1, 32, 16)] * 2
    assert {shape[2] for shape, _key in graphs(model.decoder)} == {8, 4, 1}


def test_decoders_on_the_banked_step_print_fairseqs_greedy_output(toy_task, tmp_path, graphs_on_the_cpu):
    """The plugin's greedy loop, blockwise exact acceptance and speculative exact verification (drafter and teacher
    on the bank) on batches of 8 sentences leaving at different steps and on each sentence alone: fairseq's greedy
    output up to near-ties, every step replayed from a graph."""
    model = random_transformer(toy_task, seed=3).eval()

    def greedy_loop(_reference):
        return GreedyLoop([model], toy_task, Namespace(beam=1, max_len_b=MAX_LEN_B))

    cases = [
        (model, model, greedy_loop, random_batch(toy_task.target_dictionary, 8, seed=3)),
        *blockwise_cases(toy_task, "cpu", torch.float32, 3),
        *speculative_cases(toy_task, "cpu", torch.float32, 3, tmp_path, ReferenceDrafter),
    ]
    _generators, (_diverged, _sentences, tokens, calls) = check_exact_decoder(toy_task, "cpu", torch.float32, cases)
    assert calls < tokens  # drafts were accepted
    assert graphs_on_the_cpu.replays == graphs_on_the_cpu.calls > 0
    assert STATE.capture_failures == {}


def test_every_decoder_on_the_static_step_prints_the_same_with_graphs_as_without(
    sat_task, dummy_data_bin, tmp_path, monkeypatch, graphs_on_the_cpu
):
    """The CUDA-only test of graphs against the eager step (tests/test_gpu.py), here on the CPU's stand-in graphs."""
    replays = check_graphs_print_the_eager_output(sat_task, dummy_data_bin, "cpu", torch.float32, tmp_path, monkeypatch)
    assert len(replays) == graphs_on_the_cpu.replays


def test_buffer_sets_and_graphs_serve_later_batches_until_the_weights_change(toy_task, graphs_on_the_cpu, monkeypatch):
    """A later batch of the same buckets takes the same buffers and graphs (no capture), a cache alive at once gets a
    set of its own; with NAT_CUDA_GRAPHS=0 the same buffers run eagerly, the same features bit for bit; once the
    weights change in place (as an optimizer updates them) the bank is dropped and the new graphs compute with the
    new weights."""
    model = random_transformer(toy_task, seed=0).eval()
    captures = []
    capture = step_graphs.capture
    monkeypatch.setattr(step_graphs, "capture", lambda run: captures.append(1) or capture(run))

    def decode(seed, keep_cache=None):
        sample = random_batch(toy_task.target_dictionary, 3, seed=seed)
        encoder_out = model.encoder.forward_torchscript(sample["net_input"])
        with torch.no_grad():
            cache = StaticCache(model.decoder, encoder_out, 10 + seed)
            tokens = torch.randint(4, 28, (3, 4), generator=torch.Generator().manual_seed(seed))
            slots = torch.arange(4).expand(3, 4)
            features = cache.step(tokens, slots, slots)
        expected = full_features(model, encoder_out, tokens, range(3), [4] * 3)
        return cache, features, expected

    first, _, _ = decode(0)
    sets = STATE.banks[model.decoder][1]
    (shape,) = sets
    assert len(sets[shape]) == 1 and len(captures) == 1
    alive_at_once, _, _ = decode(1)
    assert len(sets[shape]) == 2 and alive_at_once.keys[0] is not first.keys[0] and len(captures) == 2
    del first, alive_at_once
    later, graphed, _ = decode(2)
    assert len(captures) == 2  # the first set and its graph
    del later
    monkeypatch.setenv(CUDA_GRAPHS_ENV, "0")
    replays = graphs_on_the_cpu.replays
    _, eager, _ = decode(2)
    assert graphs_on_the_cpu.replays == replays and torch.equal(eager, graphed)
    monkeypatch.delenv(CUDA_GRAPHS_ENV)
    with torch.no_grad():
        for parameter in model.decoder.layers[0].parameters():
            parameter.mul_(1.5)
    _, features, expected = decode(2)
    assert len(captures) == 3 and not torch.allclose(features, graphed)
    for row, full in enumerate(expected):
        torch.testing.assert_close(features[row], full, rtol=1e-5, atol=1e-5)


def test_a_failed_capture_runs_eagerly_and_says_why(toy_task, graphs_on_the_cpu, monkeypatch):
    model = random_transformer(toy_task, seed=0).eval()
    sample = random_batch(toy_task.target_dictionary, 2, seed=0)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])

    def step():
        with torch.no_grad():
            slots = torch.zeros(2, 1, dtype=torch.long)
            return StaticCache(model.decoder, encoder_out, 8).step(slots + 2, slots, slots)

    graphed = step()

    def failing(run):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    STATE.banks.clear()
    monkeypatch.setattr(step_graphs, "capture", failing)
    assert torch.equal(step(), graphed) and torch.equal(step(), graphed)
    assert STATE.capture_failures == {"RuntimeError: operation not permitted when stream is capturing": 1}
    assert list(graphs(model.decoder).values()) == [None]


def test_a_bank_that_fills_the_device_is_dropped_for_the_new_set(toy_task, graphs_on_the_cpu, monkeypatch):
    """Out of device memory for a new buffer set, the decoder's other sets (and their graphs) are dropped and the set
    allocated again; a set a live cache holds stays its cache's."""
    model = random_transformer(toy_task, seed=0).eval()

    def cache(size, length):
        sample = random_batch(toy_task.target_dictionary, size, seed=size)
        with torch.no_grad():
            return StaticCache(model.decoder, model.encoder.forward_torchscript(sample["net_input"]), length)

    held = cache(2, 8)
    cache(1, 8), cache(1, 40)  # sets of other shapes, free once made
    sets = STATE.banks[model.decoder][1]
    assert len(sets) == 3
    new_buffers, failures = step_graphs.new_buffers, []

    def out_of_memory_once(*args):
        if not failures:
            failures.append(1)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return new_buffers(*args)

    monkeypatch.setattr(step_graphs, "new_buffers", out_of_memory_once)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    fresh = cache(4, 8)
    assert failures and list(sets) == [(torch.float32, torch.device("cpu"), 4, 32, 16)]
    assert fresh.keys[0].size(0) == 4 and held.keys[0].size(0) == 2 and not held.buffers.free()
