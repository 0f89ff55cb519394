"""Checks of the exercises of the chapter "Heatmaps on METR-LA" (``book/heatmaps.ipynb``).

* ``ex-heatmaps-off-range``: ``off_range(attn)``, the smallest and largest off-diagonal
  weight of one map ``[T, T]`` (the ranges the paper prints for its panels).
* ``ex-heatmaps-stripes``: ``stripe_index(attn)``, the column-stripe index of one map
  ``[T, T]`` (:func:`diagsink.stats.column_stripe_index`).

Each check draws fresh random inputs and returns ``None`` or a hint (never the solution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..stats import column_stripe_index
from . import fresh_generator, register

__all__ = ["check_off_range", "check_stripe_index", "random_maps"]


def random_maps(gen: torch.Generator, *lead: int, t: int | None = None) -> torch.Tensor:
    """Random attention maps ``[*lead, T, T]`` (rows sum to 1) with a random diagonal boost."""
    t = t if t is not None else int(torch.randint(4, 13, (1,), generator=gen))
    logits = torch.randn(*lead, t, t, generator=gen, dtype=torch.float64)
    logits = logits + 2 * torch.rand((), generator=gen, dtype=torch.float64) * torch.eye(
        t, dtype=torch.float64
    )
    return logits.softmax(-1)


def _number(got: object) -> float | str:
    try:
        value = float(got)
    except (TypeError, ValueError, RuntimeError):
        return "return one number (a float), not a tensor with several entries."
    if not math.isfinite(value):
        return "the result is NaN or infinite."
    return value


@register("ex-heatmaps-off-range")
def check_off_range(fn: Callable[[torch.Tensor], tuple[float, float]]) -> str | None:
    gen = fresh_generator()
    masked = random_maps(gen)
    # like the mask variant: alpha_ii = 0,
    masked = masked * (1 - torch.eye(masked.shape[-1], dtype=masked.dtype))
    # so a range that includes the diagonal starts at 0
    masked = masked / masked.sum(-1, keepdim=True)
    for attn in (masked, random_maps(gen), random_maps(gen)):
        t = attn.shape[-1]
        off = attn[~torch.eye(t, dtype=torch.bool)]
        ref = (float(off.min()), float(off.max()))
        try:
            got = tuple(float(v) for v in fn(attn.clone()))
        except NotImplementedError:  # the unfinished stub: let it show as exactly that
            raise
        except (TypeError, ValueError, RuntimeError):
            return "return two numbers (smallest, largest) as a tuple."
        if len(got) != 2:
            return f"return two numbers (smallest, largest); got {len(got)}."
        if all(math.isclose(g, r, rel_tol=1e-6) for g, r in zip(got, ref)):
            continue
        if all(math.isclose(g, r, rel_tol=1e-6) for g, r in zip(got, ref[::-1])):
            return "the order is (smallest, largest)."
        if all(
            math.isclose(g, r, rel_tol=1e-6)
            for g, r in zip(got, (float(attn.min()), float(attn.max())))
        ):
            return "leave the diagonal out: the range is over the entries with i != j."
        return f"wrong range for a random {t}x{t} map; take min and max over the off-diagonal entries only."
    return None


@register("ex-heatmaps-stripes")
def check_stripe_index(fn: Callable[[torch.Tensor], float]) -> str | None:
    gen = fresh_generator()
    t = int(torch.randint(5, 13, (1,), generator=gen))
    same = random_maps(gen, t=t)[0].expand(t, t).clone()  # every row equal: pure column stripes
    cases = [
        ("a random map", random_maps(gen, t=t)),
        ("a map whose rows are all equal", same),
        ("the identity", torch.eye(t, dtype=torch.float64)),
    ]
    for name, attn in cases:
        ref = column_stripe_index(attn)
        got = _number(fn(attn.clone()))
        if isinstance(got, str):
            return got
        if math.isclose(got, ref, rel_tol=1e-6, abs_tol=1e-9):
            continue
        if math.isclose(
            got, column_stripe_index(attn.transpose(-2, -1)), rel_tol=1e-6, abs_tol=1e-9
        ):
            return "you averaged over keys (rows) instead of queries: the column profile is the mean over i of α_ij."
        return f"wrong value for {name} of size {t}; all rows equal must give 1, the identity 0."
    return None
