"""book/bounds.ipynb on random layers: the coupling (query path ≤ ν Δ̂ / 2), the aggregate-influence
theorem and its share bounds, the uniform-attention counterexample and the directional bound."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagsink import coupling as CP
from diagsink import depth, toy
from diagsink import jacobian as J
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


# ---- theorem bnd-thm-aggregate: the other steps' aggregate influence --------------------
def _within(lo: torch.Tensor, v: torch.Tensor, hi: torch.Tensor) -> bool:
    tol = 1e-9 * (1 + v.abs())
    return bool(((lo - tol) <= v).all() and (v <= hi + tol).all())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.sampled_from([2, 3, 6, 9]),
    shape=st.sampled_from([(4, 1), (6, 2), (8, 4)]),
    scale=st.sampled_from([0.1, 0.5, 1.0, 3.0]),
    bias=st.booleans(),
    residual=st.booleans(),
    diag=st.sampled_from([None, "mask", "penalty"]),
    pe=st.sampled_from([None, "sinusoidal"]),
    seed=st.integers(0, 10_000),
)
def test_aggregate_bounds_hold_and_measure_the_autograd_jacobian(
    T, shape, scale, bias, residual, diag, pe, seed
):
    C, H = shape
    layer = toy.init_layer(
        C, H, qk_scale=scale, seed=seed, bias=bias, residual=residual, diag=diag, pos_encoding=pe
    )
    x = toy.gaussian_inputs(T, C, torch.Generator().manual_seed(seed))
    agg = CP.aggregate_influence(layer, x)
    norms = torch.linalg.matrix_norm(J.autograd_jacobian(layer, x).permute(0, 2, 1, 3), ord=2)
    eye = torch.eye(T, dtype=torch.bool)
    torch.testing.assert_close(agg.off_sum, norms.masked_fill(eye, 0).sum(-1))
    torch.testing.assert_close(agg.diag, norms.diagonal())
    assert _within(agg.off_lower, agg.off_sum, agg.off_upper)
    assert _within(agg.diag_lower, agg.diag, agg.diag_upper)
    assert _within(agg.share_lower, agg.share, agg.share_upper)
    assert all(float(agg.eps[h].max()) <= agg.eps_apriori[h] * (1 + REL) for h in range(H))


@pytest.mark.parametrize("scale", [0.1, 0.5, 2.0])
def test_one_head_form_with_the_apriori_spread(scale):
    # one head: value_sum = (1 − α_ii) ν exactly, and the off-diagonal aggregate lies within
    # (1 − α_ii) ν (1 ± Δ̂); with the penalty Δ̂ includes |β|, so the bound holds a fortiori
    layer = toy.init_layer(16, 1, qk_scale=scale, seed=2, diag="penalty", diag_penalty=-0.4)
    x = toy.sphere_inputs(24, 16, torch.Generator().manual_seed(2))
    agg = CP.aggregate_influence(layer, x)
    dhat = J.bound(layer, x).constants["delta_apriori"][0]
    base = (1 - agg.alpha_diag[0]) * agg.nu[0]
    torch.testing.assert_close(agg.value_sum, base, rtol=1e-12, atol=1e-12)
    assert _within(base * (1 - dhat), agg.off_sum, base * (1 + dhat))


def test_share_tends_to_one_over_one_plus_nu():
    # near-uniform attention on bounded inputs: α_ii ~ 1/T and ε ≈ 0.02, so the share moves
    # towards 1/(1 + ν) as T grows and ends within 0.01 of it (measured gaps 0.045, 0.011,
    # 0.0027 at T = 8, 32, 128: about 1/T); a residual-free layer's share falls like 1/T instead
    gaps, plain = [], []
    for T in (8, 32, 128):
        x = toy.sphere_inputs(T, 16, torch.Generator().manual_seed(0))
        agg = CP.aggregate_influence(toy.init_layer(16, 1, qk_scale=0.1, seed=0), x)
        gaps.append(float(agg.share.mean()) - agg.limit)
        flat = CP.aggregate_influence(
            toy.init_layer(16, 1, qk_scale=0.1, seed=0, residual=False), x
        )
        plain.append(float(flat.share.mean()) * T)
        assert flat.limit == 0.0
    assert gaps[0] > gaps[1] > gaps[2] > 0 and gaps[-1] < 0.01, gaps
    assert all(0.5 < v < 2 for v in plain), plain  # share ≈ 1/T without the residual


@pytest.mark.parametrize("T", [4, 32])
def test_averaging_layer_is_the_baseline(T):
    # y_i = x_i + mean_j x_j: J_ii = (1 + 1/T) I, J_ij = I/T, ν = 1, ε = 0: the bounds are exact
    layer = depth.averaging_layer(6)
    agg = CP.aggregate_influence(layer, toy.sphere_inputs(T, 6, torch.Generator().manual_seed(0)))
    share = (1 + 1 / T) / 2  # ‖J_ii‖ + Σ_{j≠i} ‖J_ij‖ = (1 + 1/T) + (T − 1)/T = 2
    torch.testing.assert_close(agg.share, torch.full((T,), share, dtype=f64))
    torch.testing.assert_close(agg.share_lower, agg.share_upper)
    assert agg.nu_layer == pytest.approx(1.0) and agg.limit == pytest.approx(0.5)


def test_sink_needs_the_diagonal_weight_or_a_small_value_map():
    x = toy.sphere_inputs(32, 8, torch.Generator().manual_seed(1))
    base = CP.aggregate_influence(toy.init_layer(8, 1, qk_scale=0.1, seed=1), x)
    assert float(base.share.min()) < 0.8  # no sink at near-uniform attention
    pulled = toy.init_layer(8, 1, qk_scale=0.1, seed=1, diag="penalty", diag_penalty=12.0)
    tiny = toy.init_layer(8, 1, qk_scale=0.1, seed=1)
    with torch.no_grad():
        tiny.v_proj.weight.mul_(1e-3)
    for layer in (pulled, tiny):  # α_ii -> 1, or ν -> 0
        agg = CP.aggregate_influence(layer, x)
        assert float(agg.share.min()) > 0.99
        assert float(((1 - agg.alpha_diag[0]) * agg.nu[0]).max()) < 0.01


# ---- the minimal counterexample and the directional bound --------------------------------
@pytest.mark.parametrize("T", [4, 16, 256])
def test_uniform_attention_with_the_largest_query_term(T):
    layer, x = CP.uniform_counterexample(T)
    b = J.bound(layer, x)
    assert b.constants["delta"][0] == 0.0 and b.diag_lower == 0.0  # Δ = 0, ℓ vacuous
    norms = CP.head_query_norms(layer, x)
    cb = CP.coupling_bounds(layer, x)
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(2)))
    assert cb.half_spread[0] == pytest.approx(math.sqrt(2), rel=1e-12)  # the bound is attained
    e1 = torch.tensor([1.0, 0.0], dtype=f64)
    z = x[:, 0] / math.sqrt(2)
    along, bound = CP.directional_query(layer, z, math.sqrt(2) * e1)
    assert float(along.abs().max()) < 1e-12 and bound[0] == 0.0  # along the tokens: nothing


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from([(4, 1), (8, 2), (16, 4)]),
    scale=st.sampled_from([0.3, 1.0, 3.0]),
    diag=st.sampled_from([None, "mask", "penalty"]),
    T=st.sampled_from([3, 12, 40]),
    seed=st.integers(0, 10_000),
)
def test_directional_bound_uses_the_measured_spread(shape, scale, diag, T, seed):
    C, H = shape
    layer = toy.init_layer(C, H, qk_scale=scale, seed=seed, diag=diag)
    g = torch.Generator().manual_seed(seed)
    z, w, w0 = (torch.randn(n, generator=g, dtype=f64) for n in (T, C, C))
    along, bound = CP.directional_query(layer, z, w, w0)
    for h in range(H):
        assert float(along[h].max()) <= bound[h] * (1 + REL) + 1e-15


@pytest.mark.bad_input
def test_counterexample_and_directional_refuse_bad_input():
    with pytest.raises(ConfigError, match="even T"):
        CP.uniform_counterexample(5)
    layer = toy.init_layer(4, 1, pos_encoding="sinusoidal")
    with pytest.raises(ConfigError, match="positional"):
        CP.directional_query(layer, torch.zeros(3, dtype=f64), torch.ones(4, dtype=f64))


@pytest.mark.parametrize("diag", [None, "mask", "penalty"])
def test_diagonal_blocks_and_the_aposteriori_lower_bound(diag):
    layer = toy.init_layer(8, 2, qk_scale=0.5, seed=4, diag=diag)
    x = toy.gaussian_inputs(7, 8, torch.Generator().manual_seed(4))
    agg = CP.aggregate_influence(layer, x)
    jac = J.autograd_jacobian(layer, x).permute(0, 2, 1, 3)
    blocks = jac[torch.arange(7), torch.arange(7)]
    torch.testing.assert_close(agg.sigma_min, torch.linalg.svdvals(blocks)[:, -1])
    assert (
        bool((agg.sigma_lower <= agg.sigma_min + 1e-12).all()) and float(agg.sigma_lower.max()) > 0
    )
    assert bool((agg.value_share > 0).all() and (agg.value_share < 1).all())


def test_rows_restrict_every_per_row_field():
    layer = toy.init_layer(8, 2, qk_scale=0.5, seed=5)
    x = toy.sphere_inputs(11, 8, torch.Generator().manual_seed(5))
    full, part = CP.aggregate_influence(layer, x), CP.aggregate_influence(layer, x, rows=[0, 4, 10])
    idx = torch.tensor([0, 4, 10])
    for name in (
        "off_sum",
        "diag",
        "share",
        "value_sum",
        "off_upper",
        "diag_lower",
        "sigma_min",
        "sigma_lower",
    ):
        torch.testing.assert_close(getattr(part, name), getattr(full, name)[idx])
    torch.testing.assert_close(part.alpha_diag, full.alpha_diag[:, idx])
    torch.testing.assert_close(part.eps, full.eps[:, idx])


# ---- exercise ex-bounds-share (diagsink/exercises/bounds.py) ----------------------------
def test_share_exercise_passes_the_reference_and_names_mistakes():
    import diagsink as ds
    from diagsink.exercises.bounds import reference_share_bounds as ref

    assert ds.exercises.check("ex-bounds-share", ref, strict=True).passed
    assert ref(0.0, 1.7, 0.0, 0.0) == pytest.approx((1 / 2.7, 1 / 2.7))
    wrong = {
        "this order": lambda a, n, e, q: ref(a, n, e, q)[::-1],
        "query term q": lambda a, n, e, q: ref(a, n, e, 0.0),
        "α ν (1 + ε)": lambda a, n, e, q: ref(0.0, n, e, q),
        "ε is missing": lambda a, n, e, q: ref(a, n, 0.0, q),
    }
    for hint, answer in wrong.items():
        result = ds.exercises.check("ex-bounds-share", answer)
        assert not result.passed and hint in result.message, result.message


def test_share_exercise_bounds_the_measured_share():
    # the reference bounds, fed with a real layer's α_ii, ν, ε_i and q, contain its measured share
    from diagsink.exercises.bounds import reference_share_bounds as ref

    layer = toy.init_layer(16, 1, qk_scale=0.1, seed=7)
    agg = CP.aggregate_influence(layer, toy.sphere_inputs(20, 16, torch.Generator().manual_seed(7)))
    for i in range(20):
        lo, hi = ref(
            float(agg.alpha_diag[0, i]), agg.nu[0], float(agg.eps[0, i]), agg.query_bound[0]
        )
        assert lo - 1e-12 <= float(agg.share[i]) <= hi + 1e-12


@pytest.mark.parametrize(
    "label, reference, wrong, hint",
    [
        (
            "ex-bends-ratio",
            "diagsink.exercises.bends:reference_max_over_mean",
            lambda n: float(n.max() / n.mean()),
            "leave the diagonal out",
        ),
        (
            "ex-trained-share",
            "diagsink.exercises.trained:reference_diagonal_share",
            lambda n: n.diagonal() / (n.sum(-1) - n.diagonal()),
            "whole row",
        ),
        (
            "ex-trained-column",
            "diagsink.exercises.trained:reference_column_weight",
            lambda a, j: float(a[:, j].mean()),
            "leave out row i = j",
        ),
    ],
)
def test_bends_and_trained_exercises(label, reference, wrong, hint):
    import importlib

    import diagsink as ds

    module, name = reference.split(":")
    ref = getattr(importlib.import_module(module), name)
    assert ds.exercises.check(label, ref, strict=True).passed
    result = ds.exercises.check(label, wrong)
    assert not result.passed and hint in result.message, result.message
