"""Masked metrics: hand-computed cases, the all-masked error, and a NumPy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from diagsink import metrics as M
from diagsink.errors import DataError


def test_hand_computed_values():
    pred = torch.tensor([[1.0, 5.0], [3.0, 10.0]])
    target = torch.tensor([[2.0, 0.0], [6.0, 8.0]])  # the 0 is masked
    # errors on the unmasked entries: |1-2| = 1, |3-6| = 3, |10-8| = 2
    assert float(M.masked_mae(pred, target)) == pytest.approx(2.0)
    assert float(M.masked_rmse(pred, target)) == pytest.approx(math.sqrt((1 + 9 + 4) / 3))
    assert float(M.masked_mape(pred, target)) == pytest.approx(100 * (1 / 2 + 3 / 6 + 2 / 8) / 3)
    # a masked entry really has no effect, whatever the prediction there
    pred2 = pred.clone()
    pred2[0, 1] = 1e6
    assert float(M.masked_mae(pred2, target)) == pytest.approx(2.0)


def test_entirely_masked_batch_raises():
    for fn in (M.masked_mae, M.masked_rmse, M.masked_mape):
        with pytest.raises(DataError, match="every target is masked"):
            fn(torch.ones(3, 4), torch.zeros(3, 4))
    with pytest.raises(DataError, match="every target is masked"):
        M.horizon_metrics(torch.ones(2, 12, 3), torch.zeros(2, 12, 3))


def test_mae_is_differentiable():
    pred = torch.tensor([1.0, 4.0, 2.0], requires_grad=True)
    loss = M.masked_mae(pred, torch.tensor([2.0, 0.0, 1.0]))
    loss.backward()
    torch.testing.assert_close(pred.grad, torch.tensor([-0.5, 0.0, 0.5]))


def test_shape_mismatch_is_an_error():
    with pytest.raises(DataError, match="same shape"):
        M.masked_mae(torch.ones(2, 3), torch.ones(3, 2))


def test_horizon_metrics_labels_and_single_steps():
    rng = np.random.default_rng(1)
    target = rng.uniform(10, 70, size=(5, 12, 4))
    target[rng.random(target.shape) < 0.2] = 0.0
    pred = target + rng.normal(0, 3, size=target.shape)
    out = M.horizon_metrics(pred, target)
    assert list(out) == [f"{m}@{h}" for h in (3, 6, 12) for m in ("MAE", "RMSE", "MAPE")] + [
        "MAE@mean",
        "RMSE@mean",
        "MAPE@mean",
    ]
    # horizon h is the h-th step alone (index h - 1)
    assert out["MAE@6"] == pytest.approx(float(M.masked_mae(pred[:, 5], target[:, 5])))
    assert out["MAE@mean"] == pytest.approx(float(M.masked_mae(pred, target)))
    per_step = M.horizon_metrics(pred, target, average="per-step")
    ref = np.mean([float(M.masked_rmse(pred[:, k], target[:, k])) for k in range(12)])
    assert per_step["RMSE@mean"] == pytest.approx(ref)
    with pytest.raises(DataError, match="horizon 13"):
        M.horizon_metrics(pred, target, horizons=(13,))


def _np_reference(p, t):
    m = t != 0
    e = p[m] - t[m]
    return np.abs(e).mean(), np.sqrt((e**2).mean()), 100 * np.mean(np.abs(e) / np.abs(t[m]))


speeds = st.floats(0.0, 80.0, allow_nan=False, width=64)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(7,), (3, 4), (2, 3, 5)]))
def test_against_numpy_reference(data, shape):
    t = data.draw(arrays(np.float64, shape, elements=st.one_of(st.just(0.0), st.floats(0.5, 80.0))))
    p = data.draw(arrays(np.float64, shape, elements=speeds))
    if not (t != 0).any():
        with pytest.raises(DataError):
            M.masked_mae(p, t)
        return
    mae, rmse, mape = _np_reference(p, t)
    assert float(M.masked_mae(p, t)) == pytest.approx(mae, rel=1e-9, abs=1e-12)
    assert float(M.masked_rmse(p, t)) == pytest.approx(rmse, rel=1e-9, abs=1e-12)
    assert float(M.masked_mape(p, t)) == pytest.approx(mape, rel=1e-9, abs=1e-12)
    # float32 tensors give the same answer up to float32 rounding
    assert float(
        M.masked_mae(torch.tensor(p, dtype=torch.float32), torch.tensor(t, dtype=torch.float32))
    ) == pytest.approx(mae, rel=1e-4, abs=1e-4)


@settings(max_examples=30, deadline=None)
@given(
    t=arrays(np.float64, (3, 12, 2), elements=st.floats(1.0, 80.0)),
    noise=arrays(np.float64, (3, 12, 2), elements=st.floats(-5.0, 5.0)),
)
def test_horizon_values_against_numpy(t, noise):
    p = t + noise
    out = M.horizon_metrics(p, t)
    for h in (3, 6, 12):
        mae, rmse, mape = _np_reference(p[:, h - 1], t[:, h - 1])
        assert out[f"MAE@{h}"] == pytest.approx(mae, abs=1e-12)
        assert out[f"RMSE@{h}"] == pytest.approx(rmse, abs=1e-12)
        assert out[f"MAPE@{h}"] == pytest.approx(mape, abs=1e-9)


# ---------------------------------------------------------------- baselines
def _calendar(days: int):
    import pandas as pd

    return pd.date_range("2012-03-01", periods=days * 288, freq="5min")  # starts on a Thursday


def test_historical_average_table_by_hand():
    from diagsink.data import baselines as B

    ts = _calendar(8)
    rng = np.random.default_rng(0)
    speed = rng.uniform(20, 70, size=(len(ts), 3))
    speed[rng.random(speed.shape) < 0.1] = 0.0
    end = 7 * 288
    table = B.historical_average_table(speed, ts, end)
    assert table.shape == (3, 288, 2)
    # sensor 1, slot 100 (08:20), weekdays: the mean of its non-zero training values
    sel = (ts[:end].hour * 60 + ts[:end].minute == 500) & (ts[:end].day_of_week < 5)
    vals = speed[:end][np.asarray(sel), 1]
    assert table[1, 100, 0] == pytest.approx(vals[vals != 0].mean())
    wk = (ts[:end].hour * 60 + ts[:end].minute == 500) & (ts[:end].day_of_week >= 5)
    vals = speed[:end][np.asarray(wk), 2]
    assert table[2, 100, 1] == pytest.approx(vals[vals != 0].mean())
    # an empty cell falls back to the slot pooled over both day types
    speed2 = speed.copy()
    speed2[:end][np.asarray(wk), 2] = 0.0
    t2 = B.historical_average_table(speed2, ts, end)
    both = ts[:end].hour * 60 + ts[:end].minute == 500
    vals = speed2[:end][np.asarray(both), 2]
    assert t2[2, 100, 1] == pytest.approx(vals[vals != 0].mean())


def test_historical_average_forecast_looks_up_target_times():
    from diagsink.data import baselines as B

    ts = _calendar(3)
    table = np.arange(2 * 288 * 2, dtype=float).reshape(2, 288, 2)
    pred = B.historical_average(table, ts, torch.tensor([0, 300]), 12, 12)
    assert pred.shape == (2, 12, 2)
    assert pred[0, 0, 1] == table[1, 12, 0]  # window 0: first target is step 12 = 01:00 Thursday
    assert pred[1, 11, 0] == table[0, (300 + 23) % 288, 0]  # Friday


def test_last_value_copies_the_present_and_fills_gaps():
    from diagsink.data import baselines as B

    speed = np.array([[10.0, 1.0], [20.0, 2.0], [0.0, 3.0], [40.0, 0.0], [50.0, 5.0]])
    pred = B.last_value(speed, torch.tensor([0, 1]), t_in=2, t_out=3)
    assert pred.shape == (2, 3, 2)
    np.testing.assert_array_equal(pred[0], [[20.0, 2.0]] * 3)
    # step 2 of sensor 0 is missing: filled with 20
    np.testing.assert_array_equal(pred[1], [[20.0, 3.0]] * 3)
    raw = B.last_value(speed, torch.tensor([1]), t_in=2, t_out=3, fill=False)
    np.testing.assert_array_equal(raw[0], [[0.0, 3.0]] * 3)


def test_baseline_table_on_a_periodic_series():
    from diagsink.data import baselines as B
    from diagsink.data import windows as P

    ts = _calendar(14)
    day = 60 - 10 * np.sin(np.arange(288) / 288 * 2 * np.pi)
    speed = np.tile(day, 14)[:, None] * np.array([1.0, 0.9])[None, :]
    out = B.baseline_table(speed, ts, P.split_windows(len(ts)))
    # a series that repeats every day is forecast exactly by the historical average (weekday and
    # weekend profiles are identical here) and not by copying the present
    assert out.loc["historical average", "MAE@12"] == pytest.approx(0.0, abs=1e-9)
    assert out.loc["last value (copy the present)", "MAE@12"] > 0.5
    assert (
        out.loc["last value (copy the present)", "MAE@3"]
        < out.loc["last value (copy the present)", "MAE@12"]
    )


def test_linear_forecaster_is_exact_on_a_sinusoid_and_time_of_week_ha_on_a_weekly_series():
    """A sinusoid's future is an affine map of two past values, so the fitted per-sensor linear
    model forecasts it exactly; a series that repeats every week (but not every day) is forecast
    exactly by the time-of-week HA and not by the weekday/weekend HA."""
    from diagsink.data import baselines as B
    from diagsink.data import windows as P

    ts = _calendar(28)
    t = np.arange(len(ts))
    speed = 50 + np.stack([10 * np.sin(t / 37.0), 5 * np.cos(t / 11.0 + 1)], axis=1)
    splits = P.split_windows(len(ts))
    w = B.fit_linear(speed, splits.train, ridge=1e-12)
    pred = B.linear_forecaster(speed, w, splits.test)
    target = P.gather(torch.as_tensor(speed), splits.test, 12, offset=12).numpy()
    np.testing.assert_allclose(pred, target, atol=1e-6)

    week = 60 - 10 * np.sin(np.arange(7 * 288) / (7 * 288) * 2 * np.pi)
    weekly = np.tile(week, 4)[:, None] * np.array([1.0, 0.9])[None, :]
    out = B.baseline_table(weekly, ts, splits)
    assert out.loc["historical average (time of week)", "MAE@12"] == pytest.approx(0.0, abs=1e-9)
    assert out.loc["historical average", "MAE@12"] > 0.1


# ---------------------------------------------------------------- exercise checks of book/metr_la.ipynb
def test_exercise_checks_pass_the_reference_and_hint_typical_mistakes():
    from diagsink.exercises import check

    def good_mae(pred, target):
        mask = target != 0
        if not mask.any():
            raise ValueError("all targets missing")
        return (pred - target).abs()[mask].mean()

    def plain_mae(pred, target):
        return (pred - target).abs().mean()

    def wrong_denominator(pred, target):
        return ((pred - target).abs() * (target != 0)).sum() / target.numel()

    def silent_zero(pred, target):
        mask = target != 0
        return (pred - target).abs()[mask].sum() / mask.sum().clamp_min(1)

    assert check("ex-metr-la-masked-mae", good_mae).passed
    assert "plain MAE" in check("ex-metr-la-masked-mae", plain_mae).message
    assert (
        "divide by the number of observed"
        in check("ex-metr-la-masked-mae", wrong_denominator).message
    )
    assert "raise a ValueError" in check("ex-metr-la-masked-mae", silent_zero).message

    def good_windows(series, t_in, t_out):
        w = series.shape[0] - t_in - t_out + 1
        s = torch.arange(w)[:, None]
        return series[s + torch.arange(t_in)], series[s + t_in + torch.arange(t_out)]

    def one_short(series, t_in, t_out):
        x, y = good_windows(series, t_in, t_out)
        return x[:-1], y[:-1]

    def early_targets(series, t_in, t_out):
        w = series.shape[0] - t_in - t_out + 1
        s = torch.arange(w)[:, None]
        return series[s + torch.arange(t_in)], series[s + t_in - 1 + torch.arange(t_out)]

    assert check("ex-metr-la-windows", good_windows).passed
    assert "T - t_in - t_out + 1" in check("ex-metr-la-windows", one_short).message
    assert "one step too early" in check("ex-metr-la-windows", early_targets).message

    def good_split(n):
        te, tr = round(n * 0.2), round(n * 0.7)
        return tr, n - tr - te, te

    def truncating(n):
        te, tr = int(n * 0.2), int(n * 0.7)
        return tr, n - tr - te, te

    assert check("ex-metr-la-split", good_split).passed
    assert "int() truncates" in check("ex-metr-la-split", truncating).message
    assert "add up" in check("ex-metr-la-split", lambda n: (1, 1, 1)).message
