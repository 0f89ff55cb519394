"""Temporal self-attention with the three diagonal regularizers of the paper.

A layer maps ``x`` of shape ``[..., T, C]`` (time on the second-to-last axis; leading
axes such as ``[batch, nodes]`` are independent sequences) to ``y`` of the same shape::

    y_i = x_i + W_O concat_h( Σ_j α^h_ij W^h_V x_j ),   α^h_ij = softmax_j(s^h_ij),
    s^h_ij = q^h_i · k^h_j / sqrt(d_h) + b_ij,

where the regularizer's bias ``b`` acts on the diagonal only (``b_ij = 0`` for ``i != j``):

* ``diag=None``      ``b = 0``;
* ``diag="mask"``    ``b_ii = -inf`` (a step never attends to itself);
* ``diag="dropout"`` ``b_ii = -inf`` with probability ``diag_p``, drawn anew on every forward
  pass in training mode only (``b = 0`` in eval mode);
* ``diag="penalty"`` ``b_ii = diag_penalty`` (a constant added *after* the 1/sqrt(d_h) scaling).

Explained in the chapter "Attention over time, step by step" (``book/attention.ipynb``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import is_int, is_real
from .errors import ConfigError
from .positional import PositionalEncoding

__all__ = [
    "TemporalAttention",
    "diagonal_bias",
    "diagonal_entries",
    "bias_from_diagonal",
    "penalized_diagonal",
    "DIAG_OPTIONS",
    "NORM_OPTIONS",
]

#: The values ``diag`` may take.
DIAG_OPTIONS = (None, "mask", "dropout", "penalty")
#: The values ``norm`` may take.
NORM_OPTIONS = (None, "post", "pre")


def penalized_diagonal(alpha, penalty: float):
    """A row's self-weight after the penalty ``c`` is added to its diagonal logit alone.

    The other logits unchanged, ``α_ii`` becomes ``α_ii e^c / (α_ii e^c + 1 − α_ii)``; for a
    uniform row (``α_ii = 1/T``) that is ``e^c / (e^c + T − 1)``. Works on floats and tensors
    (element-wise). Attention chapter, section on the penalty; used by the heatmaps chapter.
    """
    scaled = alpha * math.exp(penalty)
    return scaled / (scaled + 1 - alpha)


def _check_diag_args(diag: str | None, diag_p: float, diag_penalty: float) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) naming the bad argument and the allowed values."""
    if not (diag is None or (isinstance(diag, str) and diag in DIAG_OPTIONS)):
        raise ConfigError(
            f"diag={diag!r} is not known; choose one of {DIAG_OPTIONS} "
            "(None: no regularizer, 'mask', 'dropout' or 'penalty' on the diagonal logits)."
        )
    if not is_real(diag_p) or not 0.0 <= float(diag_p) < 1.0:
        raise ConfigError(
            f"diag_p={diag_p!r} must be a probability in [0, 1): the chance that a diagonal "
            "logit is dropped (the paper uses 0.2). Use diag='mask' to drop every diagonal entry."
        )
    if not is_real(diag_penalty) or not math.isfinite(float(diag_penalty)):
        raise ConfigError(
            f"diag_penalty={diag_penalty!r} must be a finite number (the paper uses -0.1); "
            "for an infinite penalty use diag='mask'."
        )


def _check_dropped(dropped: torch.Tensor, length: int) -> torch.Tensor:
    """A valid boolean dropout pattern ``[..., T]`` (0/1 integers accepted), else a ValueError."""
    if not isinstance(dropped, torch.Tensor):
        raise ValueError(
            f"dropped must be a boolean tensor ([T] or [..., H, T]), got {type(dropped).__name__}."
        )
    if dropped.dim() == 0 or dropped.shape[-1] != length:
        raise ValueError(
            f"dropped has shape {tuple(dropped.shape)} but the sequence has T={length} steps; "
            f"pass a boolean pattern of shape [T] = [{length}] or [..., H, T] (last axis {length})."
        )
    if dropped.dtype != torch.bool:
        if (
            dropped.is_floating_point()
            or dropped.is_complex()
            or bool(((dropped != 0) & (dropped != 1)).any())
        ):
            raise ValueError(
                "dropped must hold booleans (True = this diagonal logit is set to -inf)."
            )
        dropped = dropped.to(torch.bool)
    if length == 1 and bool(dropped.any()):
        raise ValueError(
            "dropped drops the diagonal of a sequence with T=1, which leaves no key to attend to "
            "(softmax over an empty set); with T=1 nothing can be dropped."
        )
    return dropped


