"""The diagonal query path, the a-priori logit spread and the aggregate influence (one layer).

For a :class:`~diagsink.attention.TemporalAttention` layer without LayerNorm and one
sequence ``x`` ``[T, C]`` (``u = x + P`` after the positional encoding), the query path of
head ``h`` contributes to the diagonal block ``∂y_i/∂x_i`` the ``C x C`` matrix::

    G^h_i = M^h S^h_i W_K^hᵀ W_Q^h / sqrt(d),   S^h_i = Σ_m α^h_im (u_m − ū^h_i)(u_m − ū^h_i)ᵀ,

with ``M^h = W_O^h W_V^h`` (chapter ``book/jacobian.ipynb``). Proposition ``bnd-prop-coupling``
of ``book/bounds.ipynb`` ("One layer: how much of a step's sensitivity stays on the diagonal") states, with
``ν_h, ρ_h, κ_h, D, Q_h`` as in :func:`diagsink.jacobian.bound` and the a-priori spread
``Δ̂_h = Q_h κ_h D / sqrt(d) + |β|``::

    ‖G^h_i‖₂ ≤ ν_h ρ_h κ_h D² / (4 sqrt(d)) ≤ (ν_h / 2) (Δ̂_h − |β|),

and the cruder variance bound ``ν_h ρ_h κ_h V / sqrt(d)`` (``V = min(R², D²/2)``) is at most
``(ν_h / √2) (Δ̂_h − |β|)``. Both constants (1/2 and 1/√2) are sharp. The bound is in terms of
the a-priori spread ``Δ̂``, not the measured one: :func:`uniform_counterexample` attains it at
exactly uniform attention.

Functions:

* :func:`head_query_norms` -- ``‖G^h_i‖₂`` for every head and row, ``[H, T]``.
* :func:`coupling_bounds` -- the right-hand sides of the proposition, per head.
* :func:`aggregate_influence` -- theorem ``bnd-thm-aggregate``: the other steps' aggregate
  influence ``Σ_{j≠i} ‖J_ij‖`` and the diagonal's share, measured and bounded; for long,
  near-uniform rows the share tends to ``1/(1 + ν)`` with a residual connection.
* :func:`uniform_counterexample` -- exactly uniform attention with the largest query term.
* :func:`directional_query` -- the query term along the direction a scalar input moves,
  bounded by the *measured* logit spread (proposition ``bnd-prop-directional``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import jacobian as J
from .attention import TemporalAttention
from .errors import ConfigError

__all__ = [
    "head_query_blocks",
    "head_query_norms",
    "Coupling",
    "coupling_bounds",
    "Aggregate",
    "aggregate_influence",
    "uniform_counterexample",
    "directional_query",
]


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
        theorem_query: the cruder variance bound ``ν_h ρ_h κ_h V / sqrt(d)`` (``V = min(R², D²/2)``).
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


# ----------------------------------------------------------------------------------------
# the aggregate-influence theorem (theorem bnd-thm-aggregate)
# ----------------------------------------------------------------------------------------
@dataclass
class Aggregate:
    """Theorem ``bnd-thm-aggregate`` for one layer and one sequence (spectral norms).

    Per row ``i`` (tensors ``[T]``) or per head and row (``[H, T]``):

    Attributes:
        off_sum: measured ``Σ_{j≠i} ‖J_ij‖``, the other steps' aggregate influence on ``y_i``.
        diag: measured ``‖J_ii‖``.
        share: measured ``‖J_ii‖ / (‖J_ii‖ + Σ_{j≠i} ‖J_ij‖)``, the diagonal's share.
        value_sum: ``Σ_{j≠i} ‖Σ_h α^h_ij M^h‖``, the value path alone (``(1 − α_ii) ν`` for one head).
        alpha_diag: ``α^h_ii``, ``[H, T]``.
        eps: ``ε^h_i = ‖W_K^hᵀ q^h_i‖ max_j ‖u_j − ū^h_i‖ / sqrt(d)``, ``[H, T]``; at most
            ``eps_apriori[h]``.
        eps_apriori: ``ε_h = Q_h κ_h D / sqrt(d) = Δ̂_h − |β|``, per head.
        query_bound: ``ν_h ρ_h κ_h D² / (4 sqrt(d)) ≥ ‖G^h_i‖`` (proposition ``bnd-prop-coupling``).
        off_lower, off_upper: the theorem's bounds on ``off_sum``.
        diag_lower, diag_upper: its bounds on ``diag``.
        share_lower, share_upper: the bounds on ``share`` that follow from the four above.
        value_diag: ``‖r I + Σ_h α^h_ii M^h‖`` (``r = 1`` with a residual connection, else 0).
        sigma_min: measured smallest singular value of ``J_ii``.
        sigma_lower: a-posteriori lower bound on it, ``r − Σ_h α^h_ii ν_h (1 + ε^h_i) − ‖G_i‖``
            (clipped at 0), from the actual diagonal weights and query term.
        nu: ``ν_h = ‖W_O^h W_V^h‖`` per head.
        nu_layer: ``ν = ‖Σ_h W_O^h W_V^h‖``, the layer's value map.
        residual: whether the layer adds its input.
    """

    off_sum: torch.Tensor
    diag: torch.Tensor
    share: torch.Tensor
    value_sum: torch.Tensor
    alpha_diag: torch.Tensor
    eps: torch.Tensor
    eps_apriori: list[float]
    query_bound: list[float]
    off_lower: torch.Tensor
    off_upper: torch.Tensor
    diag_lower: torch.Tensor
    diag_upper: torch.Tensor
    share_lower: torch.Tensor
    share_upper: torch.Tensor
    value_diag: torch.Tensor
    sigma_min: torch.Tensor
    sigma_lower: torch.Tensor
    nu: list[float]
    nu_layer: float
    residual: bool

    @property
    def value_share(self) -> torch.Tensor:
        """The share with the key and query paths left out (``ε → 0``): the theorem's
        multi-head prediction from the actual weights, ``value_diag / (value_diag + value_sum)``."""
        return _ratio(self.value_diag, self.value_diag + self.value_sum)

    @property
    def limit(self) -> float:
        """The share the theorem predicts for long, near-uniform rows, ``1/(1 + ν)`` with a
        residual connection and ``0`` without one."""
        return 1.0 / (1.0 + self.nu_layer) if self.residual else 0.0


def _eps(p: J._Heads) -> torch.Tensor:
    """``ε^h_i = ‖W_Kᵀ q_i‖ max_j ‖u_j − ū_i‖ / sqrt(d)`` over attended keys ``j``, ``[H, T]``."""
    ubar = p.alpha @ p.u  # [H, T, C]
    dist = torch.cdist(ubar, p.u[None].expand(ubar.shape[0], -1, -1))  # [H, i, j]
    dist = dist.masked_fill(~torch.isfinite(p.logits), 0.0)
    return p.scale * p.r.norm(dim=-1) * dist.amax(-1)


def _diag_blocks(p: J._Heads, residual: bool) -> torch.Tensor:
    """The diagonal blocks ``J_ii`` ``[T, C, C]`` in closed form (all four paths)."""
    idx = torch.arange(p.u.shape[0], device=p.u.device)
    a_ii = p.alpha[:, idx, idx]  # [H, T]
    dz = torch.einsum("hab,hib->hia", p.M, p.u[None] - p.alpha @ p.u)  # M (u_i − ū_i)
    key = p.scale * torch.einsum("hi,hia,hib->iab", a_ii, dz, p.r)
    value = torch.einsum("hi,hab->iab", a_ii, p.M)
    eye = torch.eye(p.u.shape[1], dtype=p.u.dtype, device=p.u.device)
    return float(residual) * eye + value + key + J._query_blocks(p)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def _apriori(c: dict, d: int) -> tuple[list[float], list[float]]:
    """Per head ``ε_h = Q_h κ_h D / sqrt(d)`` and ``ν_h ρ_h κ_h D² / (4 sqrt(d))`` from ``bound()``."""
    H, sqrt_d = len(c["nu"]), math.sqrt(d)
    eps = [c["Q"][h] * c["kappa"][h] * c["D"] / sqrt_d for h in range(H)]
    query = [
        c["nu"][h] * c["rho"][h] * c["kappa"][h] * c["D"] ** 2 / (4 * sqrt_d) for h in range(H)
    ]
    return eps, query


def _aggregate_bounds(
    a_ii: torch.Tensor,
    eps: torch.Tensor,
    nu: torch.Tensor,
    value_sum: torch.Tensor,
    centre: torch.Tensor,
    qb: list[float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bounds of theorem ``bnd-thm-aggregate`` on ``off_sum`` and ``diag`` (each ``[R]``)."""
    diag_slack = (a_ii * nu * eps).sum(0) + sum(qb)
    off_slack = ((1 - a_ii) * nu * eps).sum(0)
    off_upper = torch.minimum(((1 - a_ii) * nu * (1 + eps)).sum(0), value_sum + off_slack)
    off_lower = (value_sum - off_slack).clamp_min(0)
    return off_lower, off_upper, (centre - diag_slack).clamp_min(0), centre + diag_slack


