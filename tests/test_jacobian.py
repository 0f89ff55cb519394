"""The closed-form Jacobian of temporal attention (diagsink.jacobian) against autograd, and the bounds.

Chapters: book/jacobian.ipynb and book/bounds.ipynb.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diagsink as ds
from diagsink import jacobian as J
from diagsink import toy

TOL = dict(rtol=0.0, atol=1e-10)
LENGTHS = [1, 2, 5, 12, 64]

CONFIGS = {
    "plain": dict(),
    "multihead": dict(n_heads=4),
    "no-residual": dict(n_heads=2, residual=False),
    "no-bias-no-out": dict(bias=False, out_proj=False),
    "sinusoidal-pe": dict(n_heads=2, pos_encoding="sinusoidal"),
    "tape-pe": dict(pos_encoding="tape", residual=False),
    "learned-pe": dict(n_heads=2, pos_encoding="learned", max_len=64),
    "mask": dict(n_heads=2, diag="mask"),
    "mask-no-residual": dict(diag="mask", residual=False),
    "penalty": dict(n_heads=2, diag="penalty", diag_penalty=-0.7),
    "dropout-eval": dict(n_heads=2, diag="dropout", diag_p=0.5),
    "attn-dropout-eval": dict(dropout=0.3),
}


def _layer(seed: int, d_model: int = 8, scale: float = 1.0, **kw) -> ds.TemporalAttention:
    """A random float64 layer; biases and the learned table are randomised too (not left at 0)."""
    torch.manual_seed(seed)
    layer = ds.TemporalAttention(d_model, **kw).double().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("bias") or name.startswith("pos."):
                p.normal_(0.0, 0.5)
        layer.q_proj.weight.mul_(scale)
        layer.k_proj.weight.mul_(scale)
    return layer


def _x(T: int, C: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(T, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


#: every configuration at every length, except the mask at T = 1 (a row with no key left; its
#: error is tested in test_unsupported_configurations_raise_clear_errors)
CASES = [
    (name, T)
    for name in sorted(CONFIGS)
    for T in LENGTHS
    if not (CONFIGS[name].get("diag") == "mask" and T < 2)
]


@pytest.mark.parametrize("name, T", CASES)
def test_paths_sum_to_autograd(name, T):
    kw = CONFIGS[name]
    layer = _layer(T, **kw)
    x = _x(T)
    paths = J.decompose(layer, x)
    assert set(paths) == set(J.PATHS)
    for p in paths.values():
        assert p.shape == (T, 8, T, 8) and p.dtype == torch.float64
    torch.testing.assert_close(J.total(paths), J.autograd_jacobian(layer, x).detach(), **TOL)


@pytest.mark.parametrize("T", [2, 5, 12, 64])
@pytest.mark.parametrize("per_head", [False, True])
def test_dropout_with_a_fixed_pattern_in_training_mode(T, per_head):
    layer = _layer(3, n_heads=2, diag="dropout", diag_p=0.5).train()
    gen = torch.Generator().manual_seed(T)
    dropped = torch.rand((2, T) if per_head else (T,), generator=gen) < 0.5
    dropped[..., 0] = True  # at least one dropped entry, so the pattern matters
    x = _x(T)
    paths = J.decompose(layer, x, dropped)
    torch.testing.assert_close(
        J.total(paths), J.autograd_jacobian(layer, x, dropped).detach(), **TOL
    )
    # a dropped diagonal entry removes that step's value and key blocks on the diagonal
    if not per_head:
        i = int(torch.nonzero(dropped)[0])
        assert paths["value"][i, :, i, :].abs().max() == 0
        assert paths["key"][i, :, i, :].abs().max() == 0


def test_query_path_vanishes_off_the_diagonal_and_residual_is_identity():
    layer = _layer(0, n_heads=2)
    T = 12
    paths = J.decompose(layer, _x(T))
    off = ~torch.eye(T, dtype=torch.bool)
    q = paths["query"].permute(0, 2, 1, 3)  # [i, j, C, C]
    assert q[off].abs().max() == 0
    assert q[~off].abs().max() > 1e-3  # but not on it
    res = paths["residual"].permute(0, 2, 1, 3)
    torch.testing.assert_close(res[~off], torch.eye(8, dtype=torch.float64).expand(T, 8, 8), **TOL)
    assert res[off].abs().max() == 0


def test_no_residual_has_a_zero_residual_path():
    paths = J.decompose(_layer(0, residual=False), _x(5))
    assert paths["residual"].abs().max() == 0


def test_mask_removes_value_and_key_on_the_diagonal_but_keeps_query():
    T = 6
    paths = J.decompose(_layer(0, diag="mask"), _x(T))
    idx = torch.arange(T)
    assert paths["value"][idx, :, idx, :].abs().max() == 0
    assert paths["key"][idx, :, idx, :].abs().max() == 0
    assert paths["query"][idx, :, idx, :].abs().max() > 1e-3


def test_key_bias_and_value_bias_do_not_enter_the_jacobian_but_query_bias_does():
    layer, x = _layer(0, n_heads=2), _x(7)
    ref = J.total(J.decompose(layer, x))
    for proj, changes in (("k_proj", False), ("v_proj", False), ("q_proj", True)):
        other = _layer(0, n_heads=2)
        with torch.no_grad():
            getattr(other, proj).bias.add_(3.0)
        new = J.total(J.decompose(other, x))
        assert (not torch.allclose(new, ref, atol=1e-8, rtol=0)) == changes, proj


def test_positional_encoding_shifts_the_evaluation_point():
    layer = _layer(0, n_heads=2, pos_encoding="sinusoidal")
    plain = _layer(0, n_heads=2)
    x = _x(9)
    shifted = x + ds.sinusoidal_table(9, 8, torch.float64)
    torch.testing.assert_close(
        J.total(J.decompose(layer, x)), J.total(J.decompose(plain, shifted)), **TOL
    )


def test_penalty_changes_alpha_but_not_the_formula():
    T = 6
    layer = _layer(0, diag="penalty", diag_penalty=-2.0)
    x = _x(T)
    _, attn = layer(x, return_attention=True)
    # value path = α_ij M: recover α from the value blocks and compare with the layer's attention
    M = layer.out_proj.weight @ layer.v_proj.weight
    alpha = J.decompose(layer, x)["value"][:, 0, :, 0] / M[0, 0]
    torch.testing.assert_close(alpha, attn[0].detach(), **TOL)


def test_unsupported_configurations_raise_clear_errors():
    x = _x(5)
    with pytest.raises(ValueError, match="norm='post'.*norm=None"):
        J.decompose(_layer(0, norm="post"), x)
    with pytest.raises(ValueError, match="dropout.*layer.eval"):
        J.decompose(_layer(0, dropout=0.1).train(), x)
    with pytest.raises(ValueError, match="dropped="):
        J.decompose(_layer(0, diag="dropout").train(), x)
    with pytest.raises(ValueError, match=r"\[T, C\]"):
        J.decompose(_layer(0), x[None])
    with pytest.raises(ValueError, match="T >= 2"):
        J.decompose(_layer(0, diag="mask"), x[:1])
    assert isinstance(
        pytest.raises(ds.ConfigError, J.decompose, _layer(0, norm="pre"), x).value, ValueError
    )


def test_block_norms_match_the_dense_decomposition_and_row_subsets():
    layer, x = _layer(0, n_heads=2, diag="penalty"), _x(12)
    paths = J.decompose(layer, x)
    dense = {n: p.permute(0, 2, 1, 3) for n, p in paths.items()}
    dense["total"] = sum(dense.values())
    for norm, ord_ in (("spectral", 2), ("fro", "fro")):
        got = J.block_norms(layer, x, norm=norm, chunk_elems=500)  # several chunks
        for n in (*J.PATHS, "total"):
            torch.testing.assert_close(got[n], torch.linalg.matrix_norm(dense[n], ord=ord_), **TOL)
    rows = torch.tensor([7, 2])
    sub = J.block_norms(layer, x, rows=rows)
    torch.testing.assert_close(
        sub["total"], torch.linalg.matrix_norm(dense["total"][rows], ord=2), **TOL
    )


def _measured(paths: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    blocks = {n: p.permute(0, 2, 1, 3) for n, p in paths.items()}
    blocks["total"] = sum(blocks.values())
    return {n: torch.linalg.matrix_norm(b, ord=2) for n, b in blocks.items()}  # [T, T]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    T=st.integers(2, 40),
    heads=st.sampled_from([1, 2, 4]),
    diag=st.sampled_from([None, "mask", "penalty", "dropout"]),
    residual=st.booleans(),
    pe=st.sampled_from([None, "sinusoidal", "tape"]),
    scale=st.sampled_from([0.1, 1.0, 3.0]),
    x_scale=st.sampled_from([0.3, 1.0, 3.0]),
)
def test_measured_norms_never_exceed_the_bounds(seed, T, heads, diag, residual, pe, scale, x_scale):
    layer = _layer(seed, n_heads=heads, diag=diag, residual=residual, pos_encoding=pe, scale=scale)
    dropped = None
    if diag == "dropout":
        layer.train()
        dropped = torch.rand(T, generator=torch.Generator().manual_seed(seed)) < 0.5
    x = x_scale * _x(T, seed=seed)
    b = J.bound(layer, x, dropped)
    paths = J.decompose(layer, x, dropped)
    norms = _measured(paths)
    eye = torch.eye(T, dtype=torch.bool)
    slack = 1e-9
    for n in (*J.PATHS, "total"):
        assert float(norms[n][~eye].max()) <= b.off[n] * (1 + slack) + slack, n
        assert float(norms[n][eye].max()) <= b.diag[n] * (1 + slack) + slack, n
        avg = norms[n].masked_fill(eye, 0.0).sum(1) / (T - 1)  # average over j != i, per i
        assert float(avg.max()) <= b.off_average[n] * (1 + slack) + slack, n
    if residual:
        diag_blocks = J.total(paths).permute(0, 2, 1, 3)[
            torch.arange(T), torch.arange(T)
        ]  # [T, C, C]
        smallest = torch.linalg.svdvals(diag_blocks)[:, -1]
        assert float(smallest.min()) >= b.diag_lower - slack
    # the measured logit spread never exceeds its a-priori bound, so alpha <= e^Δ / N holds
    for h in range(heads):
        assert b.constants["delta"][h] <= b.constants["delta_apriori"][h] + slack
    _, attn = layer(x, return_attention=True, dropped=dropped)
    for h in range(heads):
        assert float(attn[h].detach().max()) <= b.constants["alpha_max_bound"][h] + slack


def test_sweep_small_weights_gives_one_over_T_off_diagonal_and_flat_diagonal():
    """Near-uniform attention (W_Q, W_K scaled by 0.1: logits within about ±0.05)."""
    lengths = [4, 8, 16, 32, 64, 128]
    sweep = toy.sensitivity_vs_length(
        lengths, layer_factory=lambda s: toy.init_layer(qk_scale=0.1, seed=s), n_samples=2, seed=0
    )
    assert -1.15 <= sweep.slope["off"]["total"] <= -0.85, sweep.slope
    assert -1.15 <= sweep.slope["off"]["value"] <= -0.85, sweep.slope
    assert abs(sweep.slope["diag"]["total"]) <= 0.1, sweep.slope
    assert math.isnan(sweep.slope["off"]["query"]) and math.isnan(sweep.slope["off"]["residual"])
    # the measured means stay below the bounds at every length
    for kind in ("off", "diag"):
        assert (sweep.mean[kind]["total"] <= sweep.bound[kind]["total"] + 1e-12).all()
    assert (sweep.mean["off"]["total"] <= sweep.bound_average["total"] + 1e-12).all()


def test_sweep_sharp_attention_breaks_the_per_entry_law():
    """With W_Q, W_K scaled by 3 the largest off-diagonal block stops falling like 1/T."""
    lengths = [4, 16, 64]
    sweep = toy.sensitivity_vs_length(
        lengths, layer_factory=lambda s: toy.init_layer(qk_scale=3.0, seed=s), n_samples=2, seed=0
    )
    assert sweep.max_slope["off"]["total"] > -0.5, sweep.max_slope
    assert sweep.slope["off"]["value"] < -0.85, sweep.slope  # the mean still falls like 1/T


def test_sweep_rejects_bad_arguments():
    with pytest.raises(ValueError, match="T must be"):
        toy.sensitivity_vs_length([1, 4])
    with pytest.raises(ValueError, match="either layer"):
        toy.sensitivity_vs_length([4], layer=toy.init_layer(), layer_factory=toy.init_layer)
    with pytest.raises(ValueError, match="inputs="):
        toy.sensitivity_vs_length([4], inputs="uniform")


def test_loglog_slope_recovers_a_power_law():
    lengths = [4, 8, 16, 32]
    assert toy.loglog_slope(lengths, [3.0 * t**-0.7 for t in lengths]) == pytest.approx(-0.7)
    assert math.isnan(toy.loglog_slope(lengths, [1.0, 0.0, 1.0, 1.0]))


def test_train_toy_layer_learns():
    layer, losses = toy.train_toy_layer(steps=60, d_model=8)
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10
    assert not layer.training and next(layer.parameters()).dtype == torch.float64


# ----------------------------------------------------------------------------------------
# exercise checks (diagsink/exercises/jacobian.py and bounds.py)
# ----------------------------------------------------------------------------------------
def _ref_softmax_jacobian(alpha):
    return torch.diag(alpha) - torch.outer(alpha, alpha)


def _ref_query_blocks(x, W_Q, W_K, W_V):
    T = x.shape[0]
    paths = J.decompose(ds.exercises.jacobian.one_head_layer(W_Q, W_K, W_V), x)
    return paths["query"][torch.arange(T), :, torch.arange(T), :]


def _ref_key_path(x, W_Q, W_K, W_V):
    return J.decompose(ds.exercises.jacobian.one_head_layer(W_Q, W_K, W_V), x)["key"]


def _ref_alpha_bound(scores):
    finite = torch.isfinite(scores)
    spread = scores.masked_fill(~finite, -math.inf).amax(-1) - scores.masked_fill(
        ~finite, math.inf
    ).amin(-1)
    return torch.exp(spread) / finite.sum(-1)


def _ref_offdiag(x, W_Q, W_K, W_V):
    return J.bound(ds.exercises.jacobian.one_head_layer(W_Q, W_K, W_V), x).off["total"]


def _ref_slope(lengths, values):
    import numpy as np

    return float(np.polyfit(np.log(lengths), np.log(values), 1)[0])


def _uncentred_query(x, W_Q, W_K, W_V):
    d = x.shape[1]
    q, k, z = x @ W_Q.T, x @ W_K.T, x @ W_V.T
    alpha = torch.softmax(q @ k.T / d**0.5, dim=-1)
    return torch.einsum("im,ma,mc,cb->iab", alpha, z, k, W_Q) / d**0.5


def _end_point_slope(lengths, values):
    return (math.log(values[-1]) - math.log(values[0])) / (
        math.log(lengths[-1]) - math.log(lengths[0])
    )


CHECKS = {
    "ex-jacobian-softmax": (
        _ref_softmax_jacobian,
        [
            (lambda a: torch.diag(a), "missing"),
            (lambda a: torch.diag(a) - torch.outer(a, a).T * 2, ""),
        ],
    ),
    "ex-jacobian-query": (
        _ref_query_blocks,
        [
            (_uncentred_query, "centre the keys"),
            (
                lambda *a: J.decompose(ds.exercises.jacobian.one_head_layer(*a[1:]), a[0])["query"],
                "diagonal blocks",
            ),
        ],
    ),
    "ex-jacobian-key": (
        _ref_key_path,
        [
            (
                lambda *a: (
                    _ref_key_path(*a)
                    + J.decompose(ds.exercises.jacobian.one_head_layer(*a[1:]), a[0])["value"]
                ),
                "value path",
            ),
            (lambda *a: 2 * _ref_key_path(*a), "factor"),
        ],
    ),
    "ex-bounds-alpha": (
        _ref_alpha_bound,
        [
            (
                lambda s: _ref_alpha_bound(s) * torch.isfinite(s).sum(-1) / s.shape[-1],
                "number of keys",
            ),
            (lambda s: torch.exp(s.max(-1).values - s.min(-1).values) / s.shape[-1], ""),
        ],
    ),
    "ex-bounds-offdiag": (
        _ref_offdiag,
        [
            (
                lambda *a: J.bound(ds.exercises.jacobian.one_head_layer(*a[1:]), a[0]).off["value"],
                "value path only",
            )
        ],
    ),
    "ex-bounds-slope": (_ref_slope, [(_end_point_slope, "end points")]),
}


@pytest.mark.parametrize("label", sorted(CHECKS))
def test_exercise_reference_passes_and_typical_mistakes_get_hints(label, capsys):
    reference, wrong_answers = CHECKS[label]
    assert ds.exercises.check(label, reference, strict=True).passed
    for wrong, hint_part in wrong_answers:
        result = ds.exercises.check(label, wrong)
        assert not result.passed, label
        assert hint_part in result.message, result.message


def test_exercise_labels_are_registered():
    labels = set(ds.exercises.labels())
    assert set(CHECKS) <= labels


def test_sweep_row_subsampling_estimates_the_full_mean():
    factory = lambda s: toy.init_layer(8, 1, qk_scale=0.1, seed=s)  # noqa: E731
    full = toy.sensitivity_vs_length(
        [40], layer_factory=factory, n_samples=1, max_rows=None, seed=3
    )
    sub = toy.sensitivity_vs_length([40], layer_factory=factory, n_samples=1, max_rows=10, seed=3)
    for kind in ("off", "diag"):
        assert sub.mean[kind]["total"][0] == pytest.approx(full.mean[kind]["total"][0], rel=0.1)
    fro = toy.sensitivity_vs_length([8], layer_factory=factory, n_samples=1, norm="fro", seed=3)
    spectral = toy.sensitivity_vs_length([8], layer_factory=factory, n_samples=1, seed=3)
    assert fro.mean["diag"]["residual"][0] == pytest.approx(math.sqrt(8))  # ‖I‖_F = sqrt(C)
    assert fro.mean["off"]["total"][0] >= spectral.mean["off"]["total"][0]


def test_bound_for_a_single_step_has_no_off_diagonal_part():
    layer = _layer(0, n_heads=2)
    b = J.bound(layer, _x(1))
    assert b.off_average["total"] == 0 and b.constants["D"] == 0 and b.constants["N"] == 1
    jac = J.total(J.decompose(layer, _x(1)))[0, :, 0, :]
    assert float(torch.linalg.matrix_norm(jac, ord=2)) <= b.diag["total"] + 1e-12
