"""The road graph: DCRNN's thresholded Gaussian kernel and the normalisations a graph convolution uses.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA", section "The road graph").

DCRNN (``scripts/gen_adj_mx.py``) turns the road distances ``d_ij`` (metres along the road
network, *directed*: ``d_ij`` need not equal ``d_ji``) into weights

.. math:: W_{ij} = \\exp\\bigl(-(d_{ij}/\\sigma)^2\\bigr),\\qquad W_{ij} := 0 \\text{ if } W_{ij} < \\kappa,

with ``sigma`` the standard deviation of all finite distances listed for pairs of the chosen
sensors, ``kappa = 0.1`` and ``W_ij = 0`` for pairs without a listed distance. The result is
``adj_mx.pkl`` (float32, directed, diagonal 1 because ``d_ii = 0``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..errors import DataError

__all__ = ["gaussian_kernel_adjacency", "random_walk", "symmetric_normalize", "diffusion_supports"]


def gaussian_kernel_adjacency(
    distances: pd.DataFrame, sensor_ids: list[str], kappa: float = 0.1
) -> np.ndarray:
    """DCRNN's adjacency from a distance table, float32 ``[N, N]`` (row = from, column = to).

    Args:
        distances: columns ``from, to, cost`` (as ``distances_la_2012.csv``); pairs with a
            sensor outside ``sensor_ids`` are ignored, as in DCRNN.
        sensor_ids: the node order (``graph_sensor_ids.txt``).
        kappa: threshold; weights below it become 0.

    The arithmetic is float32 like DCRNN's script, so the result equals ``adj_mx.pkl``
    when built from ``distances_la_2012.csv``.
    """
    need = {"from", "to", "cost"}
    if not need <= set(distances.columns):
        raise DataError(
            f"the distance table needs the columns from, to, cost (as distances_la_2012.csv); "
            f"it has {list(distances.columns)}. Fix: rename the columns."
        )
    index = {str(s): i for i, s in enumerate(sensor_ids)}
    n = len(sensor_ids)
    dist = np.full((n, n), np.inf, dtype=np.float32)
    src = distances["from"].astype(str).map(index)
    dst = distances["to"].astype(str).map(index)
    keep = src.notna().to_numpy() & dst.notna().to_numpy()
    if not keep.any():
        raise DataError(
            "no row of the distance table joins two of the given sensors. "
            "Fix: pass the sensor ids the table uses (graph_sensor_ids.txt for distances_la_2012.csv)."
        )
    # later rows overwrite earlier ones, as DCRNN's loop does
    dist[src[keep].to_numpy(dtype=np.int64), dst[keep].to_numpy(dtype=np.int64)] = distances[
        "cost"
    ].to_numpy(dtype=np.float32)[keep]
    finite = dist[~np.isinf(dist)].flatten()
    sigma = finite.std()
    if not sigma > 0:
        raise DataError(
            "all listed distances are equal, so sigma = 0 and the kernel is undefined. "
            "Fix: use a distance table with at least two different distances."
        )
    adj = np.exp(-np.square(dist / sigma))
    adj[adj < kappa] = 0
    return adj


def _degree_inverse(deg, power: float):
    if isinstance(deg, torch.Tensor):
        inv = torch.where(
            deg > 0, deg.clamp_min(torch.finfo(deg.dtype).tiny) ** power, torch.zeros_like(deg)
        )
        return inv
    with np.errstate(divide="ignore"):
        inv = np.where(deg > 0, np.power(np.where(deg > 0, deg, 1), power), 0.0)
    return inv.astype(deg.dtype, copy=False)


def _check_adjacency(adj) -> None:
    """``adj`` must be a square ``[N, N]`` matrix of finite, non-negative weights (numpy or torch)."""
    shape = tuple(adj.shape)
    if len(shape) != 2 or shape[0] != shape[1] or shape[0] == 0:
        raise DataError(
            f"an adjacency must be a square [N, N] matrix; got shape {shape}. Fix: pass the "
            "[N, N] weights, e.g. ds.data.load_metr_la().adjacency."
        )
    finite = np.isfinite(adj).all() if isinstance(adj, np.ndarray) else torch.isfinite(adj).all()
    if not bool(finite) or bool((adj < 0).any()):
        raise DataError(
            "an adjacency must hold finite, non-negative weights (0 = no edge); this one has NaN, inf "
            "or negative entries. Fix: rebuild it (gaussian_kernel_adjacency) or reload adj_mx.pkl."
        )


def random_walk(adj):
    """Forward random-walk matrix ``D_out^{-1} A`` (each row sums to 1; zero rows stay 0).

    ``adj``: ``[N, N]`` numpy array or tensor; returns the same type. The backward support is
    ``random_walk(adj.T)`` (``D_in^{-1} A^T``).

    Raises:
        DataError: ``adj`` is not square or has NaN, inf or negative weights.
    """
    _check_adjacency(adj)
    deg = adj.sum(1)
    return _degree_inverse(deg, -1.0)[:, None] * adj


def symmetric_normalize(adj):
    """``D^{-1/2} A D^{-1/2}`` with ``D`` the row sums (out-degrees); same type as ``adj``.

    For a symmetric ``A`` this is the usual GCN normalisation (its eigenvalues lie in ``[-1, 1]``);
    for METR-LA's directed ``A`` it is not symmetric.
    """
    _check_adjacency(adj)
    d = _degree_inverse(adj.sum(1), -0.5)
    return d[:, None] * adj * d[None, :]


def diffusion_supports(adj: np.ndarray | torch.Tensor) -> list[torch.Tensor]:
    """The two diffusion supports of DCRNN: ``[P_fwd, P_bwd] = [D_out^{-1} A, D_in^{-1} A^T]``, float32 ``[N, N]``.

    DCRNN's paper writes one diffusion step on node features ``X [N, C]`` as ``P @ X`` (node ``i``
    averages its out-neighbours); its released code multiplies by ``P.T``. State which you use.
    """
    a = torch.as_tensor(adj, dtype=torch.float32)
    return [random_walk(a), random_walk(a.T)]
