"""diagsink.probe: recording attention maps of unmodified models, statistics, sensitivity."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import diagsink.stats as stats
from diagsink.attention import TemporalAttention
from diagsink.errors import DiagsinkError
from diagsink.probe import map_stats, record, report, sensitivity_profile, table
from diagsink.regularize import regularize

matplotlib.use("Agg")


def _encoder(norm_first: bool = False) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.2, batch_first=True, norm_first=norm_first
    )
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first)


def _run(model, x, seed, **kw):
    torch.manual_seed(seed)
    return model(x, **kw)


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_outputs_bit_identical_and_maps_recorded(train, grad, norm_first):
    model = _encoder(norm_first).train(train)
    x = torch.randn(3, 6, 8)
    with torch.set_grad_enabled(grad):
        plain = _run(model, x, 1)
        with record(model) as rec:
            probed = _run(model, x, 1)
    assert torch.equal(plain, probed)
    assert set(rec.maps) == {"layers.0.self_attn", "layers.1.self_attn"}
    for attn in rec.maps.values():
        assert attn.shape == (3, 2, 6, 6)
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, 2, 6))
    # the wrappers are gone afterwards
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_fast_path_map_equals_slow_path_map():
    """In eval mode without grad the encoder layer never calls self_attn; the map is still right."""
    model = _encoder().eval()
    x = torch.randn(3, 6, 8)
    with torch.no_grad(), record(model) as fast:
        model(x)
    with record(model) as slow:  # grad enabled: the slow path calls self_attn
        model(x)
    assert fast.kinds["layers.0.self_attn"].endswith("(encoder fast path)")
    assert slow.kinds["layers.0.self_attn"] == "nn.MultiheadAttention"
    for name in fast.maps:
        torch.testing.assert_close(fast.maps[name], slow.maps[name])
    # the first layer's map by hand from the layer's own in_proj
    mha = model.layers[0].self_attn
    w_q, w_k, _ = mha.in_proj_weight.chunk(3)
    b_q, b_k, _ = mha.in_proj_bias.chunk(3)
    q = (x @ w_q.T + b_q).reshape(3, 6, 2, 4).transpose(1, 2)
    k = (x @ w_k.T + b_k).reshape(3, 6, 2, 4).transpose(1, 2)
    by_hand = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
    torch.testing.assert_close(fast.maps["layers.0.self_attn"], by_hand.detach())


def test_padding_mask_nested_fast_path():
    model = _encoder().eval()
    x = torch.randn(3, 6, 8)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        plain = model(x, src_key_padding_mask=pad)
        with record(model) as rec:
            probed = model(x, src_key_padding_mask=pad)
    assert torch.equal(plain, probed)
    attn = rec.maps["layers.0.self_attn"]
    assert float(attn[1, :, :, 4:].abs().max()) == 0.0  # padded keys get no weight


def test_mha_batch_first_false_attention_dropout_and_cross_attention_skipped():
    mha = nn.MultiheadAttention(8, 2, dropout=0.5).train()
    x = torch.randn(6, 3, 8)  # [T, N, E]
    y = torch.randn(4, 3, 8)
    torch.manual_seed(0)
    plain = mha(x, x, x)[0], mha(y, x, x)[0]
    with record(mha) as rec:
        torch.manual_seed(0)
        probed = mha(x, x, x)[0], mha(y, x, x)[0]
    assert all(torch.equal(a, b) for a, b in zip(plain, probed))
    attn = rec.maps["<model>"]
    assert attn.shape == (3, 2, 6, 6)  # before dropout: rows sum to 1
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 2, 6))
    assert "cross-attention" in rec.skipped["<model>"]
    assert len(rec.calls["<model>"]) == 1


def test_temporal_attention_recorded_once_with_its_drawn_dropout_pattern():
    layer = TemporalAttention(8, 2, diag="dropout", diag_p=0.5).train()
    x = torch.randn(2, 3, 6, 8)
    plain = _run(layer, x, 3)
    with record(layer) as rec:
        probed = _run(layer, x, 3)
    assert torch.equal(plain, probed)
    # the SDPA call inside the layer is not recorded a second time
    assert list(rec.maps) == ["<model>"]
    _, reference = _run(layer, x, 3, return_attention=True)  # same seed: same pattern
    torch.testing.assert_close(rec.maps["<model>"], reference.detach())
    assert float(rec.maps["<model>"].diagonal(dim1=-2, dim2=-1).min()) == 0.0  # dropped


def test_regularized_mha_inside_encoder_records_regularized_map():
    model = regularize(_encoder().eval(), "mask")
    with torch.no_grad(), record(model) as rec:
        model(torch.randn(2, 5, 8))
    for attn in rec.maps.values():
        assert float(attn.diagonal(dim1=-2, dim2=-1).abs().max()) == 0.0


class _Custom(nn.Module):
    """A hand-written attention that calls scaled_dot_product_attention itself."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.proj(x).reshape(*x.shape[:-1], 3, 2, 4).unbind(-3)
        q, k, v = (t.transpose(-2, -3) for t in (q, k, v))  # [B, H, T, d]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.3)


