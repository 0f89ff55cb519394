"""Yardsticks for METR-LA: historical averages, "copy the present" (last value), a linear model.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA", section "Baselines").

* **Historical average (HA).** For every sensor, 5-minute time-of-day slot (288 per day) and
  day type (weekday Monday-Friday, or weekend Saturday-Sunday) the mean of the *non-zero*
  training speeds ``speed[:train_steps(splits)]``. The forecast for a target step is the
  table entry of its sensor, slot and day type; it ignores the input window entirely. A cell
  without any non-zero training value falls back to the same slot pooled over both day
  types, then to the sensor's mean, then to the mean of all sensors.
  (DCRNN's paper describes its HA only as a weighted average of previous seasons; the
  numbers are therefore not expected to match its 4.16 MAE exactly.) ``period="week"`` keys
  the table by the time of *week* instead (7 x 288 slots), with the same fallbacks (the slot
  over all days, then the sensor's mean): the usual HA of traffic benchmarks on long series.
* **Last value ("parroting").** Every one of the ``t_out`` future steps is predicted to equal
  the last observed speed, i.e. the value at the last input step ``s + t_in - 1``. With
  ``fill=True`` (default) a missing reading (0) there is replaced by the latest earlier
  non-zero reading of that sensor (a forward fill: only the past is used); with
  ``fill=False`` the zero is copied as it is. A model whose attention sinks onto the
  diagonal tends towards this forecast.
* **Linear forecaster.** For every sensor ``n`` and horizon ``h`` an affine map of the 12
  (forward-filled) input speeds, ``y_h = w_{n,h}^T x_n + b_{n,h}``, fitted by ridge-regularised
  least squares on the training windows whose target is observed (:func:`linear_forecaster`).
  The simplest learned model; it sees each sensor alone, like the released graph layer.

All arrays are float64 ``[B, t_out, N]`` speeds in mph.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..errors import DataError
from ..metrics import horizon_metrics
from .windows import Splits, gather, split_windows, train_steps

__all__ = [
    "historical_average_table",
    "historical_average",
    "last_value",
    "fit_linear",
    "linear_forecaster",
    "baseline_forecasts",
    "baseline_table",
    "SLOTS_PER_DAY",
]

SLOTS_PER_DAY = 288


def _keys(timestamps: pd.DatetimeIndex, period: str = "daytype") -> tuple[np.ndarray, np.ndarray]:
    """(time-of-day slot, day class) of every step: day class = weekend flag, or weekday 0-6."""
    if period not in ("daytype", "week"):
        raise ValueError(f"period={period!r}; choose 'daytype' (weekday/weekend) or 'week'.")
    ts = pd.DatetimeIndex(timestamps)
    slot = np.asarray(ts.hour * 60 + ts.minute) // 5
    day = np.asarray(ts.day_of_week)
    day = day if period == "week" else (day >= 5)
    return slot.astype(np.int64), day.astype(np.int64)


def historical_average_table(
    speed: np.ndarray, timestamps: pd.DatetimeIndex, end: int, period: str = "daytype"
) -> np.ndarray:
    """The HA table ``[N, 288, D]`` (sensor, time-of-day slot, day class) from ``speed[:end]``.

    ``period="daytype"``: ``D = 2`` (0 = weekday, 1 = weekend); ``"week"``: ``D = 7`` (Monday =
    0). Means of the non-zero values; empty cells filled as described in the module docstring.
    """
    if len(timestamps) != len(speed) or not 1 <= end <= len(speed):
        raise DataError(
            f"historical_average_table needs one timestamp per step and 1 <= end <= {len(speed)}; "
            f"got {len(timestamps)} timestamps and end={end}. Fix: pass data.timestamps and "
            "end=train_steps(splits)."
        )
    x = np.asarray(speed, dtype=np.float64)[:end]
    slot, day = _keys(timestamps[:end], period)
    n, days = x.shape[1], 7 if period == "week" else 2
    observed = (x != 0).astype(np.float64)
    key = slot * days + day
    sums = np.zeros((SLOTS_PER_DAY * days, n))
    counts = np.zeros((SLOTS_PER_DAY * days, n))
    np.add.at(sums, key, x)
    np.add.at(counts, key, observed)
    sums = sums.reshape(SLOTS_PER_DAY, days, n)
    counts = counts.reshape(SLOTS_PER_DAY, days, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        table = sums / counts  # NaN where a cell is empty
        pooled = sums.sum(1) / counts.sum(1)  # [288, N]: both day types
        sensor = sums.sum((0, 1)) / counts.sum((0, 1))  # [N]
    overall = x[x != 0].mean() if (x != 0).any() else 0.0
    sensor = np.where(np.isnan(sensor), overall, sensor)
    pooled = np.where(np.isnan(pooled), sensor[None, :], pooled)
    table = np.where(np.isnan(table), pooled[:, None, :], table)
    return np.ascontiguousarray(table.transpose(2, 0, 1))


def historical_average(
    table: np.ndarray,
    timestamps: pd.DatetimeIndex,
    starts: torch.Tensor,
    t_in: int = 12,
    t_out: int = 12,
) -> np.ndarray:
    """HA forecasts ``[B, t_out, N]`` for the windows starting at ``starts`` (looked up, not learned).

    The table's day axis says its period: 2 classes = weekday/weekend, 7 = time of week.
    """
    slot, weekend = _keys(timestamps, "week" if table.shape[2] == 7 else "daytype")
    idx = gather(torch.arange(len(timestamps)), starts, t_out, offset=t_in).numpy()  # [B, t_out]
    return table[:, slot[idx], weekend[idx]].transpose(1, 2, 0)


def last_value(
    speed: np.ndarray, starts: torch.Tensor, t_in: int = 12, t_out: int = 12, fill: bool = True
) -> np.ndarray:
    """Copy the present: ``[B, t_out, N]``, every future step = the last (observed) input value."""
    x = np.asarray(speed, dtype=np.float64)
    if fill:
        x = _filled(x)
    index = torch.as_tensor(starts).numpy() + t_in - 1
    if len(index) and (index.min() < 0 or index.max() >= len(x)):
        raise DataError(
            f"windows reach outside the series of {len(x)} steps. Fix: make the splits from this "
            "series' length."
        )
    last = x[index]  # [B, N]
    return np.repeat(last[:, None, :], t_out, axis=1)


def _filled(speed: np.ndarray) -> np.ndarray:
    """Missing readings (0) replaced by the sensor's latest earlier reading (only the past)."""
    x = np.where(np.asarray(speed, dtype=np.float64) == 0, np.nan, speed)
    return pd.DataFrame(x).ffill().fillna(0.0).to_numpy(copy=True)


