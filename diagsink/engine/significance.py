"""Statistics over runs: metric tables, Student's t quantiles, paired comparisons of seeds.

Used by the results chapter (``book/results.ipynb``) on the artifacts of
:mod:`diagsink.engine.artifacts`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .artifacts import METRIC_KEYS, ArtifactError

__all__ = ["metric_table", "t_quantile", "paired_comparison", "paired_difference"]


def metric_table(arts: list[dict[str, Any]], key: str) -> dict[str, dict[int, float]]:
    """``{variant: {seed: value}}`` of metric ``key`` (e.g. ``"MAE@12"``) over the artifacts."""
    if key not in METRIC_KEYS:
        raise ArtifactError(
            f"metric {key!r} is not recorded; choose one of {', '.join(METRIC_KEYS)}."
        )
    out: dict[str, dict[int, float]] = {}
    for a in arts:
        out.setdefault(a["variant"], {})[a["seed"]] = float(a["metrics"][key])
    return out


def t_quantile(q: float, df: int, *, upper: float = 400.0, points: int = 400_001) -> float:
    """Quantile ``q`` (> 0.5) of Student's t with ``df`` degrees of freedom (numerical integration).

    The density is integrated with the trapezoidal rule on ``[0, upper]``; accurate to about
    1e-4 for ``df >= 1`` and ``q <= 0.995`` (e.g. ``t_quantile(0.975, 2) = 4.303``).
    """
    if not (0.5 < q < 1 and df >= 1):
        raise ValueError("t_quantile needs 0.5 < q < 1 and df >= 1.")
    x = torch.linspace(0.0, upper, points, dtype=torch.float64)
    pdf = (
        torch.distributions.StudentT(torch.tensor(float(df), dtype=torch.float64)).log_prob(x).exp()
    )
    cdf = 0.5 + torch.cumulative_trapezoid(pdf, x, dim=0)
    idx = int(torch.searchsorted(cdf, torch.tensor([q], dtype=torch.float64)))
    return float(x[min(idx + 1, points - 1)])


def paired_comparison(
    arts: list[dict[str, Any]], variant: str, key: str, baseline: str = "none", level: float = 0.95
) -> dict[str, float]:
    """Paired comparison of ``variant`` against ``baseline`` over the seeds both have.

    Runs with the same seed share the initial weights (all variants have the same
    parameters), the order of the training windows and the data, so the per-seed
    differences ``d_s = variant_s - baseline_s`` remove that source of noise. Returns the
    mean difference, its standard deviation (``n - 1``), the half-width of the ``level``
    paired-t interval and ``exceeds_noise`` = 1.0 when the interval excludes 0 (else 0.0).
    """

    table = metric_table(arts, key)
    if variant not in table or baseline not in table:
        raise ArtifactError(f"need artifacts of both {variant!r} and {baseline!r} for {key}.")
    seeds = sorted(set(table[variant]) & set(table[baseline]))
    if len(seeds) < 2:
        raise ArtifactError(
            f"a paired comparison needs >= 2 common seeds; {variant} and {baseline} share {len(seeds)}."
        )
    return paired_difference(
        [table[variant][s] for s in seeds], [table[baseline][s] for s in seeds], level
    )


def paired_difference(a: list[float], b: list[float], level: float = 0.95) -> dict[str, float]:
    """The paired-t summary of ``d_s = a_s - b_s`` (same seeds, same order; at least 2 pairs).

    Returns ``n``, ``mean_diff``, ``sd_diff`` (``n - 1``), ``half_width`` of the ``level``
    interval, ``t`` and ``exceeds_noise`` (1.0 when the interval excludes 0, else 0.0).
    """
    if len(a) != len(b) or len(a) < 2:
        raise ArtifactError(
            f"a paired comparison needs >= 2 pairs of equal length; got {len(a)} and {len(b)}."
        )
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return {
        "n": n,
        "mean_diff": mean,
        "sd_diff": sd,
        "half_width": half,
        "t": mean / (sd / math.sqrt(n)) if sd > 0 else math.inf,
        "exceeds_noise": float(abs(mean) > half),
    }