def test_sdpa_calls_recorded_by_module_and_call_site():
    model = nn.Sequential(_Custom()).train()
    x = torch.randn(2, 5, 8)
    plain = _run(model, x, 4)
    with record(model) as rec:
        probed = _run(model, x, 4)
    assert torch.equal(plain, probed)
    (name,) = rec.maps
    assert name.startswith("0:sdpa@test_probe.py:")
    attn = rec.maps[name]
    assert attn.shape == (2, 2, 5, 5)
    assert float(attn.triu(1).abs().max()) == 0.0  # causal
    assert F.scaled_dot_product_attention.__module__ != __name__  # restored afterwards
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_several_calls_concatenate():
    model = _encoder().eval()
    with record(model) as rec:
        model(torch.randn(2, 5, 8))
        model(torch.randn(3, 5, 8))
        model(torch.randn(1, 4, 8))
    assert len(rec.calls["layers.0.self_attn"]) == 3
    with pytest.raises(ValueError, match="different shapes"):
        _ = rec.maps


def test_map_stats_agree_with_diagsink_stats():
    attn = torch.softmax(torch.randn(4, 3, 7, 7) * 2, dim=-1)
    row = map_stats(attn)
    assert row["T"] == 7 and row["maps"] == 12
    assert row["diag_mass"] == pytest.approx(stats.diagonal_mass(attn).mass, rel=1e-6)
    assert row["diag_ratio"] == pytest.approx(stats.diagonal_mass(attn).ratio, rel=1e-6)
    assert row["stripe"] == pytest.approx(stats.column_stripe_index(attn), rel=1e-6)
    ent = stats.attention_entropy(attn, normalized=True).mean()
    assert row["entropy"] == pytest.approx(float(ent), rel=1e-6)
    mean = attn.mean((0, 1))
    assert row["avg_stripe"] == pytest.approx(stats.column_stripe_index(mean), rel=1e-6)
    # spread: the standard deviation of the per-map diagonal masses
    per_map = attn.diagonal(dim1=-2, dim2=-1).mean(-1).flatten()
    assert row["diag_mass_sd"] == pytest.approx(float(per_map.double().std()), rel=1e-6)


def test_map_stats_on_known_maps():
    eye = torch.eye(5).expand(2, 5, 5)
    row = map_stats(eye)
    assert row["diag_mass"] == 1.0 and row["diag_ratio"] == pytest.approx(5.0)
    assert row["entropy"] == pytest.approx(0.0) and row["stripe"] == pytest.approx(0.0)
    stripes = torch.zeros(5, 5)
    stripes[:, 2] = 1.0  # every query attends to key 2
    assert map_stats(stripes)["stripe"] == pytest.approx(1.0)


def test_exact_profile_on_known_jacobian():
    """f(x) = M x over time: ∂f/∂x_j = M[:, j] ⊗ I_C, so S_j = ||M[:, j]|| · sqrt(C)."""
    m = torch.randn(4, 6)
    x = torch.randn(6, 3)
    prof = sensitivity_profile(lambda z: m @ z, x, time_dim=0)
    torch.testing.assert_close(prof.values, m.norm(dim=0) * math.sqrt(3))
    assert prof.se is None


def test_exact_profile_matches_autograd_with_batch_dim():
    model = _encoder().eval()
    x = torch.randn(2, 5, 8)
    prof = sensitivity_profile(lambda z: model(z)[:, -1], x, time_dim=1, batch_dim=0)
    jac = torch.autograd.functional.jacobian(lambda z: model(z)[:, -1], x)  # [2, 8, 2, 5, 8]
    per_b = torch.stack([jac[b, :, b].pow(2).sum((0, 2)) for b in range(2)])  # [B, T]
    torch.testing.assert_close(prof.values, per_b.mean(0).sqrt())


