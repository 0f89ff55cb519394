"""Exercise checks for the chapter "A task where parroting fails" (``book/parroting.ipynb``).

Each check runs the student's function on fresh random inputs (from
:func:`~diagsink.exercises.fresh_generator`, so the notebook's random state is untouched),
compares it with the package's reference (:mod:`diagsink.stats`) and returns ``None`` or a hint.
"""

from __future__ import annotations

import math

import torch

from .. import stats
from . import fresh_generator, register


def _close(a, b, tol: float = 1e-5) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)
    except (TypeError, ValueError):
        return False


@register("ex-parroting-score")
def check_score(fn):
    """``fn(pred, last, target) -> float``: the parroting score of :func:`diagsink.stats.parroting_score`."""
    g = fresh_generator()
    last = torch.randn(6, 9, generator=g, dtype=torch.float64)
    target = torch.randn(6, 9, generator=g, dtype=torch.float64)
    if not _close(fn(last.clone(), last, target), 1.0):
        return "a forecast equal to the last value (a pure parrot) must score exactly 1."
    if not _close(fn(target.clone(), last, target), 0.0):
        return "a perfect forecast (pred == target) must score 0."
    far = last + 3.0 * (target - last)
    if not _close(fn(far, last, target), 0.0):
        return "a forecast further from the last value than the truth must score 0: clip the score to [0, 1]."
    for _ in range(3):
        c = float(torch.rand((), generator=g))
        noise = 0.3 * torch.randn(6, 9, generator=g, dtype=torch.float64)
        pred = last + c * (target - last) + noise
        if not _close(fn(pred, last, target), stats.parroting_score(pred, last, target)):
            return (
                "the score differs from the definition on a random forecast: use the Euclidean norms of "
                "(pred − last) and (target − last) over ALL entries at once, not an average of per-entry ratios."
            )
    return None


@register("ex-parroting-diagonal-ratio")
def check_diagonal_ratio(fn):
    """``fn(attn [..., T, T]) -> float``: ``T · mean α_ii`` (diagonal mass against uniform)."""
    g = fresh_generator()
    T = int(torch.randint(3, 10, (), generator=g))
    if not _close(fn(torch.full((2, T, T), 1.0 / T)), 1.0):
        return "uniform attention must give ratio 1 (mean α_ii = 1/T, times T)."
    if not _close(fn(torch.eye(T).expand(3, 2, T, T)), float(T)):
        return f"identity attention with T = {T} must give ratio T = {T}."
    attn = torch.softmax(2 * torch.randn(4, 2, T, T, generator=g, dtype=torch.float64), -1)
    if not _close(fn(attn), stats.diagonal_mass(attn).ratio):
        return "on random attention the ratio is off: average α_ii over every leading axis and every row i, then multiply by T."
    return None


@register("ex-parroting-self-share")
def check_self_share(fn):
    """``fn(S [T, T]) -> float``: mean over rows of ``|S_tt| / Σ_j |S_tj|``."""
    g = fresh_generator()
    T = int(torch.randint(4, 12, (), generator=g))
    if not _close(fn(torch.eye(T)), 1.0):
        return "an identity sensitivity map (each output depends only on its own step) must give 1."
    if not _close(fn(torch.ones(T, T)), 1.0 / T):
        return f"equal sensitivity to all T = {T} steps must give 1/T."
    S = torch.randn(T, T, generator=g, dtype=torch.float64)
    if not _close(fn(S), stats.self_share(S)):
        return "on a random map with negative entries the share is off: use absolute values |S_tj| in the numerator AND in the row total."
    return None
