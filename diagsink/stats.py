"""Summary statistics of attention maps and forecasts: is the model looking at itself?

Every function takes attention weights ``attn`` of shape ``[..., T, T]`` (rows = query
step ``i``, columns = key step ``j``, rows summing to 1, as returned by
``ds.TemporalAttention(..., return_attention=True)``) or forecasts of matching shapes.
Leading axes (batch, nodes, heads) are averaged where a single number is returned.

* :func:`diagonal_mass`        mean ``α_ii`` against the uniform reference ``1/T``
* :func:`lag_mass`             mean ``α_{i, i-lag}``: the weight on one fixed lag
* :func:`attention_entropy`    entropy of each row (natural log), optionally ``/ log T``
* :func:`column_stripe_index`  how much of the structure is shared by every query (column stripes)
* :func:`parroting_score`      how close a forecast is to copying the last observed value
* :func:`self_share`           share of a step's sensitivity (or attention) that falls on itself

Used in the chapter "A task where parroting fails" (``book/parroting.ipynb``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "DiagonalMass",
    "diagonal_mass",
    "lag_mass",
    "attention_entropy",
    "column_stripe_index",
    "stripe_index_per_map",
    "map_statistics",
    "parroting_score",
    "self_share",
]


def _check_square(attn: torch.Tensor, name: str = "attn") -> int:
    if not isinstance(attn, torch.Tensor) or attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
        shape = tuple(attn.shape) if isinstance(attn, torch.Tensor) else type(attn).__name__
        raise ValueError(
            f"{name} has shape {shape}; expected attention weights [..., T, T] "
            "(rows = query steps, columns = key steps, the last two axes equal)."
        )
    return attn.shape[-1]


class DiagonalMass(NamedTuple):
    """Result of :func:`diagonal_mass`: ``mass``, the mean of ``α_ii`` over all rows and
    leading axes, and ``uniform = 1/T``, its value for uniform attention.
    """

    mass: float
    uniform: float

    @property
    def ratio(self) -> float:
        """``mass / uniform = T · mean α_ii``: 1 for uniform attention, ``T`` for the identity."""
        return self.mass / self.uniform


def diagonal_mass(attn: torch.Tensor) -> DiagonalMass:
    """Mean weight a step gives to itself, ``(1/T) Σ_i α_ii`` (averaged over leading axes).

    Args:
        attn: ``[..., T, T]`` attention weights.

    Returns:
        :class:`DiagonalMass` ``(mass, uniform=1/T)``. Identity attention gives ``mass = 1``,
        uniform attention ``mass = 1/T``, a full diagonal mask ``mass = 0``.

    Raises:
        ValueError: ``attn`` is not ``[..., T, T]``.
    """
    length = _check_square(attn)
    mass = attn.diagonal(dim1=-2, dim2=-1).mean()
    return DiagonalMass(float(mass), 1.0 / length)


def lag_mass(attn: torch.Tensor, lag: int) -> float:
    """Mean weight that query ``i`` gives to key ``i - lag``, over the rows ``i ≥ lag``.

    ``lag = 0`` is the diagonal (:func:`diagonal_mass`); ``lag = 1`` the step before. A map
    that attends exactly ``lag`` steps back has ``lag_mass = 1``; uniform attention ``1/T``.

    Args:
        attn: ``[..., T, T]`` attention weights.
        lag: ``0 ≤ lag < T``.

    Raises:
        ValueError: bad shape, or a lag outside ``[0, T)``.
    """
    length = _check_square(attn)
    if not (isinstance(lag, int) and 0 <= lag < length):
        raise ValueError(f"lag={lag!r} must be an integer with 0 <= lag < T = {length}.")
    return float(attn.diagonal(offset=-lag, dim1=-2, dim2=-1).mean())


def attention_entropy(attn: torch.Tensor, normalized: bool = False) -> torch.Tensor:
    """Entropy of each attention row, ``H_i = -Σ_j α_ij log α_ij`` (natural log, ``0 log 0 = 0``).

    Args:
        attn: ``[..., T, T]`` attention weights.
        normalized: divide by ``log T``, so that uniform rows give 1 (and ``T = 1`` gives 0).

    Returns:
        ``[..., T]``: one entropy per query row. Identity attention gives 0; uniform
        attention ``log T`` (or 1 when normalised).

    Raises:
        ValueError: ``attn`` is not ``[..., T, T]``.
    """
    length = _check_square(attn)
    ent = -torch.special.xlogy(attn, attn).sum(-1)
    if normalized:
        ent = ent / math.log(length) if length > 1 else torch.zeros_like(ent)
    return ent


def column_stripe_index(attn: torch.Tensor) -> float:
    """Share of the map's departure from uniform that every query has in common.

    With ``ā_j = (1/T) Σ_i α_ij`` (the mean row, i.e. the column profile) and ``u = 1/T``::

        index = Σ_j (ā_j − u)²  /  ( (1/T) Σ_i Σ_j (α_ij − u)² )

    It lies in ``[0, 1]`` (the numerator is the square of a mean, the denominator the mean
    of squares). It is 1 when all rows are equal and not uniform -- vertical stripes: the
    same few keys for every query, the failure the paper describes for the full mask -- and
    0 when the column profile is flat, e.g. for the identity or any shifted diagonal. For
    exactly uniform attention (no structure at all) it returns 0.

    Args:
        attn: ``[..., T, T]``; the index is computed per map and averaged over leading axes.

    Raises:
        ValueError: ``attn`` is not ``[..., T, T]``.
    """
    return float(stripe_index_per_map(attn).mean())


def stripe_index_per_map(attn: torch.Tensor) -> torch.Tensor:
    """:func:`column_stripe_index` of every map: ``[..., T, T]`` -> ``[...]``."""
    length = _check_square(attn)
    dev = attn - 1.0 / length
    common = (attn.mean(-2) - 1.0 / length).pow(2).sum(-1)  # [...]
    total = dev.pow(2).sum((-2, -1)) / length  # [...]
    return torch.where(total > 1e-12, common / total.clamp_min(1e-30), torch.zeros_like(total))


def map_statistics(attn: torch.Tensor) -> dict[str, dict[str, float]]:
    """The book's three map statistics per sequence (mean, spread) and of the averaged map.

    Entropy is concave, so the entropy of an averaged map is at least the mean entropy of its
    maps: a flat average can hide sharp attention in every sequence. This reports both.

    Args:
        attn: ``[..., T, T]`` attention weights, one map per leading index (e.g.
            ``[B, N, H, T, T]``: window, sensor, head).

    Returns:
        ``{"diagonal_ratio" | "entropy" | "stripe_index": {"mean", "std", "of_mean"}}``:
        ``T · mean α_ii``, the row entropy divided by ``log T`` (1 = uniform) and
        :func:`column_stripe_index`; ``mean``/``std`` over the maps, ``of_mean`` of their average.
    """
    length = _check_square(attn)
    maps = attn.reshape(-1, length, length).double()
    mean_map = maps.mean(0)
    per_map = {
        "diagonal_ratio": (
            maps.diagonal(dim1=-2, dim2=-1).mean(-1) * length,
            mean_map.diagonal().mean() * length,
        ),
        "entropy": (
            attention_entropy(maps, normalized=True).mean(-1),
            attention_entropy(mean_map, normalized=True).mean(),
        ),
        "stripe_index": (stripe_index_per_map(maps), stripe_index_per_map(mean_map)),
    }
    return {
        k: {"mean": float(v.mean()), "std": float(v.std(unbiased=False)), "of_mean": float(m)}
        for k, (v, m) in per_map.items()
    }


def parroting_score(pred: torch.Tensor, last_value: torch.Tensor, target: torch.Tensor) -> float:
    """How close a forecast is to copying the last observed value (1 = a pure parrot).

    Defined over all entries at once (Euclidean norms of the flattened tensors)::

        score = clip( 1 − ‖pred − last‖ / ‖target − last‖ ,  0, 1 )

    * ``pred == last_value`` (copying the present) gives 1;
    * ``pred == target`` (a perfect forecast) gives 0, as does any forecast at least as
      far from the last value as the truth is;
    * ``pred = last + c (target − last)`` with ``0 ≤ c ≤ 1`` gives ``1 − c``.

    A low score alone does not mean a good forecast (the error says that); a high score
    says the forecast stays where the series is now.

    Args:
        pred: forecasts, any shape.
        last_value: the last observed value each forecast could copy, same shape.
        target: the true values, same shape.

    Raises:
        ValueError: shapes differ, or ``target == last_value`` everywhere (the score is undefined).
    """
    if not (pred.shape == last_value.shape == target.shape):
        raise ValueError(
            f"pred {tuple(pred.shape)}, last_value {tuple(last_value.shape)} and target "
            f"{tuple(target.shape)} must have the same shape (one last value and one target per forecast)."
        )
    denom = torch.linalg.vector_norm((target - last_value).double())
    if float(denom) == 0.0:
        raise ValueError(
            "target equals last_value everywhere, so copying the last value is already perfect and "
            "the parroting score is undefined; evaluate on steps where the series changes."
        )
    ratio = torch.linalg.vector_norm((pred - last_value).double()) / denom
    return float((1.0 - ratio).clamp(0.0, 1.0))


def self_share(sens: torch.Tensor, lag: int = 0) -> float:
    """Mean share of each row's total absolute weight that sits ``lag`` steps back.

    For a sensitivity map ``S[t, j] = ∂ forecast_t / ∂ x_j`` (or an attention map)::

        share = mean over rows t ≥ lag of  |S[t, t − lag]| / Σ_j |S[t, j]|

    ``lag = 0`` (the default) measures the *diagonal sink*: 1 when each output depends only
    on its own step, ``1/T`` when it depends on all steps equally. Rows whose total is 0
    count as 0.

    Args:
        sens: ``[..., T, T]`` (rows = outputs, columns = inputs); averaged over leading axes.
        lag: ``0 ≤ lag < T``.

    Raises:
        ValueError: bad shape or lag.
    """
    length = _check_square(sens, "sens")
    if not (isinstance(lag, int) and 0 <= lag < length):
        raise ValueError(f"lag={lag!r} must be an integer with 0 <= lag < T = {length}.")
    a = sens.abs()
    total = a.sum(-1)[..., lag:]  # rows t >= lag
    part = a.diagonal(offset=-lag, dim1=-2, dim2=-1)
    share = torch.where(total > 0, part / total.clamp_min(1e-30), torch.zeros_like(total))
    return float(share.mean())
