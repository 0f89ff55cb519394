"""Checks of the exercises of the chapter "Depth and LayerNorm" (``book/depth.ipynb``).

* ``ex-depth-layernorm``: ``layernorm_block(x_t, gamma, eps)`` -> ``[C, C]``: the Jacobian
  ``∂y_t/∂x_t`` of a channel LayerNorm at one step (lemma ``dep-lem-ln``), the diagonal block
  of :func:`diagsink.depth.layernorm_jacobian`.
* ``ex-depth-bound``: ``stack_off_bound(constants, T)`` -> float: the off-diagonal bound of
  proposition ``dep-prop-stack`` from per-entry constants ``(a_l, b_l)``, the ``"off"`` entry
  of :func:`diagsink.depth.depth_bound`.

The check draws fresh random inputs, compares with the package's reference and returns
``None`` or a hint that names the kind of mistake (never the solution).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
from torch import nn

from ..depth import depth_bound, layernorm_jacobian
from . import compare_tensors, fresh_generator, register

__all__ = ["check_layernorm_block", "check_stack_off_bound"]


def _layernorm(c: int, gamma: torch.Tensor, eps: float) -> nn.LayerNorm:
    ln = nn.LayerNorm(c, eps=eps).to(torch.float64)
    with torch.no_grad():
        ln.weight.copy_(gamma)
    return ln


# ---------------------------------------------------------------------------------------------
@register("ex-depth-layernorm")
def check_layernorm_block(
    layernorm_block: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor],
) -> str | None:
    """Fresh ``x_t`` ``[C]``, gain ``γ`` ``[C]`` and a large ``ε``; compare with the package.

    ``layernorm_block(x_t, gamma, eps)`` must return ``∂y_t/∂x_t`` ``[C, C]`` (row = output
    channel, column = input channel) for ``y_t = γ ⊙ (x_t − μ_t) / σ_t + β``.
    """
    gen = fresh_generator()
    c = int(torch.randint(4, 9, (1,), generator=gen))
    x = 1.0 + 0.3 * torch.randn(c, generator=gen, dtype=torch.float64)  # small variance: ε matters
    gamma = 1.0 + 0.5 * torch.randn(c, generator=gen, dtype=torch.float64)
    eps = 0.05
    expected = layernorm_jacobian(_layernorm(c, gamma, eps), x[None])[0, :, 0, :]
    got = layernorm_block(x.clone(), gamma.clone(), eps)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (c, c):
        g = got.detach().to(torch.float64)
        if not torch.allclose(g, expected, atol=1e-10, rtol=1e-8):
            hint = _layernorm_hint(g, expected, x, gamma, eps)
            if hint:
                return hint
    return compare_tensors(got, expected, name="the LayerNorm block", atol=1e-10, rtol=1e-8)


def _layernorm_hint(
    got: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float
) -> str | None:
    """Name the usual mistakes: a missing term, the gain on the wrong side, ε or the variance."""
    c = x.numel()
    eye = torch.eye(c, dtype=torch.float64)

    def block(
        sigma: torch.Tensor, centre: bool = True, outer: bool = True, n: int = c
    ) -> torch.Tensor:
        xhat = (x - x.mean()) / sigma
        p = eye - (1.0 / c if centre else 0.0)
        if outer:
            p = p - torch.outer(xhat, xhat) / n  # n = C − 1 for the unbiased variance
        return p / sigma

    sigma = torch.sqrt(x.var(unbiased=False) + eps)
    wrong = [
        (
            torch.diag(gamma) @ block(sigma, outer=False),
            "the term −x̂ x̂ᵀ / C is missing: σ_t depends on x_t too (the quotient rule).",
        ),
        (
            torch.diag(gamma) @ block(sigma, centre=False),
            "the term −1 1ᵀ / C is missing: the mean μ_t depends on every channel of x_t.",
        ),
        (
            block(sigma) @ torch.diag(gamma),  # = the transposed answer: the bracket is symmetric
            "your block is transposed, or the gain is on the wrong side: row = output channel, "
            "so diag(γ) multiplies from the left.",
        ),
        (block(sigma), "the gain γ is missing: y_t = γ ⊙ x̂_t + β."),
        (
            torch.diag(gamma) @ block(torch.sqrt(x.var(unbiased=False))),
            "ε is missing: σ_t = sqrt(var_t + ε).",
        ),
        (
            torch.diag(gamma) @ block(torch.sqrt(x.var(unbiased=True) + eps), n=c - 1),
            "LayerNorm uses the biased variance (divide by C, not C − 1).",
        ),
    ]
    for candidate, hint in wrong:
        if torch.allclose(got, candidate, atol=1e-10, rtol=1e-8):
            return hint
    return None


# ---------------------------------------------------------------------------------------------
@register("ex-depth-bound")
def check_stack_off_bound(
    stack_off_bound: Callable[[list[tuple[float, float]], int], float],
) -> str | None:
    """Fresh constants ``(a_l, b_l)`` of a few entries and a length ``T``; compare with the package.

    ``stack_off_bound(constants, T)`` must return ``(Π(α_l + b_l) − Π α_l) / T`` with
    ``α_l = a_l − b_l / T`` (every ``a_l ≥ b_l / T`` here).
    """
    gen = fresh_generator()
    T = int(torch.randint(4, 40, (1,), generator=gen))
    L = int(torch.randint(2, 6, (1,), generator=gen))
    b = (2.0 * torch.rand(L, generator=gen, dtype=torch.float64)).tolist()
    a = [bl / T + 0.2 + float(torch.rand(1, generator=gen, dtype=torch.float64)) for bl in b]
    constants = list(zip(a, b))
    expected = depth_bound(constants, T)["off"]
    got = stack_off_bound(list(constants), T)
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = float(got)
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return f"stack_off_bound returned {type(got).__name__}; return a float."
    got = float(got)
    if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
        return None
    alpha = [al - bl / T for al, bl in constants]
    prod = math.prod
    wrong = [
        (
            prod(al + bl for al, bl in constants) / T,
            "that is the looser T-free ceiling Π(a_l + b_l) / T; the proposition's bound uses "
            "α_l = a_l − b_l / T and subtracts Π α_l.",
        ),
        (
            prod(x + bl for x, (_, bl) in zip(alpha, constants)) / T,
            "subtract Π α_l: the product of the majorants α_l I + (b_l/T) 1 1ᵀ has Π α_l on the "
            "part (I − P) that never reaches an off-diagonal entry.",
        ),
        (
            (prod(al + bl for al, bl in constants) - prod(a)) / T,
            "use α_l = a_l − b_l / T in both products, not a_l: the majorant's diagonal a_l "
            "already holds b_l / T.",
        ),
        (
            prod(x + bl for x, (_, bl) in zip(alpha, constants)) - prod(alpha),
            "divide by T: the off-diagonal entries of (Π(α_l + b_l)) P are that product over T.",
        ),
        (
            prod(alpha) + (prod(x + bl for x, (_, bl) in zip(alpha, constants)) - prod(alpha)) / T,
            "that is the bound on the diagonal blocks; the off-diagonal bound has no Π α_l term.",
        ),
    ]
    for value, hint in wrong:
        if math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12):
            return hint
    return (
        f"stack_off_bound gives {got:.6g}, not the proposition's bound for these {L} entries and "
        f"T = {T}; check α_l = a_l − b_l / T and the two products."
    )