@torch.no_grad()
def aggregate_influence(
    layer: TemporalAttention,
    x: torch.Tensor,
    dropped: torch.Tensor | None = None,
    *,
    rows: torch.Tensor | None = None,
) -> Aggregate:
    """Theorem ``bnd-thm-aggregate`` at ``x`` ``[T, C]``: measured aggregates and their bounds.

    With ``X^h_ij = I + (u_j − ū^h_i) (W_K^hᵀ q^h_i)ᵀ / sqrt(d)`` every block is
    ``J_ij = Σ_h α^h_ij M^h X^h_ij`` (``j ≠ i``) and ``‖X^h_ij − I‖ ≤ ε^h_i``, so::

        off_sum ≤ Σ_h (1 − α^h_ii) ν_h (1 + ε^h_i),  |off_sum − value_sum| ≤ Σ_h (1 − α^h_ii) ν_h ε^h_i,
        |diag − ‖r I + Σ_h α^h_ii M^h‖| ≤ Σ_h (α^h_ii ν_h ε^h_i + ν_h ρ_h κ_h D² / (4 sqrt(d))),

    with ``r = 1`` with a residual, else 0 (``book/bounds.ipynb``). Blocks are measured in row chunks
    (:func:`diagsink.jacobian.block_norms`; ``T = 1024`` fits); ``rows`` (default: all) restricts each field.
    """
    _check(layer, x)
    p = J._heads(layer, x, dropped)
    rows = torch.arange(x.shape[0], device=x.device) if rows is None else torch.as_tensor(rows)
    norms = J.block_norms(layer, x, dropped, rows=rows)  # [R, T] per path
    on_diag = torch.zeros_like(norms["total"], dtype=torch.bool)
    on_diag[torch.arange(len(rows)), rows] = True
    off_sum = norms["total"].masked_fill(on_diag, 0).sum(-1)
    value_sum = norms["value"].masked_fill(on_diag, 0).sum(-1)
    diag, query = norms["total"][on_diag], norms["query"][on_diag]  # [R] each
    c = J.bound(layer, x, dropped).constants
    eps_hat, qb = _apriori(c, layer.d_head)
    nu = torch.tensor(c["nu"], dtype=x.dtype, device=x.device)[:, None]  # [H, 1]
    a_ii, eps = p.alpha.diagonal(dim1=-2, dim2=-1)[:, rows], _eps(p)[:, rows]  # [H, R] each
    eye_C = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    centre = float(layer.residual) * eye_C + torch.einsum("hi,hab->iab", a_ii, p.M)
    centre = torch.linalg.matrix_norm(centre, ord=2)  # [T]: ‖r I + Σ_h α^h_ii M^h‖
    off_lower, off_upper, diag_lower, diag_upper = _aggregate_bounds(
        a_ii, eps, nu, value_sum, centre, qb
    )
    sigma_lower = float(layer.residual) - (a_ii * nu * (1 + eps)).sum(0) - query
    return Aggregate(
        off_sum=off_sum,
        diag=diag,
        share=_ratio(diag, diag + off_sum),
        value_sum=value_sum,
        alpha_diag=a_ii,
        eps=eps,
        eps_apriori=eps_hat,
        query_bound=qb,
        off_lower=off_lower,
        off_upper=off_upper,
        diag_lower=diag_lower,
        diag_upper=diag_upper,
        share_lower=_ratio(diag_lower, diag_lower + off_upper),
        share_upper=_ratio(diag_upper, diag_upper + off_lower),
        value_diag=centre,
        sigma_min=torch.linalg.svdvals(_diag_blocks(p, layer.residual)[rows])[:, -1],
        sigma_lower=sigma_lower.clamp_min(0),
        nu=list(c["nu"]),
        nu_layer=float(torch.linalg.matrix_norm(p.M.sum(0), ord=2)),
        residual=bool(layer.residual),
    )


