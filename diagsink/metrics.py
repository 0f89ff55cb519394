"""Masked error metrics for traffic forecasting (MAE, RMSE, MAPE) and the horizon report.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA", section "Masked metrics").

A target equal to ``null_value`` (0.0: a missing reading in METR-LA) is left out: with the
mask ``m = (y != 0)`` and ``n = sum(m)``

* ``MAE  = sum(m * |p - y|) / n``
* ``RMSE = sqrt(sum(m * (p - y)^2) / n)``
* ``MAPE = 100 * sum(m * |p - y| / |y|) / n``  (in percent)

The mean is over *all* unmasked entries of the input (a pooled mean), which is what
DCRNN's ``masked_mae_loss`` computes. An input with no unmasked entry raises
:class:`~diagsink.errors.DataError` instead of returning a silent 0 or NaN.

``pred`` and ``target`` are unscaled speeds of any (broadcast-equal) shape; tensors or numpy
arrays. The functions return a 0-d tensor (differentiable in ``pred``, usable as a loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .errors import DataError

__all__ = [
    "masked_mae",
    "masked_rmse",
    "masked_mape",
    "horizon_metrics",
    "metric_mask",
    "format_metrics",
]


def _as_tensors(pred, target) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.as_tensor(pred)
    t = torch.as_tensor(target, device=p.device)
    if p.shape != t.shape:
        raise DataError(
            f"pred has shape {tuple(p.shape)} but target {tuple(t.shape)}. "
            "Fix: compare predictions and targets of the same shape (e.g. both [B, 12, N])."
        )
    if not p.is_floating_point():
        p = p.to(torch.float64)
    return p, t.to(p.dtype)


def metric_mask(target, null_value: float = 0.0) -> torch.Tensor:
    """Boolean mask of the entries that count: ``target != null_value`` (``~isnan`` if it is NaN)."""
    t = torch.as_tensor(target)
    if isinstance(null_value, float) and math.isnan(null_value):
        return ~torch.isnan(t)
    return t != null_value


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, what: str) -> torch.Tensor:
    n = mask.sum()
    if int(n) == 0:
        raise DataError(
            f"{what}: every target is masked (all equal the null value), so the error is undefined. "
            "Fix: evaluate on a batch that contains at least one observed (non-zero) target."
        )
    return torch.where(mask, values, torch.zeros_like(values)).sum() / n


def masked_mae(pred, target, null_value: float = 0.0) -> torch.Tensor:
    """Masked mean absolute error (targets equal to ``null_value`` are ignored)."""
    p, t = _as_tensors(pred, target)
    return _masked_mean((p - t).abs(), metric_mask(t, null_value), "masked_mae")


def masked_rmse(pred, target, null_value: float = 0.0) -> torch.Tensor:
    """Masked root mean squared error: the square root of the pooled masked MSE."""
    p, t = _as_tensors(pred, target)
    return torch.sqrt(_masked_mean((p - t) ** 2, metric_mask(t, null_value), "masked_rmse"))


def masked_mape(pred, target, null_value: float = 0.0) -> torch.Tensor:
    """Masked mean absolute percentage error, in percent."""
    p, t = _as_tensors(pred, target)
    mask = metric_mask(t, null_value) & (t != 0)
    safe = torch.where(mask, t, torch.ones_like(t))
    return 100.0 * _masked_mean((p - t).abs() / safe.abs(), mask, "masked_mape")


_METRICS = {"MAE": masked_mae, "RMSE": masked_rmse, "MAPE": masked_mape}


@torch.no_grad()
def horizon_metrics(
    pred,
    target,
    horizons: Sequence[int] = (3, 6, 12),
    null_value: float = 0.0,
    average: str = "pooled",
) -> dict[str, float]:
    """MAE, RMSE and MAPE at single horizons and over all steps, labelled.

    Args:
        pred, target: ``[B, T_out, N]`` (or ``[B, T_out, N, 1]``): time is dimension 1.
        horizons: 1-based steps reported *alone*: horizon ``h`` is index ``h - 1`` (with 5-minute
            steps 3, 6, 12 are 15, 30 and 60 minutes ahead).
        average: how ``"@mean"`` is formed: ``"pooled"`` (default; the masked metric over all
            ``T_out`` steps together) or ``"per-step"`` (the plain mean of the ``T_out``
            single-step values, as Graph WaveNet prints "average over 12 horizons").

    Returns:
        A dict of Python floats computed in float64, keyed ``MAE@3``, ``RMSE@3``, ``MAPE@3``, ... for each
        horizon, then ``MAE@mean``, ``RMSE@mean``, ``MAPE@mean`` (MAPE in percent).
    """
    p, t = _as_tensors(pred, target)
    p, t = p.to(torch.float64), t.to(torch.float64)
    if p.dim() < 2:
        raise DataError(
            f"horizon_metrics needs [B, T_out, N] inputs (time in dimension 1); got shape {tuple(p.shape)}."
        )
    steps = p.shape[1]
    for h in horizons:
        if not 1 <= h <= steps:
            raise DataError(
                f"horizon {h} is outside 1..{steps} (the predicted steps). Fix: choose horizons within it."
            )
    if average not in ("pooled", "per-step"):
        raise DataError(f"average={average!r}; choose 'pooled' or 'per-step'.")
    out: dict[str, float] = {}
    for h in horizons:
        for name, fn in _METRICS.items():
            out[f"{name}@{h}"] = float(fn(p[:, h - 1], t[:, h - 1], null_value))
    for name, fn in _METRICS.items():
        if average == "pooled":
            out[f"{name}@mean"] = float(fn(p, t, null_value))
        else:
            out[f"{name}@mean"] = (
                sum(float(fn(p[:, k], t[:, k], null_value)) for k in range(steps)) / steps
            )
    return out


def format_metrics(metrics: dict[str, float], digits: int = 3) -> str:
    """One line ``MAE@3 2.966 | RMSE@3 ...`` in the order of the dict."""
    return " | ".join(f"{k} {v:.{digits}f}" for k, v in metrics.items())
