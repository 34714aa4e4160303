"""The shared non-autoregressive decoder blocks (nat_plugins/modules/nad.py) on fixed tensors: copy by fertility,
uniform copy, the self-masking mask, sublayer order of the NAD layer, and padding invariance of the decoder."""

import pytest
import torch
from fairseq.models.transformer import TransformerConfig

from nat_plugins.modules.nad import (
    HIDDEN,
    LengthPredictor,
    NonAutoregressiveDecoder,
    copy_source,
    fertility_copy_index,
    self_attention_mask,
    uniform_fertility,
)


def tiny_config(normalize_before=False):
    cfg = TransformerConfig()
    cfg.encoder.embed_dim = cfg.decoder.embed_dim = 16
    cfg.decoder.ffn_embed_dim = 32
    cfg.decoder.attention_heads = 2
    cfg.decoder.normalize_before = normalize_before
    cfg.dropout = 0.0
    return cfg


def test_copy_by_fertility_on_a_left_padded_source():
    # row 0: left padding (2 columns), then fertilities 2, 0, 1, 3 and EOS (0); row 1: 1, 2, then EOS and padding
    fertility = torch.tensor([[0, 0, 2, 0, 1, 3, 0], [1, 2, 0, 0, 0, 0, 0]])
    index, padding = fertility_copy_index(fertility)
    assert index.tolist() == [[2, 2, 4, 5, 5, 5], [0, 1, 1, 0, 0, 0]]
    assert padding.tolist() == [[False] * 6, [False, False, False, True, True, True]]
    source = torch.arange(2 * 7).view(2, 7, 1).float()
    copied = copy_source(source, index).squeeze(-1)
    assert copied[0].tolist() == [2, 2, 4, 5, 5, 5]
    assert copied[1, :3].tolist() == [7, 8, 8]


def test_copy_by_fertility_with_zero_total_and_max_length():
    index, padding = fertility_copy_index(torch.zeros(1, 3, dtype=torch.long))
    assert padding.tolist() == [[True]]  # at least one (padding) position
    index, padding = fertility_copy_index(torch.tensor([[3, 2]]), max_length=4)
    assert index.tolist() == [[0, 0, 0, 1]] and not padding.any()
    with pytest.raises(ValueError, match=">= 0"):
        fertility_copy_index(torch.tensor([[1, -1]]))


@pytest.mark.parametrize("target_length", [1, 2, 3, 5, 7, 11])
def test_uniform_fertility_is_round_down_of_t_times_n_over_T(target_length):
    copyable = torch.tensor([[False, True, True, True, False], [True, True, False, False, False]])
    fertility = uniform_fertility(copyable, torch.tensor([target_length, target_length]))
    assert fertility.sum(dim=1).tolist() == [target_length, target_length]
    assert fertility.masked_select(~copyable).eq(0).all()
    index, _ = fertility_copy_index(fertility)
    for row, offset, n in ((0, 1, 3), (1, 0, 2)):
        expected = [offset + (t * n) // target_length for t in range(target_length)]
        assert index[row, :target_length].tolist() == expected


def test_self_attention_mask_hides_only_the_diagonal():
    reference = torch.zeros(1)
    assert self_attention_mask(3, False, reference) is None
    mask = self_attention_mask(3, True, reference)
    assert mask.tolist() == [[HIDDEN, 0, 0], [0, HIDDEN, 0], [0, 0, HIDDEN]]


def test_length_predictor_ignores_padding():
    torch.manual_seed(0)
    predictor = LengthPredictor(4, 10)
    states = torch.randn(1, 3, 4)
    padded = torch.cat([states, torch.randn(1, 2, 4) * 100], dim=1)
    mask = torch.tensor([[False, False, False, True, True]])
    assert torch.allclose(predictor(states, torch.zeros(1, 3, dtype=torch.bool)), predictor(padded, mask), atol=1e-5)


def test_nad_layer_order_is_self_positional_encoder_ffn():
    """Post-norm: each sublayer ends in its own LayerNorm; recording the calls gives the order."""
    torch.manual_seed(0)
    decoder = NonAutoregressiveDecoder(tiny_config(), 1, padding_idx=1, mask_self_diagonal=True).eval()
    layer, calls = decoder.layers[0], []
    for name in ("self_attn", "pos_attn", "encoder_attn", "fc1"):
        getattr(layer, name).register_forward_hook(lambda *_, name=name: calls.append(name))
    inputs = torch.randn(2, 3, 16)
    encoder_out = {
        "encoder_out": [torch.randn(4, 2, 16)],
        "encoder_padding_mask": [torch.zeros(2, 4, dtype=torch.bool)],
    }
    decoder(inputs, torch.zeros(2, 3, dtype=torch.bool), encoder_out)
    assert calls == ["self_attn", "pos_attn", "encoder_attn", "fc1"]


def test_positional_attention_uses_positions_as_query_and_key():
    """With identity value/output projections, positional attention of a one-position input returns the input."""
    torch.manual_seed(0)
    decoder = NonAutoregressiveDecoder(tiny_config(), 1, padding_idx=1, mask_self_diagonal=False).eval()
    attn = decoder.layers[0].pos_attn
    seen = {}
    attn.register_forward_hook(lambda _m, args, kwargs, _out: seen.update(kwargs), with_kwargs=True)
    inputs = torch.randn(1, 3, 16)
    encoder_out = {
        "encoder_out": [torch.randn(2, 1, 16)],
        "encoder_padding_mask": [torch.zeros(1, 2, dtype=torch.bool)],
    }
    decoder(inputs, torch.zeros(1, 3, dtype=torch.bool), encoder_out)
    positions = decoder.positions(torch.zeros(1, 3, dtype=torch.bool)).transpose(0, 1)
    assert torch.equal(seen["query"], positions) and torch.equal(seen["key"], positions)
    assert not torch.equal(seen["value"], positions)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_decoder_output_ignores_padding_and_one_token_targets_are_finite(normalize_before):
    torch.manual_seed(0)
    decoder = NonAutoregressiveDecoder(tiny_config(normalize_before), 2, padding_idx=1, mask_self_diagonal=True).eval()
    inputs = torch.randn(2, 4, 16)
    padding = torch.tensor([[False] * 4, [False, True, True, True]])
    encoder_out = {
        "encoder_out": [torch.randn(3, 2, 16)],
        "encoder_padding_mask": [torch.zeros(2, 3, dtype=torch.bool)],
    }
    states, _ = decoder(inputs, padding, encoder_out)
    assert torch.isfinite(states).all()
    alone, _ = decoder(
        inputs[1:, :1],
        padding[1:, :1],
        {
            "encoder_out": [encoder_out["encoder_out"][0][:, 1:]],
            "encoder_padding_mask": [encoder_out["encoder_padding_mask"][0][1:]],
        },
    )
    assert torch.allclose(alone[0, 0], states[1, 0], atol=1e-5)
