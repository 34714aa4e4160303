"""The static-shape decoder step (nat_plugins/engine/static_cache.py): its features equal a full recomputation by
fairseq's decoder of the prefixes each sentence accepted, whatever was rejected before, after sentences leave the
batch, pre- and post-norm; verify-accept decoding uses it wherever it runs the verifier, fairseq's cache elsewhere."""

import copy
import math
from argparse import Namespace

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from nat_plugins.engine import static_cache
from nat_plugins.engine.block_call import IncrementalCache
from nat_plugins.engine.config import STATE, TRACED_STEP_ENV
from nat_plugins.engine.cpu_linear import int8_copy
from nat_plugins.engine.static_cache import StaticCache, static_unsupported
from nat_plugins.generators.verify_accept_loop import GreedyLoop, VerifyAcceptLoop, greedy_loop_refusal
from nat_plugins.systems.recover_sat.segments import DEL_SYMBOL

from .test_block_call import RandomDrafts, random_transformer
from .test_blockwise import (
    LENGTH_AND_SCORE_OPTIONS,
    MAX_LEN_B,
    assert_same_hypotheses,
    build_model,
    check_options_matter,
    fairseq_greedy,
    greedy,
)
from .test_recover_sat import build_recover_sat
from .test_recover_sat import decode as recover_sat_decode
from .test_sat import batch as sat_batch
from .test_sat import build_sat
from .test_sat import decode as sat_decode
from .utils import TINY_TRANSFORMER, random_batch, sub_batch, with_task_options


def full_features(model, encoder_out, tokens, rows, lengths):
    """fairseq's decoder (no cache) on the first ``lengths[i]`` tokens of sentence ``rows[i]``: a (length, C) each."""
    out = []
    for row, length in zip(rows, lengths):
        row_encoder_out = model.encoder.reorder_encoder_out(encoder_out, torch.tensor([row]))
        features, _ = model.decoder(tokens[row : row + 1, :length], encoder_out=row_encoder_out, features_only=True)
        out.append(features[0])
    return out


