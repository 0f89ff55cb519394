"""TemporalAttention: shapes, the three diagonal regularizers, the two paths, nn.MultiheadAttention, bad input.

The layer and the regularizers are explained in ``book/attention.ipynb``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import diagsink as ds
from diagsink import exercises
from diagsink.attention import DIAG_OPTIONS, diagonal_bias

ALL_DIAGS = list(DIAG_OPTIONS)


def _layer(c=8, h=2, dtype=torch.float64, **kw) -> ds.TemporalAttention:
    return ds.TemporalAttention(c, h, **kw).to(dtype)


def _diagonal(a: torch.Tensor) -> torch.Tensor:
    return a.diagonal(dim1=-2, dim2=-1)


def _by_hand_logits(layer: ds.TemporalAttention, x: torch.Tensor) -> torch.Tensor:
    """q k^T / sqrt(d_h) per head, written without the layer's helpers: [..., H, T, T]."""
    H, d = layer.n_heads, layer.d_head
    q = layer.q_proj(x)
    k = layer.k_proj(x)
    qs = torch.stack([q[..., h * d : (h + 1) * d] for h in range(H)], dim=-3)
    ks = torch.stack([k[..., h * d : (h + 1) * d] for h in range(H)], dim=-3)
    return torch.einsum("...id,...jd->...ij", qs, ks) / math.sqrt(d)


# ------------------------------------------------------------------------------- layer behaviour
@pytest.mark.parametrize("diag", ALL_DIAGS)
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_shapes_and_rows_sum_to_one(diag, lead):
    layer = _layer(diag=diag).train()
    x = torch.randn(*lead, 7, 8, dtype=torch.float64)
    y, attn = layer(x, return_attention=True)
    assert y.shape == x.shape
    assert attn.shape == (*lead, 2, 7, 7)
    torch.testing.assert_close(attn.sum(-1), torch.ones(*lead, 2, 7, dtype=torch.float64))
    assert layer(x).shape == x.shape


def test_leading_axes_are_independent_sequences():
    layer = _layer(diag="penalty")
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    y, attn = layer(x, return_attention=True)
    for b in range(2):
        for n in range(3):
            yb, ab = layer(x[b, n], return_attention=True)
            torch.testing.assert_close(y[b, n], yb)
            torch.testing.assert_close(attn[b, n], ab)


def test_mask_gives_exact_zero_diagonal():
    layer = _layer(diag="mask")
    _, attn = layer(torch.randn(4, 9, 8, dtype=torch.float64), return_attention=True)
    assert bool((_diagonal(attn) == 0).all())
    assert bool((attn + torch.eye(9, dtype=torch.float64) > 0).all()), (
        "off-diagonal weights stay positive"
    )


def test_mask_with_one_step_raises_instead_of_nan():
    layer = _layer(diag="mask")
    x = torch.randn(3, 1, 8, dtype=torch.float64)
    for kwargs in ({}, {"return_attention": True}):
        with pytest.raises(ValueError, match=r"T=1.*no key"):
            layer(x, **kwargs)
    with pytest.raises(ValueError, match="T=1"):
        diagonal_bias(1, "mask")


@pytest.mark.parametrize("diag", [None, "dropout", "penalty"])
def test_one_step_is_defined_for_the_other_options(diag):
    layer = _layer(diag=diag, diag_p=0.9).train()
    y, attn = layer(torch.randn(5, 1, 8, dtype=torch.float64), return_attention=True)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(attn, torch.ones_like(attn))  # the only key gets all the weight
    if diag == "dropout":  # an explicit pattern cannot drop the only key either
        with pytest.raises(ValueError, match="T=1"):
            layer(torch.randn(1, 8, dtype=torch.float64), dropped=torch.tensor([True]))


def test_dropout_acts_only_in_training():
    torch.manual_seed(1)
    base = _layer()
    drop = _layer(diag="dropout", diag_p=0.5)
    drop.load_state_dict(base.state_dict())
    x = torch.randn(4, 12, 8, dtype=torch.float64)
    drop.eval()
    torch.testing.assert_close(drop(x), base(x), rtol=0, atol=0)
    assert drop.bias(x) is None
    drop.train()
    _, attn = drop(x, return_attention=True)
    assert bool((_diagonal(attn) == 0).any()), "training mode drops diagonal entries"
    assert not torch.allclose(drop(x), base(x))


