"""diagsink.regularize: the regularizers on any nn.MultiheadAttention equal the package layer."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from diagsink.regularize import (
    as_temporal_attention,
    is_regularized,
    regularize,
    unregularize,
)

B, T, C, H = 3, 7, 8, 2
CASES = [("mask", True), ("penalty", True), ("dropout", True), ("dropout", False)]


def _pair(diag, shared, batch_first, dropout=0.0, train=False):
    mha = nn.MultiheadAttention(C, H, batch_first=batch_first, dropout=dropout)
    reg = regularize(mha, diag, p=0.4, penalty=-0.7, shared=shared).train(train)
    ta = as_temporal_attention(mha, diag=diag, diag_p=0.4, diag_penalty=-0.7, diag_shared=shared)
    return reg, ta.train(train)


def _call(reg, x, seed, **kw):
    """The regularized MHA on ``x`` ``[B, T, C]``, in its own layout; returns ``[B, T, C]``."""
    xi = x if reg.batch_first else x.transpose(0, 1)
    torch.manual_seed(seed)
    out = reg(xi, xi, xi, **kw)[0]
    return out if reg.batch_first else out.transpose(0, 1)


@pytest.mark.parametrize("diag, shared", CASES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("train", [False, True])
def test_equals_temporal_attention(diag, shared, batch_first, train):
    reg, ta = _pair(diag, shared, batch_first, train=train)
    x = torch.randn(B, T, C)
    torch.manual_seed(5)
    expected = ta(x)
    torch.testing.assert_close(_call(reg, x, 5, need_weights=False), expected)
    torch.testing.assert_close(_call(reg, x, 5), expected)  # need_weights=True path too


@pytest.mark.parametrize("diag, shared", [("dropout", True), ("dropout", False)])
def test_dropout_pattern_changes_with_seed_and_vanishes_in_eval(diag, shared):
    reg, _ = _pair(diag, shared, True, train=True)
    x = torch.randn(B, T, C)
    assert not torch.allclose(_call(reg, x, 1), _call(reg, x, 2))
    reg.eval()
    plain = copy.deepcopy(reg)
    unregularize(plain)
    torch.testing.assert_close(_call(reg, x, 1), _call(plain, x, 2))  # eval: no dropout


def test_attention_dropout_draws_in_the_same_order():
    """Diagonal pattern first, then the attention dropout: the same seed, the same output."""
    reg, ta = _pair("dropout", False, True, dropout=0.3, train=True)
    x = torch.randn(B, T, C)
    torch.manual_seed(9)
    expected = ta(x)
    torch.testing.assert_close(_call(reg, x, 9), expected)


def _reference(ta, x, mask):
    """TemporalAttention's attention core with an extra additive logit mask ``[..., T, T]``."""
    logits = ta.scores(x) + mask  # draws the diagonal pattern as ta(x) does
    v = ta.split_heads(ta.v_proj(x))
    return ta.out_proj(ta.merge_heads(torch.softmax(logits, dim=-1) @ v))


@pytest.mark.parametrize("diag, shared", CASES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("kind", ["attn_mask", "key_padding_mask", "both", "causal"])
def test_with_masks_equals_temporal_attention_core(diag, shared, batch_first, train, kind):
    """TemporalAttention has no mask argument: compare with its core plus the same mask."""
    reg, ta = _pair(diag, shared, batch_first, train=train)
    x = torch.randn(B, T, C)
    extra = torch.zeros(B, 1, T, T)
    kw = {}
    if kind in ("attn_mask", "both"):
        kw["attn_mask"] = torch.rand(T, T) < 0.2
        kw["attn_mask"].fill_diagonal_(False)
        kw["attn_mask"][:, 0] = False  # every row keeps two keys: never all -inf
        extra = extra.masked_fill(kw["attn_mask"], -math.inf)
    if kind in ("key_padding_mask", "both"):
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[1, -2:] = True
        kw["key_padding_mask"] = pad
        extra = extra.masked_fill(pad[:, None, None, :], -math.inf)
    if kind == "causal":
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        # step 0 has one key; mask and dropout can remove it (a NaN row): let it see step 1
        causal[0, 1] = 0.0
        kw.update(attn_mask=causal, is_causal=True)
        extra = extra + causal
    torch.manual_seed(3)
    expected = _reference(ta, x, extra)
    torch.testing.assert_close(_call(reg, x, 3, **kw), expected)


def test_state_dict_round_trip_and_undo():
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(C, H, 16, batch_first=True), 2)
    keys = list(model.state_dict())
    reg = regularize(model, "penalty", penalty=-0.3)
    assert reg is not model and list(reg.state_dict()) == keys
    assert not any(is_regularized(m) for m in model.modules())  # the original is untouched
    fresh = nn.TransformerEncoder(nn.TransformerEncoderLayer(C, H, 16, batch_first=True), 2)
    fresh.load_state_dict(reg.state_dict())  # into the original class ...
    reg.load_state_dict(fresh.state_dict())  # ... and back
    x = torch.randn(2, T, C)
    model.eval()
    reg.eval()
    fresh.eval()
    assert not torch.allclose(reg(x), model(x), atol=1e-4)  # the penalty changes the output
    back = unregularize(reg)
    assert back is reg and not any(is_regularized(m) for m in reg.modules())
    assert all("forward" not in m.__dict__ and not m._forward_pre_hooks for m in reg.modules())
    torch.testing.assert_close(reg(x), model(x))