def fit_linear(
    speed: np.ndarray, starts: torch.Tensor, t_in: int = 12, t_out: int = 12, ridge: float = 1e-3
) -> np.ndarray:
    """Per-sensor, per-horizon ridge least squares: weights ``[N, t_out, t_in + 1]`` (last = bias).

    Inputs are the forward-filled speeds of each window ``[B, t_in]``; a horizon's equation uses
    the windows whose target is observed (non-zero). ``ridge`` (relative to the mean diagonal of
    the normal matrix) keeps the 13 x 13 solves well conditioned; the bias is not penalised.
    """
    filled = torch.as_tensor(_filled(speed))
    x = gather(filled, starts, t_in).numpy()  # [B, t_in, N]
    y = gather(
        torch.as_tensor(np.asarray(speed, dtype=np.float64)), starts, t_out, offset=t_in
    ).numpy()
    design = np.concatenate([x, np.ones_like(x[:, :1])], axis=1)  # [B, t_in + 1, N]
    weights = np.zeros((x.shape[2], t_out, t_in + 1))
    penalty = np.eye(t_in + 1)
    penalty[-1, -1] = 0.0
    for n in range(x.shape[2]):
        a = design[:, :, n]  # [B, t_in + 1]
        for h in range(t_out):
            seen = y[:, h, n] != 0
            gram = a[seen].T @ a[seen]
            lam = ridge * np.trace(gram) / len(gram)
            weights[n, h] = np.linalg.solve(gram + lam * penalty, a[seen].T @ y[seen, h, n])
    return weights


def linear_forecaster(
    speed: np.ndarray, weights: np.ndarray, starts: torch.Tensor, t_in: int = 12, t_out: int = 12
) -> np.ndarray:
    """Forecasts ``[B, t_out, N]`` of the linear model ``weights`` (:func:`fit_linear`)."""
    x = gather(torch.as_tensor(_filled(speed)), starts, t_in).numpy()  # [B, t_in, N]
    design = np.concatenate([x, np.ones_like(x[:, :1])], axis=1)  # [B, t_in + 1, N]
    return np.einsum("bin,nhi->bhn", design, weights)


def baseline_forecasts(
    speed: np.ndarray, timestamps: pd.DatetimeIndex, splits: Splits | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The baselines' forecasts of the test windows and their targets, ``[B, t_out, N]`` mph each.

    In order: the historical average by weekday/weekend and by time of week (fitted on
    ``speed[:train_steps(splits)]``), the last value, and the linear forecaster (fitted on the
    training windows). ``splits`` defaults to DCRNN's protocol for this series.
    """
    splits = splits or split_windows(len(speed))
    t_in, t_out, test = splits.t_in, splits.t_out, splits.test
    target = gather(torch.as_tensor(np.asarray(speed, dtype=np.float64)), test, t_out, offset=t_in)
    fit = train_steps(splits)
    forecasts = {
        "historical average": historical_average(
            historical_average_table(speed, timestamps, fit), timestamps, test, t_in, t_out
        ),
        "historical average (time of week)": historical_average(
            historical_average_table(speed, timestamps, fit, "week"), timestamps, test, t_in, t_out
        ),
        "last value (copy the present)": last_value(speed, test, t_in, t_out),
        "linear (12 inputs, per sensor)": linear_forecaster(
            speed, fit_linear(speed, splits.train, t_in, t_out), test, t_in, t_out
        ),
    }
    return {k: torch.as_tensor(v) for k, v in forecasts.items()}, target


def baseline_table(
    speed: np.ndarray,
    timestamps: pd.DatetimeIndex,
    splits: Splits | None = None,
    horizons=(3, 6, 12),
    forecasts: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None,
) -> pd.DataFrame:
    """Masked metrics of the baselines on the test split, one row each (horizons and the 12-step
    mean): :func:`baseline_forecasts` (or ``forecasts``, its result computed before) scored
    with :func:`diagsink.metrics.horizon_metrics`."""
    forecasts, target = forecasts or baseline_forecasts(speed, timestamps, splits)
    rows = {name: horizon_metrics(pred, target, horizons) for name, pred in forecasts.items()}
    return pd.DataFrame(rows).T
