"""Positional encodings for temporal attention: sinusoidal, tAPE, learned, none.

Attention by itself is blind to order: permuting the time steps of ``x`` permutes the
output the same way. A positional encoding adds a table ``P`` of shape ``[T, C]`` to the
input ``[..., T, C]`` so that step ``t`` carries its position. With the angular
frequencies ``ω_k = 10000^(-2k/C)`` (``k = 0, 1, ..., ⌈C/2⌉ - 1``):

* sinusoidal (Vaswani et al. 2017): ``P[t, 2k] = sin(t ω_k)``, ``P[t, 2k+1] = cos(t ω_k)``;
* tAPE (Foumani et al. 2024), the encoding the paper uses: the same with every angle
  scaled by ``C / T``, ``P[t, 2k] = sin(t ω_k C / T)``, ``P[t, 2k+1] = cos(t ω_k C / T)``;
* learned: a trainable table ``[max_len, C]`` whose first ``T`` rows are added;
* none: the identity.

Explained in the chapter "Attention over time, step by step" (``book/attention.ipynb``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import is_int
from .errors import ConfigError

__all__ = [
    "sinusoidal_table",
    "tape_table",
    "positional_table",
    "PositionalEncoding",
    "POSITIONAL_OPTIONS",
]

#: The values ``pos_encoding`` may take.
POSITIONAL_OPTIONS = (None, "sinusoidal", "tape", "learned")


def _check_sizes(length: int, d_model: int) -> None:
    for name, value in (("length", length), ("d_model", d_model)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer.")


def _angles(
    length: int, d_model: int, scale: float, dtype: torch.dtype, device=None
) -> torch.Tensor:
    """``scale · t · ω_k`` for ``t < T`` and ``ω_k = 10000^(-2k/C)``: ``[T, ⌈C/2⌉]``."""
    # MPS has no float64
    work = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
    position = torch.arange(length, dtype=work, device=device)[:, None]  # [T, 1]
    even = torch.arange(0, d_model, 2, dtype=work, device=device)  # 2k = 0, 2, 4, ...
    omega = torch.exp(-math.log(10000.0) * even / d_model)  # ω_k = 10000^(-2k/C)
    return (position * omega[None, :] * scale).to(dtype or torch.get_default_dtype())  # [T, ⌈C/2⌉]


def _interleave(angles: torch.Tensor, d_model: int) -> torch.Tensor:
    """Even channels ``sin``, odd channels ``cos`` of the angles: ``[T, ⌈C/2⌉] -> [T, C]``."""
    table = torch.empty(angles.shape[0], d_model, dtype=angles.dtype, device=angles.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


def sinusoidal_table(
    length: int, d_model: int, dtype: torch.dtype | None = None, device=None
) -> torch.Tensor:
    """Vaswani et al. (2017): ``P[t, 2k] = sin(t ω_k)``, ``P[t, 2k+1] = cos(t ω_k)``, ``ω_k = 10000^(-2k/C)``.

    Args:
        length: ``T``; d_model: ``C`` (odd ``C`` is allowed: the last channel is a sine).
        dtype: of the table (default: ``torch.get_default_dtype()``); device: of the table.

    Returns:
        ``[T, C]`` table; row 0 is ``[0, 1, 0, 1, ...]``.
    """
    _check_sizes(length, d_model)
    return _interleave(_angles(length, d_model, 1.0, dtype, device), d_model)


def tape_table(
    length: int, d_model: int, dtype: torch.dtype | None = None, device=None
) -> torch.Tensor:
    """tAPE (Foumani et al. 2024, arXiv 2305.16642): the sinusoid with every angle scaled by ``C / T``.

    ``P[t, 2k] = sin(t ω_k C / T)``, ``P[t, 2k+1] = cos(t ω_k C / T)``. With ``T`` short
    compared with ``C`` (the paper: ``T = 12``, ``C = 72``) the plain sinusoid barely moves
    in most channels over the whole sequence, so neighbouring steps get nearly the same
    code; the factor ``C / T`` stretches the angles so that they do not. For ``T = C`` tAPE
    equals the sinusoidal table.

    ``T`` is the length of the sequence the table is added to. (The reference code builds
    the table once for a fixed length and would slice it for shorter inputs; both agree
    whenever the input has that length, as in the paper's fixed 12-step windows.)

    Returns:
        ``[T, C]`` table; row 0 is ``[0, 1, 0, 1, ...]``.
    """
    _check_sizes(length, d_model)
    return _interleave(_angles(length, d_model, d_model / length, dtype, device), d_model)


def positional_table(
    kind: str, length: int, d_model: int, dtype: torch.dtype | None = None, device=None
) -> torch.Tensor:
    """The fixed table of ``kind`` (``"sinusoidal"`` or ``"tape"``): ``[T, C]``."""
    if kind == "sinusoidal":
        return sinusoidal_table(length, d_model, dtype, device)
    if kind == "tape":
        return tape_table(length, d_model, dtype, device)
    raise ConfigError(f"kind={kind!r} has no fixed table; choose 'sinusoidal' or 'tape'.")


class PositionalEncoding(nn.Module):
    """Adds a positional table to ``x`` of shape ``[..., T, C]`` (time = second-to-last axis).

    Args:
        kind: ``None`` (identity), ``"sinusoidal"``, ``"tape"`` or ``"learned"``.
        d_model: channels ``C``.
        max_len: longest ``T`` for ``"learned"`` (the fixed tables work for any ``T``).

    The learned table is initialised with small random values (``N(0, 0.02²)``) and trained
    with the rest of the model; the fixed tables are computed for the ``T`` of each input.
    """

    def __init__(self, kind: str | None, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        if not (kind is None or (isinstance(kind, str) and kind in POSITIONAL_OPTIONS)):
            raise ConfigError(
                f"pos_encoding={kind!r} is not known; choose one of {POSITIONAL_OPTIONS}."
            )
        if not is_int(d_model) or d_model < 1:
            raise ConfigError(f"d_model={d_model!r} must be a positive integer.")
        if not is_int(max_len) or max_len < 1:
            raise ConfigError(
                f"max_len={max_len!r} must be a positive integer (the longest sequence)."
            )
        d_model, max_len = int(d_model), int(max_len)
        self.kind = kind
        self.d_model = d_model
        self.max_len = max_len
        if kind == "learned":
            self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        else:
            self.register_parameter("table", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., T, C] -> [..., T, C]``: ``x + P[:T]``."""
        if self.kind is None:
            return x
        length = x.shape[-2]
        if self.kind == "learned":
            if length > self.max_len:
                raise ValueError(
                    f"sequence length T={length} exceeds max_len={self.max_len} of the learned "
                    "positional encoding; build the layer with a larger max_len."
                )
            table = self.table[:length].to(x.dtype)
        else:
            table = positional_table(self.kind, length, self.d_model, x.dtype, x.device)
        return x + table

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, d_model={self.d_model}" + (
            f", max_len={self.max_len}" if self.kind == "learned" else ""
        )
