"""What the paper's released code does, re-stated in a few tested lines (not copied).

The released code is github.com/vicky-hnk/spatio-temp-parroting (commit ``1b6f5e2``, see
:data:`SOURCE`). Each function here re-implements *one* of its behaviours, so that a chapter
can compute the consequence instead of describing it:

* :func:`split_bounds`, :func:`split_windows`: the chronological split with ``int()``
  (``src/data_loader/spatio_temporal_dataset.py``, ``get_split``) - chapter ``book/metr_la.ipynb``;
* :func:`adaptive_supports`, :class:`ReleasedGCN`: the graph layer ``AdaptiveGCN``
  (``src/models/gnn.py``), which contracts two *learned* supports ``softmax(relu(E_1 E_2^T))``
  with ``einsum('nn,btnc->btnc')`` (their diagonals only) and never reads the road graph it is
  passed - chapter ``book/model.ipynb``;
* :class:`ReleasedBlock`: one ``TimeSpaceBlock`` (``src/models/t_and_s.py``) with
  ``nn.MultiheadAttention``: time of day enters through two ``Linear(1 -> C)`` added *after*
  the attention and after the graph layer, never inside Q/K/V; dropout on both sublayer outputs
  - chapter ``book/model.ipynb``;
* :func:`diag_attn_mask`: the ``attn_mask`` of ``MultiHeadTemporalAttention.forward``
  (``src/models/temporal_attn.py``): the penalty is added whenever ``diag_penalty != 0``, also
  in dropout runs - chapter ``book/results.ipynb``.

Shapes follow the book: ``[batch, time, nodes, channels]`` (the released code permutes to
``[batch, nodes, time, channels]`` internally; the arithmetic is the same).
"""

from __future__ import annotations

import torch
from torch import nn

from .data.windows import Splits, split_sizes
from .errors import ConfigError, DataError
from .graphconv import adaptive_adjacency, released_code_contraction

__all__ = [
    "SOURCE",
    "DEFAULTS",
    "split_bounds",
    "split_windows",
    "adaptive_supports",
    "ReleasedGCN",
    "ReleasedBlock",
    "diag_attn_mask",
]

#: Where the behaviours re-stated here were read.
SOURCE: dict[str, str] = {
    "repository": "https://github.com/vicky-hnk/spatio-temp-parroting",
    "commit": "1b6f5e2fe2526dfbe588c5ba0b6a07ad538e03ba",
}

#: The released defaults, read from ``src/config/config.json`` where it sets the key, else from
#: the code's ``config.get(key, default)`` (``dropout`` and ``attn_dropout`` are absent from the
#: JSON).
DEFAULTS: dict[str, object] = {
    "diag_mask": False,
    "diag_drop": 0.0,
    "diag_penalty": -0.05,
    "attn_dropout": 0.1,  # nn.MultiheadAttention(dropout=...)
    "dropout": 0.1,  # both sublayer outputs of every block and the tAPE output
    "gcn_dropout": 0.1,  # AdaptiveGCN(dropout=0.1), on the graph layer's output
    "gcn_order": 2,
    "node_embedding_dim": 10,
    "data_split": (0.7, 0.1, 0.2),
    "learning_rate": 2e-4,
}


