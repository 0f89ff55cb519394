"""diagsink.results: the full-length runs read as whatever subset is committed (chapter
"Results: every variant", book/results.ipynb, and the forecasts of book/heatmaps.ipynb)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import diagsink.results as dr
from diagsink.data.windows import split_windows
from diagsink.engine.artifacts import ArtifactError
from diagsink.engine.significance import t_quantile
from diagsink.variants import LABELS, VARIANTS

KEYS = ["MAE@3", "MAE@12"]


def _art(variant: str, seed: int, mae: float, protocol: str = "full29", val=None) -> dict:
    val = val or [3.0, 2.5, 2.4, 2.4]
    return {
        "protocol": protocol,
        "variant": variant,
        "seed": seed,
        "metrics": {"MAE@3": mae, "MAE@12": 2 * mae},
        "history": [{"epoch": i, "lr": 1e-3 / (i + 1), "val_mae": v} for i, v in enumerate(val)],
    }


def _grid(seeds, offsets, protocol="full29", variants=VARIANTS) -> list[dict]:
    """One artifact per variant and seed: MAE@3 = 3 + offsets[variant] + 0.01 * seed**2."""
    return [
        _art(v, s, 3.0 + offsets.get(v, 0.0) + 0.01 * s**2, protocol)
        for s in seeds
        for v in variants
    ]


def test_complete_seeds_need_every_variant():
    arts = _grid([0, 1], {}) + [_art("none", 2, 3.0), _art("mask", 2, 3.0)]
    assert dr.complete_seeds(arts, VARIANTS) == [0, 1]
    assert dr.complete_seeds(arts, ["none", "mask"]) == [0, 1, 2]
    assert dr.complete_seeds([], VARIANTS) == []
    kept = dr.restrict(arts, [1], ["none", "mask"])
    assert {(a["variant"], a["seed"]) for a in kept} == {("none", 1), ("mask", 1)}


def test_run_counts_against_the_planned_runs():
    # the protocols the pages report (dr.PLANNED): 5 and 3 variants x 4 seeds
    arts = _grid([0], {}, dr.FULL) + [_art("none", s, 3.0, dr.FULL) for s in (1, 7)]  # 7: unplanned
    c = dr.run_counts(arts, dr.FULL)
    assert (c["planned"], c["present"], c["seeds"], c["complete"]) == (20, 6, 4, [0])
    rel = dr.run_counts(_grid([0, 1], {}, dr.RELEASED, ("none", "dropout", "penalty")), dr.RELEASED)
    assert (rel["planned"], rel["present"], rel["complete"]) == (12, 6, [0, 1])
    with pytest.raises(ValueError, match="plans no runs"):
        dr.run_counts(arts, "slice")


def test_summary_and_table_with_baseline_rows():
    arts = _grid([0, 1, 2], {"mask": 0.5})
    stats = dr.summary(arts, VARIANTS, KEYS)
    x = pd.Series([3.5, 3.51, 3.54])
    assert stats.loc["mask", ("MAE@3", "mean")] == pytest.approx(x.mean())
    assert stats.loc["mask", ("MAE@3", "sd")] == pytest.approx(x.std(ddof=1))
    assert stats.loc["mask", ("MAE@12", "n")] == 3
    base = pd.DataFrame({"MAE@3": [4.1], "MAE@12": [5.2]}, index=["last value"])
    table = dr.results_table(stats, base, KEYS)
    assert list(table.index) == [LABELS[v] for v in VARIANTS] + ["last value"]
    assert table.loc[LABELS["mask"], "MAE@3"] == f"{x.mean():.3f} ± {x.std(ddof=1):.3f}"
    assert table.loc["last value", "MAE@12"] == "5.200"
    one = dr.results_table(dr.summary(_grid([0], {}), VARIANTS, KEYS), None, KEYS)
    assert "±" not in one.loc[LABELS["none"], "MAE@3"]  # one seed: no sd to print


def test_paired_table_is_paired_by_seed():
    # the seed term 0.01 s^2 is common to all variants: the paired differences are exact
    arts = _grid([0, 1, 2, 3], {"mask": 0.2})
    arts = [dict(a, metrics=dict(a["metrics"])) for a in arts]
    for a in arts:  # (d) differs from (b) by +0.1 or -0.1 seed by seed: mean 0, inside the noise
        if a["variant"] == "dropout":
            a["metrics"]["MAE@3"] += 0.1 * (-1) ** a["seed"]
    p = dr.paired_table(arts, VARIANTS, [0, 1, 2, 3], ["MAE@3"])
    assert p.loc[("mask", "MAE@3"), "mean diff"] == pytest.approx(0.2)
    assert p.loc[("mask", "MAE@3"), "half-width"] == pytest.approx(0.0, abs=1e-12)
    assert bool(p.loc[("mask", "MAE@3"), "exceeds"])
    base_mean = np.mean([3.0 + 0.01 * s**2 for s in range(4)])
    assert p.loc[("mask", "MAE@3"), "relative %"] == pytest.approx(100 * 0.2 / base_mean)
    sd = math.sqrt(4 * 0.01 / 3)
    assert p.loc[("dropout", "MAE@3"), "half-width"] == pytest.approx(
        t_quantile(0.975, 3) * sd / 2, rel=1e-6
    )
    assert not bool(p.loc[("dropout", "MAE@3"), "exceeds"])
    assert ("none", "MAE@3") not in p.index and len(p) == 4
    assert dr.paired_table(arts, VARIANTS, [0], ["MAE@3"]).empty  # one seed: no interval
    text = dr.describe_paired(p, 4, {"mask": "(c)"})
    assert (
        text
        == "Over 4 seeds, 1 of the 4 differences exceeds the seed noise: (c) MAE@3 +0.200 (worse)."
    )
    assert "needs 2" in dr.describe_paired(dr.paired_table(arts, VARIANTS, [0], ["MAE@3"]), 1)


def test_paper_table_and_relative_changes():
    paper = dr.paper_means()
    assert paper["none"]["MAE@12"] == (3.989, 0.019) and paper["dropout"]["MAPE@3"] == (
        7.833,
        0.003,
    )
    rel = dr.relative_changes(
        {v: {k: m for k, (m, _) in row.items()} for v, row in paper.items()}, dr.PAPER_KEYS
    )
    assert rel.loc["dropout", "MAE@12"] == pytest.approx(100 * (3.940 - 3.989) / 3.989)
    assert -rel.loc[["mask", "dropout", "penalty"]].min().min() < 2.5  # the text's "about 2.5 %"
    assert "none" not in rel.index


def test_released_comparison_separates_gap_and_interaction():
    reg = ("none", "dropout", "penalty")
    diffusion = _grid([0, 1, 2], {"dropout": 0.1}, "full29")
    released = [
        dict(
            a,
            protocol="full29-released",
            metrics={
                k: v + 0.5 + (0.2 if a["variant"] == "dropout" else 0)
                for k, v in a["metrics"].items()
            },
        )
        for a in _grid([0, 1, 2], {"dropout": 0.1}, "full29", reg)
    ]
    r = dr.released_comparison(diffusion, released, "MAE@3")
    assert r.loc["layer gap none", "mean diff"] == pytest.approx(0.5)
    assert r.loc["dropout - (b), diffusion", "mean diff"] == pytest.approx(0.1)
    assert r.loc["dropout - (b), released", "mean diff"] == pytest.approx(0.3)
    assert r.loc["dropout - (b): released minus diffusion", "mean diff"] == pytest.approx(0.2)
    assert r.loc["penalty - (b): released minus diffusion", "mean diff"] == pytest.approx(
        0.0, abs=1e-12
    )
    assert dr.released_comparison(diffusion, released[:3], "MAE@3").empty  # one common seed


def _curve(val, peak=1e-3, floor=1e-5):
    """A history whose learning rate falls geometrically from ``peak`` to ``floor``."""
    n = len(val)
    return [
        {"lr": peak * (floor / peak) ** (i / max(n - 1, 1)), "val_mae": v}
        for i, v in enumerate(val)
    ]


def test_convergence_rule():
    flat = dr.convergence(_curve([3.0, 2.5, 2.41, 2.40, 2.405, 2.41, 2.404]))
    assert flat["converged"] and flat["best_epoch"] == 3 and flat["best"] == 2.40
    assert flat["late_change"] == pytest.approx(2.40 / 2.41 - 1)  # best of the last 4 over before
    assert flat["last_excess"] == pytest.approx(2.41 / 2.40 - 1)
    assert flat["lr_ratio"] == pytest.approx(0.01)
    # one epoch rises 2 % above the best, the others stay within 1 %: the curve has flattened,
    # though the stricter reading (every one of the last epochs within tol) fails
    spike = dr.convergence(_curve([3.0, 2.5, 2.40, 2.45, 2.41, 2.42, 2.405]))
    assert spike["converged"] and spike["last_excess"] > dr.CONVERGENCE["tol"]
    falling = dr.convergence(_curve([3.0, 2.8, 2.6, 2.4, 2.3, 2.2, 2.1]))
    assert not falling["converged"] and falling["late_change"] == pytest.approx(2.1 / 2.6 - 1)
    fell_back = dr.convergence(_curve([3.0, 2.4, 2.5, 2.6, 2.5, 2.55, 2.6]))
    assert not fell_back["converged"] and fell_back["late_change"] == pytest.approx(2.5 / 2.4 - 1)
    flat_at_peak = _curve([3.0, 2.5, 2.41, 2.40, 2.405, 2.41, 2.404], floor=1e-3)
    at_peak = dr.convergence(flat_at_peak)
    # flat, but the steps never shrank
    assert not at_peak["converged"] and at_peak["lr_ratio"] == 1.0
    assert dr.convergence(flat_at_peak, lr_frac=1.0)["converged"]
    short = dr.convergence(_curve([2.0] * 4))
    assert not short["converged"] and np.isnan(short["late_change"])  # nothing before the window
    assert dr.convergence(_curve([2.0, 2.03, 2.02]), window=2, tol=0.02)["converged"]
    assert not dr.convergence(_curve([2.0, 2.03, 2.02]), window=2, tol=0.005)["converged"]
    with pytest.raises(ArtifactError, match="empty"):
        dr.convergence([])
    table = dr.convergence_table(
        [
            _art("none", 0, 3.0, val=[3.0] + [2.4] * 10),  # learning rate down to 1/11 of its peak
            _art("mask", 1, 3.0, val=[3.0, 2.0]),
        ]
    )
    assert (
        table.loc[("full29", "none", 0), "converged"]
        and not table.loc[("full29", "mask", 1), "converged"]
    )


def test_shared_late_changes_separates_seed_from_variant():
    # seed 0 rises then falls late, seed 1 the opposite; the variants of a seed differ only in level
    up = [3.0, 2.6, 2.5, 2.55, 2.45, 2.44]
    down = [3.0, 2.6, 2.5, 2.45, 2.55, 2.52]
    arts = [
        _art("none", 0, 3.0, val=up),
        _art("mask", 0, 3.0, val=[v + 0.1 for v in up]),
        _art("none", 1, 3.0, val=down),
        _art("mask", 1, 3.0, val=[v - 0.1 for v in down]),
    ]
    r = dr.shared_late_changes(arts, window=3)
    assert (r["n same"], r["n different"]) == (2, 4)
    assert r["same seed"] == pytest.approx(1.0)
    d_up, d_down = np.diff(up[-4:]), np.diff(down[-4:])
    assert r["different seeds"] == pytest.approx(np.corrcoef(d_up, d_down)[0, 1])
    assert r["different seeds"] < 0
    with pytest.raises(ArtifactError, match="needs at least 4"):
        dr.shared_late_changes([_art("none", 0, 3.0, val=[3.0, 2.0, 1.9])], window=3)


def test_longer_schedule_pairs_each_long_run_with_its_twin():
    falling = [3.0, 2.8, 2.6, 2.5, 2.45]  # misses the rule
    short = [
        _art("none", 0, 3.0, val=falling),
        _art("none", 1, 3.2),
        _art("none", 2, 3.1),
        _art("none", 1, 9.0, protocol="full29-released"),  # same variant and seed, other layer
    ]
    long = [
        _art("none", 0, 2.9, protocol="custom-full29-x2", val=[3.0, 2.5] + [2.41, 2.40, 2.405] * 3)
    ]
    t = dr.longer_schedule(short, long)
    row = t.loc[("full29", "none", 0)]
    assert (row["short"], row["long"]) == (6.0, 5.8) and row["change"] == pytest.approx(-0.2)
    assert row["seed sd"] == pytest.approx(np.std([6.0, 6.4, 6.2], ddof=1))
    assert not row["converged"] and row["long converged"]
    assert len(t) == 1 and dr.longer_schedule(short, []).empty
    with pytest.raises(ArtifactError, match="no twin"):
        dr.longer_schedule(short[1:], long)
    assert dr.describe_budget(t) == (
        "Over 1 pair(s) of a run and its twin with twice the epochs, the longer run's MAE@12 minus its twin's is "
        "-0.200 to -0.200 mph (-3.3 to -3.3 %), in 1 of them by more than the seed-to-seed sd of its "
        "variant; 0 of the 1 shorter runs and 1 of the 1 longer ones meet the convergence rule."
    )
    assert dr.describe_budget(t.iloc[:0]) == "No run has a twin with another epoch budget yet."


def test_budget_twin_and_protocol_config_read_both_protocols_of_a_pair():
    for short, long in dr.LONGER.items():
        assert dr.budget_twin(short) == long and dr.budget_twin(long) == short
        assert (
            dr.protocol_config(long)["train"]["epochs"]
            == 2 * dr.protocol_config(short)["train"]["epochs"]
        )
        assert dr.protocol_config(long)["protocol"] == long
    assert all(dr.budget_twin(p) for p in (dr.FULL, dr.RELEASED))  # the reported ones have twins
    with pytest.raises(ValueError, match="no twin with another epoch budget"):
        dr.budget_twin("slice")


def test_longer_paired_seeds_sets_the_interval_at_both_lengths_over_the_same_seeds():
    from diagsink.engine.significance import paired_difference

    x2 = "custom-full29-x2"
    # MAE@12 = 2 * mae. Short: mask - (b) = +0.2, 0.0, -0.2 (seeds 0-2); long: +0.2, +0.4, +0.3
    short = [_art("none", s, 3.0) for s in range(3)] + [
        _art("mask", s, m) for s, m in enumerate((3.1, 3.0, 2.9))
    ]
    long = [_art("none", s, 2.8, x2) for s in range(3)] + [
        _art("mask", s, m, x2) for s, m in enumerate((2.9, 3.0, 2.95))
    ]
    long += [_art("dropout", 0, 2.7, x2)]  # one seed only: no interval, no row
    t = dr.longer_paired_seeds(short, long)
    assert list(t.index) == [("full29", "mask")]
    r = t.loc[("full29", "mask")]
    assert r["seeds"] == [0, 1, 2]
    assert r["short"] == pytest.approx(0.0, abs=1e-12) and r["long"] == pytest.approx(0.3)
    expected = paired_difference([5.8, 6.0, 5.9], [5.6, 5.6, 5.6])
    assert r["long half-width"] == pytest.approx(expected["half_width"])
    assert r["long exceeds"] == bool(expected["exceeds_noise"]) and not r["short exceeds"]
    text = dr.describe_longer_paired_seeds(t, {"mask": "(c)"})
    assert text == (
        "Of the 1 variant-minus-(b) difference(s) of MAE@12 with both budgets at two seeds or more, 0 "
        "exceed the seed noise with the shorter budget and 1 ((c) in the full29 pair, +0.300 ± "
        f"{expected['half_width']:.3f} mph) with twice its epochs (largest mean difference 0.000 and 0.300 mph)."
    )
    # a seed whose short run is missing drops out of both columns
    t2 = dr.longer_paired_seeds([a for a in short if a["seed"] != 2], long)
    assert t2.loc[("full29", "mask"), "seeds"] == [0, 1]
    assert dr.longer_paired_seeds(short, long[:3]).empty
    assert dr.describe_longer_paired_seeds(t.iloc[:0]).startswith("No variant has two seeds")


def _fake_data(n_days: int = 14, n_nodes: int = 3) -> SimpleNamespace:
    """A MetrLA-like object: 5-minute steps from a Thursday, speeds 60 + node - a daily dip."""
    ts = pd.date_range("2012-05-31 00:00", periods=288 * n_days, freq="5min")  # a Thursday
    dip = 20 * np.exp(-((((ts.hour * 60 + ts.minute) - 480) / 60.0) ** 2))
    speed = np.stack([60 + n - (n == 0) * dip for n in range(n_nodes)], 1).astype(np.float64)
    speed[5, 1] = 0.0  # one missing reading, far from the test part
    return SimpleNamespace(
        timestamps=ts, speed=speed, sensor_ids=[f"s{n}" for n in range(n_nodes)],
        coverage=f"{n_nodes} of 207 sensors, first {len(ts)} of 34272 steps", n_nodes=n_nodes,
    )  # fmt: skip


def test_split_dates_and_one_test_day():
    data = _fake_data()
    splits = split_windows(len(data.speed))
    dates = dr.split_dates(data, splits)
    assert dates["coverage"] == "3 of 207 sensors, first 4,032 of 34,272 steps"
    test = dates["test"]
    assert test["first"] == data.timestamps[int(splits.test[0]) + 12]
    assert test["last"] == data.timestamps[-1] and test["windows"] == len(splits.test)
    assert not test["weekend_only"]
    day, sensors = dr.pick_day_and_sensors(data, splits)
    assert day.day_of_week < 5 and day >= test["first"].normalize() + pd.Timedelta("1D")
    assert sensors == [0, 2]  # the dipping sensor (lowest mean), the fastest one
    f = dr.day_forecast(data, splits, day, sensors, horizon=3)
    rows = (data.timestamps >= day) & (data.timestamps < day + pd.Timedelta("1D"))
    assert len(f) == 288 and np.array_equal(f[("s0", "truth")].to_numpy(), data.speed[rows, 0])
    # the last value is the reading 3 steps (15 minutes) before each target
    assert np.array_equal(
        f[("s0", "last value")].to_numpy(), data.speed[np.flatnonzero(rows) - 3, 0]
    )
    with pytest.raises(ArtifactError, match="not covered by test windows"):
        dr.day_forecast(data, splits, data.timestamps[0].normalize(), sensors, horizon=3)


def test_one_weekend_is_recognised():
    data = _fake_data(n_days=5)  # Thursday to Monday: the test part is the last fifth
    dates = dr.split_dates(data, split_windows(len(data.speed)))
    assert dates["test"]["first"].day_name() == "Sunday" and not dates["test"]["weekend_only"]
    data.timestamps = data.timestamps - pd.Timedelta("1D")  # Wednesday to Sunday
    assert dr.split_dates(data, split_windows(len(data.speed)))["test"]["weekend_only"]


def test_results_root_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(dr.RESULTS_ENV, raising=False)
    assert dr.results_root() == dr.Path("results")
    monkeypatch.setenv(dr.RESULTS_ENV, str(tmp_path))
    assert dr.results_root() == tmp_path
    assert dr.load_protocol(tmp_path, "full29") == []  # nothing committed yet


def test_day_forecast_with_a_model_uses_the_engine(monkeypatch):
    data = _fake_data()
    splits = split_windows(len(data.speed))
    day, sensors = dr.pick_day_and_sensors(data, splits)
    seen = {}

    def fake_predict(model, prepared, starts, cfg):  # [B, t_out, N]: the window's start as value
        seen["starts"] = starts
        return starts[:, None, None].float().expand(-1, 12, len(data.sensor_ids)), None

    monkeypatch.setattr(dr, "predict", fake_predict)
    run = SimpleNamespace(
        model=None, prepared=SimpleNamespace(test=torch.zeros(1, dtype=torch.long)), cfg={}
    )
    f = dr.day_forecast(data, splits, day, sensors, horizon=12, run=run)
    steps = np.flatnonzero((data.timestamps >= day) & (data.timestamps < day + pd.Timedelta("1D")))
    assert np.array_equal(f[("s2", "model")].to_numpy(), steps - 12 - 12 + 1)


def test_map_grid_keeps_every_map_legible():
    import matplotlib.pyplot as plt

    from diagsink.plotting import MIN_PANEL_PX, caption_text, map_grid, rendered_panel_widths

    maps = {f"block {k + 1}": torch.full((12, 12), 1 / 12) for k in range(4)}
    fig = map_grid(maps, how="four blocks of one run")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == list(maps) and caption_text(fig) == "four blocks of one run"
    assert min(rendered_panel_widths(fig)) >= MIN_PANEL_PX
    plt.close(fig)
    with pytest.raises(ValueError, match="empty"):
        map_grid({}, how="nothing")


def test_load_protocol_reads_the_committed_slice():
    root = dr.Path(__file__).resolve().parents[1] / "book" / "results"
    arts = dr.load_protocol(root, "slice")
    assert len(arts) == 20 and dr.complete_seeds(arts, VARIANTS) == [0, 1, 2, 3]
    table = dr.convergence_table(arts)
    assert len(table) == 20 and set(table.index.get_level_values("protocol")) == {"slice"}