def test_hutchinson_within_a_few_standard_errors_of_exact():
    model = _encoder().eval()
    x = torch.randn(2, 5, 8)
    exact = sensitivity_profile(model, x, time_dim=1, batch_dim=0)
    est = sensitivity_profile(model, x, time_dim=1, batch_dim=0, method="hutchinson", n_samples=200)
    z = (est.values - exact.values) / est.se
    # 5 steps, each within 4 SE: a chance of about 3e-4 of failing by luck (normal tails)
    assert float(z.abs().max()) < 4.0
    assert float((est.se / exact.values).max()) < 0.2  # 200 samples: a usable estimate


def test_report_figure_and_table():
    model = _encoder().eval()
    x = torch.randn(2, 5, 8)
    with record(model) as rec:
        model(x)
    prof = sensitivity_profile(model, x, time_dim=1, batch_dim=0, method="hutchinson", n_samples=8)
    fig, rows = report(rec, prof)
    assert [r["name"] for r in rows] == [r["name"] for r in table(rec)]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3  # two maps and the profile
    assert all(t == int(t) for t in visible[-1].get_xticks())


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: record(object()).__enter__(), "nn.Module"),
        (lambda: sensitivity_profile(lambda z: z, torch.ones(3), 0, method="x"), "exact"),
        (
            lambda: sensitivity_profile(lambda z: z, torch.ones(3), 0, "hutchinson", 1),
            "2 samples",
        ),
        (lambda: sensitivity_profile(lambda z: z, torch.ones(2, 3), 0, batch_dim=0), "two axes"),
        (lambda: map_stats(torch.ones(3, 4)), r"\[\.\.\., T, T\]"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_probe_command_on_a_committed_run(capsys, tmp_path):
    from diagsink.cli import main

    from conftest import ROOT

    art = ROOT / "book" / "results" / "quick" / "mask_seed0.json"
    assert main(["probe", str(art), "--windows", "2", "--out", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    # the two blocks of the quick model, each [B, N, H, T, T]; the mask's diagonal is empty
    assert "blocks.0.attn" in out and "blocks.1.attn" in out and "(2, 207, 2, 12, 12)" in out
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert main(["probe", str(tmp_path / "missing.json")]) == 2


def test_path_norms_of_an_mha_are_its_exact_jacobian():
    """The closed-form paths of a converted nn.MultiheadAttention sum to autograd's Jacobian."""
    from diagsink import jacobian
    from diagsink.jacobian import path_norms
    from diagsink.regularize import as_temporal_attention

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    x = torch.randn(6, 8, dtype=torch.float64)
    auto = torch.autograd.functional.jacobian(lambda s: mha(s[None], s[None], s[None])[0][0], x)
    paths = jacobian.decompose(as_temporal_attention(mha).double().eval(), x)
    torch.testing.assert_close(sum(paths.values()), auto)  # [T, C, T, C]
    norms = path_norms(mha, x)
    assert norms["residual"] == {"diagonal": 0.0, "off_diagonal": 0.0}  # an MHA has no residual
    blocks = auto.permute(0, 2, 1, 3).flatten(2).norm(dim=-1)  # [T, T] Frobenius of each block
    assert norms["total"]["diagonal"] == pytest.approx(float(blocks.diagonal().mean()), rel=1e-9)
    assert norms["query"]["off_diagonal"] == 0.0 and norms["query"]["diagonal"] > 0


@pytest.mark.parametrize(
    "dims", [{"time_dim": 3}, {"time_dim": -4}, {"time_dim": 1, "batch_dim": 5}]
)
def test_sensitivity_profile_names_an_axis_that_x_lacks(dims):
    x = torch.randn(2, 5, 3)
    name, value = [(k, v) for k, v in dims.items() if v not in (1,)][0]
    with pytest.raises(ValueError, match=rf"{name}={value} is not an axis of x.*ndim=3"):
        sensitivity_profile(lambda z: z.sum(-1), x, **dims)


def test_report_without_attention_is_a_clear_error():
    model = nn.Sequential(nn.Linear(4, 4))
    with record(model) as rec:
        model(torch.randn(2, 3, 4))
    with pytest.raises(DiagsinkError, match="no nn.MultiheadAttention, TemporalAttention"):
        report(rec)
    with pytest.raises(DiagsinkError, match="takes the Recording.*got Sequential"):
        report(model)
