"""Temporal self-attention with the three diagonal regularizers of the paper.

A layer maps ``x`` of shape ``[..., T, C]`` (time on the second-to-last axis; leading
axes such as ``[batch, nodes]`` are independent sequences) to ``y`` of the same shape::

    y_i = x_i + W_O concat_h( Σ_j α^h_ij W^h_V x_j ),   α^h_ij = softmax_j(s^h_ij),
    s^h_ij = q^h_i · k^h_j / sqrt(d_h) + b_ij,

where ``b`` acts on the diagonal only:

* ``diag=None``      ``b = 0``;
* ``diag="mask"``    ``b_ii = -inf`` (a step never attends to itself);
* ``diag="dropout"`` ``b_ii = -inf`` with probability ``diag_p`` (training mode only);
* ``diag="penalty"`` ``b_ii = diag_penalty`` (a constant added after the 1/sqrt(d) scaling).

Explained in the chapter "Attention over time, step by step" (``book/attention.ipynb``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .positional import PositionalEncoding

__all__ = ["TemporalAttention", "diagonal_bias", "DIAG_OPTIONS", "NORM_OPTIONS"]

DIAG_OPTIONS = (None, "mask", "dropout", "penalty")
NORM_OPTIONS = (None, "post", "pre")


def _check_diag_args(diag: str | None, diag_p: float, diag_penalty: float) -> None:
    if diag not in DIAG_OPTIONS:
        raise ValueError(f"diag={diag!r} is not known; choose one of {DIAG_OPTIONS}.")
    if not (isinstance(diag_p, (int, float)) and 0.0 <= float(diag_p) < 1.0):
        raise ValueError(f"diag_p={diag_p!r} must be a probability in [0, 1).")
    if not (isinstance(diag_penalty, (int, float)) and math.isfinite(float(diag_penalty))):
        raise ValueError(
            f"diag_penalty={diag_penalty!r} must be a finite number (use diag='mask' for -inf)."
        )


def diagonal_bias(
    length: int,
    diag: str | None,
    *,
    diag_p: float = 0.2,
    diag_penalty: float = -0.1,
    training: bool = False,
    shared: bool = True,
    batch_shape: tuple[int, ...] = (),
    n_heads: int = 1,
    dropped: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The additive bias ``b`` that a regularizer puts on the attention logits.

    Args:
        length: sequence length ``T``.
        diag: one of :data:`DIAG_OPTIONS`.
        diag_p: drop probability for ``"dropout"``.
        diag_penalty: constant for ``"penalty"``.
        training: dropout acts only when ``True``.
        shared: for ``"dropout"``: one pattern ``[T]`` shared by the whole batch and all
            heads (the paper's released code), or, when ``False``, an independent pattern
            for every sequence and head, ``[*batch_shape, H, T]``.
        batch_shape, n_heads: used only for independent dropout patterns.
        dropped: an explicit boolean pattern of dropped diagonal entries (``[T]`` or
            ``[..., H, T]``) that replaces the random draw; used to freeze a pattern (for
            Jacobians and tests). Honoured in any mode.
        generator: optional random generator for the dropout draw.

    Returns:
        ``None`` when there is nothing to add, else a float tensor ``[T, T]`` or
        ``[*batch_shape, H, T, T]`` holding ``0``, ``diag_penalty`` or ``-inf``.

    Raises:
        ValueError: for ``diag="mask"`` with ``T = 1`` (the only key would be masked,
            so the softmax has nothing to normalise: a NaN). Use ``T >= 2``.
    """
    _check_diag_args(diag, diag_p, diag_penalty)
    eye = torch.eye(length, dtype=torch.bool, device=device)
    if diag is None:
        return None
    if diag == "penalty":
        return torch.zeros(length, length, dtype=dtype, device=device).masked_fill(eye, float(diag_penalty))
    if diag == "mask":
        if length < 2:
            raise ValueError(
                "diag='mask' on a sequence of length T=1 leaves no key to attend to "
                "(softmax over an empty set); use sequences with T >= 2 or another diag option."
            )
        return torch.zeros(length, length, dtype=dtype, device=device).masked_fill(eye, float("-inf"))
    # diag == "dropout"
    if dropped is None:
        if not training or diag_p == 0.0 or length < 2:
            # eval mode; p = 0; or T = 1, where dropping the only key is undefined: nothing to do
            return None
        shape = (length,) if shared else (*batch_shape, n_heads, length)
        dropped = torch.rand(shape, generator=generator, device=device if generator is None else generator.device)
        dropped = (dropped < diag_p).to(device)
    dropped = dropped.to(device=device, dtype=torch.bool)
    if dropped.shape[-1] != length:
        raise ValueError(f"dropped pattern has {dropped.shape[-1]} steps but T={length}.")
    bias = torch.zeros(*dropped.shape, length, dtype=dtype, device=device)  # [..., T, T]
    return bias.masked_fill(dropped[..., :, None] & eye, float("-inf"))


