"""The Jacobian of a temporal-attention layer, its four paths, and their sensitivity bounds.

For one sequence ``x`` of shape ``[T, C]`` a :class:`~diagsink.attention.TemporalAttention`
layer computes (after the positional encoding ``u = x + P``)::

    y_i = u_i + Σ_h W_O^h Σ_j α^h_ij (W_V^h u_j + b_V^h) + b_O,
    α^h_ij = softmax_j(s^h_ij),   s^h_ij = q^h_i · k^h_j / sqrt(d) + b_ij,

with ``q^h_i = W_Q^h u_i + b_Q^h``, ``k^h_j = W_K^h u_j + b_K^h`` and head size ``d``.
Its Jacobian ``J[i, :, j, :] = ∂y_i/∂x_j`` (a ``[T, C, T, C]`` tensor of ``C x C`` blocks)
splits into four *paths* (with ``M^h = W_O^h W_V^h``, ``ū_i = Σ_m α_im u_m``,
``k̄_i = Σ_m α_im k_m``)::

    residual  δ_ij I
    value     Σ_h α^h_ij M^h
    key       Σ_h α^h_ij M^h (u_j − ū^h_i) (q^h_i)ᵀ W_K^h / sqrt(d)
    query     δ_ij Σ_h Σ_m α^h_im M^h u_m (k^h_m − k̄^h_i)ᵀ W_Q^h / sqrt(d)

Derived in ``book/jacobian.ipynb`` ("The Jacobian of a temporal-attention layer"); the
bounds computed by :func:`bound` are the theorems of ``book/bounds.ipynb`` ("One layer:
how much of a step's sensitivity stays on the diagonal").

Functions:

* :func:`decompose` -- the four paths in closed form, vectorised (einsum).
* :func:`autograd_jacobian` -- the same Jacobian by ``torch.func.jacrev`` (the reference).
* :func:`block_norms` -- norms of every block, computed in row chunks (long sequences).
* :func:`bound` -- the right-hand sides of the theorems for one layer and input.

The toy layers, inputs and sweeps over ``T`` that feed these functions are in
:mod:`diagsink.toy`.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from .attention import TemporalAttention
from .errors import ConfigError
from .regularize import as_temporal_attention

__all__ = [
    "PATHS",
    "decompose",
    "total",
    "autograd_jacobian",
    "block_norms",
    "path_norms",
    "Bounds",
    "bound",
]

PATHS = ("residual", "value", "key", "query")
KINDS = ("off", "diag")


# ----------------------------------------------------------------------------------------
# the pieces of the closed form
# ----------------------------------------------------------------------------------------
def _check_supported(
    layer: TemporalAttention, x: torch.Tensor, dropped: torch.Tensor | None
) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) for what the closed form does not cover."""
    if not isinstance(layer, TemporalAttention):
        raise ConfigError(f"expected a ds.TemporalAttention layer, got {type(layer).__name__}.")
    if x.dim() != 2 or x.shape[-1] != layer.d_model:
        raise ConfigError(
            f"x has shape {tuple(x.shape)}; the Jacobian is taken for one sequence [T, C] with "
            f"C = d_model = {layer.d_model}. Pass x[b] (or x[b, n]) one sequence at a time."
        )
    if layer.norm_kind is not None:
        raise ConfigError(
            f"norm={layer.norm_kind!r}: the closed form covers layers without LayerNorm. Build the "
            "layer with norm=None, or use autograd_jacobian() for the normalised layer."
        )
    if layer.training and layer.dropout > 0:
        raise ConfigError(
            f"attention dropout={layer.dropout} is random in training mode, so the layer has no "
            "fixed Jacobian. Call layer.eval() or build the layer with dropout=0."
        )
    if (
        layer.training
        and layer.diag == "dropout"
        and layer.diag_p > 0
        and x.shape[0] >= 2
        and dropped is None
    ):
        raise ConfigError(
            "diag='dropout' in training mode draws a random diagonal pattern on every call, so the "
            "Jacobian is not defined. Pass a fixed pattern with dropped=... ([T] or [H, T] booleans) "
            "or call layer.eval()."
        )