def test_shared_pattern_is_the_same_for_every_sequence_and_head():
    torch.manual_seed(2)
    layer = _layer(diag="dropout", diag_p=0.5, diag_shared=True).train()
    x = torch.randn(4, 3, 12, 8, dtype=torch.float64)
    _, attn = layer(x, return_attention=True)
    zero = _diagonal(attn) == 0  # [4, 3, H, T]
    flat = zero.reshape(-1, 12)
    assert 0 < int(flat[0].sum()) < 12
    assert bool((flat == flat[0]).all()), "the paper's pattern is shared by batch, nodes and heads"
    assert layer.bias(x).shape == (12, 12), "a shared pattern is a [T, T] bias that broadcasts"


def test_independent_patterns_differ_between_sequences_and_heads():
    torch.manual_seed(3)
    layer = _layer(diag="dropout", diag_p=0.5, diag_shared=False).train()
    x = torch.randn(4, 3, 12, 8, dtype=torch.float64)
    _, attn = layer(x, return_attention=True)
    zero = _diagonal(attn) == 0  # [4, 3, H, T]
    flat = zero.reshape(-1, 12)
    distinct = {tuple(row.tolist()) for row in flat}
    assert len(distinct) > flat.shape[0] // 2, "patterns are drawn independently"
    assert not bool((zero[..., 0, :] == zero[..., 1, :]).all()), (
        "the two heads get different patterns"
    )
    assert 0.3 < float(zero.double().mean()) < 0.7, "about diag_p of the diagonal is dropped"
    assert layer.bias(x).shape == (4, 3, 2, 12, 12)


def test_fixed_dropped_pattern_is_honoured():
    layer = _layer(diag="dropout").eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    dropped = torch.tensor([True, False, True, False, False])
    _, attn = layer(x, return_attention=True, dropped=dropped)
    torch.testing.assert_close(_diagonal(attn) == 0, dropped.expand(2, 2, 5))
    per_head = torch.tensor(
        [[True, False, False, False, False], [False, False, False, False, True]]
    )
    _, attn = layer(x, return_attention=True, dropped=per_head)
    torch.testing.assert_close(_diagonal(attn) == 0, per_head.expand(2, 2, 5))


@pytest.mark.parametrize(
    "dropped, match",
    [
        (torch.zeros(4, dtype=torch.bool), "T=5"),
        (torch.zeros(3, 2, 5, dtype=torch.bool), "broadcast"),
        (torch.zeros(1, 2, 2, 5, dtype=torch.bool), "broadcast"),  # more axes than [batch, H, T]
        (torch.full((5,), 0.5), "booleans"),
    ],
)
def test_bad_dropped_pattern_raises(dropped, match):
    layer = _layer(diag="dropout")
    with pytest.raises(ValueError, match=match):
        layer(torch.randn(2, 5, 8, dtype=torch.float64), dropped=dropped)


def test_dropped_with_another_diag_raises():
    with pytest.raises(ValueError, match="diag='dropout'"):
        _layer(diag="penalty")(
            torch.randn(5, 8, dtype=torch.float64), dropped=torch.zeros(5, dtype=torch.bool)
        )


def test_penalty_is_added_after_the_scaling():
    layer = _layer(c=12, h=3, diag="penalty", diag_penalty=-0.37)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    plain = _by_hand_logits(layer, x)
    diff = layer.scores(x) - plain
    torch.testing.assert_close(
        diff, -0.37 * torch.eye(6, dtype=torch.float64).expand_as(diff), rtol=0, atol=1e-12
    )
    # and the forward pass uses exactly these logits
    _, attn = layer(x, return_attention=True)
    torch.testing.assert_close(
        attn, torch.softmax(plain - 0.37 * torch.eye(6, dtype=torch.float64), -1)
    )


def test_scores_without_regularizer_are_plain_scaled_dot_products():
    layer = _layer(c=12, h=4)
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    torch.testing.assert_close(layer.scores(x), _by_hand_logits(layer, x))