# ----------------------------------------------------------------------------------------
# the minimal counterexample and the directional bound
# ----------------------------------------------------------------------------------------
def uniform_counterexample(T: int) -> tuple[TemporalAttention, torch.Tensor]:
    """The book's minimal counterexample: uniform attention with a large query term.

    ``C = 2``, one head, no biases, no ``W_O``, ``W_V = W_K = I``, ``W_Q`` swaps the two
    channels; the tokens alternate ``+√2 e₁, −√2 e₁`` (``T`` even). Every logit is
    ``q_iᵀ k_j / sqrt(2) = 0`` (queries lie along ``e₂``, keys along ``e₁``), so attention is
    exactly uniform (``Δ = 0``), yet ``G_i = √2 e₁ e₂ᵀ`` reaches the coupling bound
    ``(ν/2) Δ̂ = √2``. Returns ``(layer, x)`` with ``x`` ``[T, 2]`` (float64, eval mode).
    Chapter ``book/bounds.ipynb``.
    """
    if not (isinstance(T, int) and T >= 2 and T % 2 == 0):
        raise ConfigError(
            f"T={T!r}: the counterexample alternates two tokens; pass an even T >= 2."
        )
    layer = TemporalAttention(2, 1, bias=False, out_proj=False).to(torch.float64).eval()
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        layer.v_proj.weight.copy_(torch.eye(2, dtype=torch.float64))
        layer.k_proj.weight.copy_(torch.eye(2, dtype=torch.float64))
        layer.q_proj.weight.copy_(swap)
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(T // 2)
    x = torch.zeros(T, 2, dtype=torch.float64)
    x[:, 0] = math.sqrt(2.0) * signs
    return layer, x


@torch.no_grad()
def directional_query(
    layer: TemporalAttention, z: torch.Tensor, w: torch.Tensor, w0: torch.Tensor | None = None
) -> tuple[torch.Tensor, list[float]]:
    """The query term along the direction a scalar input moves, and its bound.

    Tokens ``u_m = z_m w + w₀`` (a scalar series ``z`` ``[T]`` embedded by ``w``, ``w₀`` ``[C]``,
    as ``Linear(1→C)`` embeds speed). Returns ``‖G^h_i w‖`` ``[H, T]`` and, per head, the bound
    ``½ ‖M^h w‖ Δ^h`` with ``Δ^h`` the *measured* spread of the content logits
    ``q_iᵀ k_m / sqrt(d)`` (proposition ``bnd-prop-directional`` of ``book/bounds.ipynb``).
    """
    if layer.pos.kind is not None:
        raise ConfigError(
            "a positional encoding moves the tokens off the line z w + w0; build the layer with pos_encoding=None."
        )
    if z.dim() != 1 or w.shape != (layer.d_model,):
        raise ConfigError(
            f"z has shape {tuple(z.shape)}, w {tuple(w.shape)}; pass z [T] and w [C] with C = {layer.d_model}."
        )
    x = z[:, None] * w + (torch.zeros_like(w) if w0 is None else w0)
    G = head_query_blocks(layer, x)  # [H, T, C, C]
    p = J._heads(layer, x, None)
    content = p.q @ p.k.transpose(-1, -2) * p.scale  # [H, T, T]
    spread = (content.amax(-1) - content.amin(-1)).amax(-1)  # [H]
    Mw = torch.linalg.vector_norm(p.M @ w, dim=-1)  # [H]
    return torch.linalg.vector_norm(G @ w, dim=-1), [
        float(0.5 * Mw[h] * spread[h]) for h in range(len(spread))
    ]