@dataclass
class _Heads:
    """Per-head quantities of the closed form for one input (shapes in brackets)."""

    u: torch.Tensor  # [T, C] input after the positional encoding
    alpha: torch.Tensor  # [H, T, T] attention weights (zeros where masked/dropped)
    logits: torch.Tensor  # [H, T, T] logits s (−inf where masked/dropped)
    q: torch.Tensor  # [H, T, d] queries (with bias)
    k: torch.Tensor  # [H, T, d] keys (with bias)
    M: torch.Tensor  # [H, C, C] W_O^h W_V^h
    Wq: torch.Tensor  # [H, d, C]
    Wk: torch.Tensor  # [H, d, C]
    bq: torch.Tensor  # [H, d] query bias (zeros without bias)
    z: torch.Tensor  # [H, T, C] z_m = M^h u_m
    zbar: torch.Tensor  # [H, T, C] Σ_m α_im z_m
    r: torch.Tensor  # [H, T, C] W_K^hᵀ q_i
    scale: float  # 1 / sqrt(d)


def _out_weight(layer: TemporalAttention, like: torch.Tensor) -> torch.Tensor:
    if isinstance(layer.out_proj, nn.Linear):
        return layer.out_proj.weight
    return torch.eye(layer.d_model, dtype=like.dtype, device=like.device)


def _heads(layer: TemporalAttention, x: torch.Tensor, dropped: torch.Tensor | None) -> _Heads:
    _check_supported(layer, x, dropped)
    H, d, C = layer.n_heads, layer.d_head, layer.d_model
    u = layer.pos(x)  # [T, C]
    logits = layer.scores(u, dropped)  # [H, T, T], −inf on masked entries
    logits = logits.expand(H, *logits.shape[-2:]) if logits.dim() == 2 else logits
    alpha = torch.softmax(logits, dim=-1)
    q = layer.split_heads(layer.q_proj(u))  # [H, T, d]
    k = layer.split_heads(layer.k_proj(u))
    Wq = layer.q_proj.weight.reshape(H, d, C)
    Wk = layer.k_proj.weight.reshape(H, d, C)
    Wv = layer.v_proj.weight.reshape(H, d, C)
    Wo = _out_weight(layer, x).reshape(C, H, d).permute(1, 0, 2)  # [H, C, d]: W_O^h
    M = Wo @ Wv  # [H, C, C]
    bq = (
        layer.q_proj.bias.reshape(H, d)
        if layer.q_proj.bias is not None
        else torch.zeros(H, d, dtype=x.dtype, device=x.device)
    )
    z = torch.einsum("hac,tc->hta", M, u)  # z_t = M u_t
    zbar = alpha @ z  # [H, T, C]
    r = q @ Wk  # [H, T, C]: W_Kᵀ q_i
    return _Heads(u, alpha, logits, q, k, M, Wq, Wk, bq, z, zbar, r, 1.0 / math.sqrt(d))


def _query_blocks(p: _Heads) -> torch.Tensor:
    """Diagonal blocks of the query path, ``[T, C, C]``: Σ_h Σ_m α_im z_m (k_m − k̄_i)ᵀ W_Q / sqrt(d)."""
    kbar = p.alpha @ p.k  # [H, T, d]
    kc = p.k[:, None, :, :] - kbar[:, :, None, :]  # [H, i, m, d]: k_m − k̄_i
    inner = torch.einsum("him,hma,himc->hiac", p.alpha, p.z, kc)  # [H, T, C, d]
    return p.scale * torch.einsum("hiac,hcb->iab", inner, p.Wq)


