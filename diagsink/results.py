"""The full-length runs, read as whatever subset of them is committed: chapter "Results: every
variant" (``book/results.ipynb``) and the forecasts of "Heatmaps on METR-LA" (``book/heatmaps.ipynb``).

The protocols :data:`FULL` (5 variants x 4 seeds) and :data:`RELEASED` (the released graph
layer; variants (b), (d), (e) x 4 seeds) are trained one run at a time, so a page may find any
subset of them. Everything here works on that subset:

* :func:`complete_seeds` -- the seeds for which *every* variant of a comparison exists; tables,
  means and paired differences use only those, so each variant is averaged over the same seeds;
* :func:`run_counts` -- how many of the planned runs exist (:data:`PLANNED`);
  :func:`protocol_config` -- the config of a protocol or of its twin;
* :func:`summary` / :func:`results_table` -- mean and sample sd over the complete seeds, with the
  baselines of :func:`diagsink.data.baselines.baseline_table` as further rows;
* :func:`paired_table` -- each variant minus (b), seed by seed, with the 95 % paired-t interval
  (:func:`diagsink.engine.significance.paired_difference`); empty with fewer than 2 seeds;
* :data:`PAPER` / :func:`relative_changes` -- the paper's table (quoted) and ours as percent
  changes against (b), the only comparison that makes sense across different data;
* :func:`released_comparison` -- released minus diffusion graph layer, and whether a
  regularizer's effect differs between the two layers (a difference of differences);
* :func:`convergence` -- a run's validation curve against the rule :data:`CONVERGENCE`;
  :func:`shared_late_changes` -- how far the last epochs' fluctuations are common to one seed;
  :func:`longer_schedule` -- each run against its twin with twice the epochs (:data:`LONGER`,
  :func:`budget_twin`), in words by :func:`describe_budget`; :func:`longer_paired_seeds` -- a
  variant's difference against (b) with the paired interval at both budgets, over the seeds where
  it and (b) have both (:func:`describe_longer_paired_seeds`);
* :func:`split_dates` and :func:`day_forecast` -- the test windows' dates, one test day's
  forecasts against the truth and the last value;
* :func:`daily_errors` -- a metric of every test day, for runs (their stored ``test_by_day``)
  and for the baselines (:func:`diagsink.data.baselines.baseline_forecasts`).

Metric dictionaries are the artifacts' ``metrics`` (keys ``"MAE@3"`` ... ``"MAPE@mean"``).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from .data.baselines import last_value
from .engine.artifacts import ArtifactError, load_results
from .engine.by_day import day_groups, error_sums, metrics_from_sums
from .engine.config import PROTOCOLS, load_config
from .engine.significance import paired_difference
from .engine.train import predict
from .variants import LABELS, VARIANTS

__all__ = [
    "RESULTS_ENV", "FULL", "RELEASED", "PLANNED", "CONVERGENCE", "PAPER", "PAPER_KEYS", "results_root",
    "protocol_config",
    "load_protocol", "complete_seeds", "restrict", "run_counts", "summary", "results_table",
    "paired_table", "describe_paired", "paper_means", "relative_changes", "released_comparison", "convergence",
    "convergence_table", "shared_late_changes", "LONGER", "budget_twin", "longer_schedule", "longer_paired_seeds", "describe_longer_paired_seeds", "describe_budget", "thousands", "split_dates", "day_forecast", "pick_day_and_sensors",
    "daily_errors",
]  # fmt: skip

#: Environment variable naming another results folder (development only; default ``results``
#: next to the chapters, i.e. ``book/results``).
RESULTS_ENV = "DIAGSINK_RESULTS"

#: The full-length protocol whose runs the pages report (the book model with its mixing graph
#: layer), read by "Results", "Heatmaps on METR-LA", "Trained models through the theorem" and
#: the README's figure. It is the twin with twice the epochs (:data:`LONGER`): every one of its
#: runs meets :data:`CONVERGENCE` (the results page asserts it), not every run of ``full29``.
FULL = "custom-full29-x2"
#: The same with the released graph layer (no mixing of sensors), reported by "Results".
RELEASED = "custom-full29-released-x2"

#: The variants each full-length protocol plans (the seeds come from its config).
PLANNED: dict[str, tuple[str, ...]] = {
    FULL: VARIANTS,
    RELEASED: ("none", "dropout", "penalty"),
}

#: The convergence rule, met when the run's last learning rate is at most ``lr_frac`` of its peak
#: and the best validation MAE of its last ``window`` epochs lies within ``tol`` (relative) of the
#: best before them.
CONVERGENCE: dict[str, float] = {"window": 4, "tol": 0.01, "lr_frac": 0.1}

#: Each full-length protocol with 16 epochs and its twin with twice the epochs (the schedule and
#: the patience stretched with them, everything else equal; the twins are :data:`FULL` and
#: :data:`RELEASED`): the results page's check of the epoch budget.
LONGER: dict[str, str] = {
    "full29": "custom-full29-x2",
    "full29-released": "custom-full29-released-x2",
}

#: The paper's results table (METR-LA, mean +- sd), quoted from Hankemeier & Schilling (2026):
#: MAE, RMSE, MAPE at horizons 3, 6, 12 (15, 30, 60 minutes).
PAPER: dict[str, str] = {
    "no_residual": "3.165±.028 3.671±.064 4.627±.113 6.190±.050 7.414±.144 9.315±.227 8.705±.268 10.286±.202 13.406±.185",
    "none": "2.966±.022 3.443±.006 3.989±.019 5.881±.045 7.028±.054 8.418±.053 7.836±.041 9.670±.082 11.708±.158",
    "mask": "2.969±.019 3.447±.022 3.997±.026 5.889±.015 7.000±.017 8.431±.024 7.830±.060 9.666±.100 11.734±.083",
    "dropout": "2.959±.001 3.415±.010 3.940±.011 5.845±.029 7.006±.051 8.338±.041 7.833±.003 9.616±.037 11.570±.047",
    "penalty": "2.969±.027 3.436±.037 3.964±.041 5.859±.034 6.995±.054 8.344±.105 7.842±.070 9.655±.120 11.623±.157",
}  # fmt: skip
#: The columns of :data:`PAPER`, in order.
PAPER_KEYS: tuple[str, ...] = tuple(f"{m}@{h}" for m in ("MAE", "RMSE", "MAPE") for h in (3, 6, 12))


def results_root(default: str | Path = "results") -> Path:
    """The results folder: ``$DIAGSINK_RESULTS`` when set (development), else ``default``."""
    return Path(os.environ.get(RESULTS_ENV, "").strip() or default)


def load_protocol(root: str | Path, protocol: str) -> list[dict[str, Any]]:
    """Every artifact of ``root/protocol`` (validated), or ``[]`` when none is committed yet."""
    folder = Path(root) / protocol
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return []
    return load_results(folder)


def complete_seeds(arts: list[dict[str, Any]], variants: tuple[str, ...] | list[str]) -> list[int]:
    """The seeds (sorted) for which every one of ``variants`` has an artifact in ``arts``."""
    have: dict[int, set[str]] = {}
    for a in arts:
        have.setdefault(a["seed"], set()).add(a["variant"])
    return sorted(s for s, vs in have.items() if set(variants) <= vs)


def restrict(
    arts: list[dict[str, Any]], seeds: list[int], variants: tuple[str, ...] | list[str]
) -> list[dict[str, Any]]:
    """The artifacts of ``variants`` whose seed is in ``seeds``."""
    return [a for a in arts if a["seed"] in seeds and a["variant"] in variants]


def protocol_config(protocol: str) -> dict[str, Any]:
    """The config of ``protocol``: a shipped protocol, or the file ``<protocol>.yaml`` that ships
    beside them in ``diagsink/configs`` (the ``custom-...`` twins of :data:`LONGER`)."""
    if protocol in PROTOCOLS:
        return load_config(protocol)
    return load_config(
        Path(str(resources.files("diagsink").joinpath("configs", f"{protocol}.yaml")))
    )


def run_counts(arts: list[dict[str, Any]], protocol: str) -> dict[str, Any]:
    """How many of the runs ``protocol`` plans exist in ``arts``.

    Returns ``planned`` (variants x seeds of the config), ``present`` (planned runs found),
    ``variants``, ``seeds`` (the config's seed count) and ``complete`` (:func:`complete_seeds`
    over the planned variants, limited to the planned seeds ``0 .. seeds - 1``).
    """
    if protocol not in PLANNED:
        raise ValueError(
            f"protocol {protocol!r} plans no runs here; choose one of {sorted(PLANNED)}."
        )
    variants, n_seeds = PLANNED[protocol], int(protocol_config(protocol)["seeds"])
    planned = {(v, s) for v in variants for s in range(n_seeds)}
    present = {(a["variant"], a["seed"]) for a in arts} & planned
    complete = [s for s in complete_seeds(arts, variants) if s < n_seeds]
    return {
        "planned": len(planned),
        "present": len(present),
        "variants": variants,
        "seeds": n_seeds,
        "complete": complete,
    }


def summary(
    arts: list[dict[str, Any]], variants: tuple[str, ...] | list[str], keys: list[str]
) -> pd.DataFrame:
    """Mean, sample sd (``n - 1``; NaN for one seed) and ``n`` of each metric per variant.

    Returns a frame indexed by variant with columns ``(key, "mean" | "sd" | "n")``; a variant
    without artifacts is left out.
    """
    rows = {}
    for v in variants:
        runs = [a for a in arts if a["variant"] == v]
        if not runs:
            continue
        row = {}
        for k in keys:
            x = pd.Series([float(a["metrics"][k]) for a in runs])
            row[(k, "mean")], row[(k, "sd")], row[(k, "n")] = x.mean(), x.std(ddof=1), len(x)
        rows[v] = row
    columns = pd.MultiIndex.from_product([keys, ["mean", "sd", "n"]])
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns)


def results_table(
    stats: pd.DataFrame, baselines: pd.DataFrame | None, keys: list[str], digits: int = 3
) -> pd.DataFrame:
    """One row per variant (``mean ± sd``, labelled as in the paper) and per baseline (one number).

    ``stats`` is :func:`summary`'s frame; ``baselines`` the frame of
    :func:`diagsink.data.baselines.baseline_table` (rows = baselines, columns = metric keys).
    """
    out: dict[str, dict[str, str]] = {}
    for v in stats.index:
        out[LABELS[v]] = {
            k: f"{stats.loc[v, (k, 'mean')]:.{digits}f}"
            + (
                ""
                if np.isnan(stats.loc[v, (k, "sd")])
                else f" ± {stats.loc[v, (k, 'sd')]:.{digits}f}"
            )
            for k in keys
        }
    for name, row in [] if baselines is None else baselines.iterrows():
        out[name] = {k: f"{row[k]:.{digits}f}" for k in keys}
    return pd.DataFrame.from_dict(out, orient="index", columns=keys)


def paired_table(
    arts: list[dict[str, Any]],
    variants: tuple[str, ...] | list[str],
    seeds: list[int],
    keys: list[str],
    baseline: str = "none",
    level: float = 0.95,
) -> pd.DataFrame:
    """Each variant minus ``baseline``, paired by seed over ``seeds``, with its ``level`` interval.

    Index ``(variant, key)``; columns ``n``, ``mean diff``, ``half-width``, ``low``, ``high``,
    ``relative %`` (mean difference over the baseline's mean) and ``exceeds`` (the interval
    excludes 0). Empty (same columns) with fewer than 2 seeds: a paired interval needs 2.
    """
    columns = ["n", "mean diff", "half-width", "low", "high", "relative %", "exceeds"]
    if len(seeds) < 2:
        return pd.DataFrame(
            columns=columns, index=pd.MultiIndex.from_tuples([], names=["variant", "metric"])
        )
    value = {(a["variant"], a["seed"]): a["metrics"] for a in arts}
    rows = {}
    for v in (v for v in variants if v != baseline):
        for k in keys:
            x = [float(value[v, s][k]) for s in seeds]
            b = [float(value[baseline, s][k]) for s in seeds]
            r = paired_difference(x, b, level)
            rows[(v, k)] = [
                r["n"], r["mean_diff"], r["half_width"], r["mean_diff"] - r["half_width"],
                r["mean_diff"] + r["half_width"], 100 * r["mean_diff"] / (sum(b) / len(b)),
                bool(r["exceeds_noise"]),
            ]  # fmt: skip
    out = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    out.index = pd.MultiIndex.from_tuples(out.index, names=["variant", "metric"])
    return out


def describe_paired(
    paired: pd.DataFrame, n_seeds: int, labels: dict[str, str] | None = None
) -> str:
    """One sentence: how many differences of :func:`paired_table` exceed the seed noise, and which.

    With an empty table it says that a paired interval needs 2 seeds.
    """
    if not len(paired):
        return (
            f"With {n_seeds} complete seed(s) no paired interval can be computed yet; it needs 2."
        )
    labels = labels or {}
    hits = paired[paired["exceeds"].astype(bool)]
    which = "; ".join(
        f"{labels.get(v, v)} {k} {r['mean diff']:+.3f} ({'worse' if r['mean diff'] > 0 else 'better'})"
        for (v, k), r in hits.iterrows()
    )
    verb = "exceeds" if len(hits) == 1 else "exceed"
    return (
        f"Over {n_seeds} seeds, {len(hits)} of the {len(paired)} differences {verb} the seed noise"
        + (f": {which}." if len(hits) else ".")
    )


def paper_means() -> dict[str, dict[str, tuple[float, float]]]:
    """:data:`PAPER` parsed: ``{variant: {key: (mean, sd)}}``."""
    return {
        v: {k: tuple(float(x) for x in cell.split("±")) for k, cell in zip(PAPER_KEYS, row.split(), strict=True)}
        for v, row in PAPER.items()
    }  # fmt: skip


def relative_changes(
    means: dict[str, dict[str, float]], keys: list[str] | tuple[str, ...], baseline: str = "none"
) -> pd.DataFrame:
    """``100 (v - b) / b`` in percent for every variant but ``baseline``: rows variants, columns keys."""
    base = means[baseline]
    return pd.DataFrame.from_dict(
        {v: {k: 100 * (m[k] - base[k]) / base[k] for k in keys} for v, m in means.items() if v != baseline},
        orient="index",
    )  # fmt: skip


def released_comparison(
    diffusion: list[dict[str, Any]], released: list[dict[str, Any]], key: str, level: float = 0.95
) -> pd.DataFrame:
    """The released graph layer against the diffusion layer, paired by seed, for one metric.

    Uses the seeds complete for the released protocol's variants (:data:`PLANNED`) in *both*
    lists. Rows: ``layer gap <v>`` (released minus diffusion, per variant), ``<v> - (b),
    diffusion`` and ``<v> - (b), released`` (a regularizer's effect under each layer), and
    ``<v> - (b): released minus diffusion`` (does the effect differ between the layers).
    Columns as in :func:`paired_table`, without ``relative %``. Empty with fewer than 2 seeds.
    """
    variants = PLANNED[RELEASED]
    seeds = sorted(
        set(complete_seeds(diffusion, variants)) & set(complete_seeds(released, variants))
    )
    columns = ["n", "mean diff", "half-width", "low", "high", "exceeds"]
    if len(seeds) < 2:
        return pd.DataFrame(columns=columns)
    d = {(a["variant"], a["seed"]): float(a["metrics"][key]) for a in diffusion}
    r = {(a["variant"], a["seed"]): float(a["metrics"][key]) for a in released}
    pairs: dict[str, tuple[list[float], list[float]]] = {}
    for v in variants:
        pairs[f"layer gap {v}"] = ([r[v, s] for s in seeds], [d[v, s] for s in seeds])
    for v in variants[1:]:
        eff_d = [d[v, s] - d["none", s] for s in seeds]
        eff_r = [r[v, s] - r["none", s] for s in seeds]
        pairs[f"{v} - (b), diffusion"] = (eff_d, [0.0] * len(seeds))
        pairs[f"{v} - (b), released"] = (eff_r, [0.0] * len(seeds))
        pairs[f"{v} - (b): released minus diffusion"] = (eff_r, eff_d)
    rows = {}
    for name, (x, y) in pairs.items():
        p = paired_difference(x, y, level)
        m, h = p["mean_diff"], p["half_width"]
        rows[name] = [p["n"], m, h, m - h, m + h, bool(p["exceeds_noise"])]
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns)


def convergence(
    history: list[dict[str, float]],
    window: int | None = None,
    tol: float | None = None,
    lr_frac: float | None = None,
) -> dict[str, Any]:
    """Whether a validation curve meets the rule :data:`CONVERGENCE`: it stopped improving, and
    did not fall back, after its learning rate ran down.

    ``history`` is an artifact's list of epochs (``val_mae``, ``lr``). The run *converged* when
    it has more than ``window`` epochs, its last learning rate is at most ``lr_frac`` of the
    largest, and the best validation MAE of its last ``window`` epochs is within ``tol``
    (relative) of the best before them: those epochs neither improved on the earlier ones by more
    than ``tol`` (early stopping's test with patience ``window``) nor fell back from them by more.
    Returns ``converged``, ``epochs``, ``best_epoch``, ``best`` (MAE), ``late_change`` (best of
    the last ``window`` epochs over the best before them, minus 1: below 0 while still improving),
    ``last_excess`` (largest excess of any of the last ``window`` epochs over the best, the
    stricter reading that a single epoch's rise fails), ``lr_last`` (the last epoch's learning
    rate) and ``lr_ratio`` (``lr_last`` over the largest).
    """
    window = int(CONVERGENCE["window"] if window is None else window)
    tol = float(CONVERGENCE["tol"] if tol is None else tol)
    lr_frac = float(CONVERGENCE["lr_frac"] if lr_frac is None else lr_frac)
    if not history:
        raise ArtifactError("convergence needs a validation curve; this history is empty.")
    val = [float(h["val_mae"]) for h in history]
    lr = [float(h["lr"]) for h in history]
    best = min(val)
    late = min(val[-window:]) / min(val[:-window]) - 1 if len(val) > window else float("nan")
    lr_ratio = lr[-1] / max(lr) if max(lr) > 0 else float("nan")
    return {
        "converged": len(val) > window and abs(late) <= tol and lr_ratio <= lr_frac,
        "epochs": len(val),
        "best_epoch": int(np.argmin(val)),
        "best": best,
        "late_change": late,
        "last_excess": max(val[-window:]) / best - 1,
        "lr_last": lr[-1],
        "lr_ratio": lr_ratio,
    }


def _run_frame(
    rows: dict[tuple, Any],
    columns: list[str] | None = None,
    names: tuple[str, ...] = ("protocol", "variant", "seed"),
) -> pd.DataFrame:
    """``rows`` (keyed by tuples named ``names``) as a frame with that index (empty if none)."""
    out = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    if len(out):
        out.index = pd.MultiIndex.from_tuples(out.index, names=list(names))
    return out


def _metric_by_run(arts: list[dict[str, Any]], key: str) -> dict[tuple[str, str, int], float]:
    """``key`` of every run, keyed ``(protocol, variant, seed)``."""
    return {(a["protocol"], a["variant"], a["seed"]): float(a["metrics"][key]) for a in arts}


def _shorter(protocol: str) -> str:
    """The protocol that ``protocol`` lengthens (:data:`LONGER`), or ``""`` if none."""
    return {v: k for k, v in LONGER.items()}.get(protocol, "")


def budget_twin(protocol: str) -> str:
    """The other protocol of ``protocol``'s pair in :data:`LONGER`: the one with twice its epochs,
    or with half of them. A protocol without a twin raises :class:`ValueError`."""
    twin = LONGER.get(protocol) or _shorter(protocol)
    if not twin:
        raise ValueError(
            f"protocol {protocol!r} has no twin with another epoch budget; choose one of "
            f"{sorted([*LONGER, *LONGER.values()])}."
        )
    return twin


def convergence_table(arts: list[dict[str, Any]]) -> pd.DataFrame:
    """:func:`convergence` of every run: rows ``(protocol, variant, seed)``."""
    return _run_frame(
        {(a["protocol"], a["variant"], a["seed"]): convergence(a["history"]) for a in arts}
    )


def shared_late_changes(arts: list[dict[str, Any]], window: int | None = None) -> dict[str, Any]:
    """How much the last epochs' validation changes are shared by the runs of one seed.

    For each run, the epoch-to-epoch changes of its validation MAE into its last ``window``
    epochs (the epochs :func:`convergence` judges); for every pair of runs, the Pearson
    correlation of those changes. Returns ``same seed`` and ``different seeds`` (mean
    correlation over the pairs of different variants with the same seed, and over the pairs with
    different seeds) and ``n same`` / ``n different`` (numbers of pairs). Runs of one seed see
    the training windows in the same order, so a high ``same seed`` against a ``different
    seeds`` near 0 says the late fluctuations come from that order, not from the variant.
    """
    window = int(CONVERGENCE["window"] if window is None else window)
    changes = {}
    for a in arts:
        val = np.array([float(h["val_mae"]) for h in a["history"]])
        if len(val) < window + 1:
            raise ArtifactError(
                f"{a['protocol']}/{a['variant']}_seed{a['seed']} has {len(val)} epochs; "
                f"shared_late_changes needs at least {window + 1}."
            )
        changes[(a["variant"], a["seed"])] = np.diff(val[-window - 1 :])
    same, different = [], []
    keys = sorted(changes)
    for i, k in enumerate(keys):
        for m in keys[i + 1 :]:
            r = float(np.corrcoef(changes[k], changes[m])[0, 1])
            (same if k[1] == m[1] else different).append(r)
    return {
        "same seed": float(np.mean(same)) if same else float("nan"),
        "different seeds": float(np.mean(different)) if different else float("nan"),
        "n same": len(same),
        "n different": len(different),
    }


def longer_schedule(
    short: list[dict[str, Any]], long: list[dict[str, Any]], key: str = "MAE@12"
) -> pd.DataFrame:
    """Each run of ``long`` (a :data:`LONGER` protocol) against its twin in ``short``.

    The twin has the same variant and seed in the protocol that :data:`LONGER` maps to the long
    one. Rows ``(protocol, variant, seed)`` of the short run; columns ``short`` and ``long``
    (``key`` of the two runs), ``change`` (long minus short), ``seed sd`` (sample sd of ``key``
    over every run of that variant in ``short``), and ``converged`` / ``long converged``
    (:func:`convergence` of each curve). A long run without a twin raises :class:`ArtifactError`.
    """
    twins = {(a["protocol"], a["variant"], a["seed"]): a for a in short}
    rows = {}
    for a in long:
        name = (_shorter(a["protocol"]), a["variant"], a["seed"])
        if name not in twins:
            raise ArtifactError(
                f"{a['protocol']}/{a['variant']}_seed{a['seed']} has no twin {'/'.join(map(str, name))} "
                "among the runs given; pass the protocol it lengthens."
            )
        same = [
            float(b["metrics"][key])
            for b in short
            if b["protocol"] == name[0] and b["variant"] == name[1]
        ]
        s, x = float(twins[name]["metrics"][key]), float(a["metrics"][key])
        rows[name] = {
            "short": s, "long": x, "change": x - s,
            "seed sd": float(np.std(same, ddof=1)) if len(same) > 1 else float("nan"),
            "converged": convergence(twins[name]["history"])["converged"],
            "long converged": convergence(a["history"])["converged"],
        }  # fmt: skip
    return _run_frame(rows, ["short", "long", "change", "seed sd", "converged", "long converged"])


def describe_budget(longer: pd.DataFrame) -> str:
    """:func:`longer_schedule` summed up: how far twice the epochs moves MAE@12, for how many pairs
    by more than the seed-to-seed sd of their variant, and how many runs of each budget meet the
    convergence rule."""
    if longer.empty:
        return "No run has a twin with another epoch budget yet."
    rel = 100 * longer["change"] / longer["short"]
    n, n_more = len(longer), int((longer["change"].abs() >= longer["seed sd"]).sum())
    return (
        f"Over {n} pair(s) of a run and its twin with twice the epochs, the longer run's MAE@12 minus its twin's is "
        f"{longer['change'].min():+.3f} to {longer['change'].max():+.3f} mph ({rel.min():+.1f} to "
        f"{rel.max():+.1f} %), in {n_more} of them by more than the seed-to-seed sd of its variant; "
        f"{int(longer['converged'].sum())} of the {n} shorter runs and {int(longer['long converged'].sum())} "
        f"of the {n} longer ones meet the convergence rule."
    )


def longer_paired_seeds(
    short: list[dict[str, Any]],
    long: list[dict[str, Any]],
    key: str = "MAE@12",
    level: float = 0.95,
) -> pd.DataFrame:
    """Each variant minus (b) over the seeds where both are trained twice as long, against the
    same seeds in the short protocol: does a variant's effect against (b) depend on the budget?

    For each long protocol (:data:`LONGER`) and variant with at least 2 seeds that it and (b)
    both have in the long protocol (and, for those seeds, in the short one): rows ``(protocol,
    variant)`` in the short protocol's name; columns ``seeds`` (those seeds), ``short`` and
    ``long`` (mean variant-minus-(b) difference of ``key``), ``short half-width`` and ``long
    half-width`` (the ``level`` paired-t interval, :func:`paired_difference`) and ``short
    exceeds`` / ``long exceeds`` (the interval excludes 0). Empty when no variant qualifies.
    """
    value = _metric_by_run(short + long, key)
    rows = {}
    for p, v in sorted({(a["protocol"], a["variant"]) for a in long if a["variant"] != "none"}):
        q = _shorter(p)
        seeds = sorted(
            e
            for (pp, vv, e) in value
            if (pp, vv) == (p, v)
            and all(n in value for n in ((p, "none", e), (q, v, e), (q, "none", e)))
        )
        if len(seeds) < 2:
            continue
        row: dict[str, Any] = {"seeds": seeds}
        for name, proto in (("short", q), ("long", p)):
            r = paired_difference(
                [value[(proto, v, e)] for e in seeds],
                [value[(proto, "none", e)] for e in seeds],
                level,
            )
            row[name] = r["mean_diff"]
            row[f"{name} half-width"] = r["half_width"]
            row[f"{name} exceeds"] = bool(r["exceeds_noise"])
        rows[(q, v)] = row
    columns = ["seeds", "short", "short half-width", "short exceeds", "long", "long half-width",
               "long exceeds"]  # fmt: skip
    return _run_frame(rows, columns, names=("protocol", "variant"))


def describe_longer_paired_seeds(
    table: pd.DataFrame, labels: dict[str, str] | None = None, key: str = "MAE@12"
) -> str:
    """:func:`longer_paired_seeds` in one sentence: how many of its variant-minus-(b)
    differences exceed the seed noise with the shorter budget and with twice its epochs (each one
    that does named with its interval), and the largest mean difference at each budget."""
    if table.empty:
        return "No variant has two seeds yet at which it and (b) have both epoch budgets."
    labels = labels or {}

    def exceeding(budget: str) -> str:
        rows = table[table[f"{budget} exceeds"].astype(bool)]
        named = [
            f"{labels.get(v, v)} in the {p} pair, {r[budget]:+.3f} ± {r[f'{budget} half-width']:.3f} mph"
            for (p, v), r in rows.iterrows()
        ]
        return f"{len(rows)}" + (f" ({'; '.join(named)})" if named else "")

    n, largest = len(table), table[["short", "long"]].abs().max()
    return (
        f"Of the {n} variant-minus-(b) difference(s) of {key} with both budgets at two seeds or "
        f"more, {exceeding('short')} exceed the seed noise with the shorter budget and "
        f"{exceeding('long')} with twice its epochs (largest mean difference {largest['short']:.3f} "
        f"and {largest['long']:.3f} mph)."
    )


def thousands(n: int) -> str:
    """``34272`` -> ``"34,272"`` (the book's way of writing large counts)."""
    return f"{int(n):,}"


def split_dates(data: Any, splits: Any) -> dict[str, Any]:
    """What each part of the split covers: its first and last forecast target, and its windows.

    ``data`` is a :class:`diagsink.data.metr_la.MetrLA`, ``splits`` its
    :class:`diagsink.data.windows.Splits`. Returns ``coverage`` (:attr:`MetrLA.coverage` with
    thousands separators: "29 of 207 sensors, all 34,272 steps") and, per part ``train``,
    ``val``, ``test``: ``first`` and ``last`` target (timestamps), ``days`` between them,
    ``windows`` and ``weekend_only`` (every target on one Saturday-Sunday weekend).
    """
    ts = data.timestamps
    out: dict[str, Any] = {
        "coverage": re.sub(r"\d{4,}", lambda m: thousands(int(m.group())), data.coverage)
    }
    for part in ("train", "val", "test"):
        starts = getattr(splits, part)
        first = ts[int(starts.min()) + splits.t_in]
        last = ts[int(starts.max()) + splits.t_in + splits.t_out - 1]
        days = pd.date_range(first.normalize(), last.normalize(), freq="D")
        out[part] = {
            "first": first,
            "last": last,
            "days": (last - first) / pd.Timedelta("1D"),
            "windows": len(starts),
            "weekend_only": bool(len(days) <= 2 and (days.day_of_week >= 5).all()),
        }
    return out


def pick_day_and_sensors(
    data: Any, splits: Any, n_sensors: int = 2
) -> tuple[pd.Timestamp, list[int]]:
    """A test day and sensors to plot: the first weekday whose every step is a test target with
    no missing reading at the chosen sensors; of the sensors complete that day, the one with
    the lowest and the one with the highest mean speed (congestion and free flow)."""
    ts = data.timestamps
    first = ts[int(splits.test.min()) + splits.t_in]
    last = ts[int(splits.test.max()) + splits.t_in + splits.t_out - 1]
    for day in pd.date_range(first.normalize() + pd.Timedelta("1D"), last.normalize(), freq="D"):
        if day.day_of_week >= 5 or day + pd.Timedelta("1D") > last + pd.Timedelta("5min"):
            continue
        rows = (ts >= day) & (ts < day + pd.Timedelta("1D"))
        speed = data.speed[rows]
        ok = np.flatnonzero((speed > 0).all(0))
        if len(ok) >= n_sensors:
            means = speed[:, ok].mean(0)
            order = ok[np.argsort(means)]
            picks = [int(order[0]), int(order[-1])][:n_sensors]
            return day, picks
    raise ArtifactError("no weekday of the test period has complete readings at two sensors.")


def day_forecast(
    data: Any, splits: Any, day: pd.Timestamp, sensors: list[int], horizon: int, run: Any = None
) -> pd.DataFrame:
    """One test day at ``sensors``: the truth, the last value and (with ``run``) the model.

    Every 5-minute step ``t`` of ``day`` is the target of the test window whose ``horizon``-th
    forecast step lands on it (start ``t - t_in - horizon + 1``). The last value is the reading
    ``horizon`` steps before ``t`` (forward-filled); the model's forecast is
    :func:`diagsink.engine.train.predict` of the :class:`~diagsink.engine.reload.LoadedRun`
    ``run``. Returns a frame indexed by time with columns ``(sensor id, "truth" | "last value"
    | "model")`` in mph.
    """
    ts = data.timestamps
    steps = np.flatnonzero((ts >= day) & (ts < day + pd.Timedelta("1D")))
    starts = torch.as_tensor(steps - splits.t_in - horizon + 1)
    test = set(splits.test.tolist())
    if not all(int(s) in test for s in starts):
        raise ArtifactError(
            f"{day:%Y-%m-%d} at horizon {horizon} is not covered by test windows; pick a test day."
        )
    lv = last_value(data.speed, starts, splits.t_in, horizon)[:, -1]  # [B, N]
    cols: dict[tuple[str, str], np.ndarray] = {}
    pred = None
    if run is not None:
        pred, _ = predict(run.model, run.prepared, starts.to(run.prepared.test.device), run.cfg)
        pred = pred[:, horizon - 1].cpu().numpy()  # [B, N]
    for n in sensors:
        sid = data.sensor_ids[n]
        cols[(sid, "truth")] = data.speed[steps, n]
        cols[(sid, "last value")] = lv[:, n]
        if pred is not None:
            cols[(sid, "model")] = pred[:, n]
    return pd.DataFrame(cols, index=ts[steps])


def daily_errors(
    arts: list[dict[str, Any]],
    data: Any,
    splits: Any,
    baselines: tuple[dict[str, torch.Tensor], torch.Tensor],
    key: str = "MAE@12",
) -> pd.DataFrame:
    """``key`` (e.g. ``"MAE@12"``) of every test day: one row per day (a window belongs to the
    day of its last input step), one column per variant (the mean over the runs ``arts`` of that
    variant, from their stored ``test_by_day``) and per baseline (``baselines``: the forecasts
    and targets of :func:`diagsink.data.baselines.baseline_forecasts` on the same windows),
    and ``weekend`` (Saturday or Sunday)."""
    groups = day_groups(data.timestamps, splits.test, splits.t_in)
    cols: dict[str, pd.Series] = {}
    for variant in [v for v in VARIANTS if any(a["variant"] == v for a in arts)]:
        per_run = []
        for a in (a for a in arts if a["variant"] == variant):
            if "test_by_day" not in a:
                raise ArtifactError(
                    f"{a['protocol']}/{variant}_seed{a['seed']} has no test_by_day; attach it "
                    "with `diagsink sensitivity --by-day <artifact>`."
                )
            field = a["test_by_day"]
            per_run.append(
                pd.Series([metrics_from_sums([s])[key] for s in field["sums"]], index=field["days"])
            )
        cols[variant] = pd.concat(per_run, axis=1).mean(axis=1)
    forecasts, target = baselines
    spans = {
        day: slice(idx[0], idx[-1] + 1) for day, idx in groups.items()
    }  # windows in time order
    for name, pred in forecasts.items():
        values = {
            day: metrics_from_sums([error_sums(pred[span], target[span])])[key]
            for day, span in spans.items()
        }
        cols[name] = pd.Series(values)
    out = pd.DataFrame(cols).loc[list(groups)]
    out.index = pd.to_datetime(out.index)
    out["weekend"] = out.index.day_of_week >= 5
    return out
