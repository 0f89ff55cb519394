"""Proposition bnd-prop-coupling (book/bounds.ipynb): query path ≤ ν Δ̂ / 2, on random layers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagsink import coupling as CP
from diagsink import jacobian as J
from diagsink import toy
from diagsink.attention import TemporalAttention
from diagsink.errors import ConfigError

f64 = torch.float64
REL = 1e-9  # float64 round-off on products of spectral norms


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.sampled_from([2, 3, 5, 8, 17, 40]),
    shape=st.sampled_from([(4, 1), (8, 2), (12, 3), (16, 4)]),
    scale=st.sampled_from([0.1, 0.5, 1.0, 3.0]),
    bias=st.booleans(),
    diag=st.sampled_from([None, "mask", "penalty"]),
    inputs=st.sampled_from(["sphere", "gaussian"]),
    seed=st.integers(0, 10_000),
)
def test_coupling_inequality_on_random_layers(T, shape, scale, bias, diag, inputs, seed):
    C, H = shape
    kw = {"diag": diag, "bias": bias}
    if diag == "penalty":
        kw["diag_penalty"] = -0.5
    layer = toy.init_layer(C, H, qk_scale=scale, seed=seed, **kw)
    gen = torch.Generator().manual_seed(seed)
    x = (toy.sphere_inputs if inputs == "sphere" else toy.gaussian_inputs)(T, C, gen)
    norms = CP.head_query_norms(layer, x)  # [H, T]
    cb = CP.coupling_bounds(layer, x)
    for h in range(H):
        assert float(norms[h].max()) <= cb.popoviciu[h] * (1 + REL)
        assert cb.popoviciu[h] <= cb.half_spread[h] * (1 + REL)
        assert cb.theorem_query[h] <= cb.over_sqrt2_spread[h] * (1 + REL)
        assert cb.popoviciu[h] <= cb.theorem_query[h] * (1 + REL)  # D²/4 ≤ min(R², D²/2)
    total_query = float(norms.sum(0).max())
    assert total_query <= 0.5 * sum(n * d for n, d in zip(cb.nu, cb.delta_apriori)) * (1 + REL)


@pytest.mark.parametrize("T,C,H", [(5, 8, 1), (7, 12, 3)])
def test_head_blocks_sum_to_the_packaged_query_path(T, C, H):
    layer = toy.init_layer(C, H, seed=3, diag="penalty", diag_penalty=-0.3)
    x = toy.gaussian_inputs(T, C, torch.Generator().manual_seed(1))
    mine = CP.head_query_blocks(layer, x).sum(0)  # [T, C, C]
    ref = J.decompose(layer, x)["query"]
    idx = torch.arange(T)
    torch.testing.assert_close(mine, ref[idx, :, idx, :], rtol=0, atol=1e-12)


def _antipodal_layer(C: int, s: float) -> TemporalAttention:
    """One head, d = C, no bias, no W_O, W_V = I, W_Q = W_K = s I: ν = 1, ρ = κ = s."""
    layer = TemporalAttention(C, 1, bias=False, out_proj=False).to(f64).eval()
    with torch.no_grad():
        layer.v_proj.weight.copy_(torch.eye(C, dtype=f64))
        layer.q_proj.weight.copy_(s * torch.eye(C, dtype=f64))
        layer.k_proj.weight.copy_(s * torch.eye(C, dtype=f64))
    return layer


@pytest.mark.parametrize("C", [4, 16])
def test_constant_one_half_is_attained(C):
    # two antipodal steps ±R e: S_i = p(1 − p) D² e eᵀ with p → 1/2 as s → 0, so the query norm
    # tends to ν D² ρ κ / (4 sqrt d) = (ν/2) Δ̂. A constant below 1/2 fails the first assert, one
    # above 1/2 (or the theorem's 1/√2) fails the second: the ratio must reach 0.99.
    e = torch.zeros(C, dtype=f64)
    e[0] = math.sqrt(C)
    x = torch.stack([e, -e])
    for s in (0.02, 0.05):
        layer = _antipodal_layer(C, s)
        ratio = (
            float(CP.head_query_norms(layer, x).max()) / CP.coupling_bounds(layer, x).half_spread[0]
        )
        assert ratio <= 1 + REL
        assert ratio > 0.99


def test_constant_one_over_sqrt2_is_attained_by_the_theorem_bound():
    # D = √2 R (two orthogonal steps of norm R): V = min(R², D²/2) = R² = R D / √2 exactly
    C = 8
    x = torch.zeros(2, C, dtype=f64)
    x[0, 0] = x[1, 1] = 3.0
    cb = CP.coupling_bounds(_antipodal_layer(C, 0.3), x)
    assert cb.theorem_query[0] == pytest.approx(cb.over_sqrt2_spread[0], rel=1e-12)
    assert cb.popoviciu[0] == pytest.approx(cb.half_spread[0] / math.sqrt(2), rel=1e-12)


def test_coupling_constant_does_not_depend_on_T():
    # without biases the ratio (query bound) / (ν Δ̂ / 2) equals D / (2R) exactly: it depends on
    # the shape of the input set only, never on T, and is ≤ 1 for every T (D ≤ 2R)
    layer = toy.init_layer(16, 1, seed=0, bias=False)
    gen = torch.Generator().manual_seed(0)
    for T in (2, 16, 128, 512):
        x = toy.sphere_inputs(T, 16, gen)
        cb = CP.coupling_bounds(layer, x)
        c = J.bound(layer, x).constants
        ratio = cb.popoviciu[0] / cb.half_spread[0]
        assert ratio == pytest.approx(c["D"] / (2 * c["R"]), rel=1e-12)
        assert ratio <= 1 + REL


@pytest.mark.bad_input
def test_layernorm_is_refused():
    layer = TemporalAttention(8, 1, norm="post").to(f64).eval()
    with pytest.raises(ConfigError, match="LayerNorm"):
        CP.coupling_bounds(layer, torch.zeros(3, 8, dtype=f64))
