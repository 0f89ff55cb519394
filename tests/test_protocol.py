"""The standard protocol: windows, chronological splits, scaler, calendar features."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import diagsink as ds
from diagsink.data import windows as P
from diagsink.errors import ConfigError, DataError

FULL = 34272


def test_dcrnn_counts_on_a_series_of_full_length():
    s = P.split_windows(FULL)
    assert s.counts() == {"train": 23974, "val": 3425, "test": 6850}
    # DCRNN: consecutive windows, parts adjacent, the test part is the last 6850 windows
    assert int(s.train[0]) == 0 and int(s.val[0]) == 23974 and int(s.test[-1]) == FULL - 24
    assert torch.equal(torch.cat([s.train, s.val, s.test]), torch.arange(FULL - 23))


def test_split_first_counts_and_no_window_crosses_a_boundary():
    s = P.split_windows(FULL, order="split-first")
    assert s.counts() == {"train": 23967, "val": 3405, "test": 6831}
    n_train, n_val, n_test = P.split_sizes(FULL)
    assert (n_train, n_val, n_test) == (23990, 3428, 6854)
    assert int(s.train[-1]) + 24 <= n_train
    assert int(s.val[0]) == n_train and int(s.val[-1]) + 24 <= n_train + n_val
    assert int(s.test[0]) == n_train + n_val and int(s.test[-1]) + 24 == FULL


def test_split_sizes_follow_dcrnn_rounding():
    # DCRNN: num_test = round(n * 0.2); num_train = round(n * 0.7); val = the rest
    for n in (34249, 1003, 100, 37):
        tr, va, te = P.split_sizes(n)
        assert te == round(n * 0.2) and tr == round(n * 0.7) and tr + va + te == n


def test_bad_order_ratios_and_short_series():
    with pytest.raises(ConfigError, match="unknown split order"):
        P.split_windows(1000, order="random")
    with pytest.raises(ConfigError, match="sum to 1"):
        P.split_windows(1000, ratios=(0.5, 0.1, 0.1))
    with pytest.raises(DataError, match="Fix"):
        P.split_windows(20)
    with pytest.raises(DataError, match="Fix"):
        P.split_windows(60, order="split-first")


def test_gather_matches_a_python_loop_and_a_strided_view():
    series = torch.randn(200, 5, 2)
    starts = torch.tensor([0, 3, 50, 176])
    x = P.gather(series, starts, 12)
    y = P.gather(series, starts, 12, offset=12)
    assert x.shape == (4, 12, 5, 2) and y.shape == (4, 12, 5, 2)
    for b, s in enumerate(starts.tolist()):
        torch.testing.assert_close(x[b], series[s : s + 12])
        torch.testing.assert_close(y[b], series[s + 12 : s + 24])
    view = P.sliding_windows(series, 24)
    assert view.shape == (177, 24, 5, 2) and view.data_ptr() == series.data_ptr()  # zero-copy
    torch.testing.assert_close(view[starts], torch.cat([x, y], dim=1))
    # 2-D series and numpy input
    x2 = P.gather(np.arange(40.0).reshape(20, 2), torch.tensor([1, 2]), 3)
    assert x2.shape == (2, 3, 2) and float(x2[1, 0, 0]) == 4.0
    with pytest.raises(DataError, match="outside"):
        P.gather(series, torch.tensor([190]), 12)


def test_train_steps_is_the_end_of_the_last_training_target():
    s = P.split_windows(1000)
    assert P.train_steps(s) == int(s.train[-1]) + 24
    assert P.train_steps(s) <= int(s.val[-1]) + 24


def test_scaler_ignores_zeros_and_round_trips():
    x = np.array([[0.0, 10.0], [20.0, 0.0], [30.0, 40.0]])
    sc = P.Scaler.fit(x)
    nz = np.array([10.0, 20.0, 30.0, 40.0])
    assert sc.mean == pytest.approx(nz.mean()) and sc.std == pytest.approx(nz.std())
    with_zeros = P.Scaler.fit(x, ignore_zeros=False)
    assert with_zeros.mean == pytest.approx(x.mean()) and with_zeros.std == pytest.approx(x.std())
    t = torch.tensor(x)
    torch.testing.assert_close(sc.inverse(sc.transform(t)), t)
    np.testing.assert_allclose(sc.inverse(sc.transform(x)), x, atol=1e-12)
    with pytest.raises(DataError, match="Fix"):
        P.Scaler.fit(np.zeros((4, 3)))


def test_calendar_features():
    ts = pd.date_range("2012-03-01 00:00", periods=2 * 288, freq="5min")  # a Thursday and a Friday
    tod = P.time_of_day(ts)
    dow = P.day_of_week(ts)
    assert tod.shape == (576,) and tod.min() == 0.0 and tod.max() < 1.0
    assert tod[144] == 0.5 and tod[288] == 0.0 and tod[1] == pytest.approx(1 / 288)
    assert dow[0] == 3 and dow[300] == 4 and dow.dtype == np.int64


def test_package_exports_the_protocol():
    assert ds.data.windows.split_windows is P.split_windows
