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
import numbers
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError
from .positional import PositionalEncoding

__all__ = [
    "TemporalAttention",
    "diagonal_bias",
    "pack_groups",
    "pack_diagonal_bias",
    "DIAG_OPTIONS",
    "NORM_OPTIONS",
    "PACK_LENGTH",
]

#: The values ``diag`` may take.
DIAG_OPTIONS = (None, "mask", "dropout", "penalty")
#: The values ``norm`` may take.
NORM_OPTIONS = (None, "post", "pre")


def _is_int(value: object) -> bool:
    """An integer (Python or NumPy), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """A real number (Python or NumPy), but not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_diag_args(diag: str | None, diag_p: float, diag_penalty: float) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) naming the bad argument and the allowed values."""
    if not (diag is None or (isinstance(diag, str) and diag in DIAG_OPTIONS)):
        raise ConfigError(
            f"diag={diag!r} is not known; choose one of {DIAG_OPTIONS} "
            "(None: no regularizer, 'mask', 'dropout' or 'penalty' on the diagonal logits)."
        )
    if not _is_real(diag_p) or not 0.0 <= float(diag_p) < 1.0:
        raise ConfigError(
            f"diag_p={diag_p!r} must be a probability in [0, 1): the chance that a diagonal "
            "logit is dropped (the paper uses 0.2). Use diag='mask' to drop every diagonal entry."
        )
    if not _is_real(diag_penalty) or not math.isfinite(float(diag_penalty)):
        raise ConfigError(
            f"diag_penalty={diag_penalty!r} must be a finite number (the paper uses -0.1); "
            "for an infinite penalty use diag='mask'."
        )


def _constant_value(diag: str, diag_penalty: float) -> float:
    """The diagonal logit bias ``b_ii`` of the deterministic regularizers: ``-inf`` (``"mask"``) or the penalty."""
    return float(diag_penalty) if diag == "penalty" else float("-inf")


#: Longest sequence whose constant bias is cached (longer ones are cheap to rebuild relative
#: to the attention itself, and caching them would hold megabytes per entry).
_CACHE_MAX_T = 256


@lru_cache(maxsize=32)
def _constant_bias(
    length: int, value: float, dtype: torch.dtype, device: torch.device | None
) -> torch.Tensor:
    """``[T, T]`` zeros with ``value`` on the diagonal; cached, so never modify it in place.

    Built outside inference mode even when first requested inside ``torch.inference_mode()``:
    an inference tensor in the cache could not be saved for a later backward pass.
    """
    with torch.inference_mode(False):
        eye = torch.eye(length, dtype=torch.bool, device=device)
        return torch.zeros(length, length, dtype=dtype, device=device).masked_fill(eye, value)


#: On the CPU the fast path packs sequences of at most half this many steps end to end, into
#: sequences of at most this many (see :func:`pack_groups`). Measured with
#: ``benchmarks/attention.py`` on one x86-64 CPU (2 cores): for T = 12, packed lengths 24 and 48
#: ran about equally fast and 36, 72 and 96 slower; 24 keeps the per-sequence dropout bias
#: (``G·T`` floats per query) small. Other CPUs may prefer another length; results are the same.
PACK_LENGTH = 24


def pack_groups(n_seq: int, length: int, device: torch.device, p_drop: float = 0.0) -> int:
    """How many sequences the fast path packs into one: the largest ``G`` with ``G·T <= PACK_LENGTH`` dividing ``n_seq``.

    PyTorch's fused CPU attention kernel pays a fixed cost for every (sequence, head), which
    dominates for short sequences (``T = 12`` on METR-LA), and its code path for an additive
    mask pays more. Packing ``G`` consecutive sequences into one sequence of ``G·T`` steps,
    with a bias of ``-inf`` between steps of different sequences, computes exactly the same
    attention (a ``-inf`` logit gets weight 0), in fewer, larger pieces; the block bias then
    carries the regularizer's diagonal at no extra cost (:func:`pack_diagonal_bias`).

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
    """The logit bias of ``G`` sequences packed end to end, each with a diagonal bias: ``0`` or its diagonal value within a sequence, ``-inf`` between sequences.

    Args:
        diagonal: the diagonal ``b_ii`` of every sequence's bias (every regularizer's bias is
            zero off its diagonal): ``[T]`` (the same for every sequence and head), ``[H, T]``
            (one per head) or ``[n_seq, H, T]`` (one per sequence and head, ``n_seq``
            divisible by ``G``; sequence ``s·G + g`` becomes part ``g`` of packed sequence ``s``).
        groups: ``G``.

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
    """:func:`pack_diagonal_bias` of ``value`` on every diagonal entry, ``[G·T, G·T]``; cached, never modify it."""
    with torch.inference_mode(False):
        return pack_diagonal_bias(torch.full((length,), value, dtype=dtype, device=device), groups)


def _check_dropped(
    dropped: torch.Tensor, length: int, batch_shape: tuple[int, ...], n_heads: int
) -> torch.Tensor:
    if not isinstance(dropped, torch.Tensor):
        raise ValueError(
            f"dropped must be a boolean tensor ([T] or [..., H, T]), got {type(dropped).__name__}."
        )
    if dropped.dim() == 0 or dropped.shape[-1] != length:
        raise ValueError(
            f"dropped has shape {tuple(dropped.shape)} but the sequence has T={length} steps; "
            f"pass a boolean pattern of shape [T] = [{length}] or [..., H, T] = {[*batch_shape, n_heads, length]}."
        )
    if dropped.dim() > 1:
        target = (*batch_shape, n_heads, length)
        try:
            fits = torch.broadcast_shapes(tuple(dropped.shape), target) == target
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"dropped has shape {tuple(dropped.shape)}, which does not broadcast to the "
                f"pattern shape [..., H, T] = {[*batch_shape, n_heads, length]}."
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
    cache: bool = False,
    diagonal: bool = False,
) -> torch.Tensor | None:
    """The additive bias ``b`` that a regularizer puts on the attention logits.

    Args:
        length: sequence length ``T`` (at least 1).
        diag: one of :data:`DIAG_OPTIONS`.
        diag_p: drop probability for ``"dropout"``, in ``[0, 1)``.
        diag_penalty: finite constant for ``"penalty"``.
        training: dropout acts only when ``True``.
        shared: for ``"dropout"``: ``True`` draws one pattern ``[T]`` shared by every sequence
            of the batch and every head (what the paper's released code does); ``False`` draws
            an independent pattern for every sequence and head, ``[*batch_shape, H, T]``.
        batch_shape, n_heads: the pattern shape for independent dropout (and for checking
            ``dropped``).
        dropped: an explicit boolean pattern of dropped diagonal entries (``[T]`` or anything
            broadcastable to ``[*batch_shape, H, T]``) that replaces the random draw; used to
            freeze a pattern (for Jacobians and tests). Honoured in any mode. Only allowed with
            ``diag="dropout"``.
        generator: optional random generator for the dropout draw.
        dtype, device: of the returned bias.
        cache: return a cached tensor for the deterministic biases (``"mask"``, ``"penalty"``)
            of sequences up to ``T = 256``; the caller must then never modify it in place.
            :class:`TemporalAttention` uses this inside its forward pass.
        diagonal: return only the diagonal ``b_ii`` (``[T]`` or ``[*pattern_shape, T]``; the
            bias is zero everywhere else), never cached.

    Returns:
        ``None`` when there is nothing to add (``diag=None``; dropout in eval mode, with
        ``diag_p = 0`` or with ``T = 1``), else a float tensor holding ``0`` off the diagonal
        and ``diag_penalty`` or ``-inf`` on it: ``[T, T]`` for the mask, the penalty and a
        shared dropout pattern (it broadcasts over batch and heads and is never expanded), and
        ``[*pattern_shape, T, T]`` for independent or explicit patterns.

    Raises:
        ValueError: for an unknown ``diag``, ``diag_p`` outside ``[0, 1)``, a non-finite
            ``diag_penalty``, a ``dropped`` pattern of the wrong shape or given with another
            ``diag``, and for ``diag="mask"`` with ``T = 1`` (the only key would be masked, so
            the softmax would have nothing to normalise: a NaN).
    """
    _check_diag_args(diag, diag_p, diag_penalty)
    if not _is_int(length) or length < 1:
        raise ValueError(f"length={length!r} must be a positive integer (the sequence length T).")
    length = int(length)
    if dropped is not None and diag != "dropout":
        raise ValueError(
            f"dropped=... fixes a diagonal-dropout pattern, but diag={diag!r}; pass dropped only "
            "with diag='dropout'."
        )
    device = torch.device(device) if device is not None else None
    if diag is None:
        return None
    if diag in ("penalty", "mask"):
        if diag == "mask" and length < 2:
            raise ValueError(
                "diag='mask' on a sequence of length T=1 leaves no key to attend to (softmax over "
                "an empty set, a NaN); use sequences with T >= 2, or diag=None, 'dropout' or "
                "'penalty' (dropout never drops the only key)."
            )
        value = _constant_value(diag, diag_penalty)
        if diagonal:
            return torch.full((length,), value, dtype=dtype, device=device)
        if cache and length <= _CACHE_MAX_T:
            return _constant_bias(length, value, dtype, device)
        return _constant_bias.__wrapped__(length, value, dtype, device)
    # diag == "dropout"
    if dropped is None:
        if not training or diag_p == 0.0 or length < 2:
            # eval mode; p = 0; or T = 1, where dropping the only key is undefined: nothing to do
            return None
        shape = (length,) if shared else (*batch_shape, n_heads, length)
        draw_device = generator.device if generator is not None else device
        dropped = torch.rand(shape, generator=generator, device=draw_device) < diag_p
    else:
        dropped = _check_dropped(dropped, length, tuple(batch_shape), n_heads)
    values = torch.zeros(dropped.shape, dtype=dtype, device=device).masked_fill_(
        dropped.to(device=device), float("-inf")
    )
    return values if diagonal else torch.diag_embed(values)  # b_ii only, or [..., T, T]


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

    Two paths compute the same function: without ``return_attention`` the heads are mixed
    by the fused ``torch.nn.functional.scaled_dot_product_attention`` (the regularizer
    enters as an additive float mask); with it, the logits, the softmax and the weighted
    sum are computed explicitly so that the weights can be returned. The explicit path also
    runs on the CPU when attention dropout is active (training mode, ``dropout > 0``):
    PyTorch has no fused CPU kernel with dropout, and its unfused fallback measured slower.
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
        if not _is_int(d_model) or d_model < 1:
            raise ConfigError(f"d_model={d_model!r} must be a positive integer (the channels C).")
        if not _is_int(n_heads) or n_heads < 1:
            raise ConfigError(f"n_heads={n_heads!r} must be a positive integer.")
        if d_model % n_heads:
            divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
            raise ConfigError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; choose n_heads among "
                f"the divisors of d_model: {divisors[:12]}{' ...' if len(divisors) > 12 else ''}."
            )
        _check_diag_args(diag, diag_p, diag_penalty)
        if not _is_real(dropout) or not 0.0 <= float(dropout) < 1.0:
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

    def bias(self, x: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor | None:
        """The regularizer's additive logit bias for input ``x`` ``[..., T, C]``.

        Returns ``None``, a ``[T, T]`` tensor (mask, penalty, shared dropout) or a
        ``[..., H, T, T]`` tensor (independent dropout patterns, or an explicit ``dropped``
        pattern with more than one axis). In training mode with ``diag="dropout"`` every
        call draws a new pattern.
        """
        return self._bias(x, dropped, cache=False)

    def _bias(
        self, x: torch.Tensor, dropped: torch.Tensor | None, *, cache: bool, diagonal: bool = False
    ) -> torch.Tensor | None:
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
            cache=cache,
            diagonal=diagonal,
        )

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
        return self._logits(x, self._bias(x, dropped, cache=True))

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

    def _mix_fused(
        self, h: torch.Tensor, dropped: torch.Tensor | None, p_drop: float
    ) -> torch.Tensor:
        """The fast path: ``Σ_j α_ij v_j`` via ``scaled_dot_product_attention``, heads merged: ``[..., T, C] -> [..., T, C]``.

        The leading axes are flattened into one batch axis first (the fused CPU kernels
        want 4-D input); a ``[T, T]`` bias broadcasts and is never expanded. Short
        sequences on the CPU are packed ``G`` at a time into sequences of ``G·T`` steps
        whose bias is ``-inf`` between different sequences (see :func:`pack_groups`): the
        same function, computed faster, with or without a regularizer.
        """
        *lead, length, channels = h.shape
        n_seq = math.prod(lead)
        groups = pack_groups(n_seq, length, h.device, p_drop)
        # G consecutive sequences end to end
        hp = h.reshape(n_seq // groups, groups * length, channels)
        q = self.split_heads(self.q_proj(hp))  # [n_seq / G, H, G·T, d_h]
        k = self.split_heads(self.k_proj(hp))
        v = self.split_heads(self.v_proj(hp))
        if groups > 1:
            b = self._packed_bias(h, dropped, groups)
        else:
            # [T, T], or [..., H, T, T] for per-sequence patterns
            b = self._bias(h, dropped, cache=True)
            if b is not None and b.dim() > 3:
                b = b.expand(*lead, self.n_heads, length, length).reshape(
                    n_seq, self.n_heads, length, length
                )
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=b, dropout_p=p_drop)
        return self.merge_heads(mixed).reshape(*lead, length, channels)

    def _packed_bias(
        self, h: torch.Tensor, dropped: torch.Tensor | None, groups: int
    ) -> torch.Tensor:
        """The bias of ``G`` sequences of ``h`` packed end to end (:func:`pack_diagonal_bias`); cached when constant."""
        *lead, length, _ = h.shape
        # None, [T], [H, T] or [..., H, T]
        diagonal = self._bias(h, dropped, cache=False, diagonal=True)
        if diagonal is None or self.diag in ("mask", "penalty"):  # the same in every forward pass
            value = 0.0 if diagonal is None else _constant_value(self.diag, self.diag_penalty)
            return _packed_constant(length, groups, value, h.dtype, h.device)
        if diagonal.dim() > 2:
            diagonal = diagonal.expand(*lead, self.n_heads, length).reshape(
                -1, self.n_heads, length
            )
        return pack_diagonal_bias(diagonal, groups)

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
                explicit path; otherwise the fused ``scaled_dot_product_attention`` runs,
                except on the CPU with attention dropout in training mode, where PyTorch
                has no fused kernel and the explicit path is the faster one.
            dropped: optional fixed boolean pattern of dropped diagonal entries for
                ``diag="dropout"`` (``[T]`` or ``[..., H, T]``), replacing the random draw.

        Returns:
            ``y`` ``[..., T, C]``, or ``(y, attn)``.
        """
        self._check_input(x)
        x = self.pos(x)
        h = self.norm(x) if self.norm_kind == "pre" else x
        p_drop = self.dropout if self.training else 0.0
        attn = None
        # With attention dropout PyTorch has no fused CPU kernel: it would fall back to an unfused
        # computation that measured slower than the explicit one here (benchmarks/attention.py).
        if return_attention or (p_drop > 0.0 and h.device.type == "cpu"):
            h = h.contiguous()  # one copy of a strided input, shared by the three projections
            # [..., H, T, T]
            attn = torch.softmax(self._logits(h, self._bias(h, dropped, cache=True)), dim=-1)
            v = self.split_heads(self.v_proj(h))  # [..., H, T, d_h]
            mixed = (F.dropout(attn, p_drop, training=True) if p_drop else attn) @ v
            out = self.out_proj(self.merge_heads(mixed))  # [..., T, C]
        else:
            out = self.out_proj(self._mix_fused(h, dropped, p_drop))
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
