"""Checks for the exercises of ``book/bends.ipynb`` ("Where the 1/T law bends").

* ``ex-bends-ratio``: ``max_over_mean(norms)`` -> float: the largest off-diagonal entry of a
  block-norm matrix ``[T, T]`` divided by the mean off-diagonal entry (``1`` for uniform
  attention; growing with ``T`` where the per-entry ``1/T`` law fails).

The chapter's other exercise, ``ex-bounds-slope``, is registered in :mod:`diagsink.exercises.bounds`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import fresh_generator, register


def reference_max_over_mean(norms: torch.Tensor) -> float:
    """Largest over mean of the off-diagonal entries of ``norms`` ``[T, T]``."""
    off = ~torch.eye(norms.shape[0], dtype=torch.bool, device=norms.device)
    return float(norms[off].max() / norms[off].mean())


@register("ex-bends-ratio")
def check_max_over_mean(max_over_mean: Callable[[torch.Tensor], float]) -> str | None:
    """A fresh block-norm matrix whose diagonal is much larger than the rest (as in a residual layer)."""
    gen = fresh_generator()
    T = int(torch.randint(5, 12, (1,), generator=gen))
    norms = torch.rand(T, T, generator=gen, dtype=torch.float64) / T
    norms += torch.diag(1 + torch.rand(T, generator=gen, dtype=torch.float64))
    want = reference_max_over_mean(norms)
    got = max_over_mean(norms.clone())
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"return one number, not {type(got).__name__}."
    if abs(got - want) <= 1e-9 * want:
        return None
    if abs(got - float(norms.max() / norms.mean())) <= 1e-9 * want:
        return "leave the diagonal out: the law is about the off-diagonal blocks j ≠ i."
    off = ~torch.eye(T, dtype=torch.bool)
    if abs(got - float(norms[off].max() / norms[off].median())) <= 1e-9 * want:
        return "divide by the mean of the off-diagonal entries, not their median."
    if abs(got - float(norms[off].mean() / norms[off].max())) <= 1e-9:
        return "largest over mean, not mean over largest (the ratio is at least 1)."
    return f"your ratio {got:.4g} is not the largest over the mean off-diagonal entry."