def test_residual_false_drops_only_the_identity():
    with_res = _layer(diag="penalty")
    without = _layer(diag="penalty", residual=False)
    without.load_state_dict(with_res.state_dict())
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(with_res(x) - without(x), x)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_normalisation_by_hand(norm):
    layer = _layer(norm=norm)
    plain = _layer(residual=False)
    plain.load_state_dict(
        {k: v for k, v in layer.state_dict().items() if not k.startswith("norm.")}
    )
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    ln = layer.norm
    expected = ln(x + plain(x)) if norm == "post" else x + plain(ln(x))
    torch.testing.assert_close(layer(x), expected)


def test_attention_dropout_only_in_training():
    layer = _layer(dropout=0.5)
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)
    layer.train()
    assert not torch.allclose(layer(x), layer(x))


@pytest.mark.parametrize("diag", ALL_DIAGS)
@pytest.mark.parametrize("explicit", [False, True], ids=["fast", "explicit"])
def test_gradcheck_both_paths(diag, explicit):
    """Finite differences agree with autograd, for the input and through the in-place bias."""
    layer = _layer(c=4, h=2, diag=diag, diag_penalty=-0.7).eval()
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)

    def f(x):
        out = layer(x, return_attention=explicit)
        return out[0] if explicit else out

    assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("diag", ALL_DIAGS)
def test_attention_dropout_draws_the_same_on_both_paths(diag):
    """With attention dropout the fused call computes what return_attention computes, from the
    same draws (a fixed seed), and the dropout really acts."""
    layer = _layer(diag=diag, dropout=0.3).train()
    x = torch.randn(3, 4, 7, 8, dtype=torch.float64)
    dropped = torch.rand(3, 4, 2, 7) < 0.3 if diag == "dropout" else None
    torch.manual_seed(11)
    fast = layer(x, dropped=dropped)
    torch.manual_seed(11)
    explicit, attn = layer(x, return_attention=True, dropped=dropped)
    torch.testing.assert_close(fast, explicit, rtol=1e-12, atol=1e-12)
    torch.manual_seed(12)
    assert not torch.equal(layer(x, dropped=dropped), fast)  # the dropout really acts
    if diag == "mask":
        assert bool((_diagonal(attn) == 0).all())


@pytest.mark.parametrize("diag", ALL_DIAGS)
def test_gradients_flow_through_both_paths(diag):
    layer = _layer(diag=diag).train()
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    for ret in (False, True):
        out = layer(x, return_attention=ret)
        y = out[0] if ret else out
        (grad,) = torch.autograd.grad(y.square().sum(), x)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_bias_is_not_corrupted_by_callers():
    layer = _layer(diag="penalty", diag_penalty=-0.5)
    x = torch.randn(5, 8, dtype=torch.float64)
    b = layer.bias(x)
    b.fill_(100.0)  # a caller that modifies what it got must not change the layer
    torch.testing.assert_close(layer.bias(x), -0.5 * torch.eye(5, dtype=torch.float64))
    layer.diag_penalty = -0.25  # changing the attribute takes effect (no stale cache)
    torch.testing.assert_close(
        layer.scores(x) - _by_hand_logits(layer, x),
        -0.25 * torch.eye(5, dtype=torch.float64).expand(2, 5, 5),
    )


@pytest.mark.parametrize("diag", ["mask", "penalty"])
def test_training_works_after_inference_mode(diag):
    """The cached [T, T] bias must not be an inference tensor (it is saved for backward)."""
    layer = ds.TemporalAttention(8, 2, diag=diag)
    with torch.inference_mode():
        layer(torch.randn(3, 13, 8))
    x = torch.randn(3, 13, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


# ------------------------------------------------------------------------ fast path == explicit path
CASES = [
    (None, None),
    ("mask", None),
    ("penalty", None),
    ("dropout", "shared"),
    ("dropout", "per-head"),
    ("dropout", "independent"),
]


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
@pytest.mark.parametrize("diag, pattern", CASES, ids=[f"{d}-{p}" for d, p in CASES])
@pytest.mark.parametrize("heads", [1, 4])
def test_fast_path_equals_explicit_path(diag, pattern, dtype, tol, heads):
    torch.manual_seed(4)
    B, N, T, C = 2, 3, 10, 16
    layer = ds.TemporalAttention(C, heads, diag=diag, diag_p=0.4).to(dtype).train()
    x = torch.randn(B, N, T, C, dtype=dtype)
    dropped = None
    if pattern == "shared":
        dropped = torch.rand(T) < 0.4
    elif pattern == "per-head":
        dropped = torch.rand(heads, T) < 0.4
    elif pattern == "independent":
        dropped = torch.rand(B, N, heads, T) < 0.4
    fast = layer(x, dropped=dropped)
    slow, attn = layer(x, return_attention=True, dropped=dropped)
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol)
    if dropped is not None:
        assert torch.equal(_diagonal(attn) == 0, dropped.expand(B, N, heads, T))


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_fast_path_equals_explicit_path_with_everything_on(dtype, tol):
    layer = ds.TemporalAttention(16, 4, diag="penalty", norm="pre", pos_encoding="tape").to(dtype)
    x = torch.randn(2, 3, 12, 16, dtype=dtype)
    torch.testing.assert_close(layer(x), layer(x, return_attention=True)[0], rtol=tol, atol=tol)