def split_bounds(
    n_steps: int, ratios: tuple[float, float, float] = (0.7, 0.1, 0.2)
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The released split of a series of ``n_steps`` time steps: ``(lo, hi)`` per part, ``int()``.

    ``train = [0, int(r_train T))``, ``val`` the next ``int(r_val T)`` steps, ``test`` the next
    ``int(r_test T)``: truncation, so the steps after the test part (one on METR-LA) are
    never used. On 34272 steps: ``(0, 23990), (23990, 27417), (27417, 34271)``.
    Chapter ``book/metr_la.ipynb`` ("The chronological split").

    Raises:
        ConfigError: ratios that are not three non-negative numbers summing to 1.
    """
    split_sizes(n_steps, ratios)  # the package's ratio check (raises ConfigError)
    if not (isinstance(n_steps, int) and n_steps > 0):
        raise ConfigError(f"n_steps={n_steps!r} must be a positive integer (the series length).")
    train_end = int(ratios[0] * n_steps)
    val_end = train_end + int(ratios[1] * n_steps)
    test_end = val_end + int(ratios[2] * n_steps)
    return (0, train_end), (train_end, val_end), (val_end, test_end)


def split_windows(
    n_steps: int,
    t_in: int = 12,
    t_out: int = 12,
    ratios: tuple[float, float, float] = (0.7, 0.1, 0.2),
) -> Splits:
    """Window starts of the released split: steps split first (:func:`split_bounds`), then windowed.

    A part ``[lo, hi)`` has ``hi - lo - t_in - t_out + 1`` windows (the released dataset's
    ``__len__``); the starts are absolute step indices, as in
    :func:`diagsink.data.windows.split_windows`. Full METR-LA: 23967 / 3404 / 6831.

    Raises:
        DataError: a part shorter than one window of ``t_in + t_out`` steps.
    """
    width = t_in + t_out
    parts = []
    for (lo, hi), name in zip(split_bounds(n_steps, ratios), ("train", "val", "test")):
        if hi - lo < width:
            raise DataError(
                f"the released split's {name} part has {hi - lo} steps, fewer than one window "
                f"of {width}. Fix: use a longer series (the full metr-la.h5 has 34272 steps)."
            )
        parts.append(torch.arange(lo, hi - width + 1))
    return Splits(parts[0], parts[1], parts[2], "split-first", t_in, t_out)


def adaptive_supports(
    source: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The released layer's two learned supports, ``[N, N]`` each, rows summing to 1.

    ``forward = softmax(relu(E_s E_t^T))`` and ``backward = softmax(relu(E_t E_s^T))`` (row-wise),
    from the node embeddings ``source``, ``target`` ``[N, e]``. Chapter ``book/model.ipynb``.
    """
    return adaptive_adjacency(source, target), adaptive_adjacency(target, source)


class ReleasedGCN(nn.Module):
    """The released ``AdaptiveGCN``: ``[B, T, N, C] -> [B, T, N, C]``, with no mixing of sensors.

    ``z = [x, A_f x, A_f^2 x, A_b x, A_b^2 x]`` where each product is the released
    ``einsum('nn,btnc->btnc', A, x)`` (:func:`diagsink.graphconv.released_code_contraction`):
    ``A_nn x_n``, so every term of sensor ``n`` is its own input times a power of its learned
    self-weight. Then ``y = dropout(W z + b)``. The released ``forward(x, adj)`` takes the road
    graph ``adj`` but never reads it; here there is no such argument. Chapter ``book/model.ipynb``.
    """

    def __init__(
        self,
        channels: int,
        n_nodes: int,
        *,
        order: int = 2,
        embed_dim: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if not (isinstance(order, int) and order >= 1):
            raise ValueError(f"order={order!r} must be a positive integer (diffusion hops).")
        self.order = order
        self.source = nn.Parameter(torch.randn(n_nodes, embed_dim))
        self.target = nn.Parameter(torch.randn(n_nodes, embed_dim))
        self.mlp = nn.Linear((2 * order + 1) * channels, channels)
        self.dropout = nn.Dropout(dropout)

    def terms(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``[x, A_f x, ..., A_f^K x, A_b x, ..., A_b^K x]``, each ``[B, T, N, C]``, as released."""
        out = [x]
        for a in adaptive_supports(self.source, self.target):
            h = x
            for _ in range(self.order):
                h = released_code_contraction(a, h)
                out.append(h)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, N, C] -> [B, T, N, C]``: ``dropout(W [x, A_f x, ...] + b)``."""
        return self.dropout(self.mlp(torch.cat(self.terms(x), dim=-1)))


def diag_attn_mask(
    t: int,
    *,
    mask: bool = False,
    diag_p: float = 0.0,
    diag_penalty: float = 0.0,
    training: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor | None:
    """The ``attn_mask`` ``[T, T]`` (or ``None``) the released temporal attention passes to MHA.

    ``mask``: boolean ``eye(T)`` (True = not attended). Otherwise, when ``diag_p > 0`` *or*
    ``diag_penalty != 0``: zeros; in training with ``diag_p > 0`` each diagonal entry is ``-inf``
    with probability ``diag_p`` (one pattern per call, shared by batch and heads); then
    ``diag_penalty`` is added to the whole diagonal whenever it is non-zero, in dropout runs too.
    With the released default ``diag_penalty = -0.05`` (:data:`DEFAULTS`), "no regularization"
    needs ``diag_penalty = 0`` set explicitly. Chapter ``book/results.ipynb``.
    """
    if mask:
        return torch.eye(t, dtype=torch.bool)
    if not (diag_p > 0 or diag_penalty != 0.0):
        return None
    out = torch.zeros(t, t)
    if training and diag_p > 0:
        drop = torch.rand(t, generator=generator) < diag_p
        out[drop, drop] = float("-inf")  # boolean pairs: the diagonal entries (i, i)
    if diag_penalty != 0.0:
        out += torch.eye(t) * diag_penalty
    return out


class ReleasedBlock(nn.Module):
    """One released ``TimeSpaceBlock``: ``x [B, T, N, C]``, ``tod [B, T, N, 1]`` -> ``[B, T, N, C]``.

    ``h = LN(x + drop(MHA(x) + L_1(tod)))`` (``residual=False``: ``LN(drop(MHA(x) + L_1(tod)))``),
    ``y = LN(h + drop(GCN(h) + L_2(tod)))``: attention runs over time per sensor on ``x`` alone,
    so the time of day never enters the queries, keys or values. ``forward`` also returns the
    attention weights ``[B, N, H, T, T]``. Chapter ``book/model.ipynb``.
    """

    def __init__(
        self,
        channels: int,
        n_heads: int,
        n_nodes: int,
        *,
        residual: bool = True,
        attn_dropout: float = 0.1,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.residual = residual
        self.attn = nn.MultiheadAttention(channels, n_heads, dropout=attn_dropout, batch_first=True)
        self.gcn = ReleasedGCN(channels, n_nodes, dropout=DEFAULTS["gcn_dropout"])
        self.temporal_bias = nn.Linear(1, channels)
        self.spatial_bias = nn.Linear(1, channels)
        self.temp_norm = nn.LayerNorm(channels)
        self.space_norm = nn.LayerNorm(channels)
        self.temporal_dropout = nn.Dropout(dropout)
        self.spatial_dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, tod: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y [B, T, N, C], weights [B, N, H, T, T])``; ``attn_mask`` from :func:`diag_attn_mask`."""
        b, t, n, c = x.shape
        seq = x.transpose(1, 2).reshape(b * n, t, c)  # each sensor's sequence
        out, w = self.attn(seq, seq, seq, attn_mask=attn_mask, average_attn_weights=False)
        out = out.reshape(b, n, t, c).transpose(1, 2)
        tmp = self.temporal_dropout(out + self.temporal_bias(tod))
        h = self.temp_norm(x + tmp if self.residual else tmp)
        y = self.space_norm(h + self.spatial_dropout(self.gcn(h) + self.spatial_bias(tod)))
        return y, w.reshape(b, n, -1, t, t)