def diagonal_entries(
    length: int,
    diag: str | None,
    *,
    diag_p: float = 0.2,
    diag_penalty: float = -0.1,
    training: bool = False,
    dropped: torch.Tensor | None = None,
    pattern_shape: tuple[int, ...] = (),
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> float | torch.Tensor | None:
    """The diagonal ``b_ii`` of a regularizer's logit bias (the bias is zero off the diagonal).

    Args:
        length: sequence length ``T`` (at least 1).
        diag: one of :data:`DIAG_OPTIONS`.
        diag_p: drop probability for ``"dropout"``, in ``[0, 1)``.
        diag_penalty: finite constant for ``"penalty"``.
        training: dropout draws a pattern only when ``True``.
        dropped: an explicit boolean pattern ``[..., T]`` of dropped diagonal entries that
            replaces the random draw (to freeze a pattern, for Jacobians and tests); honoured
            in any mode, only allowed with ``diag="dropout"``.
        pattern_shape: leading shape of a random draw, ``[*pattern_shape, T]``: ``()`` is one
            pattern shared by every sequence and head (the paper's released code).
        dtype, device: of a dropout pattern.

    Returns:
        ``None`` when there is nothing to add (``diag=None``; dropout in eval mode, with
        ``diag_p = 0`` or ``T = 1``); the number ``-inf`` (mask) or ``diag_penalty`` (penalty),
        the same on every diagonal entry; for dropout a float tensor ``[*pattern_shape, T]``
        (or of ``dropped``'s shape) holding ``-inf`` where dropped and ``0`` elsewhere.

    Raises:
        ValueError: for an unknown ``diag``, ``diag_p`` outside ``[0, 1)``, a non-finite
            ``diag_penalty``, a bad ``dropped`` pattern or one given with another ``diag``, and
            for ``diag="mask"`` with ``T = 1`` (the softmax would have no key left: a NaN).
    """
    _check_diag_args(diag, diag_p, diag_penalty)
    if not is_int(length) or length < 1:
        raise ValueError(f"length={length!r} must be a positive integer (the sequence length T).")
    if dropped is not None and diag != "dropout":
        raise ValueError(
            f"dropped=... fixes a diagonal-dropout pattern, but diag={diag!r}; pass dropped only "
            "with diag='dropout'."
        )
    if diag == "mask" and length < 2:
        raise ValueError(
            "diag='mask' on a sequence of length T=1 leaves no key to attend to (softmax over "
            "an empty set, a NaN); use sequences with T >= 2, or diag=None, 'dropout' or "
            "'penalty' (dropout never drops the only key)."
        )
    if diag is None:
        return None
    if diag in ("mask", "penalty"):
        return float(diag_penalty) if diag == "penalty" else -math.inf
    if dropped is None:
        if not training or diag_p == 0.0 or length < 2:
            return None  # eval mode; p = 0; or T = 1, where dropping the only key is undefined
        dropped = torch.rand((*pattern_shape, int(length)), device=device) < diag_p
    dropped = _check_dropped(dropped, int(length)).to(device=device)
    return torch.zeros(dropped.shape, dtype=dtype, device=device).masked_fill_(dropped, -math.inf)


def bias_from_diagonal(
    entries: float | torch.Tensor | None,
    length: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The bias ``b`` with diagonal ``entries`` (:func:`diagonal_entries`), zero elsewhere.

    Returns ``None`` for ``None``, ``[T, T]`` for a number or a ``[T]`` pattern (it broadcasts
    over batch and heads), ``[..., T, T]`` for a pattern ``[..., T]``.
    """
    if entries is None:
        return None
    if isinstance(entries, float):
        return torch.zeros(length, length, dtype=dtype, device=device).fill_diagonal_(entries)
    return torch.diag_embed(entries)


def diagonal_bias(
    length: int,
    diag: str | None,
    *,
    diag_p: float = 0.2,
    diag_penalty: float = -0.1,
    training: bool = False,
    dropped: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The additive bias ``b`` that a regularizer puts on the logits of a sequence: ``[T, T]``.

    ``b_ij = 0`` for ``i != j``; the diagonal is :func:`diagonal_entries` (same arguments;
    a random dropout pattern is one ``[T]`` pattern for all sequences and heads, as in the
    paper's code). Returns ``None`` when there is nothing to add, ``[T, T]``, or
    ``[..., T, T]`` for an explicit pattern ``dropped`` of shape ``[..., T]``.
    """
    kw = dict(diag_p=diag_p, diag_penalty=diag_penalty, training=training, dropped=dropped)
    entries = diagonal_entries(length, diag, dtype=dtype, device=device, **kw)
    return bias_from_diagonal(entries, length, dtype, device)


class TemporalAttention(nn.Module):
    """Multi-head self-attention over time with an optional diagonal regularizer.

    Args:
        d_model: channels ``C`` of the input and output.
        n_heads: heads ``H``; ``d_model`` must be divisible by it (head size ``d_h = C / H``).
        diag: ``None``, ``"mask"``, ``"dropout"`` or ``"penalty"`` (see the module docstring).
        diag_p: probability that a diagonal logit is set to ``-inf`` (``diag="dropout"``).
        diag_penalty: constant added to the diagonal logits (``diag="penalty"``).
        diag_shared: ``True``: one dropout pattern per forward pass, shared by every sequence
            in the batch and every head (the paper's released code: all ``B·N·H`` sequences lose
            the *same* diagonal entries in a step); ``False``: an independent pattern for every
            sequence and head (each sequence sees its own noise; the bias is then a
            ``[..., H, T, T]`` tensor).
        residual: ``True`` gives ``y = x + attn(x)``; ``False`` is the paper's variant (a).
        dropout: dropout on the attention weights (training mode only).
        norm: ``None``, ``"post"`` (``LayerNorm(x + attn(x))``, the paper) or ``"pre"``
            (``x + attn(LayerNorm(x))``).
        pos_encoding: ``None``, ``"sinusoidal"``, ``"tape"`` or ``"learned"``; added to the
            input before the projections (so the residual carries it too).
        max_len: longest sequence for ``pos_encoding="learned"``.
        bias: whether the projections have biases.
        out_proj: whether to apply the output projection ``W_O`` (as in
            ``nn.MultiheadAttention``); without it the heads are simply concatenated.

    Shapes:
        ``x``: ``[..., T, C]``; ``y``: ``[..., T, C]``; attention ``[..., H, T, T]``
        (rows = queries, columns = keys, rows sum to 1).

    Two paths compute the same function: with ``return_attention`` the logits, the softmax and
    the weighted sum are written out (the weights are returned); without it one call of
    ``torch.nn.functional.scaled_dot_product_attention`` computes the same product without
    storing the weights (the regularizer enters as its additive float mask ``attn_mask``,
    attention dropout as its ``dropout_p``; both paths draw the same dropout numbers).
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
        if not is_int(d_model) or d_model < 1:
            raise ConfigError(f"d_model={d_model!r} must be a positive integer (the channels C).")
        if not is_int(n_heads) or n_heads < 1:
            raise ConfigError(f"n_heads={n_heads!r} must be a positive integer.")
        if d_model % n_heads:
            divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
            raise ConfigError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; choose n_heads among "
                f"the divisors of d_model: {divisors[:12]}{' ...' if len(divisors) > 12 else ''}."
            )
        _check_diag_args(diag, diag_p, diag_penalty)
        if not is_real(dropout) or not 0.0 <= float(dropout) < 1.0:
            raise ConfigError(
                f"dropout={dropout!r} must be a probability in [0, 1) (attention dropout)."
            )
        if not (isinstance(norm, (str, type(None))) and norm in NORM_OPTIONS):
            raise ConfigError(f"norm={norm!r} is not known; choose one of {NORM_OPTIONS}.")
        d_model, n_heads = int(d_model), int(n_heads)
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.diag = diag
        self.diag_p = float(diag_p)
        self.diag_penalty = float(diag_penalty)
        self.diag_shared = bool(diag_shared)
        self.residual = bool(residual)
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
        """``[..., T, C] -> [..., H, T, d_h]``: head ``h`` gets channels ``h·d_h ... (h+1)·d_h - 1``."""
        *lead, length, _ = z.shape
        return z.reshape(*lead, length, self.n_heads, self.d_head).transpose(-3, -2)

    def merge_heads(self, z: torch.Tensor) -> torch.Tensor:
        """``[..., H, T, d_h] -> [..., T, C]`` (the inverse of :meth:`split_heads`: concatenate the heads)."""
        z = z.transpose(-3, -2)
        return z.reshape(*z.shape[:-2], self.d_model)

    def diagonal(
        self, x: torch.Tensor, dropped: torch.Tensor | None = None
    ) -> float | torch.Tensor | None:
        """The regularizer's diagonal ``b_ii`` for ``x`` ``[..., T, C]`` (:func:`diagonal_entries`).

        ``None``, a number (mask, penalty), or a dropout pattern: ``[T]`` (shared, or an
        explicit ``[T]``), ``[..., H, T]`` (independent patterns, or an explicit ``dropped``
        with more than one axis). In training mode with ``diag="dropout"`` every call draws.
        """
        lead, length = tuple(x.shape[:-2]), x.shape[-2]
        if isinstance(dropped, torch.Tensor) and dropped.dim() > 1 and self.diag == "dropout":
            target = (*lead, self.n_heads, length)
            try:
                fits = torch.broadcast_shapes(tuple(dropped.shape), target) == target
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(
                    f"dropped has shape {tuple(dropped.shape)}, which does not broadcast to the "
                    f"pattern shape [..., H, T] = {list(target)}."
                )
        shape = () if self.diag_shared else (*lead, self.n_heads)  # of a random pattern
        kw = dict(diag_p=self.diag_p, diag_penalty=self.diag_penalty, training=self.training)
        kw.update(dropped=dropped, pattern_shape=shape, dtype=x.dtype, device=x.device)
        return diagonal_entries(length, self.diag, **kw)

    def bias(self, x: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor | None:
        """The regularizer's additive logit bias for input ``x`` ``[..., T, C]``.

        Returns ``None``, a ``[T, T]`` tensor (mask, penalty, shared dropout) or a
        ``[..., H, T, T]`` tensor (independent dropout patterns, or an explicit ``dropped``
        pattern with more than one axis). In training mode with ``diag="dropout"`` every
        call draws a new pattern.
        """
        return bias_from_diagonal(self.diagonal(x, dropped), x.shape[-2], x.dtype, x.device)

    def _logits(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """``q k^T / sqrt(d_h) + b``: ``[..., T, C] -> [..., H, T, T]`` (``b`` broadcasts to the result)."""
        # scaling q: T·d numbers, not T·T
        q = self.split_heads(self.q_proj(x)) / math.sqrt(self.d_head)
        k = self.split_heads(self.k_proj(x))
        s = q @ k.transpose(-1, -2)  # [..., H, T, T]
        # in place: s is new, and its gradient does not need it
        return s if b is None else s.add_(b)

    def scores(self, x: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``s = q k^T / sqrt(d_h) + b``: ``[..., T, C] -> [..., H, T, T]``.

        The regularizer's bias ``b`` is added *after* the ``1/sqrt(d_h)`` scaling, so a
        penalty of ``-0.1`` lowers every diagonal logit by exactly ``0.1``. ``x`` is the
        input *after* positional encoding (and pre-norm, if any), as inside :meth:`forward`.
        In training mode with ``diag="dropout"`` (and no ``dropped``), each call draws a
        new pattern.
        """
        return self._logits(x, self.bias(x, dropped))

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise ValueError(
                f"x must be a torch.Tensor of shape [..., T, C], got {type(x).__name__}."
            )
        if x.dim() < 2:
            raise ValueError(
                f"x has shape {tuple(x.shape)} (rank {x.dim()}); TemporalAttention expects rank >= 2, "
                "[..., T, C] with time on the second-to-last axis (e.g. [batch, nodes, T, C])."
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x has {x.shape[-1]} channels in its last axis but d_model={self.d_model}; "
                f"the input must be [..., T, C] with C = d_model = {self.d_model}."
            )
        if x.shape[-2] < 1:
            raise ValueError(
                f"x has shape {tuple(x.shape)}: the time axis (second-to-last) is empty; T must be >= 1."
            )
        if not x.is_floating_point():
            raise ValueError(f"x has dtype {x.dtype}; pass floating-point input (e.g. x.float()).")

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        return_attention: bool = False,
        *,
        dropped: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``y = x + W_O concat_h( dropout(softmax(q k^T / sqrt(d_h) + b)) v )``: ``[..., T, C] -> [..., T, C]``.

        Args:
            x: ``[..., T, C]`` (at least 2-D).
            return_attention: also return the attention weights ``[..., H, T, T]`` (taken
                before attention dropout, so every row sums to 1): the formula written out.
                Otherwise one fused ``scaled_dot_product_attention`` call computes the same.
            dropped: optional fixed boolean pattern of dropped diagonal entries for
                ``diag="dropout"`` (``[T]`` or ``[..., H, T]``), replacing the random draw.

        Returns:
            ``y`` ``[..., T, C]``, or ``(y, attn)``.
        """
        self._check_input(x)
        x = self.pos(x)
        h = self.norm(x) if self.norm_kind == "pre" else x
        p_drop = self.dropout if self.training else 0.0
        b = self.bias(h, dropped)  # the regularizer: None, [T, T] or [..., H, T, T]
        attn = None
        if return_attention:  # the formula, written out
            attn = torch.softmax(self._logits(h, b), dim=-1)  # [..., H, T, T]
            v = self.split_heads(self.v_proj(h))  # [..., H, T, d_h]
            mixed = F.dropout(attn, p_drop) @ v  # [..., H, T, d_h]
        else:  # the same function in one fused call (leading axes flattened: [M, H, T, d_h])
            *lead, length, channels = h.shape
            flat = h.reshape(-1, length, channels).contiguous()  # one copy for q, k and v
            q, k, v = (self.split_heads(p(flat)) for p in (self.q_proj, self.k_proj, self.v_proj))
            if b is not None and b.dim() > 2:  # one bias per sequence and head
                b = b.expand(*lead, self.n_heads, length, length).reshape(-1, *b.shape[-3:])
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=b, dropout_p=p_drop)
            mixed = mixed.reshape(*lead, self.n_heads, length, self.d_head)
        out = self.out_proj(self.merge_heads(mixed))  # [..., T, C]
        y = x + out if self.residual else out
        if self.norm_kind == "post":
            y = self.norm(y)
        return (y, attn) if return_attention else y  # attn: [..., H, T, T]

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"n_heads={self.n_heads}", f"diag={self.diag!r}"]
        if self.diag == "dropout":
            parts.append(f"diag_p={self.diag_p}, diag_shared={self.diag_shared}")
        if self.diag == "penalty":
            parts.append(f"diag_penalty={self.diag_penalty}")
        parts.append(f"residual={self.residual}, norm={self.norm_kind!r}")
        if self.dropout:
            parts.append(f"dropout={self.dropout}")
        return ", ".join(parts)
