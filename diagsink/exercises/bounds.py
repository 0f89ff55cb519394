"""Checks for the exercises of ``book/bounds.ipynb`` ("One layer: how much of a step's sensitivity
stays on the diagonal").

* ``ex-bounds-alpha``: ``alpha_bound(scores)`` -> ``[T]``: ``e^{Δ_i} / N_i`` per row of a
  logit matrix ``[T, T]`` (``−inf`` marks keys a row does not attend to; ``Δ_i`` is the
  spread of the finite logits of row ``i`` and ``N_i`` their number).
* ``ex-bounds-offdiag``: ``offdiag_bound(x, W_Q, W_K, W_V)`` -> float: the per-entry
  off-diagonal bound of theorem ``bnd-thm-offdiag`` for a one-head layer without biases or
  output projection (value plus key path).
* ``ex-bounds-slope``: ``fit_slope(lengths, values)`` -> float: the least-squares slope of
  ``log(values)`` against ``log(lengths)`` (asked in ``book/bends.ipynb``, where the sweeps are).
* ``ex-bounds-share``: ``share_bounds(alpha, nu, eps, q)`` -> ``(lower, upper)``: the bounds of
  corollary ``bnd-cor-share`` on the diagonal's share of one head with a residual connection.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..jacobian import bound
from . import compare_tensors, fresh_generator, register
from .jacobian import one_head_layer


def _reference_alpha_bound(scores: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(scores)
    smax = scores.masked_fill(~finite, -math.inf).amax(-1)
    smin = scores.masked_fill(~finite, math.inf).amin(-1)
    return torch.exp(smax - smin) / finite.sum(-1)


@register("ex-bounds-alpha")
def check_alpha_bound(alpha_bound: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """Fresh logits, some rows with a masked diagonal; the bound must also hold for softmax(scores)."""
    gen = fresh_generator()
    T = int(torch.randint(3, 9, (1,), generator=gen))
    scores = 2 * torch.randn(T, T, generator=gen, dtype=torch.float64)
    masked = torch.rand(T, generator=gen) < 0.5
    masked[0] = True
    rows = torch.arange(T)[masked]
    scores[rows, rows] = -math.inf  # a masked diagonal in some rows
    expected = _reference_alpha_bound(scores)
    got = alpha_bound(scores.clone())
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        got64 = got.detach().to(torch.float64)
        if not torch.isfinite(got64).all():
            return "your bound is NaN or inf: leave the −inf entries out of the spread (they are not keys)."
        finite = torch.isfinite(scores)
        s = scores.masked_fill(~finite, math.inf)
        spread = scores.masked_fill(~finite, -math.inf).amax(-1) - s.amin(-1)
        if torch.allclose(got64, torch.exp(spread) / T, atol=1e-10):
            return "divide by the number of keys the row attends to (N_i = T − 1 where the diagonal is masked), not by T."
        glob = float(scores[finite].max() - scores[finite].min())
        if torch.allclose(got64, math.exp(glob) / finite.sum(-1).to(torch.float64), atol=1e-10):
            return "use the spread of each row (max_j s_ij − min_j s_ij), not of the whole matrix: it is tighter."
        alpha = torch.softmax(scores, dim=-1)
        if (alpha.amax(-1) > got64 * (1 + 1e-12)).any():
            return "your bound is smaller than the largest attention weight of some row, so it is not an upper bound."
    return compare_tensors(got, expected, name="the per-row bound", atol=1e-10, rtol=1e-8)


@register("ex-bounds-offdiag")
def check_offdiag_bound(offdiag_bound: Callable[..., float]) -> str | None:
    """Fresh inputs and weights; compare with ``ds.jacobian.bound(...).off["total"]``."""
    gen = fresh_generator()
    T = int(torch.randint(4, 10, (1,), generator=gen))
    C = int(torch.randint(2, 5, (1,), generator=gen))
    x = torch.randn(T, C, generator=gen, dtype=torch.float64)
    W_Q, W_K, W_V = (0.5 * torch.randn(C, C, generator=gen, dtype=torch.float64) for _ in range(3))
    b = bound(one_head_layer(W_Q, W_K, W_V), x)
    expected = b.off["total"]
    got = offdiag_bound(x.clone(), W_Q.clone(), W_K.clone(), W_V.clone())
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"return one number (a float), not {type(got).__name__}."
    if math.isclose(got, expected, rel_tol=1e-8):
        return None
    if math.isclose(got, b.off["value"], rel_tol=1e-8):
        return "that is the value path only: add the key path's bound a ν κ Q D / sqrt(d)."
    if math.isclose(got, b.off["key"], rel_tol=1e-8):
        return "that is the key path only: add the value path's bound a ν."
    a = b.constants["alpha_max_bound"][0]
    if a > 0 and math.isclose(got, expected / a / T, rel_tol=1e-8):
        return "you used 1/T for the attention weights: off-uniform attention needs e^Δ / T (Δ = logit spread)."
    if math.isclose(got, expected / a, rel_tol=1e-8):
        return "the factor a = min(1, e^Δ / T), which bounds every attention weight, is missing."
    if got > expected:
        return (
            "your bound is larger than the theorem's: use spectral norms (torch.linalg.matrix_norm(W, ord=2)), "
            "R = max_j ‖x_j‖ and D = max_{j,m} ‖x_j − x_m‖."
        )
    return f"your bound differs from the theorem's by a factor {got / expected:.3g}: check each constant."


@register("ex-bounds-slope")
def check_fit_slope(fit_slope: Callable[..., float]) -> str | None:
    """A fresh noisy power law; compare with numpy's least-squares fit in log-log coordinates."""
    gen = fresh_generator()
    lengths = [4, 8, 16, 32, 64, 128]
    exponent = float(-2 * torch.rand(1, generator=gen))
    noise = torch.exp(0.05 * torch.randn(len(lengths), generator=gen, dtype=torch.float64)).numpy()
    values = [3.0 * t**exponent * float(n) for t, n in zip(lengths, noise)]
    expected = float(np.polyfit(np.log(lengths), np.log(values), 1)[0])
    got = fit_slope(list(lengths), list(values))
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"return the slope as one number, not {type(got).__name__}."
    if math.isclose(got, expected, abs_tol=1e-8):
        return None
    naive = (math.log(values[-1]) - math.log(values[0])) / (
        math.log(lengths[-1]) - math.log(lengths[0])
    )
    if math.isclose(got, naive, abs_tol=1e-8):
        return "you used the two end points only: fit a least-squares line through all points (np.polyfit)."
    lin = float(np.polyfit(lengths, values, 1)[0])
    if math.isclose(got, lin, abs_tol=1e-8):
        return "fit the line to log(values) against log(lengths), not to the raw numbers."
    return (
        f"your slope {got:.4g} is not the least-squares slope of log(values) against log(lengths)."
    )