def _value_key_rows(p: _Heads, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Value and key blocks for query rows ``rows``: two tensors ``[len(rows), T, C, C]``."""
    a = p.alpha[:, rows]  # [H, R, T]
    value = torch.einsum("hij,hab->ijab", a, p.M)
    dz = p.z[:, None, :, :] - p.zbar[:, rows, None, :]  # [H, R, T, C]: M (u_j − ū_i)
    key = p.scale * torch.einsum("hij,hija,hib->ijab", a, dz, p.r[:, rows])
    return value, key


# ----------------------------------------------------------------------------------------
# the decomposition and the autograd reference
# ----------------------------------------------------------------------------------------
@torch.no_grad()
def decompose(
    layer: TemporalAttention, x: torch.Tensor, dropped: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The four paths of the Jacobian of ``layer`` at ``x``, in closed form.

    Args:
        layer: a :class:`~diagsink.attention.TemporalAttention` with ``norm=None``; any
            number of heads, with or without biases, output projection, residual,
            positional encoding, and any diagonal regularizer (``"dropout"`` needs either
            eval mode or a fixed ``dropped`` pattern).
        x: one sequence ``[T, C]``.
        dropped: fixed boolean pattern of dropped diagonal entries (``[T]`` or ``[H, T]``)
            for ``diag="dropout"``, exactly as in ``layer(x, dropped=...)``.

    Returns:
        ``{"residual", "value", "key", "query"}`` -> ``[T, C, T, C]`` tensors; entry
        ``[i, :, j, :]`` is that path's block of ``∂y_i/∂x_j``. The four sum to the
        Jacobian (see :func:`total`). ``"query"`` is zero off the diagonal blocks.

    Raises:
        ConfigError: a ``ValueError`` for LayerNorm, attention dropout in training mode, or
            random diagonal dropout without ``dropped`` -- cases without a closed form here.

    Derived in ``book/jacobian.ipynb``.
    """
    p = _heads(layer, x, dropped)
    T, C = x.shape
    idx = torch.arange(T, device=x.device)
    value, key = _value_key_rows(p, idx)  # [T, T, C, C]
    query = torch.zeros(T, C, T, C, dtype=x.dtype, device=x.device)
    query[idx, :, idx, :] = _query_blocks(p)
    residual = torch.zeros_like(query)
    if layer.residual:
        residual[idx, :, idx, :] = torch.eye(C, dtype=x.dtype, device=x.device)
    return {
        "residual": residual,
        "value": value.permute(0, 2, 1, 3).contiguous(),  # [i, j, a, b] -> [i, a, j, b]
        "key": key.permute(0, 2, 1, 3).contiguous(),
        "query": query,
    }


def total(paths: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of the paths returned by :func:`decompose`: the full Jacobian ``[T, C, T, C]``."""
    out = paths[PATHS[0]].clone()
    for name in PATHS[1:]:
        out += paths[name]
    return out


def autograd_jacobian(
    layer: TemporalAttention, x: torch.Tensor, dropped: torch.Tensor | None = None
) -> torch.Tensor:
    """``∂y/∂x`` by reverse-mode autodiff (``torch.func.jacrev``): ``[T, C] -> [T, C, T, C]``.

    The reference that :func:`decompose` is tested against. It differentiates whatever the
    layer computes (also LayerNorm), so random dropout in training mode gives the Jacobian of
    one random draw.
    """
    if x.dim() != 2:
        raise ConfigError(f"x has shape {tuple(x.shape)}; pass one sequence [T, C].")
    with warnings.catch_warnings():
        # jacrev through the fused CPU attention kernel falls back to a loop and warns about it
        warnings.filterwarnings("ignore", message="There is a performance drop")
        return torch.func.jacrev(lambda inp: layer(inp, dropped=dropped))(x)


# ----------------------------------------------------------------------------------------
# block norms for long sequences
# ----------------------------------------------------------------------------------------
def _matrix_norm(blocks: torch.Tensor, norm: str) -> torch.Tensor:
    if norm == "spectral":
        return torch.linalg.matrix_norm(blocks, ord=2)
    if norm == "fro":
        return torch.linalg.matrix_norm(blocks, ord="fro")
    raise ConfigError(f"norm={norm!r} is not known; use 'spectral' (ord=2) or 'fro' (Frobenius).")


@torch.no_grad()
def block_norms(
    layer: TemporalAttention,
    x: torch.Tensor,
    dropped: torch.Tensor | None = None,
    *,
    norm: str = "spectral",
    rows: torch.Tensor | None = None,
    chunk_elems: int = 2**22,
) -> dict[str, torch.Tensor]:
    """Norms of every ``C x C`` block of each path, without building ``[T, C, T, C]``.

    Works through the query rows ``i`` in chunks of about ``chunk_elems`` numbers, so
    ``T = 1024`` with ``C = 16`` (a 268-million-entry Jacobian) fits in a few MB.

    Args:
        layer, x, dropped: as in :func:`decompose`.
        norm: ``"spectral"`` (largest singular value, ``matrix_norm(ord=2)``) or ``"fro"``.
        rows: the query steps ``i`` to evaluate (default: all ``T``).

    Returns:
        ``{"residual", "value", "key", "query", "total"}`` -> ``[len(rows), T]``; entry
        ``[r, j]`` is the norm of block ``∂y_{rows[r]}/∂x_j`` of that path.
    """
    p = _heads(layer, x, dropped)
    T, C = x.shape
    rows = (
        torch.arange(T, device=x.device) if rows is None else torch.as_tensor(rows, device=x.device)
    )
    R = len(rows)
    eye = torch.eye(C, dtype=x.dtype, device=x.device)
    qblocks = _query_blocks(p)  # [T, C, C]
    qnorm = _matrix_norm(qblocks, norm)
    out = {name: torch.zeros(R, T, dtype=x.dtype, device=x.device) for name in (*PATHS, "total")}
    ar = torch.arange(R, device=x.device)
    out["query"][ar, rows] = qnorm[rows]
    if layer.residual:
        out["residual"][ar, rows] = _matrix_norm(eye, norm)
    step = max(1, chunk_elems // max(1, T * C * C * p.alpha.shape[0]))
    for start in range(0, R, step):
        sl = slice(start, min(R, start + step))
        r_idx = rows[sl]
        value, key = _value_key_rows(p, r_idx)  # [r, T, C, C]
        out["value"][sl] = _matrix_norm(value, norm)
        out["key"][sl] = _matrix_norm(key, norm)
        tot = value + key
        local = torch.arange(len(r_idx), device=x.device)
        tot[local, r_idx] += qblocks[r_idx] + (eye if layer.residual else 0.0)
        out["total"][sl] = _matrix_norm(tot, norm)
    return out


# ----------------------------------------------------------------------------------------
# the bounds (theorems of book/bounds.ipynb)
# ----------------------------------------------------------------------------------------
@dataclass
class Bounds:
    """Right-hand sides of the sensitivity theorems for one layer and input (spectral norms).

    Attributes:
        off: per-entry bounds on ``‖∂y_i/∂x_j‖₂`` for every ``j ≠ i``, per path and
            ``"total"`` (theorem ``bnd-thm-offdiag`` in ``book/bounds.ipynb``).
        off_average: bounds on the average over ``j ≠ i`` of those norms, for every ``i``
            (theorem ``bnd-thm-offdiag-average``; needs no assumption on the logits).
        diag: bounds on ``‖∂y_i/∂x_i‖₂`` per path and ``"total"`` (theorem ``bnd-thm-diag``).
        diag_lower: lower bound on the smallest singular value of ``∂y_i/∂x_i`` (hence on
            its norm) when the layer has a residual connection, else 0.
        constants: the quantities the bounds are built from (see :func:`bound`).
    """

    off: dict[str, float]
    off_average: dict[str, float]
    diag: dict[str, float]
    diag_lower: float
    constants: dict[str, object] = field(default_factory=dict)


def _spectral(m: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(m, ord=2)) if m.numel() else 0.0


@torch.no_grad()
def bound(layer: TemporalAttention, x: torch.Tensor, dropped: torch.Tensor | None = None) -> Bounds:
    """The right-hand sides of the theorems of ``book/bounds.ipynb`` at ``x`` ``[T, C]``.

    With ``u = x + P`` (the input after positional encoding), head size ``d`` and, per head
    ``h``: ``ν_h = ‖W_O^h W_V^h‖₂``, ``ρ_h = ‖W_Q^h‖₂``, ``κ_h = ‖W_K^h‖₂``, ``Q_h = ρ_h R + ‖b_Q^h‖``
    (so ``‖q^h_i‖ ≤ Q_h``), ``R = max_j ‖u_j‖``, ``D = max_{j,m} ‖u_j − u_m‖`` (the spread),
    ``V = min(R², D²/2)``, ``N`` = the fewest keys any row attends to (``T``; ``T − 1`` when
    the diagonal of some row is masked or dropped), the logit spread
    ``Δ_h = max_i (max_j s_ij − min_j s_ij)`` over the keys a row attends to (measured from
    the layer's logits, penalty included), and ``a_h = min(1, e^{Δ_h} / N) ≥ α^h_ij``:

    * off-diagonal, every ``j ≠ i``: value ``Σ_h a_h ν_h``, key ``Σ_h a_h ν_h κ_h Q_h D / sqrt(d)``,
      residual and query 0;
    * averaged over ``j ≠ i``: value ``Σ_h ν_h / (T − 1)``, key ``Σ_h ν_h κ_h Q_h D / sqrt(d) / (T − 1)``;
    * diagonal: residual 1 (0 without residual), value ``Σ_h a'_h ν_h``, key
      ``Σ_h a'_h ν_h κ_h Q_h D / sqrt(d)`` (``a'_h = 0`` when every diagonal entry is masked),
      query ``Σ_h ν_h ρ_h κ_h D² / (4 sqrt(d))`` -- no ``α_ii`` factor (Popoviciu's
      inequality; ``D²/4 ≤ V``, the cruder variance bound kept in ``constants``);
    * ``diag_lower = 1 − (value + key + query)`` diagonal bounds (residual layers only).

    ``constants`` also holds the a-priori spread ``Δ_h ≤ Q_h κ_h D / sqrt(d) + |penalty|``,
    which uses the weights and ``x`` only.
    """
    p = _heads(layer, x, dropped)
    c, a_diag = _bound_constants(layer, p)
    off, off_average, diag = _path_bounds(layer, c, a_diag)
    rest = diag["value"] + diag["key"] + diag["query"]
    diag_lower = max(0.0, 1.0 - rest) if layer.residual else 0.0
    return Bounds(off, off_average, diag, diag_lower, c)


def _bound_constants(layer: TemporalAttention, p: _Heads) -> tuple[dict, list[float]]:
    """The constants of :func:`bound` (``Bounds.constants``) and the diagonal factors ``a'_h``.

    Norms of the input ``p.u`` ``[T, C]`` (``R``, ``D``, ``V``), of the per-head weights (``ν``,
    ``ρ``, ``κ``, ``Q``), and the measured and a-priori logit spreads ``Δ_h`` with ``a_h``.
    """
    T = p.u.shape[0]
    H = layer.n_heads
    sqrt_d = math.sqrt(layer.d_head)
    u = p.u
    R = float(u.norm(dim=-1).max())
    D = float(torch.cdist(u[None], u[None])[0].max()) if T > 1 else 0.0
    V = min(R**2, D**2 / 2)
    nu = [_spectral(p.M[h]) for h in range(H)]
    rho = [_spectral(p.Wq[h]) for h in range(H)]
    kappa = [_spectral(p.Wk[h]) for h in range(H)]
    Qb = [rho[h] * R + float(p.bq[h].norm()) for h in range(H)]
    finite = torch.isfinite(p.logits)
    keys_per_row = finite.sum(-1)  # [H, T]
    N = int(keys_per_row.min())
    smax = p.logits.masked_fill(~finite, -math.inf).amax(-1)
    smin = p.logits.masked_fill(~finite, math.inf).amin(-1)
    delta = [float((smax[h] - smin[h]).max()) for h in range(H)]
    a = [min(1.0, math.exp(delta[h]) / N) for h in range(H)]
    diag_open = torch.isfinite(torch.diagonal(p.logits, dim1=-2, dim2=-1)).any(-1)  # [H]
    a_diag = [a[h] if bool(diag_open[h]) else 0.0 for h in range(H)]
    penalty = abs(layer.diag_penalty) if layer.diag == "penalty" else 0.0
    delta_apriori = [Qb[h] * kappa[h] * D / sqrt_d + penalty for h in range(H)]
    constants = {
        "T": T,
        "N": N,
        "d": layer.d_head,
        "R": R,
        "D": D,
        "V": V,
        "nu": nu,
        "rho": rho,
        "kappa": kappa,
        "Q": Qb,
        "delta": delta,
        "delta_apriori": delta_apriori,
        "alpha_max_bound": a,
    }
    return constants, a_diag


def _path_bounds(
    layer: TemporalAttention, c: dict, a_diag: list[float]
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """The per-path bounds of :func:`bound` from its constants: ``(off, off_average, diag)``."""
    T, H, D = c["T"], layer.n_heads, c["D"]
    sqrt_d = math.sqrt(layer.d_head)
    nu, rho, kappa, a = c["nu"], c["rho"], c["kappa"], c["alpha_max_bound"]
    key_c = [nu[h] * kappa[h] * c["Q"][h] * D / sqrt_d for h in range(H)]
    off = {
        "residual": 0.0,
        "value": sum(a[h] * nu[h] for h in range(H)),
        "key": sum(a[h] * key_c[h] for h in range(H)),
        "query": 0.0,
    }
    off["total"] = off["value"] + off["key"]
    if T > 1:
        off_average = {
            "residual": 0.0,
            "value": sum(nu) / (T - 1),
            "key": sum(key_c) / (T - 1),
            "query": 0.0,
        }
    else:
        off_average = dict.fromkeys(PATHS, 0.0)
    off_average["total"] = off_average["value"] + off_average["key"]
    diag = {
        "residual": 1.0 if layer.residual else 0.0,
        "value": sum(a_diag[h] * nu[h] for h in range(H)),
        "key": sum(a_diag[h] * key_c[h] for h in range(H)),
        "query": sum(nu[h] * rho[h] * kappa[h] * D**2 / (4 * sqrt_d) for h in range(H)),
    }
    diag["total"] = sum(diag[name] for name in PATHS)
    return off, off_average, diag


def path_norms(layer: nn.Module, x: torch.Tensor, norm: str = "fro") -> dict[str, dict[str, float]]:
    """The Jacobian paths of one self-attention at one sequence ``x`` ``[T, C]``, in closed form.

    ``layer``: the package's layer or an ``nn.MultiheadAttention`` (converted exactly by
    :func:`~diagsink.regularize.as_temporal_attention`; no residual). Per path: the mean ``norm``
    of the diagonal and of the off-diagonal blocks (:func:`block_norms`). "Your own model" chapter.
    """
    if isinstance(layer, nn.MultiheadAttention):
        layer = as_temporal_attention(layer)
    layer = copy.deepcopy(layer).double().eval()  # the closed form needs eval mode, float64 here
    blocks = block_norms(layer, x.detach().double(), norm=norm)  # each [T, T]
    off = ~torch.eye(x.shape[0], dtype=torch.bool)
    pair = lambda b: {"diagonal": float(b.diagonal().mean()), "off_diagonal": float(b[off].mean())}  # noqa: E731
    return {k: pair(b) for k, b in blocks.items()}
