"""A run's test errors by calendar day: the sums behind its metrics, one day at a time.

Every masked metric is a ratio of sums over the test windows (``MAE = sum(m |p - y|) / sum(m)``,
:mod:`diagsink.metrics`), so the sums of each day of the test split add up to the run's metrics
exactly. The artifact field ``test_by_day`` stores them for the horizons 3, 6, 12 and for all
steps pooled. Two readers use it:

* the results chapter (``book/results.ipynb``) plots the error of every test day (weekdays
  against weekends, the model against the baselines);
* the recompute test (``tests/test_recompute.py``) checks a full-length run without predicting
  its whole test split: the stored days must add up to the recorded metrics, and one day,
  predicted again from the weights, must give its stored sums.

A window belongs to the day of its last input step (the moment the forecast is made).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..errors import DataError
from ..metrics import metric_mask
from .artifacts import load_artifact, write_artifact
from .provenance import git_commit
from .reload import LoadedRun, load_run
from .train import predict

__all__ = [
    "COLUMNS",
    "SUMS",
    "error_sums",
    "metrics_from_sums",
    "window_days",
    "day_groups",
    "by_day_field",
    "day_sums",
    "attach_test_by_day",
]

#: Horizons 3, 6 and 12 alone, then every predicted step pooled (the columns of the sums).
COLUMNS: tuple[str, ...] = ("3", "6", "12", "mean")
#: Unmasked entries, absolute, squared and relative absolute errors (the sums per column).
SUMS: tuple[str, ...] = ("n", "abs", "sq", "ape")


def error_sums(pred: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """The masked error sums of ``pred`` against ``target`` (``[B, T_out, N]``, mph), in float64.

    Returns ``{sum: [one value per column of COLUMNS]}`` with the sums of :data:`SUMS`: the mask
    ``m = (y != 0)`` and ``n = sum(m)``, ``abs = sum(m |p - y|)``, ``sq = sum(m (p - y)^2)``,
    ``ape = sum(m |p - y| / |y|)``.
    """
    p, y = pred.to(torch.float64), target.to(torch.float64)
    m = metric_mask(y)
    err = torch.where(m, (p - y).abs(), torch.zeros_like(p))
    ape = err / torch.where(m, y.abs(), torch.ones_like(y))
    parts = {"n": m.to(torch.float64), "abs": err, "sq": err**2, "ape": ape}
    steps = [slice(int(c) - 1, int(c)) for c in COLUMNS[:-1]] + [slice(None)]
    return {k: [float(v[:, s].sum()) for s in steps] for k, v in parts.items()}


def metrics_from_sums(sums: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """The metrics (``MAE@3`` ... ``MAPE@mean``, as :func:`diagsink.metrics.horizon_metrics`)
    of the sums of several days added together."""
    total = {k: [sum(s[k][c] for s in sums) for c in range(len(COLUMNS))] for k in SUMS}
    out: dict[str, float] = {}
    for c, col in enumerate(COLUMNS):
        n = total["n"][c]
        if n == 0:
            raise DataError(f"no unmasked target at horizon {col}: the metrics are undefined.")
        out[f"MAE@{col}"] = total["abs"][c] / n
        out[f"RMSE@{col}"] = (total["sq"][c] / n) ** 0.5
        out[f"MAPE@{col}"] = 100.0 * total["ape"][c] / n
    return out


def window_days(timestamps: pd.DatetimeIndex, starts: torch.Tensor, t_in: int) -> list[str]:
    """The day (``YYYY-MM-DD``) of each window's last input step; ``starts``: ``[W]`` indices."""
    last = starts.cpu().numpy() + t_in - 1
    return [str(d) for d in timestamps[last].date]


def day_groups(
    timestamps: pd.DatetimeIndex, starts: torch.Tensor, t_in: int
) -> dict[str, list[int]]:
    """The positions in ``starts`` of each day's windows, the days in time order."""
    out: dict[str, list[int]] = {}
    for i, day in enumerate(window_days(timestamps, starts, t_in)):
        out.setdefault(day, []).append(i)
    return out


def _by_day(run: LoadedRun, timestamps: pd.DatetimeIndex) -> dict[str, torch.Tensor]:
    test = run.prepared.test
    groups = day_groups(timestamps, test, run.cfg["model"]["t_in"])
    return {day: test[torch.tensor(idx)] for day, idx in groups.items()}


def day_sums(run: LoadedRun, timestamps: pd.DatetimeIndex, day: str) -> dict[str, list[float]]:
    """Predict the test windows of ``day`` from ``run``'s weights and return their sums."""
    starts = _by_day(run, timestamps).get(day)
    if starts is None:
        raise DataError(f"{day} is not a day of {run.path.name}'s test split.")
    return error_sums(*predict(run.model, run.prepared, starts, run.cfg))


def by_day_field(run: LoadedRun, timestamps: pd.DatetimeIndex) -> dict[str, Any]:
    """The field ``test_by_day``: ``days``, ``windows`` per day and ``sums`` (one
    :func:`error_sums` per day), with the columns and the commit of the code that computed it."""
    groups = _by_day(run, timestamps)
    sums = [error_sums(*predict(run.model, run.prepared, s, run.cfg)) for s in groups.values()]
    return {
        "days": list(groups),
        "windows": [len(s) for s in groups.values()],
        "columns": list(COLUMNS),
        "sums": sums,
        "origin": "a window belongs to the day of its last input step",
        "git_commit": git_commit(),
    }


def attach_test_by_day(path: str | Path, data: Any) -> dict[str, Any]:
    """Compute ``test_by_day`` for the run ``path`` on ``data`` (its :class:`MetrLA`) and store it
    in the artifact (written atomically, the rest unchanged). Returns the field."""
    run = load_run(path, data=data)
    field = by_day_field(run, data.timestamps)
    art = {k: v for k, v in load_artifact(path).items() if k != "checksum"}
    write_artifact(Path(path), {**art, "test_by_day": field})
    return field