def reference_share_bounds(alpha: float, nu: float, eps: float, q: float) -> tuple[float, float]:
    """Corollary ``bnd-cor-share`` (one head, residual): ``(lower, upper)`` on the diagonal's share."""
    off_hi, off_lo = (1 - alpha) * nu * (1 + eps), (1 - alpha) * nu * max(0.0, 1 - eps)
    d_lo = max(0.0, 1 - alpha * nu * (1 + eps) - q)
    d_hi = 1 + alpha * nu * (1 + eps) + q
    return d_lo / (d_lo + off_hi), d_hi / (d_hi + off_lo)


def _share_hint(
    got: tuple[float, float], args: tuple[float, ...], want: tuple[float, float]
) -> str:
    alpha, nu, eps, q = args
    close = lambda u, v: all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(u, v))  # noqa: E731
    if close(got, want[::-1]):
        return "return (lower, upper) in this order."
    if close(got, reference_share_bounds(alpha, nu, eps, 0.0)):
        return "the query term q is missing: it moves the diagonal block by up to q either way."
    if close(got, reference_share_bounds(0.0, nu, eps, q)):
        return "the diagonal's own value and key terms, α ν (1 + ε), are missing from the diagonal block."
    if close(got, reference_share_bounds(alpha, nu, 0.0, q)):
        return "ε is missing: the key path moves every block by a factor between 1 − ε and 1 + ε."
    if got[0] > want[0] and got[1] < want[1]:
        return "the lower bound needs the smallest diagonal and the largest off-diagonal total (and vice versa)."
    return "your bounds differ from the corollary's: the share is d / (d + o), increasing in d, decreasing in o."


@register("ex-bounds-share")
def check_share_bounds(share_bounds: Callable[..., tuple[float, float]]) -> str | None:
    """Fresh (α, ν, ε, q) with ε < 1 and q ≤ ν ε / 2; compare with the corollary's two bounds."""
    gen = fresh_generator()
    u = torch.rand(4, generator=gen, dtype=torch.float64).tolist()
    args = (0.3 * u[0], 0.5 + 1.5 * u[1], 0.3 * u[2], 0.0)
    args = (*args[:3], 0.5 * args[1] * args[2] * u[3])
    want = reference_share_bounds(*args)
    got = share_bounds(*args)
    try:
        got = (float(got[0]), float(got[1]))
    except (TypeError, ValueError, IndexError):
        return f"return two numbers (lower, upper), not {type(got).__name__}."
    if all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got, want)):
        return None
    return _share_hint(got, args, want)
