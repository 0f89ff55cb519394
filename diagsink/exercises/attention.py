"""Checks of the exercises of the chapter "Attention over time, step by step" (``book/attention.ipynb``).

* ``ex-attention-penalty``: ``penalised_scores(q, k, penalty)``, the logits
  ``q k^T / sqrt(d)`` with ``penalty`` added to the diagonal *after* the scaling.
* ``ex-attention-mask``: ``diag_masked_attention(scores)``, the softmax over keys with the
  diagonal logits set to ``-inf`` (a step never attends to itself).
* ``ex-attention-tape``: ``tape(T, C)``, the tAPE table of Foumani et al. (2024).

Each check draws fresh random inputs, compares with the package's reference and returns
``None`` or a hint that names the kind of mistake (never the solution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..positional import sinusoidal_table, tape_table
from . import compare_tensors, fresh_generator, register

__all__ = [
    "check_penalised_scores",
    "check_diag_masked_attention",
    "check_tape",
]


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """A random integer in ``[low, high]``."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _matches(got: object, candidate: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and tuple(got.shape) == tuple(candidate.shape)
        and bool(torch.allclose(got.detach().to(candidate.dtype), candidate, atol=atol, rtol=rtol))
    )


# ---------------------------------------------------------------------------------------------
@register("ex-attention-penalty")
def check_penalised_scores(
    penalised_scores: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor],
) -> str | None:
    """Fresh ``q, k`` of shape ``[B, H, T, d]`` and a fresh negative penalty."""
    gen = fresh_generator()
    b, h, t, d = (
        _randint(gen, 1, 3),
        _randint(gen, 1, 4),
        _randint(gen, 3, 9),
        _randint(gen, 2, 8) * 2,
    )
    q = torch.randn(b, h, t, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, h, t, d, generator=gen, dtype=torch.float64)
    penalty = -0.05 - float(torch.rand((), generator=gen, dtype=torch.float64))
    q_in, k_in = q.clone(), k.clone()
    got = penalised_scores(q_in, k_in, penalty)
    if not (torch.equal(q_in, q) and torch.equal(k_in, k)):
        return "your function changed q or k in place; compute new tensors instead."
    dots = q @ k.transpose(-1, -2)
    eye = torch.eye(t, dtype=torch.float64)
    scale = math.sqrt(d)
    expected = dots / scale + penalty * eye
    if _matches(got, expected):
        return None
    wrong = [
        (dots / scale, "the diagonal is missing the penalty: add it to the entries s_ii only."),
        (
            dots / scale + penalty,
            "the penalty was added to every entry; it belongs on the diagonal s_ii only "
            "(adding a constant to a whole row does not change the softmax at all).",
        ),
        (
            (dots + penalty * eye) / scale,
            "the penalty was scaled by 1/sqrt(d) as well: add it after the scaling.",
        ),
        (
            dots + penalty * eye,
            "the dot products are not divided by sqrt(d), the square root of the head size.",
        ),
        (dots / d + penalty * eye, "the dot products are divided by d; divide by sqrt(d) instead."),
        (
            k @ q.transpose(-1, -2) / scale + penalty * eye,
            "rows and columns are swapped: row i holds query i, column j key j (q k^T, not k q^T).",
        ),
    ]
    for candidate, hint in wrong:
        if _matches(got, candidate):
            return hint
    return compare_tensors(got, expected, name="the penalised scores")


