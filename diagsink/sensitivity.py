"""Where the sink lives in a trained T&S model: its sensitivity to each input step, and its maps.

Used by the heatmaps and results chapters (``book/heatmaps.ipynb``, ``book/results.ipynb``) on
the committed runs, computed from their saved weights. Two views of the same model:

* the **input-step profile** ``S_j``: how strongly the forecast (all 12 horizons, all sensors)
  moves with the speed readings at input step ``j``,

  ``S_j^2 = (1 / (B N)) Σ_b ‖∂ŷ_b / ∂x_{b,j}‖_F^2``,  ``ŷ_b`` ``[T_out, N]`` (mph),
  ``x_{b,j}`` the scaled speeds ``[N]`` of window ``b`` at step ``j``;

  computed exactly (autograd, small models) or with Hutchinson's estimator, the measure of the
  paper's released code: ``‖J‖_F^2 = E_u ‖u^T J‖^2`` for Rademacher ``u`` on the outputs, so
  one backward pass per probe gives all ``T_in`` steps at once; its standard error is reported;
* the **map statistics** of the last block per sequence and of the averaged map
  (:func:`diagsink.stats.map_statistics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._checks import is_int
from .engine.prepare import batch
from .stats import map_statistics

__all__ = [
    "Profile",
    "exact_step_norms",
    "hutchinson_step_norms",
    "input_step_profile",
    "run_sensitivity",
]


@dataclass(frozen=True)
class Profile:
    """``S_j`` for each input step ``j`` (``[T_in]``), with its standard error (Hutchinson only)."""

    steps: torch.Tensor
    se: torch.Tensor | None
    method: str
    windows: int
    probes: int

    def as_dict(self) -> dict:
        """JSON-ready: lists of floats."""
        return {
            "S": [float(v) for v in self.steps],
            "se": None if self.se is None else [float(v) for v in self.se],
            "method": self.method,
            "windows": self.windows,
            "probes": self.probes,
        }


def _speed_forward(model: torch.nn.Module, x: torch.Tensor):
    """``f(speed) -> forecast`` with the other input channels of ``x`` held fixed."""
    rest = x[..., 1:]

    def f(speed: torch.Tensor) -> torch.Tensor:
        return model(torch.cat([speed.unsqueeze(-1), rest], dim=-1))

    return f


def exact_step_norms(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``‖∂ŷ_b/∂x_{b,j}‖_F^2`` for every window and step, by autograd: ``[B, T_in]``.

    Args:
        model: maps ``[B, T_in, N, C]`` to ``[B, T_out, N]``; windows must not interact
            (no batch statistics), which holds for :class:`diagsink.model.TSModel` in eval mode.
        x: ``[B, T_in, N, C]`` inputs; channel 0 is the (scaled) speed.

    The full Jacobian of each window is formed (``T_out N x T_in N`` entries): small models only.
    """
    out = []
    for b in range(x.shape[0]):
        xb = x[b : b + 1]
        jac = torch.autograd.functional.jacobian(_speed_forward(model, xb), xb[..., 0])
        out.append(jac.pow(2).sum(dim=(0, 1, 2, 3, 5)))  # [T_in]: over outputs and sensors
    return torch.stack(out)


def hutchinson_step_norms(
    model: torch.nn.Module, x: torch.Tensor, probes: int, generator: torch.Generator
) -> torch.Tensor:
    """Hutchinson samples of ``‖∂ŷ_b/∂x_{b,j}‖_F^2``: ``[probes, B, T_in]``; their mean is unbiased."""
    speed = x[..., 0].detach().requires_grad_(True)
    pred = _speed_forward(model, x)(speed)  # one forward pass, reused by every probe
    samples = []
    for k in range(probes):
        u = torch.randint(0, 2, pred.shape, generator=generator).to(pred) * 2 - 1
        (grad,) = torch.autograd.grad(pred, speed, u, retain_graph=k < probes - 1)
        samples.append(grad.pow(2).sum(-1))  # [B, T_in]: over sensors
    return torch.stack(samples)


def input_step_profile(
    model: torch.nn.Module,
    x: torch.Tensor,
    method: str = "hutchinson",
    probes: int = 16,
    seed: int = 0,
) -> Profile:
    """``S_j`` over the windows ``x`` ``[B, T_in, N, C]`` (see the module docstring).

    ``method="hutchinson"`` (``probes`` Rademacher probes per window) reports the standard
    error of ``S_j`` over the ``probes x B`` samples (delta method, ``se(S) = se(S^2) / 2S``);
    ``"exact"`` forms each window's Jacobian (small models only).
    """
    if method not in ("exact", "hutchinson"):
        raise ValueError(f"method {method!r} is not known; use 'exact' or 'hutchinson'.")
    if method == "hutchinson" and (not is_int(probes) or probes < 2):
        raise ValueError(
            f"probes = {probes!r}: Hutchinson needs a whole number >= 2 for its error."
        )
    model.eval()
    n = x.shape[2]
    if method == "exact":
        sq = exact_step_norms(model, x).mean(0) / n
        return Profile(sq.sqrt().detach(), None, "exact", x.shape[0], 0)
    g = torch.Generator().manual_seed(seed)
    samples = hutchinson_step_norms(model, x, probes, g).flatten(0, 1) / n  # [K B, T_in]
    mean = samples.mean(0)
    se_sq = samples.std(0) / math.sqrt(samples.shape[0])
    steps = mean.clamp_min(0).sqrt()
    return Profile(
        steps.detach(),
        (se_sq / (2 * steps.clamp_min(1e-30))).detach(),
        "hutchinson",
        x.shape[0],
        probes,
    )


def run_sensitivity(run, windows: int = 32, probes: int = 16, seed: int = 0) -> dict:
    """Profile and last-block map statistics of a committed run on its first test windows.

    Args:
        run: a :class:`diagsink.engine.reload.LoadedRun`.
        windows: how many test windows (the first ones, in time order).
    """
    m = run.cfg["model"]
    x, _ = batch(run.prepared, run.prepared.test[:windows], m["t_in"], m["t_out"])
    profile = input_step_profile(run.model, x, "hutchinson", probes, seed)
    with torch.no_grad():
        _, attn = run.model(x, return_attention=True)  # [B, N, H, T, T], eval mode
    return {
        "profile": profile.as_dict(),
        "maps": map_statistics(attn),
        "how": f"first {x.shape[0]} test windows, eval mode, last block; Hutchinson with {probes} probes per window",
    }
