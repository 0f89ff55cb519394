"""The fast path of ``TemporalAttention``: fused attention, short CPU sequences packed.

Private machinery, not part of the teaching layer:
:meth:`~diagsink.attention.TemporalAttention.forward` calls :func:`fused_attention` when it
does not need the attention weights, and gets the same function as its explicit path
(``softmax(q k^T / sqrt(d_h) + b) v``), computed faster.

On the CPU, PyTorch's fused kernel pays a fixed cost for every (sequence, head), which
dominates for short sequences (``T = 12`` on METR-LA), and its code path for an additive mask
pays more. :func:`fused_attention` therefore packs ``G`` consecutive sequences end to end into
one sequence of ``G·T`` steps with a bias of ``-inf`` between steps of different sequences
(:func:`pack_diagonal_bias`): a ``-inf`` logit gets weight 0, so every softmax is the one it
would have been alone. Explained in the chapter "Attention over time, step by step"
(``book/attention.ipynb``, section "Packing short sequences").

With attention dropout on the CPU there is no fused kernel; :func:`dropout_attention` computes
the same explicit formula with one projection GEMM for ``q, k, v``, a softmax written out
(``torch.softmax`` over a last axis of 12 measured four times slower than ``exp`` and a sum)
and a boolean keep mask, with its backward pass written by hand (:class:`_DropoutAttention`,
which recomputes ``q, k, v`` there instead of storing them). It is used in training; the
appendix "Making it fast" (``book/fast.ipynb``) measures it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # the layer imports this module; only its type is needed here
    from .attention import TemporalAttention

__all__ = [
    "PACK_LENGTH",
    "dropout_attention",
    "fused_attention",
    "fused_bias",
    "pack_groups",
    "pack_diagonal_bias",
]

#: On the CPU the fast path packs sequences of at most half this many steps end to end, into
#: sequences of at most this many (see :func:`pack_groups`). Measured with
#: ``benchmarks/attention.py`` on one x86-64 CPU (2 cores): for T = 12, packed lengths 24 and 48
#: ran about equally fast and 36, 72 and 96 slower; 24 keeps the per-sequence dropout bias
#: (``G·T`` floats per query) small. Other CPUs may prefer another length; results are the same.
PACK_LENGTH = 24

#: Longest sequence whose constant bias is cached (longer ones are cheap to rebuild relative
#: to the attention itself, and caching them would hold megabytes per entry).
_CACHE_MAX_T = 256


def pack_groups(n_seq: int, length: int, device: torch.device, p_drop: float = 0.0) -> int:
    """How many sequences the fast path packs into one (``G``; 1: no packing).

    The largest ``G`` with ``G·T <= PACK_LENGTH`` that divides ``n_seq``.

    Packing ``G`` consecutive sequences into one sequence of ``G·T`` steps, with a bias of
    ``-inf`` between steps of different sequences, computes exactly the same attention in
    fewer, larger pieces; the block bias then carries the regularizer's diagonal at no extra
    cost (:func:`pack_diagonal_bias`).

    Returns 1 (no packing) off the CPU (the GPU kernels have other trade-offs), with
    attention dropout (attention is then computed unfused, where packing would multiply the
    work by ``G``), for ``T > PACK_LENGTH / 2``, and when no ``G > 1`` divides ``n_seq``.
    Explained in the chapter "Attention over time, step by step".
    """
    if device.type != "cpu" or p_drop > 0.0 or 2 * length > PACK_LENGTH:
        return 1
    groups = PACK_LENGTH // length
    while n_seq % groups:
        groups -= 1
    return groups


def pack_diagonal_bias(diagonal: torch.Tensor, groups: int) -> torch.Tensor:
    """The logit bias of ``G`` sequences packed end to end: ``-inf`` between sequences.

    Within a sequence it is its own bias: ``0`` off the diagonal, ``b_ii`` on it.

    Args:
        diagonal: the diagonal ``b_ii`` of every sequence's bias (every regularizer's bias is
            zero off its diagonal): ``[T]`` (the same for every sequence and head), ``[H, T]``
            (one per head) or ``[n_seq, H, T]`` (one per sequence and head, ``n_seq``
            divisible by ``G``; sequence ``s·G + g`` becomes part ``g`` of packed sequence ``s``).
        groups: ``G`` (``G = 1`` gives the unpacked bias, ``[..., T, T]``).

    Returns:
        ``[..., G·T, G·T]``: ``[G·T, G·T]``, ``[H, G·T, G·T]`` or ``[n_seq / G, H, G·T, G·T]``.
    """
    length = diagonal.shape[-1]
    if diagonal.dim() == 3:  # [n_seq, H, T] -> [n_seq / G, H, G·T]
        n_seq, heads = diagonal.shape[:2]
        diagonal = diagonal.reshape(n_seq // groups, groups, heads, length).transpose(1, 2)
        diagonal = diagonal.reshape(n_seq // groups, heads, groups * length)
    else:  # the same in every sequence: repeat it
        diagonal = diagonal.repeat(*[1] * (diagonal.dim() - 1), groups)
    same = torch.block_diag(
        *[torch.ones(length, length, dtype=torch.bool, device=diagonal.device)] * groups
    )
    between = torch.zeros(same.shape, dtype=diagonal.dtype, device=diagonal.device).masked_fill(
        ~same, float("-inf")
    )
    out = between.expand(*diagonal.shape, groups * length).clone()
    out.diagonal(dim1=-2, dim2=-1).copy_(diagonal)
    return out


@lru_cache(maxsize=32)
def _packed_constant(
    length: int, groups: int, value: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """:func:`pack_diagonal_bias` of ``value`` on every diagonal entry, ``[G·T, G·T]``.

    Cached: never modify it in place.

    Built outside inference mode even when first requested inside ``torch.inference_mode()``:
    an inference tensor in the cache could not be saved for a later backward pass.
    """
    with torch.inference_mode(False):
        return pack_diagonal_bias(torch.full((length,), value, dtype=dtype, device=device), groups)


def fused_bias(
    diagonal: float | torch.Tensor | None,
    lead: tuple[int, ...],
    n_heads: int,
    length: int,
    groups: int,
    like: torch.Tensor,
) -> torch.Tensor | None:
    """The ``attn_mask`` of the fused kernel for ``G`` sequences packed end to end.

    Args:
        diagonal: the regularizer's ``b_ii`` (:func:`diagsink.attention.diagonal_entries`):
            ``None``, a number (the same on every diagonal entry: cached), ``[T]``, ``[H, T]``
            or a pattern per sequence ``[..., H, T]`` (broadcastable to ``[*lead, H, T]``).
        lead, n_heads, length: the leading axes of the input, ``H`` and ``T``.
        groups: ``G`` (:func:`pack_groups`).
        like: a tensor with the dtype and device of the bias.

    Returns:
        ``None`` (nothing to add, no packing), ``[G·T, G·T]``, ``[H, G·T, G·T]`` or
        ``[n_seq / G, H, G·T, G·T]``.
    """
    if diagonal is None and groups == 1:
        return None
    if diagonal is None or isinstance(diagonal, float):  # the same in every forward pass
        value = 0.0 if diagonal is None else diagonal
        cached = groups > 1 or length <= _CACHE_MAX_T
        build = _packed_constant if cached else _packed_constant.__wrapped__
        return build(length, groups, value, like.dtype, like.device)
    if diagonal.dim() > 2:  # one pattern per sequence: [n_seq, H, T]
        diagonal = diagonal.expand(*lead, n_heads, length).reshape(-1, n_heads, length)
    return pack_diagonal_bias(diagonal, groups)


def fused_attention(
    layer: TemporalAttention,
    h: torch.Tensor,
    diagonal: float | torch.Tensor | None,
    p_drop: float,
) -> torch.Tensor:
    """The fast path, ``Σ_j α_ij v_j`` by the fused kernel: ``[..., T, C] -> [..., T, C]``.

    Computed by ``scaled_dot_product_attention``, heads merged (``W_O`` is left to the caller).

    ``layer`` provides the projections and the head split; ``diagonal`` is its regularizer's
    ``b_ii`` (:meth:`~diagsink.attention.TemporalAttention.diagonal`). The leading axes are
    flattened into one batch axis first (the fused CPU kernels want 4-D input); a ``[T, T]``
    bias broadcasts and is never expanded. Short sequences on the CPU are packed ``G`` at a
    time into sequences of ``G·T`` steps whose bias is ``-inf`` between different sequences
    (see :func:`pack_groups`): the same function, computed faster, with or without a
    regularizer.
    """
    *lead, length, channels = h.shape
    n_seq = math.prod(lead)
    groups = pack_groups(n_seq, length, h.device, p_drop)
    # G consecutive sequences end to end
    hp = h.reshape(n_seq // groups, groups * length, channels)
    q = layer.split_heads(layer.q_proj(hp))  # [n_seq / G, H, G·T, d_h]
    k = layer.split_heads(layer.k_proj(hp))
    v = layer.split_heads(layer.v_proj(hp))
    b = fused_bias(diagonal, tuple(lead), layer.n_heads, length, groups, h)
    mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=b, dropout_p=p_drop)
    return layer.merge_heads(mixed).reshape(*lead, length, channels)


def _project_qkv(
    h: torch.Tensor, weight: torch.Tensor, b_qkv: torch.Tensor | None, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v`` by one GEMM: ``h`` ``[M, T, C]`` -> three ``[M H, T, d_h]`` (heads split)."""
    n_seq, length, channels = h.shape
    qkv = F.linear(h, weight, b_qkv)  # [M, T, 3 C]
    qkv = qkv.reshape(n_seq, length, 3, heads, channels // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.reshape(3, n_seq * heads, length, channels // heads)
    return q, k, v


class _DropoutAttention(torch.autograd.Function):
    """``dropout(softmax(q k^T + b)) v`` with ``q, k, v`` projected from ``h``, and its backward pass.

    Inputs: ``h`` ``[M, T, C]`` (``M`` sequences, contiguous), ``weight`` ``[3 C, C]``
    (``W_Q / sqrt(d_h)``, ``W_K``, ``W_V`` stacked), ``b_qkv`` ``[3 C]`` or ``None``, ``bias``
    ``None``, ``[T, T]`` or ``[M H, T, T]`` (a constant: no gradient), ``p_drop`` and the number
    of heads ``H``. Output: ``[M H, T, d_h]``.

    Saved for the backward pass: ``h`` (which the weight gradient needs in any case), the
    weights ``α`` ``[M H, T, T]`` and the boolean keep mask (a byte per entry instead of a
    float). ``q, k, v`` (``3 C`` numbers per position, three times ``h``) are not kept: the
    backward pass recomputes them from ``h`` with the same GEMM.
    """

    @staticmethod
    def forward(ctx, h, weight, b_qkv, bias, p_drop: float, heads: int):
        q, k, v = _project_qkv(h, weight, b_qkv, heads)
        s = torch.bmm(q, k.transpose(1, 2))  # [M H, T, T]
        if bias is not None:
            s += bias
        s -= s.amax(-1, keepdim=True)  # softmax, in place on the new tensor s
        alpha = s.exp_()
        alpha /= alpha.sum(-1, keepdim=True)
        # the draws of F.dropout (same generator calls, same values), stored as bytes
        keep = torch.empty_like(alpha, dtype=torch.bool).bernoulli_(1.0 - p_drop)
        ctx.scale, ctx.heads = 1.0 / (1.0 - p_drop), heads
        ctx.save_for_backward(h, weight, b_qkv, alpha, keep)
        return torch.bmm(alpha * keep * ctx.scale, v)

    @staticmethod
    def backward(ctx, grad):
        h, weight, b_qkv, alpha, keep = ctx.saved_tensors
        q, k, v = _project_qkv(h, weight, b_qkv, ctx.heads)  # recomputed, not saved
        grad = grad.contiguous()
        grad_qkv = torch.empty((3, *q.shape), dtype=q.dtype, device=q.device)
        torch.bmm((alpha * keep * ctx.scale).transpose(1, 2), grad, out=grad_qkv[2])
        g = torch.bmm(grad, v.transpose(1, 2))  # d loss / d dropped weights
        g *= keep
        g *= ctx.scale
        g *= alpha  # softmax backward: α (g - Σ_j α_j g_j)
        g -= alpha * g.sum(-1, keepdim=True)
        torch.bmm(g, k, out=grad_qkv[0])
        torch.bmm(g.transpose(1, 2), q, out=grad_qkv[1])
        n_seq, length, channels = h.shape
        # [3, M H, T, d_h] back to the projection's output layout [M T, 3 C]
        grad_qkv = grad_qkv.view(3, n_seq, ctx.heads, length, channels // ctx.heads)
        grad_qkv = grad_qkv.permute(1, 3, 0, 2, 4).reshape(n_seq * length, 3 * channels)
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = (grad_qkv @ weight).view(h.shape)
        if ctx.needs_input_grad[1]:
            grad_w = grad_qkv.T @ h.reshape(n_seq * length, channels)
        if b_qkv is not None and ctx.needs_input_grad[2]:
            grad_b = grad_qkv.sum(0)
        return grad_h, grad_w, grad_b, None, None, None


def dropout_attention(
    layer: TemporalAttention, h: torch.Tensor, bias: torch.Tensor | None, p_drop: float
) -> torch.Tensor:
    """``Σ_j dropout(α)_ij v_j`` with attention dropout, heads merged: ``[..., T, C] -> [..., T, C]``.

    The layer's explicit formula ``dropout(softmax(q k^T / sqrt(d_h) + b), p) v`` (``W_O`` is
    left to the caller), computed by :class:`_DropoutAttention`: the three projections as one
    GEMM with ``1 / sqrt(d_h)`` folded into ``W_Q`` and ``b_Q``, recomputed in the backward pass
    instead of stored. ``bias`` is the regularizer's additive bias (``None``, ``[T, T]`` or
    ``[..., H, T, T]``). The keep mask is drawn as ``F.dropout`` draws it
    (``bernoulli_(1 - p)``), so the same seed drops the same weights as the explicit path and
    as ``nn.MultiheadAttention``.
    """
    *lead, length, channels = h.shape
    n_seq, heads, d_head = math.prod(lead), layer.n_heads, layer.d_head
    scale = 1.0 / math.sqrt(d_head)
    projections = (layer.q_proj, layer.k_proj, layer.v_proj)
    weight = torch.cat([layer.q_proj.weight * scale, layer.k_proj.weight, layer.v_proj.weight])
    b_qkv = None
    if all(proj.bias is not None for proj in projections):
        b_qkv = torch.cat([layer.q_proj.bias * scale, layer.k_proj.bias, layer.v_proj.bias])
    if bias is not None and bias.dim() > 2:  # one bias per sequence and head
        bias = bias.expand(*lead, heads, length, length).reshape(n_seq * heads, length, length)
    h = h.reshape(n_seq, length, channels).contiguous()  # [M, T, C]
    mixed = _DropoutAttention.apply(h, weight, b_qkv, bias, p_drop, heads)  # [M H, T, d_h]
    mixed = mixed.view(n_seq, heads, length, d_head).transpose(1, 2)
    return mixed.reshape(*lead, length, channels)
