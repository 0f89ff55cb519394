"""LayerNorm and stack Jacobians (diagsink.depth) against autograd; bounds at long T.

Module diagsink.depth, chapter book/depth.ipynb ("Depth and LayerNorm"); the single-layer bounds
tests at long T belong to book/bounds.ipynb.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from diagsink import depth as D
from diagsink import jacobian as J
from diagsink import toy
from diagsink.errors import ConfigError
from diagsink.model import TSModel

TOL = dict(rtol=0.0, atol=1e-10)
f64 = torch.float64


def _layernorm(c: int, seed: int, affine: bool = True, eps: float = 1e-5) -> nn.LayerNorm:
    torch.manual_seed(seed)
    ln = nn.LayerNorm(c, eps=eps, elementwise_affine=affine).to(f64)
    if affine:
        with torch.no_grad():  # non-trivial gain and shift, so γ and β are exercised
            ln.weight.copy_(1 + 0.5 * torch.randn(c, dtype=f64))
            ln.bias.copy_(torch.randn(c, dtype=f64))
    return ln


def _autograd(layers, x):
    return torch.autograd.functional.jacobian(lambda inp: D.apply_stack(layers, inp), x)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 0.3])
@pytest.mark.parametrize("T", [1, 3, 9])
def test_layernorm_jacobian_matches_autograd(affine, eps, T):
    ln = _layernorm(6, seed=T, affine=affine, eps=eps)
    x = 2 * torch.randn(T, 6, dtype=f64) + 0.7
    got = D.layernorm_jacobian(ln, x)
    torch.testing.assert_close(got, _autograd([ln], x), **TOL)
    if T > 1:  # block diagonal in time: no step depends on another
        off = ~torch.eye(T, dtype=torch.bool)
        assert got.permute(0, 2, 1, 3)[off].abs().max() == 0


def test_layernorm_jacobian_depends_on_eps():
    """A large ε changes the derivative (a formula that ignored ε would fail here)."""
    x = torch.randn(4, 5, dtype=f64) * 0.1
    small = D.layernorm_jacobian(_layernorm(5, 0, eps=1e-12), x)
    big = D.layernorm_jacobian(_layernorm(5, 0, eps=1.0), x)
    assert (small - big).abs().max() > 1e-2


def _stack(seed: int, C: int, L: int, post_norm: bool) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for ell in range(L):
        kw = dict(n_heads=[1, 2][(seed + ell) % 2], qk_scale=[0.5, 1.0, 2.0][(seed + ell) % 3])
        layers.append(toy.init_layer(C, seed=100 * seed + ell, **kw))
        if post_norm:
            layers.append(_layernorm(C, seed=100 * seed + ell))
    return layers


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("post_norm", [True, False])
def test_network_jacobian_matches_autograd(seed, post_norm):
    C, T, L = 8, [3, 5, 7, 10][seed], [1, 2, 3, 4][seed]
    layers = _stack(seed, C, L, post_norm)
    x = torch.randn(T, C, dtype=f64)
    got, states = D.network_jacobian(layers, x, return_outputs=True)
    torch.testing.assert_close(got, _autograd(layers, x), **TOL)
    torch.testing.assert_close(states[-1], D.apply_stack(layers, x), **TOL)
    assert len(states) == len(layers) + 1


def test_network_jacobian_leading_layernorm_and_regularizers():
    C, T = 8, 6
    layers = [
        _layernorm(C, 1),
        toy.init_layer(C, 2, seed=3, diag="penalty", diag_penalty=-0.3),
        _layernorm(C, 2),
        toy.init_layer(C, 1, seed=4, diag="mask"),
    ]
    x = torch.randn(T, C, dtype=f64)
    torch.testing.assert_close(D.network_jacobian(layers, x), _autograd(layers, x), **TOL)


def test_network_jacobian_bad_input():
    C = 4
    with pytest.raises(ConfigError, match="empty"):
        D.network_jacobian([], torch.randn(3, C, dtype=f64))
    with pytest.raises(ConfigError, match="not covered"):
        D.network_jacobian([nn.Linear(C, C)], torch.randn(3, C, dtype=f64))
    with pytest.raises(ConfigError, match="one sequence"):
        D.network_jacobian([_layernorm(C, 0)], torch.randn(2, 3, C, dtype=f64))
    with pytest.raises(ConfigError, match="channel"):
        D.layernorm_jacobian(nn.LayerNorm((3, C)).to(f64), torch.randn(3, C, dtype=f64))


# ---- bounds at long sequences: a non-vacuous property test (T up to 64) -------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.integers(2, 64),
    C=st.sampled_from([4, 8]),
    s=st.floats(0.02, 0.3),
    seed=st.integers(0, 10_000),
)
def test_diag_lower_bound_holds_and_is_positive(T, C, s, seed):
    """Small q/k scale: ℓ > 0 is guaranteed (not vacuous) and σ_min(∂y_i/∂x_i) ≥ ℓ for all i."""
    layer = toy.init_layer(C, 1, qk_scale=s, seed=seed)
    with torch.no_grad():  # ν ≤ 1/4 so that the value term leaves room for ℓ > 0
        layer.v_proj.weight.mul_(0.25 / torch.linalg.matrix_norm(layer.v_proj.weight, ord=2))
        layer.out_proj.weight.div_(torch.linalg.matrix_norm(layer.out_proj.weight, ord=2))
    x = toy.sphere_inputs(T, C, torch.Generator().manual_seed(seed))
    b = J.bound(layer, x)
    assert b.diag_lower > 0.1, b.diag  # the example is informative
    jac = J.total(J.decompose(layer, x)).permute(0, 2, 1, 3)
    idx = torch.arange(T)
    smallest = torch.linalg.svdvals(jac[idx, idx]).min(-1).values
    assert float(smallest.min()) >= b.diag_lower - 1e-12


def test_bound_constants_do_not_depend_on_T():
    """On sphere inputs (‖u_j‖ = √C) the constants of bnd-thm-offdiag have a T-free ceiling.

    D ≤ 2R and Q = ρR + ‖b_Q‖ with R = √C, so c = ν(1 + κQD/√d) ≤ ν(1 + 2κQR/√d) and
    Δ ≤ 2QκR/√d for every T; at T = 512 the measured constants come within 10 % of that
    ceiling (the spread D approaches 2R), so the ceiling is not loose.
    """
    C = 16
    layer = toy.init_layer(C, 1, seed=0)
    R = math.sqrt(C)
    for T in (8, 64, 512):
        x = toy.sphere_inputs(T, C, torch.Generator().manual_seed(T))
        k = J.bound(layer, x).constants
        nu, kap, _rho, Q = k["nu"][0], k["kappa"][0], k["rho"][0], k["Q"][0]
        assert k["R"] == pytest.approx(R)  # Q = ρR + ‖b_Q‖ is then T-free as well
        c = nu * (1 + kap * Q * k["D"] / math.sqrt(layer.d_head))
        c_ceiling = nu * (1 + 2 * kap * Q * R / math.sqrt(layer.d_head))
        d_ceiling = 2 * Q * kap * R / math.sqrt(layer.d_head)
        assert c <= c_ceiling + 1e-12 and k["delta_apriori"][0] <= d_ceiling + 1e-12
        assert k["delta"][0] <= d_ceiling
    assert c >= 0.9 * c_ceiling, (c, c_ceiling)


def test_sweep_labels_subset_maximum():
    """sensitivity_vs_length says where its maximum is over a row subset (T > max_rows)."""
    sweep = toy.sensitivity_vs_length([4, 12], n_samples=1, max_rows=6)
    assert sweep.max_exact == [True, False]
    full = toy.sensitivity_vs_length([4, 12], n_samples=1, max_rows=None)
    assert full.max_exact == [True, True]
    # a subset maximum never exceeds the exact one (same layer and inputs: same seed)
    assert sweep.max["off"]["total"][1] <= full.max["off"]["total"][1] + 1e-12


def test_network_jacobians_live_in_the_depth_module_only():
    """``network_jacobian`` and ``layernorm_jacobian`` have one home, :mod:`diagsink.depth`."""
    import diagsink.depth
    import diagsink.jacobian

    assert callable(diagsink.depth.network_jacobian) and callable(diagsink.depth.layernorm_jacobian)
    assert not hasattr(diagsink.jacobian, "network_jacobian")
    assert not hasattr(diagsink.jacobian, "layernorm_jacobian")


# ---- stacks with Shift entries, the temporal part of a T&S model, the L-layer bound --------
def test_shift_entry_and_averaging_layer_match_autograd():
    C, T = 6, 5
    gen = torch.Generator().manual_seed(0)
    layers = [
        D.Shift(torch.randn(T, C, generator=gen, dtype=f64)),
        D.averaging_layer(C),
        _layernorm(C, 3),
        D.Shift(torch.randn(T, C, generator=gen, dtype=f64)),
        toy.init_layer(C, 2, seed=5),
    ]
    x = torch.randn(T, C, generator=gen, dtype=f64)
    torch.testing.assert_close(D.network_jacobian(layers, x), _autograd(layers, x), **TOL)
    avg = D.averaging_layer(C)
    torch.testing.assert_close(avg(x), x + x.mean(0, keepdim=True), **TOL)
    with pytest.raises(ConfigError, match="Shift holds"):
        D.Shift(torch.zeros(T + 1, C, dtype=f64))(x)


def test_averaging_stack_attains_the_depth_bound():
    """L averaging layers: J = (I + 11ᵀ/T)^L ⊗ I, off-diagonal (2^L − 1)/T = the bound exactly."""
    C, T = 4, 7
    x = torch.randn(T, C, dtype=f64)
    for L in (1, 2, 5):
        layers = [D.averaging_layer(C) for _ in range(L)]
        inf = D.influence(D.network_jacobian(layers, x))
        bound = D.depth_bound(D.layer_constants(layers, x), T)
        assert inf["off_max"] == pytest.approx((2**L - 1) / T, rel=1e-12)
        assert bound["off"] == pytest.approx((2**L - 1) / T, rel=1e-12)
        assert inf["diag_mean"] == pytest.approx(1 + (2**L - 1) / T, rel=1e-12)
        assert bound["diag"] == pytest.approx(1 + (2**L - 1) / T, rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    consts=st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 3.0)), min_size=1, max_size=6),
    T=st.integers(1, 40),
)
def test_depth_bound_is_the_product_of_the_majorants(consts, T):
    """The closed form equals the explicit product of the T x T matrices α_l I + (b_l/T) 11ᵀ."""
    consts = [(max(a, b / T), b) for a, b in consts]
    prod = torch.eye(T, dtype=f64)
    for a, b in consts:
        prod = ((a - b / T) * torch.eye(T, dtype=f64) + b / T) @ prod
    got = D.depth_bound(consts, T)
    assert got["diag"] == pytest.approx(float(prod[0, 0]), rel=1e-9, abs=1e-12)
    if T > 1:
        assert got["off"] == pytest.approx(float(prod[0, 1]), rel=1e-9, abs=1e-12)
    assert T * got["off"] <= got["growth"] * (1 + 1e-12)  # the T-free ceiling


def _random_stack(L: int, C: int, seed: int, s: float, post_norm: bool) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for ell in range(L):
        heads = [1, 2][(seed + ell) % 2]
        layers.append(toy.init_layer(C, heads, qk_scale=s, seed=1000 * seed + ell))
        if post_norm:
            layers.append(_layernorm(C, seed + ell, eps=[1e-5, 0.1][ell % 2]))
    return layers


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    L=st.integers(1, 4),
    T=st.integers(2, 24),
    C=st.sampled_from([4, 8]),
    s=st.floats(0.05, 2.0),
    seed=st.integers(0, 10_000),
    post_norm=st.booleans(),
)
def test_measured_stack_blocks_within_depth_bound(L, T, C, s, seed, post_norm):
    """Proposition dep-prop-stack on random stacks: measured ≤ bound (measured constants) ≤ bound
    (theorem constants), for the largest off-diagonal and the largest diagonal block."""
    layers = _random_stack(L, C, seed, s, post_norm)
    x = toy.sphere_inputs(T, C, torch.Generator().manual_seed(seed))
    n = D.block_norm_matrix(D.network_jacobian(layers, x))
    off = ~torch.eye(T, dtype=torch.bool)
    measured = D.depth_bound(D.layer_constants(layers, x), T)
    theorem = D.depth_bound(D.theorem_constants(layers, x), T)
    slack = 1 + 1e-9
    assert float(n[off].max()) <= measured["off"] * slack
    assert float(n.diagonal().max()) <= measured["diag"] * slack
    assert measured["off"] <= theorem["off"] * slack
    assert measured["diag"] <= theorem["diag"] * slack


def test_layernorm_block_norm_lemma():
    """dep-lem-ln-norm: ‖∂y_t/∂x_t‖ ≤ max|γ|/σ_t, with equality for unit gain and C ≥ 3."""
    C, T = 6, 5
    x = 3 * torch.randn(T, C, dtype=f64) + 1
    sigma = torch.sqrt(x.var(-1, unbiased=False) + 1e-5)
    for affine in (True, False):
        ln = _layernorm(C, 2, affine=affine)
        n = D.block_norm_matrix(D.layernorm_jacobian(ln, x)).diagonal()
        gain = ln.weight.abs().max() if affine else 1.0
        assert bool((n <= gain / sigma * (1 + 1e-12)).all())
        if not affine:
            torch.testing.assert_close(n, 1 / sigma, **TOL)
    ((a, b),) = D.theorem_constants([ln], x)
    assert b == 0 and a == pytest.approx(1 / float(sigma.min()))


@pytest.mark.parametrize("variant", ["none", "no_residual", "mask"])
def test_temporal_stack_is_the_models_temporal_path(variant):
    torch.manual_seed(1)
    N = 3
    model = TSModel(N, [torch.eye(N)], d_model=8, n_heads=2, depth=3, variant=variant).eval()
    window = torch.cat([torch.randn(12, N, 1), torch.rand(12, N, 1)], dim=-1)
    layers, x0 = D.temporal_stack(model, window, node=1, depth=2)
    assert len(layers) == 6 and isinstance(layers[0], D.Shift)
    # by hand with the model's own modules (float64 copy): h ← LN_attn((h + tod) + A(h + tod))
    m = copy.deepcopy(model).double()
    w = window.double()[None]
    h = m.pos(m.speed_embed(w[..., :1]).transpose(1, 2)).transpose(1, 2)[0, :, 1]
    torch.testing.assert_close(x0, h, **TOL)
    tod = m.tod_embed(w[..., 1:])[0, :, 1]
    with torch.no_grad():
        for block in m.blocks[:2]:
            h = block.attn(h + tod)
        torch.testing.assert_close(D.apply_stack(layers, x0), h, **TOL)
    torch.testing.assert_close(D.network_jacobian(layers, x0), _autograd(layers, x0), **TOL)
    with pytest.raises(ConfigError, match="depth"):
        D.temporal_stack(model, window, node=0, depth=4)
    with pytest.raises(ConfigError, match="sensor index"):
        D.temporal_stack(model, window, node=N)


def test_depth_helpers_bad_input():
    with pytest.raises(ConfigError, match="a >= b/T"):
        D.depth_bound([(0.1, 5.0)], 4)
    with pytest.raises(ConfigError, match="empty"):
        D.depth_bound([], 4)
    with pytest.raises(ConfigError, match="Jacobian"):
        D.block_norm_matrix(torch.zeros(3, 4, 3, 5))
    with pytest.raises(ConfigError, match="pre"):
        D.post_norm_entries(toy.init_layer(4, 1, norm="pre"))
    with pytest.raises(ConfigError, match="not covered"):
        D.theorem_constants([nn.Linear(4, 4).double()], torch.zeros(3, 4, dtype=f64))


def _ceilings(layers: list[nn.Module], r_star: float) -> list[tuple[float, float]]:
    """The T-free (a_l, b_l) of the proof of dep-cor-fixed-depth, for inputs of norm ≤ r_star."""
    out = []
    for layer in layers:
        if isinstance(layer, nn.LayerNorm):
            out.append((float(layer.weight.detach().abs().max()) / math.sqrt(layer.eps), 0.0))
            continue
        k = J.bound(layer, toy.sphere_inputs(3, layer.d_model, torch.Generator())).constants
        sqrt_d, D = math.sqrt(layer.d_head), 2 * r_star
        a_diag, b_off = 1.0, 0.0
        for nu, rho, kap, Q in zip(k["nu"], k["rho"], k["kappa"], k["Q"], strict=True):
            q_star = Q - rho * k["R"] + rho * r_star  # ρ R* + ‖b_Q‖
            c = nu * (1 + kap * q_star * D / sqrt_d)
            a_diag += c + nu * rho * kap * r_star**2 / sqrt_d
            b_off += 2 * c * math.exp(q_star * kap * D / sqrt_d)  # T/(T−1) ≤ 2, a-priori Δ
        out.append((a_diag, b_off))
    return out


def test_corollary_constants_do_not_depend_on_T():
    """dep-cor-fixed-depth: behind a LayerNorm the per-entry constants stay below T-free ceilings,
    so T x (largest off-diagonal block) ≤ Π(a_l + b_l) of the ceilings for every T."""
    C = 8
    layers = [
        _layernorm(C, 1),
        toy.init_layer(C, 2, seed=1),
        _layernorm(C, 2),
        toy.init_layer(C, 1, seed=2),
    ]
    r_star = max(
        float(ln.weight.detach().abs().max()) * math.sqrt(C) + float(ln.bias.detach().norm())
        for ln in layers[::2]
    )
    ceil = _ceilings(layers, r_star)
    k_l = math.prod(a + b for a, b in ceil)
    for T in (4, 32, 160):
        x = 5 * torch.randn(T, C, dtype=f64, generator=torch.Generator().manual_seed(T))
        states = D.network_jacobian(layers, x, return_outputs=True)[1]
        assert all(float(h.norm(dim=-1).max()) <= r_star for h in states[1::2])  # LN outputs
        got = D.theorem_constants(layers, x)
        for (a, b), (a_max, b_max) in zip(got, ceil, strict=True):
            assert a <= a_max * (1 + 1e-12) and b <= b_max * (1 + 1e-12), (T, a, b, a_max, b_max)
        n = D.block_norm_matrix(D.network_jacobian(layers, x))
        off = ~torch.eye(T, dtype=torch.bool)
        assert T * float(n[off].max()) <= k_l