def test_inplace_and_encoder_fast_path_turned_off():
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(C, H, 16, batch_first=True), 1)
    model.eval()
    out = regularize(model, "mask", inplace=True)
    assert out is model and model.use_nested_tensor is False
    x = torch.randn(2, T, C)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[0, -1] = True
    with torch.no_grad():  # eval and no grad: the fused path would skip the mask
        y = model(x, src_key_padding_mask=pad)
    layer = model.layers[0]
    ta = as_temporal_attention(layer.self_attn, diag="mask")
    core = _reference(ta, x, torch.zeros(2, 1, T, T).masked_fill(pad[:, None, None], -math.inf))
    with torch.no_grad():
        z = layer.norm1(x + layer.dropout1(core))
        expected = layer.norm2(z + layer._ff_block(z))
    torch.testing.assert_close(y, expected)
    unregularize(model)
    assert model.use_nested_tensor is True


def test_decoder_cross_attention_left_alone():
    dec = nn.TransformerDecoderLayer(C, H, 16, batch_first=True)
    reg = regularize(dec, "mask")
    assert is_regularized(reg.self_attn) and not is_regularized(reg.multihead_attn)
    reg(torch.randn(2, T, C), torch.randn(2, 5, C))  # runs: the cross-attention is not touched


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: regularize(nn.Linear(3, 3), "mask"), "no self-attention"),
        (lambda: regularize(nn.MultiheadAttention(C, H), "diagonal"), "not a regularizer"),
        (lambda: regularize(nn.MultiheadAttention(C, H), None), "unregularize"),
        (lambda: regularize(nn.MultiheadAttention(C, H), "dropout", p=1.0), r"\[0, 1\)"),
        (lambda: regularize(nn.MultiheadAttention(C, H), "penalty", penalty=math.inf), "finite"),
        (lambda: regularize("model", "mask"), "torch.nn.Module"),
        (lambda: unregularize(nn.MultiheadAttention(C, H)), "nothing in this model"),
        (
            lambda: regularize(regularize(nn.MultiheadAttention(C, H), "mask"), "mask"),
            "regularized already",
        ),
        (lambda: as_temporal_attention(nn.MultiheadAttention(C, H, add_bias_kv=True)), "bias_kv"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.bad_input
def test_cross_attention_call_is_a_clear_error():
    reg = regularize(nn.MultiheadAttention(C, H, batch_first=True), "mask")
    q, kv = torch.randn(2, 4, C), torch.randn(2, T, C)
    with pytest.raises(ValueError, match="cross-attention"):
        reg(q, kv, kv)


@pytest.mark.bad_input
def test_mask_on_length_one_is_a_clear_error():
    reg = regularize(nn.MultiheadAttention(C, H, batch_first=True), "mask")
    x = torch.randn(2, 1, C)
    with pytest.raises(ValueError, match="T=1"):
        reg(x, x, x)


def test_acts_through_a_public_forward_pre_hook():
    """The module keeps PyTorch's own forward; a pre-hook passes the bias as ``attn_mask``, and
    the package reads no private attribute of ``nn.MultiheadAttention``."""
    import inspect

    import diagsink.regularize as R

    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    reg = regularize(mha, "penalty", penalty=-0.5)
    assert "forward" not in vars(reg) and type(reg).forward is nn.MultiheadAttention.forward
    x = torch.randn(3, 5, 8)
    seen = []
    reg.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw.get("attn_mask")), with_kwargs=True
    )
    reg(x, x, x)
    torch.testing.assert_close(seen[0], -0.5 * torch.eye(5))  # the bias, as attn_mask
    assert "_qkv_same_embed_dim" not in inspect.getsource(R)
    unregularize(reg)
    seen.clear()
    reg(x, x, x)
    assert seen == [None]  # the hook is gone: the caller's (absent) mask reaches the forward
