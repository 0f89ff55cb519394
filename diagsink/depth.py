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

A :class:`Shift` entry adds a fixed ``[T, C]`` tensor (the T&S model's time-of-day embedding);
its Jacobian is the identity. :func:`temporal_stack` cuts the temporal part out of a trained
:class:`~diagsink.model.TSModel` as such a stack; :func:`influence` summarises a stack Jacobian
by its block norms; :func:`layer_constants`, :func:`theorem_constants` and :func:`depth_bound`
are the L-layer bound (proposition ``dep-prop-stack``).

Used in the chapter "Depth and LayerNorm" (``book/depth.ipynb``); it extends the single-layer
closed form of "The Jacobian of a temporal-attention layer" (``book/jacobian.ipynb``) and "One
layer: how much of a step's sensitivity stays on the diagonal" (``book/bounds.ipynb``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from . import jacobian as J
from .attention import TemporalAttention
from .errors import ConfigError
from .stats import self_share

__all__ = [
    "Shift",
    "layernorm_jacobian",
    "layer_jacobian",
    "apply_stack",
    "network_jacobian",
    "averaging_layer",
    "post_norm_entries",
    "temporal_stack",
    "block_norm_matrix",
    "influence",
    "layer_constants",
    "theorem_constants",
    "depth_bound",
]


class Shift(nn.Module):
    """Adds a fixed tensor ``[T, C]`` to its input ``[T, C]`` (a bias; its Jacobian is ``I``).

    The T&S model adds the time-of-day embedding at every block input this way (chapter
    "Depth and LayerNorm", ``book/depth.ipynb``).
    """

    def __init__(self, shift: torch.Tensor) -> None:
        super().__init__()
        if shift.dim() != 2:
            raise ConfigError(f"shift has shape {tuple(shift.shape)}; pass one tensor [T, C].")
        self.register_buffer("shift", shift.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.shift.shape:
            raise ConfigError(
                f"x has shape {tuple(x.shape)} but the Shift holds {tuple(self.shift.shape)}; "
                "build the Shift for this sequence (same T and C)."
            )
        return x + self.shift


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
    """Closed-form Jacobian ``[T, C, T, C]`` of one stack entry (attention, LayerNorm, Shift)."""
    if isinstance(layer, nn.LayerNorm):
        return layernorm_jacobian(layer, x)
    if isinstance(layer, TemporalAttention):
        return J.total(J.decompose(layer, x))
    if isinstance(layer, Shift):
        _check_x(x, layer.shift.shape[-1], "layer_jacobian")
        T, C = x.shape
        return torch.eye(T * C, dtype=x.dtype, device=x.device).reshape(T, C, T, C)
    raise ConfigError(
        f"stack entry of type {type(layer).__name__} is not covered: use ds.TemporalAttention "
        "(norm=None), nn.LayerNorm(C) or ds.depth.Shift entries."
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
            computes it), ``nn.LayerNorm(C)`` or :class:`Shift` entries, applied in order. A
            post-norm block is ``[attention, LayerNorm]``.
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


# ----------------------------------------------------------------------------------------
# stacks to measure: the averaging contrast and the temporal part of a trained T&S model
# ----------------------------------------------------------------------------------------
def averaging_layer(d_model: int, dtype: torch.dtype = torch.float64) -> TemporalAttention:
    """The residual averaging layer ``y_i = x_i + (1/T) Σ_j x_j`` as a ``TemporalAttention``.

    ``W_Q = W_K = 0`` (uniform attention, ``α_ij = 1/T``), ``W_V = W_O = I``, no biases; the
    contrast of the chapter "Depth and LayerNorm": input and output ``[T, C]``.
    """
    layer = TemporalAttention(d_model, 1, bias=False).to(dtype).eval()
    eye = torch.eye(d_model, dtype=dtype)
    with torch.no_grad():
        layer.q_proj.weight.zero_()
        layer.k_proj.weight.zero_()
        layer.v_proj.weight.copy_(eye)
        layer.out_proj.weight.copy_(eye)
    return layer


def post_norm_entries(attn: TemporalAttention) -> list[nn.Module]:
    """Split a layer into stack entries: ``norm="post"`` -> ``[copy with norm=None, its LayerNorm]``.

    The copies are float64 and in eval mode; ``norm=None`` gives ``[copy]``; ``"pre"`` is refused.
    """
    if not isinstance(attn, TemporalAttention):
        raise ConfigError(f"expected a ds.TemporalAttention, got {type(attn).__name__}.")
    if attn.norm_kind == "pre":
        raise ConfigError(
            "norm='pre' puts the LayerNorm inside the residual branch, which the stack does not "
            "cover; use a layer with norm='post' or norm=None."
        )
    layer = copy.deepcopy(attn).double().eval()
    if attn.norm_kind is None:
        return [layer]
    ln = layer.norm
    layer.norm, layer.norm_kind = nn.Identity(), None
    return [layer, ln]


@torch.no_grad()
def temporal_stack(
    model: nn.Module, window: torch.Tensor, node: int, depth: int | None = None
) -> tuple[list[nn.Module], torch.Tensor]:
    """The temporal part of a T&S model for one sensor: stack entries and their input ``[T, C]``.

    Args:
        model: a :class:`~diagsink.model.TSModel`.
        window: one input window ``[T_in, N, 2]`` (scaled speed, time of day).
        node: the sensor whose sequence is followed.
        depth: the first ``depth`` blocks (default: all).

    Returns:
        ``(layers, x0)``: per block ``[Shift(time-of-day embedding), attention (norm=None),
        its post-LayerNorm]`` (float64, eval mode), and ``x0`` = the speed embedding plus the
        positional table of that sensor, the first block's input. The graph convolution
        sublayer (``gconv`` and ``block.norm``) is left out: this is the temporal part only.
    """
    n_blocks = len(model.blocks)
    depth = n_blocks if depth is None else depth
    if not (isinstance(depth, int) and 1 <= depth <= n_blocks):
        raise ConfigError(f"depth={depth!r} must be an integer in [1, {n_blocks}] (the blocks).")
    if window.dim() != 3 or window.shape[-1] != 2 or not 0 <= node < window.shape[1]:
        raise ConfigError(
            f"window has shape {tuple(window.shape)} and node={node}; pass one window "
            "[T_in, N, 2] and a sensor index 0 <= node < N."
        )
    speed_embed, pos, tod_embed = (
        copy.deepcopy(m).double() for m in (model.speed_embed, model.pos, model.tod_embed)
    )
    w = window[None].double()  # [1, T, N, 2]; float64 throughout
    x0 = pos(speed_embed(w[..., :1]).transpose(1, 2)).transpose(1, 2)[0, :, node]
    tod = tod_embed(w[..., 1:])[0, :, node]  # [T, C]
    layers: list[nn.Module] = []
    for block in model.blocks[:depth]:
        layers.append(Shift(tod))
        layers.extend(post_norm_entries(block.attn))
    return layers, x0


# ----------------------------------------------------------------------------------------
# block norms and the L-layer bound (proposition dep-prop-stack)
# ----------------------------------------------------------------------------------------
def block_norm_matrix(jac: torch.Tensor) -> torch.Tensor:
    """Spectral norms ``[T, T]`` of the ``C x C`` blocks of a Jacobian ``[T, C, T, C]``."""
    if jac.dim() != 4 or jac.shape[0] != jac.shape[2] or jac.shape[1] != jac.shape[3]:
        raise ConfigError(f"jac has shape {tuple(jac.shape)}; pass a Jacobian [T, C, T, C].")
    return torch.linalg.matrix_norm(jac.permute(0, 2, 1, 3), ord=2)


def influence(jac: torch.Tensor) -> dict[str, float]:
    """Block-norm summary of a Jacobian ``[T, C, T, C]`` (spectral norms of its ``C x C`` blocks).

    ``off_mean`` / ``off_max``: mean / largest off-diagonal block; ``off_mean_T``: ``T`` times
    the mean; ``diag_mean``: mean diagonal block; ``diag_share``: mean over rows of
    ``‖J_ii‖ / Σ_j ‖J_ij‖`` (:func:`diagsink.stats.self_share`; ``1/T`` = spread evenly).
    """
    n = block_norm_matrix(jac)
    T = n.shape[0]
    off = ~torch.eye(T, dtype=torch.bool, device=n.device)
    off_mean = float(n[off].mean()) if T > 1 else 0.0
    return {
        "off_mean": off_mean,
        "off_mean_T": T * off_mean,
        "off_max": float(n[off].max()) if T > 1 else 0.0,
        "diag_mean": float(n.diagonal().mean()),
        "diag_share": self_share(n),
    }


def _pair(a: float, b: float, T: int) -> tuple[float, float]:
    return max(a, b / T), b  # a ≥ b/T: the majorant αI + β11ᵀ is then entrywise nonnegative


@torch.no_grad()
def layer_constants(layers: Sequence[nn.Module], x: torch.Tensor) -> list[tuple[float, float]]:
    """Measured ``(a_l, b_l)`` per entry: largest diagonal block, ``T`` x largest off-diagonal.

    Each from the closed-form Jacobian of that entry at its own input (``x`` ``[T, C]`` for the
    first); ``a_l`` is raised to ``b_l / T`` where smaller (allowed: both are upper bounds).
    """
    T = x.shape[0]
    out, h = [], x
    off = ~torch.eye(T, dtype=torch.bool, device=x.device)
    for layer in layers:
        n = block_norm_matrix(layer_jacobian(layer, h))
        b = T * float(n[off].max()) if T > 1 else 0.0
        out.append(_pair(float(n.diagonal().max()), b, T))
        h = layer(h)
    return out


@torch.no_grad()
def theorem_constants(layers: Sequence[nn.Module], x: torch.Tensor) -> list[tuple[float, float]]:
    """``(a_l, b_l)`` per entry from the theorems, not from the Jacobian (``x`` ``[T, C]``).

    Attention: ``a_l`` = the diagonal bound (theorem ``bnd-thm-diag``), ``b_l = T`` x the
    per-entry off-diagonal bound (``bnd-thm-offdiag``), by :func:`diagsink.jacobian.bound` at the
    layer's input; LayerNorm: ``a_l = max|γ| / min_t σ_t``, ``b_l = 0`` (``dep-lem-ln-norm``);
    Shift: ``(1, 0)``.
    """
    T = x.shape[0]
    out, h = [], x
    for layer in layers:
        if isinstance(layer, TemporalAttention):
            b = J.bound(layer, h)
            out.append(_pair(b.diag["total"], T * b.off["total"], T))
        elif isinstance(layer, nn.LayerNorm):
            _check_x(h, layer.normalized_shape[0], "theorem_constants")
            sigma = torch.sqrt(h.var(-1, unbiased=False) + layer.eps)
            gain = float(layer.weight.detach().abs().max()) if layer.weight is not None else 1.0
            out.append((gain / float(sigma.min()), 0.0))
        elif isinstance(layer, Shift):
            out.append((1.0, 0.0))
        else:
            layer_jacobian(layer, h)  # raises the "not covered" error
        h = layer(h)
    return out


def depth_bound(constants: Sequence[tuple[float, float]], T: int) -> dict[str, float]:
    """Proposition ``dep-prop-stack``: bounds on the stack's blocks from per-layer ``(a_l, b_l)``.

    With ``α_l = a_l − b_l/T`` (needs ``a_l ≥ b_l/T``, ``b_l ≥ 0``): every off-diagonal block is
    at most ``(Π(α_l + b_l) − Π α_l) / T`` and every diagonal block at most
    ``Π α_l + (Π(α_l + b_l) − Π α_l) / T``. ``growth = Π(a_l + b_l)`` is a ``T``-free ceiling
    of ``T`` x the off-diagonal bound.
    """
    if not constants:
        raise ConfigError("constants is empty: pass one (a_l, b_l) pair per stack entry.")
    if not (isinstance(T, int) and T >= 1):
        raise ConfigError(f"T={T!r} must be a positive integer (the sequence length).")
    lo, hi, growth = 1.0, 1.0, 1.0
    for a, b in constants:
        if b < 0 or a < b / T - 1e-12 * max(1.0, a):
            raise ConfigError(
                f"(a, b) = ({a}, {b}) with T = {T}: the proposition needs b >= 0 and a >= b/T; "
                "raise a to max(a, b/T) (still an upper bound on the diagonal)."
            )
        alpha = max(a - b / T, 0.0)
        lo, hi, growth = lo * alpha, hi * (alpha + b), growth * (a + b)
    return {"off": (hi - lo) / T, "diag": lo + (hi - lo) / T, "growth": growth}
