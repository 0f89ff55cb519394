"""Checks for the exercises of ``book/trained_theory.ipynb`` ("Trained models through the theorem").

* ``ex-trained-share``: ``diagonal_share(norms)`` -> ``[T]``: per row of a block-norm matrix
  ``[T, T]`` the diagonal's share ``‖J_ii‖ / Σ_j ‖J_ij‖``.
* ``ex-trained-column``: ``column_weight(alpha, j)`` -> float: the mean attention weight that the
  rows ``i ≠ j`` of an attention matrix ``[T, T]`` put on key ``j``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import compare_tensors, fresh_generator, register


def reference_diagonal_share(norms: torch.Tensor) -> torch.Tensor:
    """``diag / row sum`` of a block-norm matrix ``[T, T]``: ``[T]``."""
    return norms.diagonal() / norms.sum(-1)


def reference_column_weight(alpha: torch.Tensor, j: int) -> float:
    """Mean of ``alpha[i, j]`` over the rows ``i ≠ j``."""
    rows = torch.arange(alpha.shape[0]) != j
    return float(alpha[rows, j].mean())


@register("ex-trained-share")
def check_diagonal_share(diagonal_share: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """A fresh positive block-norm matrix; compare row by row."""
    gen = fresh_generator()
    T = int(torch.randint(4, 10, (1,), generator=gen))
    norms = torch.rand(T, T, generator=gen, dtype=torch.float64) + torch.eye(T, dtype=torch.float64)
    want = reference_diagonal_share(norms)
    got = diagonal_share(norms.clone())
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        off_only = norms.diagonal() / (norms.sum(-1) - norms.diagonal())
        if torch.allclose(got.double(), off_only, atol=1e-10):
            return "divide by the whole row, diagonal included: the share is ‖J_ii‖ / Σ_j ‖J_ij‖ (at most 1)."
        if torch.allclose(got.double(), norms.diagonal() / norms.sum(0), atol=1e-10):
            return "sum over the row (the inputs j of output i), not over the column."
    elif isinstance(got, (float, int)) or (isinstance(got, torch.Tensor) and got.dim() == 0):
        return "return one share per row, a tensor [T], not their mean."
    return compare_tensors(got, want, name="the shares", atol=1e-10, rtol=1e-8)


@register("ex-trained-column")
def check_column_weight(column_weight: Callable[[torch.Tensor, int], float]) -> str | None:
    """A fresh attention matrix (rows sum to 1) and a key j; compare with the mean over i ≠ j."""
    gen = fresh_generator()
    T = int(torch.randint(5, 13, (1,), generator=gen))
    alpha = torch.softmax(2 * torch.randn(T, T, generator=gen, dtype=torch.float64), dim=-1)
    j = int(torch.randint(0, T, (1,), generator=gen))
    want = reference_column_weight(alpha, j)
    got = column_weight(alpha.clone(), j)
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"return one number, not {type(got).__name__}."
    if abs(got - want) <= 1e-10:
        return None
    if abs(got - float(alpha[:, j].mean())) <= 1e-10:
        return "leave out row i = j: its weight on key j is the diagonal, not the column."
    if (
        abs(got - float(alpha[j].mean())) <= 1e-10
        or abs(got - float(alpha[j, :].sum() / T)) <= 1e-10
    ):
        return "take column j (alpha[:, j]: the weight every query puts on key j), not row j."
    if abs(got - float(alpha[torch.arange(T) != j, j].sum())) <= 1e-10:
        return "average over the T − 1 rows, do not sum."
    return f"your weight {got:.4g} is not the mean of alpha[i, j] over the rows i ≠ j."
