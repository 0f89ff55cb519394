"""Positional encodings for temporal attention: sinusoidal, tAPE, learned, none.

All encodings map a sequence length ``T`` to a table ``[T, C]`` that is *added* to the
input ``[..., T, C]``. Explained in the chapter "Attention over time, step by step"
(``book/attention.ipynb``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["sinusoidal_table", "tape_table", "PositionalEncoding", "POSITIONAL_OPTIONS"]

POSITIONAL_OPTIONS = (None, "sinusoidal", "tape", "learned")


def _angles(length: int, d_model: int, scale: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    position = torch.arange(length, dtype=dtype, device=device)[:, None]  # [T, 1]
    k = torch.arange(0, d_model, 2, dtype=dtype, device=device)  # [ceil(C/2)]
    omega = torch.exp(-math.log(10000.0) * k / d_model)  # ω_k = 10000^(-2k/C)
    return position * omega[None, :] * scale  # [T, ceil(C/2)]


def _interleave(angles: torch.Tensor, d_model: int) -> torch.Tensor:
    table = torch.zeros(angles.shape[0], d_model, dtype=angles.dtype, device=angles.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


def sinusoidal_table(length: int, d_model: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Vaswani et al. (2017): ``P[t, 2k] = sin(t ω_k)``, ``P[t, 2k+1] = cos(t ω_k)``, ``ω_k = 10000^(-2k/C)``.

    Returns:
        ``[T, C]`` table.
    """
    return _interleave(_angles(length, d_model, 1.0, dtype, device), d_model)


def tape_table(length: int, d_model: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """tAPE (Foumani et al. 2024, arXiv 2305.16642): the sinusoid with ``ω_k`` scaled by ``C / T``.

    ``P[t, 2k] = sin(t ω_k C / T)``, ``P[t, 2k+1] = cos(t ω_k C / T)``. The scaling keeps
    the encodings of neighbouring steps distinguishable when ``T`` is short compared with
    ``C`` (the paper's setting: ``T = 12``, ``C = 72``).

    Returns:
        ``[T, C]`` table.
    """
    return _interleave(_angles(length, d_model, d_model / length, dtype, device), d_model)


class PositionalEncoding(nn.Module):
    """Adds a positional table to ``x`` of shape ``[..., T, C]`` (time = second-to-last axis).

    Args:
        kind: ``None`` (identity), ``"sinusoidal"``, ``"tape"`` or ``"learned"``.
        d_model: channels ``C``.
        max_len: longest ``T`` for ``"learned"`` (the fixed tables work for any ``T``).
    """

    def __init__(self, kind: str | None, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        if kind not in POSITIONAL_OPTIONS:
            raise ValueError(
                f"pos_encoding={kind!r} is not known; choose one of {POSITIONAL_OPTIONS}."
            )
        self.kind = kind
        self.d_model = d_model
        self.max_len = max_len
        if kind == "learned":
            self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        else:
            self.register_parameter("table", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., T, C] -> [..., T, C]``."""
        if self.kind is None:
            return x
        length = x.shape[-2]
        if self.kind == "sinusoidal":
            table = sinusoidal_table(length, self.d_model, x.dtype, x.device)
        elif self.kind == "tape":
            table = tape_table(length, self.d_model, x.dtype, x.device)
        else:
            if length > self.max_len:
                raise ValueError(
                    f"sequence length T={length} exceeds max_len={self.max_len} of the learned "
                    "positional encoding; build the layer with a larger max_len."
                )
            table = self.table[:length].to(x.dtype)
        return x + table

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, d_model={self.d_model}"
