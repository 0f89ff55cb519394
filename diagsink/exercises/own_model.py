"""Checks of the exercises of the chapter "Your own model" (``book/own_model.ipynb``).

* ``ex-own-diagonal``: ``diagonal_share(attn)``, the mean self-weight ``mean_i α_ii`` of
  attention weights ``[..., T, T]`` (over every map and row).
* ``ex-own-mask``: ``mask_bias(T)``, the additive ``attn_mask`` ``[T, T]`` that turns a plain
  ``nn.MultiheadAttention`` into the full diagonal mask: ``-inf`` on the diagonal, 0 elsewhere.

Each check draws fresh random inputs and returns ``None`` or a hint (never the solution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import fresh_generator, register

__all__ = ["check_diagonal_share", "check_mask_bias"]


@register("ex-own-diagonal")
def check_diagonal_share(fn: Callable[[torch.Tensor], float]) -> str | None:
    gen = fresh_generator()
    t = int(torch.randint(3, 9, (1,), generator=gen))
    attn = torch.softmax(3 * torch.randn(2, 3, t, t, generator=gen), dim=-1)
    ref = float(attn.diagonal(dim1=-2, dim2=-1).mean())
    try:
        got = float(fn(attn.clone()))
    except (
        TypeError,
        ValueError,
    ) as exc:  # not NotImplementedError: the stub must reach the student
        return f"return one number (a float); calling it raised {type(exc).__name__}."
    if math.isclose(got, ref, rel_tol=1e-6, abs_tol=1e-9):
        return None
    if math.isclose(got, ref * t, rel_tol=1e-6):
        return "this is the trace (a sum over the rows); take the mean over the rows instead."
    if math.isclose(got, float(attn.mean()), rel_tol=1e-6):
        return "this is the mean of every weight; take only the diagonal entries alpha_ii."
    return "the number differs from the mean of the diagonal entries over all maps and rows."


@register("ex-own-mask")
def check_mask_bias(fn: Callable[[int], torch.Tensor]) -> str | None:
    gen = fresh_generator()
    t = int(torch.randint(2, 10, (1,), generator=gen))
    got = fn(t)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (t, t):
        return f"return a tensor of shape [T, T] = [{t}, {t}]."
    if got.dtype == torch.bool:
        return "a boolean mask blocks where True; this exercise asks for the additive float bias."
    eye = torch.eye(t, dtype=torch.bool)
    if not (torch.isneginf(got[eye]).all() and (got[~eye] == 0).all()):
        return "put -inf on the diagonal (a step may not attend to itself) and 0 everywhere else."
    return None
