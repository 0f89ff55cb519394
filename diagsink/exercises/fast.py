"""Checks of the exercises of the appendix "Making it fast" (``book/fast.ipynb``).

* ``ex-fast-mask``: ``sdpa_mask(T, diag, penalty)``, the ``attn_mask`` that
  ``torch.nn.functional.scaled_dot_product_attention`` needs to compute the layer's regularized
  attention ``softmax(q k^T / sqrt(d) + b) v``: for ``diag="mask"`` a boolean ``[T, T]``
  (``True`` = the key takes part, the opposite of ``nn.MultiheadAttention``'s convention) or the
  float bias, for ``diag="penalty"`` the float bias ``b`` (``penalty`` on the diagonal).
* ``ex-fast-terms``: ``diffusion_terms(x, supports, order)``, the graph layer's concatenated
  terms ``cat[x, P_1 x, ..., P_1^K x, ..., P_S^K x]`` ``[B, T, N, (1 + S K) C]``, computed hop
  by hop without forming a power ``P^k`` (what :class:`diagsink.graphconv.DiffusionGraphConv`
  feeds its mixing layer).

Each check draws fresh random inputs, runs the fused kernel with the student's mask, compares
with the formula written out and returns ``None`` or a hint that names the kind of mistake
(never the solution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..graphconv import DiffusionGraphConv
from . import compare_tensors, fresh_generator, register

__all__ = ["check_sdpa_mask", "check_diffusion_terms"]


def _hint(got: torch.Tensor, t: int, diag: str, penalty: float) -> str | None:
    """The hint for a mask that gives the wrong attention: the mistakes students make."""
    eye = torch.eye(t, dtype=torch.bool)
    if got.dtype == torch.bool and torch.equal(got, eye):
        return (
            "for scaled_dot_product_attention a boolean True means 'this key takes part' (the "
            "opposite of nn.MultiheadAttention's attn_mask): your mask lets each step see only itself."
        )
    if diag == "penalty" and got.is_floating_point():
        if torch.allclose(got, torch.full((t, t), penalty, dtype=got.dtype)):
            return "the penalty acts on the diagonal only (b_ij = 0 for i != j)."
        scaled = torch.zeros(t, t, dtype=got.dtype).fill_diagonal_(penalty * math.sqrt(4.0))
        if torch.allclose(got, scaled) or torch.allclose(got, scaled / 4.0):
            return "the bias is added after the 1/sqrt(d) scaling: put the penalty itself on the diagonal."
    return None


@register("ex-fast-mask")
def check_sdpa_mask(sdpa_mask: Callable[[int, str, float], torch.Tensor]) -> str | None:
    """Fresh ``T``, penalty and ``q, k, v`` (head size 4); both regularizers must give the formula."""
    gen = fresh_generator()
    t = int(torch.randint(3, 9, (1,), generator=gen))
    penalty = -round(float(torch.rand((), generator=gen)) * 2 + 0.1, 3)
    q, k, v = torch.randn(3, 2, t, 4, generator=gen, dtype=torch.float64)
    for diag in ("mask", "penalty"):
        got = sdpa_mask(t, diag, penalty)
        call = f"sdpa_mask({t}, {diag!r}, {penalty})"
        if not isinstance(got, torch.Tensor):
            return f"{call} returned {type(got).__name__}; return a tensor of shape [T, T]."
        if tuple(got.shape) != (t, t):
            return f"{call} has shape {list(got.shape)}; it must be [T, T] = {[t, t]}."
        got = got.detach()
        bias = torch.zeros(t, t, dtype=torch.float64)
        bias.fill_diagonal_(-math.inf if diag == "mask" else penalty)
        want = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + bias, dim=-1) @ v
        mask = got if got.dtype == torch.bool else got.to(torch.float64)
        fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if not torch.allclose(fused, want, rtol=1e-9, atol=1e-9) or not torch.isfinite(fused).all():
            return _hint(got, t, diag, penalty) or compare_tensors(
                fused, want, name=f"attention with {call} as attn_mask"
            )
    return None


@register("ex-fast-terms")
def check_diffusion_terms(
    diffusion_terms: Callable[[torch.Tensor, list[torch.Tensor], int], torch.Tensor],
) -> str | None:
    """Fresh ``x [B, T, N, C]``, two random row-stochastic supports and order ``K``: the terms
    must equal the package layer's (its mixing layer set to the identity picks them out)."""
    gen = fresh_generator()
    n, c, order = (
        int(torch.randint(3, 7, (1,), generator=gen)),
        2,
        int(torch.randint(1, 4, (1,), generator=gen)),
    )
    x = torch.randn(2, 3, n, c, generator=gen, dtype=torch.float64)
    supports = [
        torch.softmax(torch.randn(n, n, generator=gen, dtype=torch.float64), 1) for _ in range(2)
    ]
    layer = DiffusionGraphConv(c, supports, order=order, adaptive=False, dropout=0.0).double()
    width = (1 + 2 * order) * c
    with torch.no_grad():  # mix = a projection onto every term: the layer's output is the terms
        layer.mix = torch.nn.Linear(width, width, dtype=torch.float64)
        layer.mix.weight.copy_(torch.eye(width, dtype=torch.float64))
        layer.mix.bias.zero_()
        want = layer(x)
    got = diffusion_terms(x, supports, order)
    call = f"diffusion_terms(x {list(x.shape)}, two supports, order={order})"
    if not isinstance(got, torch.Tensor):
        return f"{call} returned {type(got).__name__}; return a tensor [B, T, N, (1 + S K) C]."
    if tuple(got.shape) != tuple(want.shape):
        return (
            f"{call} has shape {list(got.shape)}; it must be {list(want.shape)}: x itself, then K hops "
            "of each support, concatenated on the last (channel) axis."
        )
    return compare_tensors(got.detach(), want, name=call)
