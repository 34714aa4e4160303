"""The lean decoding forward of fairseq's decoder layers (nat_plugins/engine/lean_decoder.py): the same features as
fairseq's layers, with a cache (batches with padding, post-norm and pre-norm) and without one
(``test_fused_projections_follow_the_weights``), and the cache it leaves is the one fairseq's layers would leave, its
self-attention and encoder-attention entries alike, after every call, rollback and reorder. Every comparison checks
that the lean forward did run (no layer's own forward called, its own cache entry written) where it was asked for."""

import os

import pytest
import torch
import torch.nn.functional as F
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from nat_plugins.engine.block_call import decoder_stack_features, rollback_cache, self_attention_buffers
from nat_plugins.engine.lean_decoder import lean_unsupported

from .test_blockwise import build_model
from .utils import REPO_ROOT, TINY_TRANSFORMER, random_batch

TORCH_SDPA = F.scaled_dot_product_attention


def random_decoder_model(task, pre_norm):
    arch = [a for a in TINY_TRANSFORMER if a != "--share-all-embeddings"]
    extra = ["--decoder-layers", "2"] + (["--decoder-normalize-before"] if pre_norm else [])
    return build_model(task, None, 0, extra, arch).eval()


def features(model, embedded, positions, encoder_out, cache, attn_mask, padding_mask, lean, lean_runs=None):
    """The decoder stack's features with the lean forward asked for (``lean``) or not, checking which forward ran:
    the lean one calls no layer's own forward (``lean_runs``, by default ``lean``), fairseq's calls each layer
    once."""
    called = []
    hooks = [
        layer.register_forward_pre_hook(lambda module, args: called.append(module)) for layer in model.decoder.layers
    ]
    try:
        output = decoder_stack_features(
            model.decoder, embedded, positions, encoder_out, cache, attn_mask, padding_mask, lean=lean
        )
    finally:
        for hook in hooks:
            hook.remove()
    lean_ran = lean if lean_runs is None else lean_runs
    assert called == ([] if lean_ran else list(model.decoder.layers)), f"lean forward expected: {lean_ran}"
    return output


def assert_same_caches(decoder, caches):
    """The lean forward's cache (``caches[True]``) holds fairseq's (``caches[False]``): every self-attention and
    encoder-attention entry fairseq stores, equal (the lean encoder attention keeps its padding bias beside them:
    the entry only the lean forward writes, which shows that it filled ``caches[True]``)."""
    for layer in decoder.layers:
        for attention in (layer.self_attn, layer.encoder_attn):
            fairseqs, leans = (attention._get_input_buffer(caches[lean]) for lean in (False, True))
            assert fairseqs and set(fairseqs) <= set(leans)
            if attention is layer.encoder_attn:
                assert "lean_padding_bias" in leans and "lean_padding_bias" not in fairseqs, (
                    sorted(leans),
                    sorted(fairseqs),
                )
            for name, tensor in fairseqs.items():
                if tensor is None:
                    assert leans[name] is None, name
                else:
                    torch.testing.assert_close(leans[name].to(tensor.dtype), tensor, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_lean_forward_equals_fairseqs_layers_with_a_cache_padding_and_rollback(toy_task, pre_norm):
    """Three sentences read a padded prefix, then blocks of new slots against the cache, the cache rolled back to
    different lengths per sentence in between: every call's features and the cache equal fairseq's."""
    model = random_decoder_model(toy_task, pre_norm)
    decoder = model.decoder
    sample = random_batch(toy_task.target_dictionary, 3, seed=0)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    generator = torch.Generator().manual_seed(0)
    caches = {False: {}, True: {}}
    width = 4
    prefix = torch.randn(3, width, 32, generator=generator)
    padding = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    causal = decoder.buffered_future_mask(prefix.transpose(0, 1))
    positions = torch.arange(width).expand(3, -1)
    with torch.no_grad():
        outputs = {
            lean: features(model, prefix, positions, encoder_out, caches[lean], causal, padding, lean)
            for lean in (False, True)
        }
        torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-5, atol=1e-5)
        assert_same_caches(decoder, caches)
        cached = width
        for accepted in ([1, 3, 2], [2, 1, 3]):
            block = torch.randn(3, 3, 32, generator=generator)
            mask = torch.cat([torch.zeros(3, cached), decoder.buffered_future_mask(block.transpose(0, 1))], dim=1)
            positions = cached + torch.arange(3).expand(3, -1)
            new_padding = torch.zeros(3, 3)
            for lean in (False, True):
                outputs[lean] = features(model, block, positions, encoder_out, caches[lean], mask, new_padding, lean)
                rollback_cache(decoder, caches[lean], 3, torch.tensor(accepted))
            torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-5, atol=1e-5)
            assert_same_caches(decoder, caches)
            cached = self_attention_buffers(decoder, caches[False])[0]["prev_key"].size(2)
        # sentences leaving the batch: fairseq's reorder of the lean cache, then one more call each way
        keep = torch.tensor([2, 0])
        block = torch.randn(2, 1, 32, generator=generator)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, keep)
        for lean in (False, True):
            decoder.reorder_incremental_state_scripting(caches[lean], keep)
        assert_same_caches(decoder, caches)
        for lean in (False, True):
            outputs[lean] = features(
                model, block, torch.full((2, 1), cached), encoder_out, caches[lean], None, torch.zeros(2, 1), lean
            )
        torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-5, atol=1e-5)
        assert_same_caches(decoder, caches)


class ExtendedLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with one more sublayer (as Encoder-NAD-AD's layers add an attention)."""

    def forward(self, x, *args, **kwargs):
        x, attn, state = super().forward(x, *args, **kwargs)
        return x + 1, attn, state


def test_lean_forward_runs_only_in_evaluation_and_on_supported_layers(toy_task):
    """In training (dropout) and on layers it does not implement (NormFormer's ``attn_ln``; a subclass of fairseq's
    layer, whose extra sublayers it would skip), the layers' own forward runs: the result is theirs."""
    model = random_decoder_model(toy_task, pre_norm=False)
    assert lean_unsupported(model.decoder) is None
    sample = random_batch(toy_task.target_dictionary, 2, seed=1)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    embedded = torch.randn(2, 3, 32)
    positions = torch.arange(3).expand(2, -1)

    def both(lean_runs=False):
        """The features with the lean forward asked for and not, under the same dropout masks; ``lean_runs``:
        whether the lean forward runs when asked for (checked by :func:`features`)."""
        outputs = []
        for lean in (False, True):
            torch.manual_seed(0)
            outputs.append(
                features(model, embedded, positions, encoder_out, None, None, None, lean, lean_runs=lean and lean_runs)
            )
        return outputs

    with torch.no_grad():
        evaluation = both(lean_runs=True)[0]
        model.train()
        trained = both()
        assert model.decoder.dropout_module.p > 0 and not torch.allclose(trained[0], evaluation)  # dropout ran
        assert torch.equal(trained[1], trained[0])  # fairseq's forward, dropout included, both times
        model.eval()
        model.decoder.layers[0].attn_ln = torch.nn.LayerNorm(32)  # what --scale-attn adds
        assert "attn_ln" in lean_unsupported(model.decoder)
        normformer = both()
        assert torch.equal(normformer[1], normformer[0])  # the unsupported layer ran fairseq's forward both times
        model.decoder.layers[0].attn_ln = None
        model.decoder.layers[1].__class__ = ExtendedLayer
        assert lean_unsupported(model.decoder) == "layer 1 is a ExtendedLayer, not fairseq's TransformerDecoderLayer"
        extended = both()
        assert torch.equal(extended[1], extended[0])
        torch.testing.assert_close(extended[0], evaluation + 1)  # its own forward: the extra sublayer ran
        model.decoder.layers[1].__class__ = TransformerDecoderLayerBase
        model.decoder.layers[0].encoder_attn.scaling = 0.3  # F.scaled_dot_product_attention's is head_dim ** -0.5
        assert lean_unsupported(model.decoder) == "attention scaling 0.3 (not head_dim ** -0.5)"
        rescaled = both()
        assert torch.equal(rescaled[1], rescaled[0])


def test_fused_projections_follow_the_weights(toy_task):
    """The concatenated q/k/v weights are rebuilt when a projection changes (an optimizer step between two
    validations is an in-place update): the lean forward keeps equal to fairseq's."""
    model = random_decoder_model(toy_task, pre_norm=False)
    sample = random_batch(toy_task.target_dictionary, 2, seed=2)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    embedded = torch.randn(2, 3, 32)
    positions = torch.arange(3).expand(2, -1)
    causal = model.decoder.buffered_future_mask(embedded.transpose(0, 1))
    with torch.no_grad():
        for _ in range(2):
            both = [features(model, embedded, positions, encoder_out, None, causal, None, lean) for lean in (0, 1)]
            torch.testing.assert_close(both[1], both[0], rtol=1e-5, atol=1e-5)
            model.decoder.layers[0].self_attn.k_proj.weight.mul_(2.0)


def test_lean_forward_continues_a_cache_fairseqs_layers_filled(toy_task):
    """A cache begun by fairseq's layers (its encoder keys and padding mask included) and continued by the lean
    forward gives what fairseq's layers give on it: the padded sources stay hidden."""
    model = random_decoder_model(toy_task, pre_norm=False)
    sample = random_batch(toy_task.target_dictionary, 3, seed=3)
    encoder_out = model.encoder.forward_torchscript(sample["net_input"])
    assert encoder_out["encoder_padding_mask"][0].any()  # the batch's sources differ in length
    generator = torch.Generator().manual_seed(3)
    prefix, block = torch.randn(3, 2, 32, generator=generator), torch.randn(3, 1, 32, generator=generator)
    caches = {False: {}, True: {}}
    with torch.no_grad():
        for cache in caches.values():
            causal = model.decoder.buffered_future_mask(prefix.transpose(0, 1))
            features(model, prefix, torch.arange(2).expand(3, -1), encoder_out, cache, causal, None, lean=False)
        outputs = [
            features(model, block, torch.full((3, 1), 2), encoder_out, caches[lean], None, None, lean)
            for lean in (False, True)
        ]
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


def sdpa_of_torch_2_0(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False):
    """``F.scaled_dot_product_attention`` with torch 2.0's signature (``scale=`` came with torch 2.1)."""
    sdpa_of_torch_2_0.calls += 1
    return TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


sdpa_of_torch_2_0.calls = 0


def test_lean_forward_needs_only_torch_2_0s_attention(toy_task, monkeypatch):
    """pyproject.toml allows torch >= 2.0: with that version's ``F.scaled_dot_product_attention`` the lean forward
    runs and equals fairseq's layers (the rest of its torch calls are older)."""
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        assert '"torch>=2.0",' in f.read()  # the floor this test stands for
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa_of_torch_2_0)
    monkeypatch.setattr(sdpa_of_torch_2_0, "calls", 0)
    test_lean_forward_equals_fairseqs_layers_with_a_cache_padding_and_rollback(toy_task, pre_norm=True)
    assert sdpa_of_torch_2_0.calls > 0  # the lean forward attended through torch 2.0's signature
