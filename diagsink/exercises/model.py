"""Checks of the exercises of the chapter "The T&S model and its training loop" (``book/model.ipynb``).

* ``ex-model-diffusion``: ``diffusion_terms(p, x, k)``, the concatenation
  ``[x, P x, P^2 x, ..., P^k x]`` on the channel axis, with ``(P x)[b, t, n] = Σ_m P[n, m] x[b, t, m]``.
* ``ex-model-schedule``: ``lr_schedule(epoch, lr, min_lr, warmup, epochs)``, linear warm-up
  then cosine decay (:func:`diagsink.engine.train.lr_at`).

Each check draws fresh random inputs and returns ``None`` or a hint (never the solution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import fresh_generator, register

__all__ = [
    "check_diffusion_terms",
    "check_lr_schedule",
    "reference_diffusion_terms",
    "reference_lr_schedule",
]


def reference_diffusion_terms(p: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """``[B, T, N, C] -> [B, T, N, (k + 1) C]``."""
    terms, h = [x], x
    for _ in range(k):
        h = p @ h
        terms.append(h)
    return torch.cat(terms, dim=-1)


def reference_lr_schedule(epoch: int, lr: float, min_lr: float, warmup: int, epochs: int) -> float:
    if epoch < warmup:
        return lr * (epoch + 1) / warmup
    return min_lr + (lr - min_lr) * 0.5 * (
        1 + math.cos(math.pi * (epoch - warmup) / max(1, epochs - warmup))
    )


def _close(got: object, ref: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == ref.shape
        and bool(torch.allclose(got.double(), ref, atol=1e-8))
    )


@register("ex-model-diffusion")
def check_diffusion_terms(
    fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> str | None:
    """Fresh non-symmetric row-stochastic ``p`` ``[N, N]``, ``x`` ``[B, T, N, C]`` and ``k``."""
    gen = fresh_generator()
    b, t, n, c = (
        int(torch.randint(lo, hi, (1,), generator=gen))
        for lo, hi in ((1, 4), (2, 6), (4, 9), (2, 5))
    )
    k = int(torch.randint(1, 4, (1,), generator=gen))
    a = torch.rand(n, n, generator=gen, dtype=torch.float64)
    p = a / a.sum(1, keepdim=True)
    x = torch.randn(b, t, n, c, generator=gen, dtype=torch.float64)
    got = fn(p.clone(), x.clone(), k)
    ref = reference_diffusion_terms(p, x, k)
    if _close(got, ref):
        return None
    if not isinstance(got, torch.Tensor):
        return f"return a tensor, not {type(got).__name__}."
    if got.shape != ref.shape:
        return (
            f"shape {tuple(got.shape)} but expected [B, T, N, (k + 1) C] = {tuple(ref.shape)}: keep x itself as "
            "the first term and concatenate the k diffused copies on the last (channel) axis."
        )
    if _close(got, reference_diffusion_terms(p.T, x, k)):
        return "you diffused with P^T: sensor n must aggregate Σ_m P[n, m] x[..., m, :] (rows of P), not the columns."
    if _close(got, torch.cat([x] + [torch.linalg.matrix_power(p, 1) @ x] * k, dim=-1)):
        return "every term uses P once; term j must be P^j x (apply P again to the previous term)."
    if _close(got, torch.cat([x] + [torch.diagonal(p)[:, None] * x] * k, dim=-1)) or _close(
        got,
        torch.cat(
            [x]
            + [
                torch.diagonal(torch.linalg.matrix_power(p, j))[:, None] * x
                for j in range(1, k + 1)
            ],
            dim=-1,
        ),
    ):
        return "only the diagonal of P is used (like einsum('nn,...')): sensors must mix with their neighbours."
    return "values differ from the reference; check that P acts on the node axis (second to last) of x."


@register("ex-model-schedule")
def check_lr_schedule(fn: Callable[[int, float, float, int, int], float]) -> str | None:
    """Fresh ``lr``, ``min_lr``, warm-up length and epoch count; every epoch is compared."""
    gen = fresh_generator()
    lr = float(10 ** (-4 + 2 * torch.rand((), generator=gen)))
    min_lr = lr * float(0.001 + 0.05 * torch.rand((), generator=gen))
    warmup = int(torch.randint(1, 6, (1,), generator=gen))
    epochs = warmup + int(torch.randint(5, 40, (1,), generator=gen))
    got = [fn(e, lr, min_lr, warmup, epochs) for e in range(epochs)]
    ref = [reference_lr_schedule(e, lr, min_lr, warmup, epochs) for e in range(epochs)]
    if all(
        isinstance(g, (int, float)) and math.isclose(g, r, rel_tol=1e-6) for g, r in zip(got, ref)
    ):
        return None
    if not all(isinstance(g, (int, float)) for g in got):
        return "return a Python float for each epoch."
    if not math.isclose(got[0], ref[0], rel_tol=1e-6):
        if math.isclose(got[0], 0.0, abs_tol=1e-15):
            return "epoch 0 gets learning rate 0: the warm-up should reach lr/warmup already in epoch 0 ((epoch + 1) / warmup)."
        return "the warm-up is wrong: during epoch e < warmup the rate is lr (e + 1) / warmup."
    if not math.isclose(got[warmup], lr, rel_tol=1e-6):
        return "the first epoch after the warm-up should use the full lr (the cosine starts at its top)."
    if got[-1] < min_lr * (1 - 1e-6):
        return "the rate drops below min_lr: the cosine goes from lr down to min_lr, not to 0."
    return "the decay is not the half cosine from lr to min_lr over the epochs after the warm-up."
