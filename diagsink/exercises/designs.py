"""Exercise checks for the chapter "Moving the parrot into the attention weights" (``book/designs.ipynb``).

* ``ex-designs-scored-diagonal``: ``diagonal_on_scored_rows(attn, lag)``, mean ``α_tt`` over the
  rows that have an answer in the window.
* ``ex-designs-phase-mass``: ``phase_class_mass(attn, period, k)``, the attention on the keys
  whose offset from the query is ``k`` modulo the period.
"""

from __future__ import annotations

import math

import torch

from . import fresh_generator, register


def _close(a, b, tol: float = 1e-5) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)
    except (TypeError, ValueError):
        return False


def _scored_diagonal_reference(attn: torch.Tensor, lag: int) -> float:
    return float(attn.diagonal(dim1=-2, dim2=-1)[..., lag:].mean())


@register("ex-designs-scored-diagonal")
def check_scored_diagonal(fn):
    """``fn(attn [..., T, T], lag) -> float``: mean ``α_tt`` over the scored rows ``t ≥ lag`` and every leading axis."""
    g = fresh_generator()
    T = int(torch.randint(8, 15, (), generator=g))
    lag = int(torch.randint(2, 6, (), generator=g))
    # rows t < lag look at themselves, scored rows look exactly lag steps back
    attn = torch.zeros(T, T, dtype=torch.float64)
    rows = torch.arange(T)
    attn[rows[:lag], rows[:lag]] = 1.0
    attn[rows[lag:], rows[lag:] - lag] = 1.0
    got = fn(attn, lag)
    if _close(got, lag / T):
        return "you averaged over all T rows: the first `lag` rows are not scored (they have no answer in the window); average over rows t ≥ lag only."
    if not _close(got, 0.0):
        return "a map whose scored rows look exactly lag steps back has no weight on the scored diagonal: the answer must be 0."
    if not _close(fn(torch.eye(T, dtype=torch.float64), lag), 1.0):
        return "identity attention must give 1."
    rand = torch.softmax(2 * torch.randn(3, 2, T, T, generator=g, dtype=torch.float64), -1)
    if not _close(fn(rand, lag), _scored_diagonal_reference(rand, lag)):
        return "on random attention the value is off: take α_tt for t = lag, ..., T − 1 and average over those rows and every leading axis."
    return None


def _phase_reference(attn: torch.Tensor, period: int, k: int) -> float:
    T = attn.shape[-1]
    offset = (torch.arange(T)[None, :] - torch.arange(T)[:, None]) % period  # m - t mod P
    return float((attn * (offset == k).to(attn.dtype)).sum(-1).mean())


@register("ex-designs-phase-mass")
def check_phase_mass(fn):
    """``fn(attn [..., T, T], period, k) -> float``: mean over rows of the weight on keys ``m - t ≡ k (mod P)``."""
    g = fresh_generator()
    period = int(torch.randint(3, 9, (), generator=g))
    T = int(torch.randint(2 * period + 1, 4 * period, (), generator=g))
    k = int(torch.randint(1, period, (), generator=g))
    eye = torch.eye(T, dtype=torch.float64)
    if not _close(fn(eye, period, 0), 1.0) or not _close(fn(eye, period, k), 0.0):
        return "identity attention puts all weight on class k = 0 (the step itself) and none on any other class."
    ahead = eye.roll(k, dims=-1)  # row t attends to key t + k (wrapping at the end)
    got, want = fn(ahead, period, k), _phase_reference(ahead, period, k)
    if _close(got, _phase_reference(ahead, period, (-k) % period)) and not _close(got, want):
        return "the offset has the wrong sign: the class of key m for query t is (m − t) mod P, not (t − m)."
    rand = torch.softmax(2 * torch.randn(3, 2, T, T, generator=g, dtype=torch.float64), -1)
    got, want = fn(rand, period, k), _phase_reference(rand, period, k)
    if _close(got, want):
        return None
    if _close(got, want / (T // period)) or _close(got, want * period / T):
        return "sum the weights over the keys of the class in each row (do not average them), then average over rows."
    return "on random attention the value is off: sum α_tm over keys m with (m − t) mod P == k, then average over rows and leading axes."