# ------------------------------------------------- the two paths: values and gradients, float64
@pytest.mark.parametrize("diag, pattern", CASES, ids=[f"{d}-{p}" for d, p in CASES])
@pytest.mark.parametrize("p_attn", [0.0, 0.3], ids=["no-attn-dropout", "attn-dropout"])
def test_fused_path_equals_explicit_path_with_gradients(diag, pattern, p_attn):
    """One ``scaled_dot_product_attention`` call == the formula written out, float64: outputs and
    the gradients of the input and of every parameter; with attention dropout both draw the same
    keep mask from the same seed."""
    torch.manual_seed(5)
    B, N, T, C, H = 2, 4, 6, 8, 2
    layer = _layer(c=C, h=H, diag=diag, diag_p=0.4, dropout=p_attn, norm="post").train()
    x = torch.randn(B, N, T, C, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(B, N, T, C, dtype=torch.float64)
    dropped = {
        None: None,
        "shared": torch.rand(T) < 0.4,
        "per-head": torch.rand(H, T) < 0.4,
        "independent": torch.rand(B, N, H, T) < 0.4,
    }[pattern]
    results = []
    for explicit in (False, True):
        torch.manual_seed(11)  # the same draws on both paths
        out = layer(x, return_attention=explicit, dropped=dropped)
        y = out[0] if explicit else out
        results.append((y, *torch.autograd.grad((y * weights).sum(), [x, *layer.parameters()])))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_independent_patterns_on_the_fused_path_for_any_leading_axes(lead):
    torch.manual_seed(6)
    layer = _layer(diag="dropout", diag_p=0.5, diag_shared=False).train()
    x = torch.randn(*lead, 5, 8, dtype=torch.float64)
    torch.manual_seed(1)
    fused = layer(x)
    torch.manual_seed(1)
    torch.testing.assert_close(fused, layer(x, return_attention=True)[0])


def test_fused_path_is_one_sdpa_call_with_the_bias_as_attn_mask(monkeypatch):
    """Without ``return_attention`` the layer calls ``F.scaled_dot_product_attention`` once, with
    the regularizer's bias as ``attn_mask`` and the attention dropout as ``dropout_p``."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, **kw):
        calls.append((q.shape, attn_mask, dropout_p))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    layer = _layer(c=8, h=2, diag="penalty", diag_penalty=-0.5, dropout=0.1).train()
    layer(torch.randn(3, 5, 7, 8, dtype=torch.float64))
    ((shape, mask, p),) = calls
    assert shape == (15, 2, 7, 4) and p == 0.1  # leading axes flattened: [M, H, T, d_h]
    torch.testing.assert_close(mask, -0.5 * torch.eye(7, dtype=torch.float64))
    layer.eval()(torch.randn(3, 7, 8, dtype=torch.float64))
    assert calls[-1][2] == 0.0  # no attention dropout in evaluation


# --------------------------------------------------------------- against torch.nn.MultiheadAttention
def _mha_copy(layer: ds.TemporalAttention) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(layer.d_model, layer.n_heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(
            torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight])
        )
        mha.in_proj_bias.copy_(torch.cat([layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias]))
        mha.out_proj.weight.copy_(layer.out_proj.weight)
        mha.out_proj.bias.copy_(layer.out_proj.bias)
    return mha.eval()


@pytest.mark.parametrize("diag", [None, "penalty", "mask"])
@pytest.mark.parametrize("heads", [1, 4])
def test_equals_multihead_attention(diag, heads):
    T, C = 9, 16
    layer = _layer(c=C, h=heads, diag=diag, diag_penalty=-0.3, residual=False).eval()
    mha = _mha_copy(layer)
    x = torch.randn(5, T, C, dtype=torch.float64)
    eye = torch.eye(T, dtype=torch.bool)
    attn_mask = {None: None, "penalty": -0.3 * eye.double(), "mask": eye}[
        diag
    ]  # bool: True = not allowed
    ref, ref_w = mha(x, x, x, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    y, w = layer(x, return_attention=True)
    torch.testing.assert_close(layer(x), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"d_model": 10, "n_heads": 3}, ["d_model=10", "n_heads=3", "divisors", "[1, 2, 5, 10]"]),
        ({"d_model": 0}, ["d_model=0", "positive"]),
        ({"n_heads": 0}, ["n_heads=0", "positive"]),
        ({"diag": "diagonal"}, ["diag='diagonal'", "'mask'", "'dropout'", "'penalty'", "None"]),
        ({"diag": "Mask"}, ["diag='Mask'", "'mask'"]),
        ({"diag": "dropout", "diag_p": 1.0}, ["diag_p=1.0", "[0, 1)"]),
        ({"diag": "dropout", "diag_p": -0.1}, ["diag_p=-0.1", "[0, 1)"]),
        ({"diag": "dropout", "diag_p": float("nan")}, ["diag_p=nan", "[0, 1)"]),
        (
            {"diag": "penalty", "diag_penalty": float("-inf")},
            ["diag_penalty=-inf", "finite", "diag='mask'"],
        ),
        ({"diag": "penalty", "diag_penalty": float("nan")}, ["diag_penalty=nan", "finite"]),
        ({"norm": "layer"}, ["norm='layer'", "'post'", "'pre'"]),
        ({"pos_encoding": "rope"}, ["pos_encoding='rope'", "'sinusoidal'", "'tape'", "'learned'"]),
        ({"dropout": 1.5}, ["dropout=1.5", "[0, 1)"]),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, words):
    args = {"d_model": 8, "n_heads": 2, **kwargs}
    with pytest.raises(ValueError) as info:
        ds.TemporalAttention(args.pop("d_model"), args.pop("n_heads"), **args)
    assert isinstance(info.value, ds.ConfigError)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@pytest.mark.parametrize(
    "shape, words",
    [
        ((8,), ["rank 1", "[..., T, C]"]),
        ((), ["rank 0", "[..., T, C]"]),
        ((4, 6, 7), ["7 channels", "d_model=8"]),
        ((4, 0, 8), ["time axis", "T must be >= 1"]),
    ],
)
def test_bad_input_tensor_raises(shape, words):
    layer = ds.TemporalAttention(8, 2)
    with pytest.raises(ValueError) as info:
        layer(torch.randn(shape))
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


def test_numpy_numbers_are_accepted():
    layer = ds.TemporalAttention(np.int64(8), np.int64(2), diag="dropout", diag_p=np.float32(0.25))
    assert (layer.d_model, layer.n_heads, layer.d_head) == (8, 2, 4) and type(layer.d_model) is int
    assert layer(torch.randn(3, 5, 8)).shape == (3, 5, 8)
    with pytest.raises(ValueError, match="diag_p"):
        ds.TemporalAttention(8, 2, diag="dropout", diag_p=True)


def test_integer_input_raises():
    with pytest.raises(ValueError, match="floating-point"):
        ds.TemporalAttention(8, 2)(torch.ones(3, 8, dtype=torch.long))


# --------------------------------------------------------------------------------- property test
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    T=st.integers(1, 9),
    heads=st.integers(1, 3),
    d_head=st.integers(1, 4),
    diag=st.sampled_from(ALL_DIAGS),
    p=st.floats(0.0, 0.95),
    penalty=st.floats(-5.0, 5.0),
    shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_rows_sum_to_one_and_masked_entries_are_zero(
    lead, T, heads, d_head, diag, p, penalty, shared, seed
):
    if diag == "mask" and T == 1:
        return  # covered by test_mask_with_one_step_raises_instead_of_nan
    torch.manual_seed(seed)
    C = heads * d_head
    layer = (
        ds.TemporalAttention(
            C, heads, diag=diag, diag_p=p, diag_penalty=penalty, diag_shared=shared
        )
        .double()
        .train()
    )
    x = torch.randn(*lead, T, C, dtype=torch.float64)
    dropped = (
        (torch.rand(*lead, heads, T) < p) if (diag == "dropout" and T > 1 and not shared) else None
    )
    y, attn = layer(x, return_attention=True, dropped=dropped)
    assert attn.shape == (*lead, heads, T, T)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones(*lead, heads, T, dtype=torch.float64))
    diagonal = _diagonal(attn)
    if diag == "mask":
        assert bool((diagonal == 0).all())
    if dropped is not None:
        assert bool((diagonal[dropped] == 0).all())
        assert bool((diagonal[~dropped] > 0).all())
    off = attn.masked_select(~torch.eye(T, dtype=torch.bool).expand_as(attn))
    assert bool((off > 0).all()), "only diagonal entries are ever removed"


# ------------------------------------------------------------------------------- exercise checks
SOLUTIONS = {
    "ex-attention-penalty": lambda q, k, penalty: (
        q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        + penalty * torch.eye(q.shape[-2], dtype=q.dtype)
    ),
    "ex-attention-mask": lambda s: torch.softmax(
        s.masked_fill(torch.eye(s.shape[-1], dtype=torch.bool), float("-inf")), -1
    ),
    "ex-attention-tape": lambda T, C: ds.tape_table(T, C),
}

WRONG = [
    (
        "ex-attention-penalty",
        lambda q, k, p: q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + p,
        "every entry",
    ),
    (
        "ex-attention-penalty",
        lambda q, k, p: (
            (q @ k.transpose(-1, -2) + p * torch.eye(q.shape[-2], dtype=q.dtype))
            / math.sqrt(q.shape[-1])
        ),
        "after the scaling",
    ),
    (
        "ex-attention-penalty",
        lambda q, k, p: q @ k.transpose(-1, -2) + p * torch.eye(q.shape[-2], dtype=q.dtype),
        "sqrt(d)",
    ),
    (
        "ex-attention-mask",
        lambda s: torch.softmax(s, -1) * (1 - torch.eye(s.shape[-1], dtype=s.dtype)),
        "after the softmax",
    ),
    (
        "ex-attention-mask",
        lambda s: torch.softmax(s.masked_fill(torch.eye(s.shape[-1], dtype=torch.bool), 0.0), -1),
        "-inf",
    ),
    ("ex-attention-mask", lambda s: torch.softmax(s, -1), "not masked"),
    ("ex-attention-tape", lambda T, C: ds.sinusoidal_table(T, C), "C / T"),
    ("ex-attention-tape", lambda T, C: ds.tape_table(T, C).T, "[T, C]"),
]


@pytest.mark.parametrize("label", sorted(SOLUTIONS))
def test_exercise_reference_passes(label):
    assert label in exercises.labels()
    for _ in range(3):  # fresh inputs each time
        assert exercises.check(label, SOLUTIONS[label], strict=True).passed


@pytest.mark.parametrize(
    "label, answer, words", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)]
)
def test_exercise_wrong_answer_gets_a_hint(label, answer, words):
    result = exercises.check(label, answer)
    assert not result.passed
    assert words in result.message
    with pytest.raises(exercises.ExerciseFailed):
        exercises.check(label, answer, strict=True)


def test_exercise_stub_propagates_not_implemented():
    def stub(*args):
        raise NotImplementedError("ex-attention-mask")

    with pytest.raises(NotImplementedError):
        exercises.check("ex-attention-mask", stub)


def test_penalized_diagonal_is_what_the_penalty_does_to_a_row():
    """The closed form the heatmaps chapter uses equals the layer's own penalized self-weights."""
    torch.manual_seed(3)
    plain = ds.TemporalAttention(8, 2, diag=None).eval()
    pen = ds.TemporalAttention(8, 2, diag="penalty", diag_penalty=-0.7).eval()
    pen.load_state_dict(plain.state_dict())
    x = torch.randn(4, 9, 8)
    _, a0 = plain(x, return_attention=True)
    _, a1 = pen(x, return_attention=True)
    want = ds.attention.penalized_diagonal(a0.diagonal(dim1=-2, dim2=-1), -0.7)
    torch.testing.assert_close(a1.diagonal(dim1=-2, dim2=-1), want)
    assert ds.attention.penalized_diagonal(1 / 12, 0.0) == pytest.approx(1 / 12)
