"""The input-step profile (exact and Hutchinson) and the per-sequence map statistics."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diagsink.data import toy_data
from diagsink.engine.config import load_config, override
from diagsink.engine.prepare import batch, prepare
from diagsink.engine.reload import load_run
from diagsink.engine.train import build_model
from diagsink.sensitivity import exact_step_norms, input_step_profile, run_sensitivity
from diagsink.stats import map_statistics

from conftest import ROOT


class StepMix(nn.Module):
    """``ŷ[b, h, n] = Σ_j W[h, j] x[b, j, n, 0]``: ``S_j^2 = Σ_h W[h, j]^2`` exactly."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("hj,bjn->bhn", self.w, x[..., 0]) + x[..., 1].mean(1, keepdim=True)


def test_exact_profile_of_a_linear_model_is_known():
    w = torch.randn(5, 7, dtype=torch.float64)
    x = torch.randn(3, 7, 4, 2, dtype=torch.float64)
    prof = input_step_profile(StepMix(w), x, "exact")
    torch.testing.assert_close(prof.steps, w.pow(2).sum(0).sqrt().detach())
    assert prof.se is None and prof.windows == 3
    # per window: ‖∂ŷ_b/∂x_{b,j}‖_F^2 = N Σ_h W[h, j]^2
    torch.testing.assert_close(exact_step_norms(StepMix(w), x)[1], 4 * w.pow(2).sum(0).detach())


def test_hutchinson_agrees_with_the_exact_profile_of_a_ts_model():
    torch.manual_seed(0)
    cfg = override(load_config("quick"), {"model.d_model": 8, "model.depth": 1})
    prepared = prepare(toy_data(400, 5), cfg)
    model = build_model(cfg, "none", prepared).eval()
    x, _ = batch(prepared, prepared.test[:4], 12, 12)
    exact = input_step_profile(model, x, "exact")
    est = input_step_profile(model, x, "hutchinson", probes=200, seed=1)
    z = (est.steps - exact.steps).abs() / est.se
    assert (z < 4).all(), z  # within 4 standard errors at every step
    assert (est.se < 0.1 * est.steps).all()  # and the errors are small
    # a wrong estimator (e.g. forgetting the square) would be far off: the check can fail
    assert not torch.allclose(est.steps, exact.steps.sqrt(), rtol=0.05)


def test_bad_arguments_are_refused():
    x = torch.randn(1, 3, 2, 2)
    with pytest.raises(ValueError, match="exact"):
        input_step_profile(StepMix(torch.randn(2, 3)), x, "hutch")
    with pytest.raises(ValueError, match="probes"):
        input_step_profile(StepMix(torch.randn(2, 3)), x, probes=1)


def test_map_statistics_per_sequence_and_of_the_average():
    t = 6
    eye = torch.eye(t).expand(3, t, t)
    s = map_statistics(eye)
    assert s["diagonal_ratio"]["mean"] == pytest.approx(t) and s["entropy"][
        "mean"
    ] == pytest.approx(0)
    uniform = torch.full((2, t, t), 1 / t)
    assert map_statistics(uniform)["entropy"]["of_mean"] == pytest.approx(1)
    # two sharp maps attending to different keys: each has entropy 0, their average does not
    a = torch.zeros(2, t, t)
    a[0, :, 0] = 1
    a[1, :, 1] = 1
    s = map_statistics(a)
    assert s["entropy"]["mean"] == pytest.approx(0) and s["entropy"]["of_mean"] == pytest.approx(
        math.log(2) / math.log(t)
    )
    assert s["stripe_index"]["mean"] == pytest.approx(1) and s["stripe_index"]["std"] == 0


def test_run_sensitivity_on_a_committed_run():
    run = load_run(ROOT / "book" / "results" / "quick" / "none_seed0.json")
    out = run_sensitivity(run, windows=4, probes=4)
    assert len(out["profile"]["S"]) == 12 and all(v > 0 for v in out["profile"]["S"])
    assert all(0 < e < s for e, s in zip(out["profile"]["se"], out["profile"]["S"]))
    assert set(out["maps"]) == {"diagonal_ratio", "entropy", "stripe_index"}
