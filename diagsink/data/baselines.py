"""Two yardsticks for METR-LA: the historical average and "copy the present" (last value).

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA", section "Baselines").

* **Historical average (HA).** For every sensor, 5-minute time-of-day slot (288 per day) and
  day type (weekday Monday-Friday, or weekend Saturday-Sunday) the mean of the *non-zero*
  training speeds ``speed[:train_steps(splits)]``. The forecast for a target step is the
  table entry of its sensor, slot and day type; it ignores the input window entirely. A cell
  without any non-zero training value falls back to the same slot pooled over both day
  types, then to the sensor's mean, then to the mean of all sensors.
  (DCRNN's paper describes its HA only as a weighted average of previous seasons; the
  numbers are therefore not expected to match its 4.16 MAE exactly.)
* **Last value ("parroting").** Every one of the ``t_out`` future steps is predicted to equal
  the last observed speed, i.e. the value at the last input step ``s + t_in - 1``. With
  ``fill=True`` (default) a missing reading (0) there is replaced by the latest earlier
  non-zero reading of that sensor (a forward fill: only the past is used); with
  ``fill=False`` the zero is copied as it is. A model whose attention sinks onto the
  diagonal tends towards this forecast.

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
    "baseline_table",
    "SLOTS_PER_DAY",
]

SLOTS_PER_DAY = 288


def _keys(timestamps: pd.DatetimeIndex) -> tuple[np.ndarray, np.ndarray]:
    ts = pd.DatetimeIndex(timestamps)
    slot = np.asarray(ts.hour * 60 + ts.minute) // 5
    weekend = np.asarray(ts.day_of_week >= 5).astype(np.int64)
    return slot.astype(np.int64), weekend


def historical_average_table(
    speed: np.ndarray, timestamps: pd.DatetimeIndex, end: int
) -> np.ndarray:
    """The HA table ``[N, 288, 2]`` (sensor, time-of-day slot, 0 = weekday / 1 = weekend) from ``speed[:end]``.

    Means of the non-zero values; empty cells filled as described in the module docstring.
    """
    if len(timestamps) != len(speed) or not 1 <= end <= len(speed):
        raise DataError(
            f"historical_average_table needs one timestamp per step and 1 <= end <= {len(speed)}; "
            f"got {len(timestamps)} timestamps and end={end}. Fix: pass data.timestamps and "
            "end=train_steps(splits)."
        )
    x = np.asarray(speed, dtype=np.float64)[:end]
    slot, weekend = _keys(timestamps[:end])
    n = x.shape[1]
    observed = (x != 0).astype(np.float64)
    key = slot * 2 + weekend
    sums = np.zeros((SLOTS_PER_DAY * 2, n))
    counts = np.zeros((SLOTS_PER_DAY * 2, n))
    np.add.at(sums, key, x)
    np.add.at(counts, key, observed)
    sums = sums.reshape(SLOTS_PER_DAY, 2, n)
    counts = counts.reshape(SLOTS_PER_DAY, 2, n)
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
    """HA forecasts ``[B, t_out, N]`` for the windows starting at ``starts`` (looked up, not learned)."""
    slot, weekend = _keys(timestamps)
    idx = gather(torch.arange(len(timestamps)), starts, t_out, offset=t_in).numpy()  # [B, t_out]
    return table[:, slot[idx], weekend[idx]].transpose(1, 2, 0)


def last_value(
    speed: np.ndarray, starts: torch.Tensor, t_in: int = 12, t_out: int = 12, fill: bool = True
) -> np.ndarray:
    """Copy the present: ``[B, t_out, N]``, every future step = the last (observed) input value."""
    x = np.asarray(speed, dtype=np.float64)
    if fill:
        x = pd.DataFrame(np.where(x == 0, np.nan, x)).ffill().fillna(0.0).to_numpy()
    index = torch.as_tensor(starts).numpy() + t_in - 1
    if len(index) and (index.min() < 0 or index.max() >= len(x)):
        raise DataError(
            f"windows reach outside the series of {len(x)} steps. Fix: make the splits from this "
            "series' length."
        )
    last = x[index]  # [B, N]
    return np.repeat(last[:, None, :], t_out, axis=1)


def baseline_table(
    speed: np.ndarray,
    timestamps: pd.DatetimeIndex,
    splits: Splits | None = None,
    horizons=(3, 6, 12),
) -> pd.DataFrame:
    """Masked metrics of both baselines on the test split, one row each (horizons and the 12-step mean).

    ``splits`` defaults to DCRNN's protocol for this series. The HA is fitted on
    ``speed[:train_steps(splits)]``.
    """
    splits = splits or split_windows(len(speed))
    t_in, t_out = splits.t_in, splits.t_out
    target = gather(
        torch.as_tensor(np.asarray(speed, dtype=np.float64)), splits.test, t_out, offset=t_in
    )
    table = historical_average_table(speed, timestamps, train_steps(splits))
    rows = {
        "historical average": horizon_metrics(
            historical_average(table, timestamps, splits.test, t_in, t_out), target, horizons
        ),
        "last value (copy the present)": horizon_metrics(
            last_value(speed, splits.test, t_in, t_out), target, horizons
        ),
    }
    return pd.DataFrame(rows).T
