"""The coupling of the diagonal query path and the a-priori logit spread (one layer).

For a :class:`~diagsink.attention.TemporalAttention` layer without LayerNorm and one
sequence ``x`` ``[T, C]`` (``u = x + P`` after the positional encoding), the query path of
head ``h`` contributes to the diagonal block ``∂y_i/∂x_i`` the ``C x C`` matrix::

    G^h_i = M^h S^h_i W_K^hᵀ W_Q^h / sqrt(d),   S^h_i = Σ_m α^h_im (u_m − ū^h_i)(u_m − ū^h_i)ᵀ,

with ``M^h = W_O^h W_V^h`` (chapter ``book/jacobian.ipynb``). Proposition ``bnd-prop-coupling``
of ``book/bounds.ipynb`` ("Why the diagonal wins: sensitivity bounds") states, with
``ν_h, ρ_h, κ_h, D, Q_h`` as in :func:`diagsink.jacobian.bound` and the a-priori spread
``Δ̂_h = Q_h κ_h D / sqrt(d) + |β|``::

    ‖G^h_i‖₂ ≤ ν_h ρ_h κ_h D² / (4 sqrt(d)) ≤ (ν_h / 2) (Δ̂_h − |β|),

and the theorem's own query bound ``ν_h ρ_h κ_h V / sqrt(d)`` is at most
``(ν_h / √2) (Δ̂_h − |β|)``. Both constants (1/2 and 1/√2) are sharp.

Functions:

* :func:`head_query_norms` -- ``‖G^h_i‖₂`` for every head and row, ``[H, T]``.
* :func:`coupling_bounds` -- the right-hand sides of the proposition, per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import jacobian as J
from .attention import TemporalAttention
from .errors import ConfigError

__all__ = ["head_query_blocks", "head_query_norms", "Coupling", "coupling_bounds"]


def _check(layer: TemporalAttention, x: torch.Tensor) -> None:
    if not isinstance(layer, TemporalAttention):
        raise ConfigError(f"expected a ds.TemporalAttention layer, got {type(layer).__name__}.")
    if layer.norm_kind is not None:
        raise ConfigError(
            f"norm={layer.norm_kind!r}: the coupling bound is for layers without LayerNorm; "
            "build the layer with norm=None."
        )
    if x.dim() != 2 or x.shape[-1] != layer.d_model:
        raise ConfigError(
            f"x has shape {tuple(x.shape)}; pass one sequence [T, C] with C = {layer.d_model}."
        )
    if layer.training and (layer.dropout > 0 or layer.diag == "dropout"):
        raise ConfigError("the layer is random in training mode; call layer.eval() first.")


@torch.no_grad()
def head_query_blocks(layer: TemporalAttention, x: torch.Tensor) -> torch.Tensor:
    """Per-head query-path diagonal blocks ``G^h_i`` of ``layer`` at ``x`` ``[T, C]``: ``[H, T, C, C]``.

    Their sum over heads is the query path of :func:`diagsink.jacobian.decompose` at
    ``j = i``. Chapter ``book/bounds.ipynb`` (proposition ``bnd-prop-coupling``).
    """
    _check(layer, x)
    H, d, C = layer.n_heads, layer.d_head, layer.d_model
    u = layer.pos(x)  # [T, C]
    logits = layer.scores(u)
    logits = logits.expand(H, *logits.shape[-2:]) if logits.dim() == 2 else logits
    alpha = torch.softmax(logits, dim=-1)  # [H, T, T]
    w_o = (
        layer.out_proj.weight
        if isinstance(layer.out_proj, nn.Linear)
        else torch.eye(C, dtype=x.dtype, device=x.device)
    )
    Wo = w_o.reshape(C, H, d).permute(1, 0, 2)  # [H, C, d]
    M = Wo @ layer.v_proj.weight.reshape(H, d, C)  # [H, C, C]
    A = layer.k_proj.weight.reshape(H, d, C).transpose(1, 2) @ layer.q_proj.weight.reshape(H, d, C)
    ubar = alpha @ u  # [H, T, C]
    w = u[None, None] - ubar[:, :, None]  # [H, i, m, C]: u_m − ū_i
    S = torch.einsum("him,hima,himb->hiab", alpha, w, w)  # [H, T, C, C]
    return torch.einsum("hac,hicd,hdb->hiab", M, S, A) / math.sqrt(d)


def head_query_norms(layer: TemporalAttention, x: torch.Tensor) -> torch.Tensor:
    """Spectral norms ``‖G^h_i‖₂`` of the per-head query blocks, ``[H, T]`` (``book/bounds.ipynb``)."""
    return torch.linalg.matrix_norm(head_query_blocks(layer, x), ord=2)


@dataclass
class Coupling:
    """Right-hand sides of proposition ``bnd-prop-coupling`` (lists over heads).

    Attributes:
        popoviciu: ``ν_h ρ_h κ_h D² / (4 sqrt(d))``, a bound on every ``‖G^h_i‖₂``.
        half_spread: ``(ν_h / 2)(Δ̂_h − |β|)`` ≥ ``popoviciu``.
        theorem_query: the query bound of theorem ``bnd-thm-diag``, ``ν_h ρ_h κ_h V / sqrt(d)``.
        over_sqrt2_spread: ``(ν_h / √2)(Δ̂_h − |β|)`` ≥ ``theorem_query``.
        delta_apriori: ``Δ̂_h`` (from :func:`diagsink.jacobian.bound`).
        nu: ``ν_h``.
        penalty: ``|β|`` (0 without the diagonal penalty).
    """

    popoviciu: list[float]
    half_spread: list[float]
    theorem_query: list[float]
    over_sqrt2_spread: list[float]
    delta_apriori: list[float]
    nu: list[float]
    penalty: float


def coupling_bounds(layer: TemporalAttention, x: torch.Tensor) -> Coupling:
    """The bounds of proposition ``bnd-prop-coupling`` for ``layer`` at ``x`` ``[T, C]``.

    Built from the constants of :func:`diagsink.jacobian.bound` (chapter ``book/bounds.ipynb``).
    """
    _check(layer, x)
    c = J.bound(layer, x).constants
    H, sqrt_d = layer.n_heads, math.sqrt(layer.d_head)
    nu, rho, kappa, D, V = c["nu"], c["rho"], c["kappa"], c["D"], c["V"]
    beta = abs(layer.diag_penalty) if layer.diag == "penalty" else 0.0
    dhat = list(c["delta_apriori"])
    return Coupling(
        popoviciu=[nu[h] * rho[h] * kappa[h] * D**2 / (4 * sqrt_d) for h in range(H)],
        half_spread=[nu[h] / 2 * (dhat[h] - beta) for h in range(H)],
        theorem_query=[nu[h] * rho[h] * kappa[h] * V / sqrt_d for h in range(H)],
        over_sqrt2_spread=[nu[h] / math.sqrt(2) * (dhat[h] - beta) for h in range(H)],
        delta_apriori=dhat,
        nu=list(nu),
        penalty=beta,
    )