class TemporalAttention(nn.Module):
    """Multi-head self-attention over time with an optional diagonal regularizer.

    Args:
        d_model: channels ``C`` of the input and output.
        n_heads: heads ``H``; ``d_model`` must be divisible by it (head size ``d_h = C / H``).
        diag: ``None``, ``"mask"``, ``"dropout"`` or ``"penalty"`` (see module docstring).
        diag_p: probability that a diagonal logit is set to ``-inf`` (``diag="dropout"``).
        diag_penalty: constant added to the diagonal logits (``diag="penalty"``).
        diag_shared: ``True``: one dropout pattern per forward pass shared across batch
            and heads (the paper); ``False``: independent patterns per sequence and head.
        residual: ``True`` gives ``y = x + attn(x)``; ``False`` is the paper's variant (a).
        dropout: dropout on the attention weights (training mode only).
        norm: ``None``, ``"post"`` (``LayerNorm(x + attn(x))``, the paper) or ``"pre"``
            (``x + attn(LayerNorm(x))``).
        pos_encoding: ``None``, ``"sinusoidal"``, ``"tape"`` or ``"learned"``; added to the
            input before the projections (and the residual).
        max_len: longest sequence for ``pos_encoding="learned"``.
        bias: whether the projections have biases.
        out_proj: whether to apply the output projection ``W_O`` (as in
            ``nn.MultiheadAttention``); without it the heads are simply concatenated.

    Shapes:
        ``x``: ``[..., T, C]``; ``y``: ``[..., T, C]``; attention ``[..., H, T, T]``
        (rows = queries, columns = keys, rows sum to 1).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 1,
        *,
        diag: str | None = None,
        diag_p: float = 0.2,
        diag_penalty: float = -0.1,
        diag_shared: bool = True,
        residual: bool = True,
        dropout: float = 0.0,
        norm: str | None = None,
        pos_encoding: str | None = None,
        max_len: int = 1024,
        bias: bool = True,
        out_proj: bool = True,
    ) -> None:
        super().__init__()
        if not (isinstance(d_model, int) and d_model > 0):
            raise ValueError(f"d_model={d_model!r} must be a positive integer.")
        if not (isinstance(n_heads, int) and n_heads > 0):
            raise ValueError(f"n_heads={n_heads!r} must be a positive integer.")
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; choose n_heads "
                f"among the divisors of d_model, e.g. {[h for h in range(1, d_model + 1) if d_model % h == 0][:8]}."
            )
        _check_diag_args(diag, diag_p, diag_penalty)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout!r} must be in [0, 1).")
        if norm not in NORM_OPTIONS:
            raise ValueError(f"norm={norm!r} is not known; choose one of {NORM_OPTIONS}.")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.diag = diag
        self.diag_p = float(diag_p)
        self.diag_penalty = float(diag_penalty)
        self.diag_shared = bool(diag_shared)
        self.residual = residual
        self.dropout = float(dropout)
        self.norm_kind = norm
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias) if out_proj else nn.Identity()
        self.norm = nn.LayerNorm(d_model) if norm is not None else nn.Identity()
        self.pos = PositionalEncoding(pos_encoding, d_model, max_len)

    # -- pieces, usable on their own (the chapters and the Jacobian module use them) --------
    def split_heads(self, z: torch.Tensor) -> torch.Tensor:
        """``[..., T, C] -> [..., H, T, d_h]``."""
        *lead, length, _ = z.shape
        return z.reshape(*lead, length, self.n_heads, self.d_head).transpose(-3, -2)

    def merge_heads(self, z: torch.Tensor) -> torch.Tensor:
        """``[..., H, T, d_h] -> [..., T, C]``."""
        z = z.transpose(-3, -2)
        return z.reshape(*z.shape[:-2], self.d_model)

    def bias(self, x: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor | None:
        """The regularizer's additive logit bias for input ``x`` ``[..., T, C]``."""
        return diagonal_bias(
            x.shape[-2],
            self.diag,
            diag_p=self.diag_p,
            diag_penalty=self.diag_penalty,
            training=self.training,
            shared=self.diag_shared,
            batch_shape=tuple(x.shape[:-2]),
            n_heads=self.n_heads,
            dropped=dropped,
            dtype=x.dtype,
            device=x.device,
        )

    def scores(self, x: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``s = q k^T / sqrt(d_h) + b``: ``[..., T, C] -> [..., H, T, T]``.

        ``x`` is the input *after* positional encoding (and pre-norm, if any).
        """
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        b = self.bias(x, dropped)
        return s if b is None else s + b

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        return_attention: bool = False,
        *,
        dropped: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Apply the layer.

        Args:
            x: ``[..., T, C]`` (at least 2-D).
            return_attention: also return the attention weights ``[..., H, T, T]``
                (taken before attention dropout, so every row sums to 1). This uses the
                explicit path; otherwise the fused ``scaled_dot_product_attention`` runs.
            dropped: optional fixed boolean pattern of dropped diagonal entries for
                ``diag="dropout"`` (``[T]`` or ``[..., H, T]``), replacing the random draw.

        Returns:
            ``y`` ``[..., T, C]``, or ``(y, attn)``.
        """
        if x.dim() < 2:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; TemporalAttention expects [..., T, C] "
                "with time on the second-to-last axis (e.g. [batch, nodes, T, C])."
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x has {x.shape[-1]} channels in its last axis but d_model={self.d_model}; "
                "the input must be [..., T, C] with C = d_model."
            )
        x = self.pos(x)
        h = self.norm(x) if self.norm_kind == "pre" else x
        p_drop = self.dropout if self.training else 0.0
        if return_attention:
            attn = torch.softmax(self.scores(h, dropped), dim=-1)  # [..., H, T, T]
            v = self.split_heads(self.v_proj(h))
            mixed = F.dropout(attn, p_drop, training=True) @ v if p_drop else attn @ v
        else:
            q = self.split_heads(self.q_proj(h))
            k = self.split_heads(self.k_proj(h))
            v = self.split_heads(self.v_proj(h))
            b = self.bias(h, dropped)
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=b, dropout_p=p_drop)
            attn = None
        out = self.out_proj(self.merge_heads(mixed))
        y = x + out if self.residual else out
        if self.norm_kind == "post":
            y = self.norm(y)
        return (y, attn) if return_attention else y

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"n_heads={self.n_heads}", f"diag={self.diag!r}"]
        if self.diag == "dropout":
            parts.append(f"diag_p={self.diag_p}, diag_shared={self.diag_shared}")
        if self.diag == "penalty":
            parts.append(f"diag_penalty={self.diag_penalty}")
        parts.append(f"residual={self.residual}, norm={self.norm_kind!r}")
        return ", ".join(parts)
