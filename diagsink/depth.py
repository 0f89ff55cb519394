"""Depth and LayerNorm: the closed-form Jacobian of a stack of attention and LayerNorm layers.

For one sequence ``x`` of shape ``[T, C]`` a stack ``layers = [f_1, ..., f_L]`` computes
``f_L(... f_1(x))``; each entry is a :class:`~diagsink.attention.TemporalAttention` with
``norm=None`` (its residual included, as the layer computes it) or an :class:`torch.nn.LayerNorm`
over the ``C`` channels. By the chain rule its Jacobian is the product of the per-layer
Jacobians, each in closed form:

* attention: the four paths of :func:`diagsink.jacobian.decompose`, summed by
  :func:`diagsink.jacobian.total`;
* LayerNorm ``y_t = γ ⊙ (x_t − μ_t) / σ_t + β`` with ``σ_t = sqrt(var_t + ε)`` (biased
  variance): ``∂y_t/∂x_t = diag(γ) (I − 1 1ᵀ / C − x̂_t x̂_tᵀ / C) / σ_t`` with
  ``x̂_t = (x_t − μ_t) / σ_t``, and ``∂y_t/∂x_s = 0`` for ``s ≠ t`` (block diagonal in time;
  ``β`` drops out).

It extends the single-layer closed form of the chapters "The Jacobian of a
temporal-attention layer" (``book/jacobian.ipynb``) and "Why the diagonal wins: sensitivity
bounds" (``book/bounds.ipynb``). No chapter page uses it yet; the theory issue plans a depth
chapter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from . import jacobian as J
from .attention import TemporalAttention
from .errors import ConfigError

__all__ = ["layernorm_jacobian", "layer_jacobian", "apply_stack", "network_jacobian"]


def _check_x(x: torch.Tensor, c: int, what: str) -> None:
    if x.dim() != 2 or x.shape[-1] != c:
        raise ConfigError(
            f"x has shape {tuple(x.shape)}; {what} needs one sequence [T, C] with C = {c}. "
            "Pass x[b] (or x[b, n]) one sequence at a time."
        )


@torch.no_grad()
def layernorm_jacobian(ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """Exact Jacobian of a channel LayerNorm at ``x`` ``[T, C]``: ``[T, C, T, C]``, block diagonal.

    Covers ``eps``, the gain ``γ`` (``elementwise_affine``) and the shift ``β`` (which drops
    out of the derivative). Entry ``[t, :, s, :]`` is ``∂y_t/∂x_s``: zero for ``s ≠ t``, and
    ``diag(γ) (I − 1 1ᵀ/C − x̂_t x̂_tᵀ/C) / σ_t`` on the diagonal.
    """
    if not isinstance(ln, nn.LayerNorm):
        raise ConfigError(f"expected an nn.LayerNorm, got {type(ln).__name__}.")
    if len(ln.normalized_shape) != 1:
        raise ConfigError(
            f"normalized_shape={tuple(ln.normalized_shape)}: only a LayerNorm over the last "
            "(channel) dimension, nn.LayerNorm(C), is covered."
        )
    C = ln.normalized_shape[0]
    _check_x(x, C, "layernorm_jacobian")
    T = x.shape[0]
    mu = x.mean(-1, keepdim=True)
    sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)  # [T, 1]
    xhat = (x - mu) / sigma  # [T, C]
    eye = torch.eye(C, dtype=x.dtype, device=x.device)
    centre = eye - 1.0 / C  # I − 1 1ᵀ / C
    blocks = (centre - xhat[:, :, None] * xhat[:, None, :] / C) / sigma[:, :, None]  # [T, C, C]
    if ln.weight is not None:
        blocks = ln.weight.to(x.dtype)[None, :, None] * blocks
    out = torch.zeros(T, C, T, C, dtype=x.dtype, device=x.device)
    idx = torch.arange(T, device=x.device)
    out[idx, :, idx, :] = blocks
    return out


def layer_jacobian(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Closed-form Jacobian ``[T, C, T, C]`` of one stack entry (attention or LayerNorm) at ``x``."""
    if isinstance(layer, nn.LayerNorm):
        return layernorm_jacobian(layer, x)
    if isinstance(layer, TemporalAttention):
        return J.total(J.decompose(layer, x))
    raise ConfigError(
        f"stack entry of type {type(layer).__name__} is not covered: use ds.TemporalAttention "
        "(norm=None) or nn.LayerNorm(C) entries."
    )


def apply_stack(layers: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """The stack's output ``[T, C]``: ``layers`` applied in order to ``x`` ``[T, C]``."""
    for layer in layers:
        x = layer(x)
    return x


@torch.no_grad()
def network_jacobian(
    layers: Sequence[nn.Module], x: torch.Tensor, *, return_outputs: bool = False
) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
    """Closed-form Jacobian ``[T, C, T, C]`` of a stack of attention and LayerNorm layers.

    Args:
        layers: ``TemporalAttention`` (``norm=None``; residual included as the layer
            computes it) or ``nn.LayerNorm(C)`` entries, applied in order. A post-norm
            block is ``[attention, LayerNorm]``.
        x: one sequence ``[T, C]`` (float64 for comparisons at 1e-10).
        return_outputs: also return the inputs of every layer and the final output
            (``L + 1`` tensors ``[T, C]``).

    Returns:
        ``J`` with ``J[i, :, j, :] = ∂(stack(x))_i / ∂x_j``: the product of the per-layer
        closed forms (:func:`layer_jacobian`), the last layer on the left.
    """
    if len(layers) == 0:
        raise ConfigError("layers is empty: pass at least one TemporalAttention or LayerNorm.")
    if x.dim() != 2:
        raise ConfigError(f"x has shape {tuple(x.shape)}; pass one sequence [T, C].")
    T, C = x.shape
    n = T * C
    prod = torch.eye(n, dtype=x.dtype, device=x.device)
    h = x
    states = [x]
    for layer in layers:
        jl = layer_jacobian(layer, h).reshape(n, n)
        prod = jl @ prod
        h = layer(h)
        states.append(h)
    out = prod.reshape(T, C, T, C)
    return (out, states) if return_outputs else out
