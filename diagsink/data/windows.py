"""The standard METR-LA protocol: windows, chronological splits, scaling, calendar features.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA", section "The protocol").

* A *window* is identified by its start index ``s`` (the first input step): inputs are
  ``series[s : s + t_in]`` and targets ``series[s + t_in : s + t_in + t_out]`` (12 and 12 by
  default, stride 1). :func:`gather` builds a batch of windows by tensor indexing, without a
  Python loop over samples.
* ``order="dcrnn"`` (default) reproduces DCRNN's ``generate_training_data.py``: build every
  window of the whole series first, then split the *windows* chronologically with
  ``num_test = round(n * 0.2)``, ``num_train = round(n * 0.7)``, ``num_val = n - num_train - num_test``.
  On the full 34272 steps: 34249 windows = 23974 / 3425 / 6850. Neighbouring parts share
  time steps (a validation window's inputs may be a training window's targets).
* ``order="split-first"`` splits the *time steps* with the same rounding and then windows each
  part separately (no window crosses a boundary): 23967 / 3405 / 6831 on the full series.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..errors import ConfigError, DataError

__all__ = [
    "Splits",
    "split_windows",
    "split_sizes",
    "gather",
    "sliding_windows",
    "Scaler",
    "time_of_day",
    "day_of_week",
    "train_steps",
    "ORDERS",
]

ORDERS = ("dcrnn", "split-first")


@dataclass(frozen=True)
class Splits:
    """Window start indices (first input step) of the three chronological parts.

    Attributes:
        train, val, test: ``LongTensor [n_part]``, increasing.
        order: ``"dcrnn"`` (windows first, then split) or ``"split-first"``.
        t_in, t_out: the window lengths the indices were made for.
    """

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    order: str
    t_in: int = 12
    t_out: int = 12

    def counts(self) -> dict[str, int]:
        """``{"train": n_train, "val": n_val, "test": n_test}``."""
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


def split_sizes(
    n: int, ratios: tuple[float, float, float] = (0.7, 0.1, 0.2)
) -> tuple[int, int, int]:
    """DCRNN's rounding: ``test = round(n*r_test)``, ``train = round(n*r_train)``, ``val`` = the rest.

    Python's :func:`round` (half to even) as in DCRNN's script.
    """
    r_train, r_val, r_test = ratios
    if min(ratios) < 0 or abs(r_train + r_val + r_test - 1.0) > 1e-9:
        raise ConfigError(
            f"ratios {ratios} must be three non-negative numbers that sum to 1, e.g. (0.7, 0.1, 0.2)."
        )
    n_test = round(n * r_test)
    n_train = round(n * r_train)
    return n_train, n - n_train - n_test, n_test


def split_windows(
    n_steps: int,
    t_in: int = 12,
    t_out: int = 12,
    ratios: tuple[float, float, float] = (0.7, 0.1, 0.2),
    order: str = "dcrnn",
) -> Splits:
    """Window start indices for the train/val/test parts of a series of ``n_steps`` steps.

    Args:
        n_steps: length ``T`` of the series.
        t_in, t_out: input and output lengths (12 and 12: one hour each at 5 minutes).
        ratios: train/val/test fractions.
        order: ``"dcrnn"`` (windows first, then split; the default) or ``"split-first"``.

    Raises:
        ConfigError: unknown ``order`` or bad ratios.
        DataError: the series (or a part of it) is too short for a single window.
    """
    if order not in ORDERS:
        raise ConfigError(f"unknown split order {order!r}; choose one of {ORDERS}.")
    if t_in < 1 or t_out < 1:
        raise ConfigError(f"t_in and t_out must be >= 1, got {t_in}, {t_out}.")
    width = t_in + t_out
    if order == "dcrnn":
        n_windows = n_steps - width + 1
        if n_windows < 3:
            raise DataError(
                f"a series of {n_steps} steps has {max(n_windows, 0)} windows of {width} steps; "
                f"need at least 3. Fix: load more data (a longer slice or the full metr-la.h5)."
            )
        n_train, n_val, n_test = split_sizes(n_windows, ratios)
        for name, count in (("train", n_train), ("val", n_val), ("test", n_test)):
            if count < 1:  # e.g. 3 windows at (0.7, 0.1, 0.2): round(0.3) = 0 validation windows
                raise DataError(
                    f"the {name} part gets {max(count, 0)} of the {n_windows} windows of {width} steps "
                    f"(ratios {tuple(ratios)}). Fix: load more data, or give every part a ratio > 0."
                )
        starts = torch.arange(n_windows)
        return Splits(
            starts[:n_train],
            starts[n_train : n_train + n_val],
            starts[n_windows - n_test :],
            order,
            t_in,
            t_out,
        )
    n_train, n_val, n_test = split_sizes(n_steps, ratios)
    bounds = [(0, n_train), (n_train, n_train + n_val), (n_train + n_val, n_steps)]
    parts = []
    for (lo, hi), name in zip(bounds, ("train", "val", "test")):
        if hi - lo < width:
            raise DataError(
                f"the {name} part has {hi - lo} steps, fewer than one window of {width}. "
                "Fix: load more data or use order='dcrnn'."
            )
        parts.append(torch.arange(lo, hi - width + 1))
    return Splits(parts[0], parts[1], parts[2], order, t_in, t_out)


def train_steps(splits: Splits, t_in: int | None = None, t_out: int | None = None) -> int:
    """The end (exclusive) of the time steps that training windows touch, inputs *and* targets.

    Fit the :class:`Scaler` (and the historical average) on ``speed[:train_steps(splits)]``;
    nothing after this index has been seen in training.
    """
    t_in = splits.t_in if t_in is None else t_in
    t_out = splits.t_out if t_out is None else t_out
    return int(splits.train[-1]) + t_in + t_out


def gather(
    series: torch.Tensor, starts: torch.Tensor, length: int, offset: int = 0
) -> torch.Tensor:
    """Stack ``series[s + offset : s + offset + length]`` for every ``s`` in ``starts``.

    Args:
        series: ``[T, N]`` or ``[T, N, F]`` (numpy arrays are converted without copying).
        starts: ``LongTensor [B]`` window starts (e.g. ``splits.test``).
        length, offset: inputs are ``gather(s, starts, t_in)``, targets
            ``gather(s, starts, t_out, offset=t_in)``.

    Returns:
        ``[B, length, N]`` or ``[B, length, N, F]``: one advanced-indexing call (a copy).
    """
    series = torch.as_tensor(series)
    starts = torch.as_tensor(starts, dtype=torch.long, device=series.device)
    index = starts[:, None] + (offset + torch.arange(length, device=series.device))[None, :]
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= series.shape[0]):
        raise DataError(
            f"windows reach outside the series of {series.shape[0]} steps "
            f"(indices {int(index.min())}..{int(index.max())}). Fix: make the splits from this series' length."
        )
    return series[index]


def sliding_windows(series: torch.Tensor, length: int) -> torch.Tensor:
    """All windows of ``length`` steps as a zero-copy view ``[T - length + 1, length, N, ...]``.

    Row ``s`` is ``series[s : s + length]``; no memory is allocated (``Tensor.unfold``).
    """
    series = torch.as_tensor(series)
    if not 1 <= length <= series.shape[0]:
        raise DataError(
            f"windows of length {length} do not fit a series of {series.shape[0]} steps. "
            "Fix: choose 1 <= length <= the number of steps."
        )
    view = series.unfold(0, length, 1)  # [W, N, ..., length]
    return view.movedim(-1, 1)


@dataclass(frozen=True)
class Scaler:
    """z-score with ONE mean and standard deviation (over all sensors and steps).

    ``fit(..., ignore_zeros=True)`` (our default) leaves the zeros (missing readings) out of
    the statistics. DCRNN's released code, and the paper's (per sensor), include them, which
    pulls the mean down and the standard deviation up.
    """

    mean: float
    std: float

    @classmethod
    def fit(cls, speed: np.ndarray | torch.Tensor, ignore_zeros: bool = True) -> Scaler:
        """Fit on the training part of the speed matrix (``speed[:train_steps(splits)]``)."""
        values = torch.as_tensor(speed).detach().to(torch.float64).reshape(-1)
        if ignore_zeros:
            values = values[values != 0]
        if values.numel() < 2:
            raise DataError(
                "cannot fit a scaler: fewer than two usable (non-zero) values. "
                "Fix: fit on the training part of a loaded speed matrix."
            )
        std = float(values.std(unbiased=False))
        if std == 0.0:
            raise DataError(
                "cannot fit a scaler: all values are equal (std = 0). Fix: fit on real speeds."
            )
        return cls(float(values.mean()), std)

    def transform(self, x):
        """``(x - mean) / std``; numpy in, numpy out; torch in, torch out."""
        return (x - self.mean) / self.std

    def inverse(self, z):
        """``z * std + mean``."""
        return z * self.std + self.mean


def time_of_day(timestamps: pd.DatetimeIndex) -> np.ndarray:
    """Fraction of the day elapsed, float64 ``[T]`` in ``[0, 1)`` (00:00 -> 0, 12:00 -> 0.5), as DCRNN."""
    ts = pd.DatetimeIndex(timestamps)
    return ((ts - ts.normalize()) / pd.Timedelta(days=1)).to_numpy(dtype=np.float64)


def day_of_week(timestamps: pd.DatetimeIndex) -> np.ndarray:
    """Day of the week, int64 ``[T]`` in ``0..6`` (Monday = 0)."""
    return pd.DatetimeIndex(timestamps).day_of_week.to_numpy(dtype=np.int64)