# ---------------------------------------------------------------------------------------------
@register("ex-attention-mask")
def check_diag_masked_attention(
    diag_masked_attention: Callable[[torch.Tensor], torch.Tensor],
) -> str | None:
    """Fresh logits ``[B, H, T, T]`` with ``T >= 2``; the diagonal must get weight exactly 0."""
    gen = fresh_generator()
    b, h, t = _randint(gen, 1, 3), _randint(gen, 1, 4), _randint(gen, 2, 9)
    scores = 2.0 * torch.randn(b, h, t, t, generator=gen, dtype=torch.float64)
    scores_in = scores.clone()
    got = diag_masked_attention(scores_in)
    if not torch.equal(scores_in, scores):
        return "your function changed the scores in place; build a new tensor (e.g. with masked_fill, not masked_fill_)."
    eye = torch.eye(t, dtype=torch.bool)
    expected = torch.softmax(scores.masked_fill(eye, float("-inf")), dim=-1)
    if _matches(got, expected, atol=1e-7):
        if not bool((got.detach()[..., eye] == 0).all()):
            return "almost right, but the diagonal weights are not exactly 0: use -inf (not a large negative number)."
        return None
    plain = torch.softmax(scores, dim=-1)
    wrong = [
        (plain, "the diagonal is not masked: set the diagonal logits to -inf before the softmax."),
        (
            plain.masked_fill(eye, 0.0),
            "you zeroed the diagonal after the softmax, so the rows no longer sum to 1: "
            "mask the logits (set them to -inf) before the softmax instead.",
        ),
        (
            torch.softmax(scores.masked_fill(eye, 0.0), dim=-1),
            "a logit of 0 is not a mask: exp(0) = 1 still gives the diagonal weight. Use -inf.",
        ),
        (
            torch.softmax(scores.masked_fill(eye, float("-inf")), dim=-2),
            "the softmax runs over the queries (dim=-2); it must normalise over the keys, the last dimension.",
        ),
        (
            torch.softmax(scores.masked_fill(~eye, float("-inf")), dim=-1),
            "you masked everything except the diagonal; mask the diagonal itself (torch.eye marks it).",
        ),
    ]
    for candidate, hint in wrong:
        if _matches(got, candidate, atol=1e-7):
            return hint
    return compare_tensors(got, expected, name="the masked attention weights")


# ---------------------------------------------------------------------------------------------
@register("ex-attention-tape")
def check_tape(tape: Callable[[int, int], torch.Tensor]) -> str | None:
    """Fresh ``T`` and even ``C``; also ``T = C``, where tAPE equals the sinusoid."""
    gen = fresh_generator()
    t, c = _randint(gen, 3, 24), 2 * _randint(gen, 4, 24)
    if t == c:
        t += 1
    got = tape(t, c)
    expected = tape_table(t, c, dtype=torch.float64)
    tol = {"atol": 1e-4, "rtol": 1e-4}
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (c, t) and t != c:
        return f"the table has shape [C, T] = {[c, t]}; it must be [T, C]: one row per time step."
    if _matches(got, expected, **tol):
        return None
    sin_table = sinusoidal_table(t, c, dtype=torch.float64)
    position = torch.arange(t, dtype=torch.float64)[:, None]
    omega = torch.exp(-math.log(10000.0) * torch.arange(0, c, 2, dtype=torch.float64) / c)
    angle = position * omega * c / t
    inverse = torch.empty(t, c, dtype=torch.float64)
    inverse[:, 0::2] = torch.sin(position * omega * t / c)
    inverse[:, 1::2] = torch.cos(position * omega * t / c)
    swapped = torch.empty(t, c, dtype=torch.float64)
    swapped[:, 0::2], swapped[:, 1::2] = torch.cos(angle), torch.sin(angle)
    blocks = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
    wrong = [
        (sin_table, "this is the plain sinusoidal table: tAPE multiplies every angle by C / T."),
        (
            inverse,
            "the angles are scaled by T / C; tAPE scales them by C / T (d_model over the sequence length).",
        ),
        (swapped, "sine and cosine are swapped: even channels hold sin, odd channels cos."),
        (
            blocks,
            "the sines and cosines are in two blocks; interleave them: channel 2k is sin, channel 2k+1 is cos.",
        ),
    ]
    for candidate, hint in wrong:
        if _matches(got, candidate, **tol):
            return hint
    hint = compare_tensors(got, expected, name=f"tape({t}, {c})", **tol)
    if hint is not None:
        return hint
    # T = C: tAPE must reduce to the sinusoidal table
    return compare_tensors(
        tape(c, c), sinusoidal_table(c, c, dtype=torch.float64), name=f"tape({c}, {c})", **tol
    )