def check_steps_see_the_accepted_prefixes(task, model, accepted_per_step, keeps, after_call=None):
    """A static cache of ``model``'s decoder on a batch of random sources: BOS, then at each step a block of 3 new
    tokens per sentence, of which sentence i keeps ``accepted_per_step[step][i]``; before step s the batch keeps the
    sentences ``keeps[s]`` (indices into the current batch). Every call's features equal fairseq's decoder on the
    accepted prefix + the block (the slots not written yet and the rejected ones, left in the buffers and overwritten
    later, never seen);
    ``after_call(cache, features)`` runs after each call. Returns the cache."""
    size = len(accepted_per_step[0])
    sample = random_batch(task.target_dictionary, size, seed=0)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    tokens = torch.randint(4, 28, (size, 14), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = task.target_dictionary.eos()  # BOS
    with torch.no_grad():
        cache = StaticCache(model.decoder, encoder_out, 16)
        for buffer in cache.keys + cache.values:
            buffer.normal_()  # as an earlier batch may leave them: never seen
        zeros = torch.zeros(size, 1, dtype=torch.long)
        features = cache.step(tokens[:, :1], zeros, zeros)
    for row, full in enumerate(full_features(model, encoder_out, tokens, range(size), [1] * size)):
        torch.testing.assert_close(features[row], full, rtol=1e-5, atol=1e-5)
    lengths, rows = torch.ones(size, dtype=torch.long), list(range(size))  # slots kept: BOS, accepted tokens
    for step, accepted in enumerate(accepted_per_step):
        if step in keeps:
            keep = torch.tensor(keeps[step])
            cache.reorder(keep)
            lengths, rows = lengths[keep], [rows[i] for i in keeps[step]]
        slots = lengths.unsqueeze(1) + torch.arange(3)
        block = tokens[rows].gather(1, slots)
        with torch.no_grad():
            features = cache.step(block, slots, slots)
        if after_call is not None:
            after_call(cache, features)
        expected = full_features(model, encoder_out, tokens, rows, (lengths + 3).tolist())
        for i, full in enumerate(expected):
            torch.testing.assert_close(features[i], full[-3:], rtol=1e-5, atol=1e-5)
        lengths = lengths + torch.tensor(accepted)
    assert model.decoder not in STATE.traces
    return cache


@pytest.mark.parametrize("pre_norm", [False, True])
def test_static_steps_see_exactly_the_accepted_prefixes(toy_task, pre_norm):
    """Blocks of 3 new tokens per sentence, of which each sentence keeps a different number: every call's features
    equal fairseq's decoder on the accepted prefix + the block, the rejected slots (left in the buffers, overwritten
    later) never seen; then a sentence leaves the batch and the others go on (a batch's step runs eagerly; the
    single sentence's trace computes the same: the next test)."""
    if pre_norm:
        arch = [a for a in TINY_TRANSFORMER if a != "--share-all-embeddings"]
        model = build_model(toy_task, None, 0, ["--decoder-normalize-before", "--encoder-normalize-before"], arch)
    else:
        model = random_transformer(toy_task, seed=0)
    check_steps_see_the_accepted_prefixes(
        toy_task,
        model.eval(),
        ([1, 3, 2], [2, 1, 3], [3, 3, 1], [2, 2]),
        {3: [0, 2]},  # sentence 1 ends
    )
    assert model.decoder not in STATE.traces


def test_the_traced_step_computes_the_eager_steps_features_and_follows_new_weights(toy_task, monkeypatch):
    """The trace runs the eager step's operations: the same features bit for bit, at any source and buffer length
    (one trace per width serves them all), and the same buffers written; a batch of 2 runs eagerly (no trace made);
    once the weights change (in place, as an optimizer does), a new trace computes with the new weights, not the ones
    the first trace held."""
    monkeypatch.setattr(static_cache, "EAGER_CALLS_BEFORE_TRACING", 0)
    model = random_transformer(toy_task, seed=0).eval()

    def features(traced, batch_size, length, seed):
        monkeypatch.setenv(TRACED_STEP_ENV, "1" if traced else "0")
        sample = random_batch(toy_task.target_dictionary, batch_size, seed=seed)
        with torch.no_grad():
            cache = StaticCache(model.decoder, model.encoder.forward_torchscript(sample["net_input"]), length)
            generator = torch.Generator().manual_seed(seed)
            for buffer in cache.keys + cache.values:
                buffer.normal_(generator=generator)  # slots written earlier: seen by the queries
            slots = torch.arange(4, 8).expand(batch_size, 4)
            tokens = torch.randint(4, 28, slots.shape, generator=generator)
            return cache.step(tokens, slots, slots), cache.keys + cache.values

    for batch_size, length, seed in ((1, 12, 0), (1, 20, 1), (2, 12, 2), (1, 9, 3)):
        (eager, eager_buffers), (traced, traced_buffers) = (
            features(False, batch_size, length, seed),
            features(True, batch_size, length, seed),
        )
        assert torch.equal(eager, traced)
        assert all(torch.equal(a, b) for a, b in zip(eager_buffers, traced_buffers))
    (key, trace), *others = STATE.traces[model.decoder][1].items()
    assert key == (torch.float32, 1, 4, False, False) and not others
    assert isinstance(trace, torch.jit.ScriptModule)  # a trace, not the eager fallback
    before = features(True, 1, 12, 0)[0]
    with torch.no_grad():
        for parameter in model.decoder.layers[0].parameters():
            parameter.mul_(1.5)
    after, _ = features(True, 1, 12, 0)
    assert torch.equal(after, features(False, 1, 12, 0)[0])
    assert not torch.allclose(after, before)


def test_a_width_is_traced_once_it_recurs(toy_task):
    """A width's first EAGER_CALLS_BEFORE_TRACING calls run eagerly (a trace costs ~70 ms and pays only for widths a
    loop repeats), the next one makes its trace; a width called fewer times, as the drafter's once-per-batch call on
    the prefix the batch's greedy steps emitted, gets none."""
    model = random_transformer(toy_task, seed=0).eval()
    sample = random_batch(toy_task.target_dictionary, 1, seed=0)
    with torch.no_grad():
        cache = StaticCache(model.decoder, model.encoder.forward_torchscript(sample["net_input"]), 12)
        for call in range(static_cache.EAGER_CALLS_BEFORE_TRACING + 1):
            assert (torch.float32, 1, 2, False, False) not in STATE.traces.get(model.decoder, (None, {}))[1], call
            slots = torch.tensor([[3, 4]])
            cache.step(torch.tensor([[5, 9]]), slots, slots)
        slots = torch.arange(5).unsqueeze(0)
        cache.step(torch.tensor([[2, 5, 9, 7, 6]]), slots, slots)
    traces = STATE.traces[model.decoder][1]
    assert isinstance(traces[(torch.float32, 1, 2, False, False)], torch.jit.ScriptModule)
    assert (torch.float32, 1, 5, False, False) not in traces


def test_decoding_between_training_updates_uses_the_updated_weights(toy_task, monkeypatch):
    """``--eval-bleu`` decodes the model being trained between updates, and fairseq's optimizers update ``p.data``,
    which leaves the version counters the caches' keys read: a forward in training mode drops the traces and the fused
    q/k/v projections, so the next decoding computes with the new weights (as fairseq's own forward does)."""
    monkeypatch.setattr(static_cache, "EAGER_CALLS_BEFORE_TRACING", 0)
    model = random_transformer(toy_task, seed=0).eval()
    sample = random_batch(toy_task.target_dictionary, 1, seed=0)
    tokens = torch.tensor([[toy_task.target_dictionary.eos(), 5, 9]])
    slots = torch.arange(3).unsqueeze(0)

    def static_features():
        with torch.no_grad():
            encoder_out = model.encoder.forward_torchscript(sample["net_input"])
            return StaticCache(model.decoder, encoder_out, 6).step(tokens, slots, slots), encoder_out

    before, _ = static_features()
    assert isinstance(STATE.traces[model.decoder][1][(torch.float32, 1, 3, False, False)], torch.jit.ScriptModule)
    model.train()
    model(**sample["net_input"], prev_output_tokens=tokens)  # a training forward ...
    for parameter in model.decoder.parameters():
        parameter.data.mul_(1.1)  # ... and an update as fairseq's Adam writes it (p.data: no version bump)
    model.eval()
    after, encoder_out = static_features()
    (expected,) = full_features(model, encoder_out, tokens, [0], [3])
    torch.testing.assert_close(after[0], expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


def test_an_int8_decoders_step_is_traced_too(toy_task, monkeypatch):
    """An int8 copy (``--int8-drafts``, ``--int8-decoder``) cannot be traced as a function of the tensors (its packed
    weights must belong to a traced module): its step runs the module's frozen trace, with the eager step's features
    bit for bit."""
    monkeypatch.setattr(static_cache, "EAGER_CALLS_BEFORE_TRACING", 0)
    model = random_transformer(toy_task, seed=0).eval()
    decoder = int8_copy(model.decoder, "the decoder")
    sample = random_batch(toy_task.target_dictionary, 1, seed=0)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    slots = torch.arange(2, 5).unsqueeze(0)
    tokens = torch.tensor([[5, 9, 7]])
    out = {}
    for traced in ("0", "1"):
        monkeypatch.setenv(TRACED_STEP_ENV, traced)
        with torch.no_grad():
            out[traced] = StaticCache(decoder, encoder_out, 8).step(tokens, slots, slots)
    assert isinstance(STATE.traces[decoder][1][(torch.float32, 1, 3, False, False)], torch.jit.ScriptModule)
    assert torch.equal(out["0"], out["1"])


def test_the_static_step_is_used_where_it_runs_the_verifier(toy_task):
    model = random_transformer(toy_task, seed=0)
    model.eval()
    sample = random_batch(toy_task.target_dictionary, 2, seed=0)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    loop = VerifyAcceptLoop([model], toy_task, Namespace(beam=1), verifier=model, call_width=2)
    assert isinstance(loop.new_cache(encoder_out, 8), StaticCache)
    model.decoder.train()
    assert static_unsupported(model.decoder, encoder_out) == "the decoder is in training mode (dropout)"
    assert isinstance(loop.new_cache(encoder_out, 8), IncrementalCache)
    with pytest.raises(ValueError, match="cannot run this decoder: the decoder is in training mode"):
        StaticCache(model.decoder, encoder_out, 8)
    model.decoder.eval()
    assert static_unsupported(model.decoder, {"encoder_out": []}) == "no encoder output"


def test_translation_nat_decodes_a_plain_transformer_greedily_with_the_plugins_loop(toy_task):
    """``--task translation_nat --beam 1`` on an AR checkpoint: the plugin's greedy loop (what fairseq-generate
    passes to build_generator included), fairseq's greedy output token for token; fairseq's generator for what the
    loop does not implement."""
    model = random_transformer(toy_task, seed=2)
    model.eval()
    sample = random_batch(toy_task.target_dictionary, 6, seed=2)
    fairseq_generate_kwargs = {"extra_gen_cls_kwargs": {"lm_model": None, "lm_weight": 0.0}}
    generator = toy_task.build_generator([model], Namespace(beam=1, max_len_b=MAX_LEN_B), **fairseq_generate_kwargs)
    assert isinstance(generator, GreedyLoop)
    hypos = generator.generate([model], sample)
    for hypo, reference in zip(hypos, greedy(model, toy_task, sample)):
        assert hypo[0]["tokens"].tolist() == reference[0]["tokens"].tolist()
        torch.testing.assert_close(
            hypo[0]["positional_scores"], reference[0]["positional_scores"], rtol=1e-4, atol=1e-4
        )
    for other in (dict(beam=4), dict(beam=1, sampling=True), dict(beam=1, nbest=2)):
        assert isinstance(toy_task.build_generator([model], Namespace(**other)), SequenceGenerator), other
    assert greedy_loop_refusal([model, model], Namespace(beam=1)) == "an ensemble"
    assert greedy_loop_refusal([model], Namespace(beam=1), extra_gen_cls_kwargs={"lm_model": model, "lm_weight": 1})


@pytest.mark.parametrize("seed", [0, 1])
def test_the_greedy_loop_follows_fairseqs_length_unk_and_score_options(toy_task, seed):
    """The plugin's greedy loop on a batch of mixed source lengths (sentences leave it at different steps) under
    --max-len-a, --min-len, --unkpen and --lenpen prints SequenceGenerator's beam-1 hypotheses and scores, on models
    where each option changes the output (unk and EOS made likely)."""
    dictionary = toy_task.target_dictionary
    model = random_transformer(toy_task, seed)
    model.eval()
    with torch.no_grad():
        model.decoder.output_projection.weight[dictionary.unk()] += torch.randn(32)
        model.decoder.output_projection.weight[dictionary.eos()] += 3 * torch.randn(32)
    sample = random_batch(dictionary, 8, seed)

    def decode(options):
        generator = toy_task.build_generator([model], Namespace(beam=1, **options))
        assert isinstance(generator, GreedyLoop)
        return generator.generate([model], sample)

    assert_same_hypotheses(
        decode(LENGTH_AND_SCORE_OPTIONS), fairseq_greedy(model, toy_task, sample, LENGTH_AND_SCORE_OPTIONS)
    )
    check_options_matter(decode, sample)


def test_an_int8_decoder_decodes_greedily_in_the_plugins_loop(toy_task):
    """``--int8-decoder``: the plugin's greedy loop over an int8 copy of the decoder; at batch 1 (activations
    quantized over one row per call) the static step prints what fairseq's cache path prints on that copy, close to
    the float32 model's output; the model itself keeps its float32 decoder. Refused where the loop would not run."""
    model = random_transformer(toy_task, seed=2)
    model.eval()
    sample = random_batch(toy_task.target_dictionary, 6, seed=2)
    task = with_task_options(toy_task, int8_decoder=True)
    float32_decoder = model.decoder
    generator = task.build_generator([model], Namespace(beam=1, max_len_b=MAX_LEN_B))
    assert isinstance(generator, GreedyLoop) and model.decoder is float32_decoder
    assert type(generator.verifier.decoder.layers[0].fc1) is not type(float32_decoder.layers[0].fc1)
    incremental = GreedyLoop([model], task, Namespace(beam=1, max_len_b=MAX_LEN_B))
    incremental.new_cache = lambda encoder_out, length: IncrementalCache(incremental.verifier.decoder)
    float32 = greedy(model, toy_task, sample)
    agree = 0
    for i in range(6):
        one = sub_batch(sample, i)
        static_hypo, cache_hypo = generator.generate([model], one)[0][0], incremental.generate([model], one)[0][0]
        assert static_hypo["tokens"].tolist() == cache_hypo["tokens"].tolist()
        torch.testing.assert_close(static_hypo["positional_scores"], cache_hypo["positional_scores"])
        agree += static_hypo["tokens"].tolist() == float32[i][0]["tokens"].tolist()
    assert agree >= 3, f"only {agree}/6 outputs of the int8 decoder are the float32 model's"
    with pytest.raises(ValueError, match="--int8-decoder decodes with the plugin's greedy loop.*beam search"):
        task.build_generator([model], Namespace(beam=4))
    with pytest.raises(ValueError, match="--int8-decoder runs the decoder on the CPU in float32"):
        GreedyLoop([copy.deepcopy(model).half()], task, Namespace(beam=1))


def ending_at_random(decoder, ends):
    """Make ``decoder``'s output layer emit token ``ends[i]`` where feature i of a row is more than a standard
    deviation above its mean over the call's rows (a random model's outputs hardly depend on the source): sentences
    (and segments) end at different steps, the same on any path that computes the same features."""
    output_layer = decoder.output_layer

    def layer(features, *args):
        logits = output_layer(features, *args)
        best = logits.max(dim=-1).values
        for i, end in enumerate(ends):
            feature = features[..., i]
            logits[..., end] = best + 10.0 * (feature - feature.mean() - feature.std())
        return logits

    decoder.output_layer = layer


@pytest.mark.parametrize(
    "kind, group_size, banked",
    [("sat", 2, False), ("sat", 3, False), ("recover_sat", 2, False), ("recover_sat", 3, False)]
    + [("sat", 2, True), ("recover_sat", 3, True)],
)
def test_grouped_decoding_prints_the_same_on_the_static_cache_as_on_fairseqs(
    dummy_data_bin, sat_task, monkeypatch, request, kind, group_size, banked
):
    """SAT group decoding and RecoverSAT segment decoding on the static cache print what they print on fairseq's
    incremental cache (same tokens, scores up to rounding) in a batch whose sentences leave it at different steps
    and, for RecoverSAT, whose ended segments feed padding (hidden from the later steps); ``banked``: on the CUDA
    path's buffers and graphs (tests/test_step_graphs.py), every step replayed."""
    counts = request.getfixturevalue("graphs_on_the_cpu") if banked else None
    task = sat_task
    torch.manual_seed(0)
    model = (build_sat if kind == "sat" else build_recover_sat)(dummy_data_bin, task, group_size)
    ends = [task.target_dictionary.eos()]
    if kind == "recover_sat":
        ends.append(task.target_dictionary.index(DEL_SYMBOL))
    ending_at_random(model.decoder, ends)
    sample = sat_batch(task, range(12))
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    assert isinstance(model.decoder.new_cache(encoder_out, 8), StaticCache)
    decode = sat_decode if kind == "sat" else recover_sat_decode
    # greedy: SAT's beam search is fairseq's with fairseq's cache; RecoverSAT's decode is greedy
    options = dict(beam=1, max_len_b=20) if kind == "sat" else dict(max_len_b=20)
    static = decode(model, task, sample, **options)
    if banked:
        assert counts.replays == counts.calls > 0
    monkeypatch.setattr(model.decoder, "new_cache", lambda encoder_out, length: IncrementalCache(model.decoder))
    incremental = decode(model, task, sample, **options)
    steps = {hyps[0]["steps"] for hyps in static}
    assert len(steps) > 1, "every sentence left the batch at the same step: the test does not reorder the cache"
    if kind == "recover_sat":
        assert any(min(map(len, h[0]["segments"])) < h[0]["steps"] - 1 for h in static), "no segment ended early"
    for fast, reference in zip(static, incremental):
        assert fast[0]["tokens"].tolist() == reference[0]["tokens"].tolist()
        assert fast[0]["steps"] == reference[0]["steps"]
        torch.testing.assert_close(
            fast[0]["positional_scores"], reference[0]["positional_scores"], rtol=1e-4, atol=1e-4
        )


def exact_paths(model, task, gen_args):
    """Every exact decoder of a plain Transformer: the plugin's greedy loop as ``--task translation_nat --beam 1``
    builds it (the static step), and verify-accept decoding with random drafts (3 tokens a call) on the static
    step, on fairseq's incremental cache (:class:`IncrementalCache`) and without a cache: ``{name: generator}``."""
    generators = {"greedy loop": task.build_generator([model], gen_args)}
    assert isinstance(generators["greedy loop"], GreedyLoop)
    for name in ("static", "fairseq cache", "no cache"):
        loop = RandomDrafts([model], task, gen_args, verifier=model, call_width=3, use_cache=name != "no cache")
        loop.rng, loop.max_drafting_sentences = torch.Generator().manual_seed(0), math.inf
        if name == "fairseq cache":
            loop.new_cache = lambda encoder_out, length, loop=loop: IncrementalCache(loop.verifier.decoder)
        generators[f"random drafts, {name}"] = loop
    return generators


def test_a_teacher_with_layernorm_embedding_decodes_to_fairseqs_greedy_output(toy_task):
    """A Transformer trained with --layernorm-embedding (normalizes token + position embeddings before the first
    layer; large positional embeddings, so the output depends on them): the static step and the lean forward take it
    (nothing refuses it), and every exact path prints fairseq's greedy output, batched and alone."""
    arch = [a for a in TINY_TRANSFORMER if a != "--share-all-embeddings"]
    extra = ["--decoder-layers", "2", "--decoder-learned-pos", "--layernorm-embedding"]
    model = build_model(toy_task, None, 3, extra, arch)
    assert model.decoder.layernorm_embedding is not None
    with torch.no_grad():
        model.decoder.embed_positions.weight.mul_(10)
        model.decoder.output_projection.weight[toy_task.target_dictionary.eos()] += 0.5 * torch.randn(32)
    sample = random_batch(toy_task.target_dictionary, 6, seed=3)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    assert static_unsupported(model.decoder, encoder_out) is None
    assert greedy_loop_refusal([model], Namespace(beam=1)) is None
    reference = greedy(model, toy_task, sample)
    assert len({tuple(h[0]["tokens"].tolist()) for h in reference}) == 6  # outputs that depend on the source
    for name, generator in exact_paths(model, toy_task, Namespace(beam=1, max_len_b=MAX_LEN_B)).items():
        batched = generator.generate([model], sample)
        alone = [generator.generate([model], sub_batch(sample, i))[0] for i in range(6)]
        for i, expected in enumerate(reference):
            for hypo in (batched[i][0], alone[i][0]):
                assert hypo["tokens"].tolist() == expected[0]["tokens"].tolist(), (name, i)
                torch.testing.assert_close(
                    hypo["positional_scores"], expected[0]["positional_scores"], rtol=1e-4, atol=1e-4
                )


def test_the_exact_loops_stop_where_the_models_positions_end(toy_task):
    """A model with --max-target-positions 8 and a length limit (--max-len-b 200) far beyond it: fairseq's
    SequenceGenerator emits at most 7 tokens and EOS (its last position is reserved); every exact path prints that,
    batched and alone."""
    arch = [a for a in TINY_TRANSFORMER if a != "--share-all-embeddings"]
    model = build_model(toy_task, None, 0, ["--decoder-layers", "2", "--max-target-positions", "8"], arch)
    assert model.max_decoder_positions() == 8
    sample = random_batch(toy_task.target_dictionary, 6, seed=0)
    reference = fairseq_greedy(model, toy_task, sample, {"max_len_b": 200})
    lengths = [len(h[0]["tokens"]) for h in reference]
    assert max(lengths) == 8, lengths  # the cap binds: 7 tokens and the forced EOS
    for name, generator in exact_paths(model, toy_task, Namespace(beam=1, max_len_b=200)).items():
        batched = generator.generate([model], sample)
        alone = [generator.generate([model], sub_batch(sample, i))[0] for i in range(6)]
        for i, expected in enumerate(reference):
            for hypo in (batched[i][0], alone[i][0]):
                assert len(hypo["tokens"]) == lengths[i], (name, i, hypo["tokens"].tolist())
                assert hypo["tokens"].tolist() == expected[0]["tokens"].tolist(), (name, i)
