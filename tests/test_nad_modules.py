"""The shared non-autoregressive decoder blocks (nat_plugins/modules/nat_decoder.py) on fixed tensors: copy by
fertility, uniform copy, the self-masking mask, the length predictor's padding invariance, sublayer order and
LayerNorm placement of the NAD layer, the positional attention (positions as query and key, states as value, on both
of fairseq's attention paths; checkpoint layout unchanged), and padding invariance and finite states of the decoder."""

import pytest
import torch
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import MultiheadAttention

from nat_plugins.modules.nat_decoder import (
    HIDDEN,
    LengthPredictor,
    NADLayer,
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


def encoder_out_of(batch_size, source_length=4):
    return {
        "encoder_out": [torch.randn(source_length, batch_size, 16)],
        "encoder_padding_mask": [torch.zeros(batch_size, source_length, dtype=torch.bool)],
    }


@pytest.mark.parametrize("normalize_before", [False, True])
def test_nad_layer_order_is_self_positional_encoder_ffn(normalize_before):
    """Each sublayer has its own LayerNorm, after it (post-norm) or before it (pre-norm); recording the calls gives
    the order: self-attention -> positional attention -> encoder attention -> FFN."""
    torch.manual_seed(0)
    cfg = tiny_config(normalize_before)
    decoder = NonAutoregressiveDecoder(cfg, 1, padding_idx=1, mask_self_diagonal=True).eval()
    layer, calls = decoder.layers[0], []
    sublayers = ("self_attn", "pos_attn", "encoder_attn", "fc1")
    norms = ("self_attn_layer_norm", "pos_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
    for name in sublayers + norms:
        getattr(layer, name).register_forward_hook(lambda *_, name=name: calls.append(name))
    decoder(torch.randn(2, 3, 16), torch.zeros(2, 3, dtype=torch.bool), encoder_out_of(2))
    pairs = zip(norms, sublayers) if normalize_before else zip(sublayers, norms)
    assert calls == [name for pair in pairs for name in pair]


def test_positional_attention_uses_positions_as_query_and_key():
    """Gu et al. §3.1: the positional encodings are the query and the key, the layer's hidden states the value;
    with identity value/output projections, positional attention of a one-position input returns that value."""
    torch.manual_seed(0)
    decoder = NonAutoregressiveDecoder(tiny_config(), 1, padding_idx=1, mask_self_diagonal=False).eval()
    attn = decoder.layers[0].pos_attn
    with torch.no_grad():
        for projection in (attn.v_proj, attn.out_proj):
            projection.weight.copy_(torch.eye(16))
            projection.bias.zero_()
    seen = {}
    attn.register_forward_hook(lambda _m, _args, kwargs, out: seen.update(kwargs, output=out[0]), with_kwargs=True)
    decoder(torch.randn(3, 1, 16), torch.zeros(3, 1, dtype=torch.bool), encoder_out_of(3))
    positions = decoder.positions(torch.zeros(3, 1, dtype=torch.bool)).transpose(0, 1)
    assert torch.equal(seen["query"], positions) and torch.equal(seen["key"], positions)
    assert not torch.allclose(seen["value"], positions)  # the states after self-attention
    assert torch.allclose(seen["output"], seen["value"], atol=1e-6)


def test_positional_attention_values_are_the_states_on_both_of_fairseqs_paths(monkeypatch):
    """fairseq's MultiheadAttention computes through torch's fused ``F.multi_head_attention_forward`` or, with an
    ``incremental_state``, TorchScript, ONNX export or ``skip_embed_dim_check``, through its own projections, where an
    encoder-decoder attention takes its values from the key (``v_proj(key)``). The positional attention (Gu et al.
    §3.1: positions as query and key, states as value) must give the same output on both paths, and depend on the
    values: the whole NAD (with padding) on fairseq's own path == on the fused one."""
    torch.manual_seed(0)
    decoder = NonAutoregressiveDecoder(tiny_config(), 2, padding_idx=1, mask_self_diagonal=True).eval()
    attn = decoder.layers[0].pos_attn
    fused_calls = []
    fused = torch.nn.functional.multi_head_attention_forward
    monkeypatch.setattr(
        torch.nn.functional,
        "multi_head_attention_forward",
        lambda *args, **kwargs: fused_calls.append(1) or fused(*args, **kwargs),
    )
    T, B = 4, 2
    states, other_states = torch.randn(T, B, 16), torch.randn(T, B, 16)
    padding = torch.tensor([[False] * 4, [False, False, True, True]])
    positions = decoder.positions(padding).transpose(0, 1)

    def run(values, **kwargs):
        fused_calls.clear()
        out = attn(query=positions, key=positions, value=values, key_padding_mask=padding, **kwargs)[0]
        return out, len(fused_calls)

    out, fused_used = run(states, need_weights=False)
    assert fused_used == 1
    assert not torch.allclose(run(other_states)[0], out)  # the output depends on the values...
    assert not torch.allclose(run(positions)[0], out)  # ...which are not the key
    slow, fused_used = run(states, incremental_state={})  # fairseq's own path (as in incremental decoding)
    assert fused_used == 0 and torch.allclose(slow, out, atol=1e-6)
    assert not torch.allclose(run(other_states, incremental_state={})[0], slow)

    inputs, encoder_out = torch.randn(B, T, 16), encoder_out_of(B)
    nad_fused, _ = decoder(inputs, padding, encoder_out)
    for module in decoder.modules():
        if isinstance(module, MultiheadAttention):
            monkeypatch.setattr(module, "skip_embed_dim_check", True)  # bypasses the fused path
    fused_calls.clear()
    nad_own, _ = decoder(inputs, padding, encoder_out)
    assert not fused_calls
    assert torch.allclose(nad_own[~padding], nad_fused[~padding], atol=1e-5)


def test_positional_attention_keeps_the_checkpoint_layout(monkeypatch):
    """The positional attention has the parameter names, shapes and initial values of the fairseq encoder
    attention it was built as before, so the whole NAD's state dict is unchanged and existing checkpoints load."""
    torch.manual_seed(0)
    ours = NonAutoregressiveDecoder(tiny_config(), 2, padding_idx=1, mask_self_diagonal=False).state_dict()
    monkeypatch.setattr(NADLayer, "build_positional_attention", NADLayer.build_encoder_attention)
    torch.manual_seed(0)
    before = NonAutoregressiveDecoder(tiny_config(), 2, padding_idx=1, mask_self_diagonal=False).state_dict()
    assert "layers.1.pos_attn.v_proj.weight" in ours and ours.keys() == before.keys()
    assert all(torch.equal(ours[name], before[name]) for name in ours)


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
