"""Sparse road graphs: the diffusion graph convolution with ``torch.sparse`` supports.

A road graph is sparse: METR-LA's 207 sensors have 1,722 weighted links (4 % of the
207 x 207 entries), and a graph of thousands of sensors keeps only a few dozen links per
sensor. The dense layer (:class:`diagsink.graphconv.DiffusionGraphConv`) multiplies by the
full ``[N, N]`` matrices: ``2 N^2`` multiply-adds per channel and ``N^2`` floats per support.
:class:`SparseDiffusionGraphConv` stores the fixed supports ``P`` as sparse COO tensors and
applies them as ``P (P x)``: ``2 nnz(P)`` multiply-adds per channel and hop, ``O(nnz)`` memory.
It is the same function: same parameters (same initialisation from the same seed), same
output up to floating-point summation order (tested on METR-LA's adjacency).

The learned (adaptive) adjacency ``softmax(relu(E_1 E_2^T))`` is dense by construction and
stays dense; for a graph of thousands of sensors it dominates memory and time (switch it off
with ``model.adaptive_adjacency: false``).

:func:`sparsify` swaps the graph convolutions of a model for sparse ones when the graph is
large and sparse (:func:`use_sparse`: more than :data:`SPARSE_MIN_NODES` sensors and at most
:data:`SPARSE_MAX_DENSITY` non-zeros in every fixed support), so METR-LA (207 sensors) keeps
the dense path, which is faster at that size. Explained in the appendix "Running it
bigger" (``book/scaling.ipynb``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .graphconv import DiffusionGraphConv

__all__ = [
    "SPARSE_MIN_NODES",
    "SPARSE_MAX_DENSITY",
    "density",
    "use_sparse",
    "SparseDiffusionGraphConv",
    "sparsify",
]

#: Graphs with more sensors than this may use the sparse path.
SPARSE_MIN_NODES = 1000
#: ... if every fixed support has at most this share of non-zero entries.
SPARSE_MAX_DENSITY = 0.1


def density(p: torch.Tensor) -> float:
    """Share of non-zero entries of an ``[N, N]`` matrix (dense or sparse)."""
    n = p.shape[0] * p.shape[1]
    nnz = p.coalesce()._nnz() if p.is_sparse else int(torch.count_nonzero(p))
    return nnz / n


def use_sparse(
    supports: Sequence[torch.Tensor],
    *,
    min_nodes: int = SPARSE_MIN_NODES,
    max_density: float = SPARSE_MAX_DENSITY,
) -> bool:
    """True when there are fixed supports, ``N > min_nodes`` and every support's density is ``<= max_density``."""
    if not supports:
        return False
    return supports[0].shape[0] > min_nodes and all(density(p) <= max_density for p in supports)


class SparseDiffusionGraphConv(DiffusionGraphConv):
    """:class:`diagsink.graphconv.DiffusionGraphConv` whose fixed supports are sparse COO tensors.

    Same arguments, parameters and output as the dense layer; ``supports()`` returns the
    sparse fixed supports followed by the (dense) adaptive one.

    Shapes:
        ``x``: ``[B, T, N, C]`` -> ``[B, T, N, C]``.
    """

    def __init__(self, channels: int, supports: Sequence[torch.Tensor] = (), **kwargs) -> None:
        super().__init__(channels, supports, **kwargs)
        for i in range(self.n_fixed):
            dense = getattr(self, f"support_{i}")
            self.register_buffer(f"support_{i}", dense.to_sparse_coo().coalesce(), persistent=False)

    @classmethod
    def from_dense(cls, layer: DiffusionGraphConv) -> SparseDiffusionGraphConv:
        """A sparse copy of ``layer`` (same parameter values, same device; the global RNG is untouched)."""
        fixed = [getattr(layer, f"support_{i}") for i in range(layer.n_fixed)]
        embed_dim = layer.e1.shape[1] if layer.adaptive else 10
        with torch.random.fork_rng(devices=[]):
            new = cls(
                layer.channels,
                fixed,
                order=layer.order,
                adaptive=layer.adaptive,
                n_nodes=layer.n_nodes,
                embed_dim=embed_dim,
                dropout=layer.dropout.p,
            )
        new.load_state_dict(layer.state_dict())
        return new.to(next(layer.parameters()).device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, N, C] -> [B, T, N, C]``: the terms ``P^k x`` as ``P (P^(k-1) x)``, sparse products in float32."""
        if x.dim() != 4 or x.shape[-2] != self.n_nodes or x.shape[-1] != self.channels:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; DiffusionGraphConv expects [batch, time, nodes={self.n_nodes}, "
                f"channels={self.channels}]."
            )
        b, t, n, c = x.shape
        flat = x.permute(2, 0, 1, 3).reshape(n, b * t * c)  # [N, B T C]
        terms = []
        for p in self.supports():
            h = flat
            for _ in range(self.order):
                # float32 outside autocast: sparse kernels for every dtype are not a given
                if p.is_sparse:
                    with torch.autocast(device_type=x.device.type, enabled=False):
                        h = torch.sparse.mm(p, h.float()).to(x.dtype)
                else:
                    h = p.to(x.dtype) @ h
                terms.append(h)
        mixed = torch.stack(terms).reshape(len(terms), n * b * t, c)  # [S K, N B T, C]
        # the channel mix W [x, P_1 x, ...] + b, term by term
        weight = self.mix.weight.to(x.dtype)  # [D, (1 + S K) C]
        d = weight.shape[0]
        w_terms = weight[:, c:].reshape(d, len(terms), c).permute(1, 2, 0)  # [S K, C, D]
        # [B, T, N, D]
        spatial = torch.bmm(mixed, w_terms).sum(0).reshape(n, b, t, d).permute(1, 2, 0, 3)
        bias = None if self.mix.bias is None else self.mix.bias.to(x.dtype)
        return self.dropout(torch.nn.functional.linear(x, weight[:, :c], bias) + spatial)


def sparsify(
    model: nn.Module,
    *,
    min_nodes: int = SPARSE_MIN_NODES,
    max_density: float = SPARSE_MAX_DENSITY,
    force: bool = False,
) -> nn.Module:
    """Replace every dense :class:`diagsink.graphconv.DiffusionGraphConv` of ``model`` by its sparse copy where
    :func:`use_sparse` says so (or everywhere with ``force``); returns ``model`` (changed in place)."""
    targets = [
        (name, child)
        for name, child in model.named_modules()
        if type(child) is DiffusionGraphConv
        and child.n_fixed
        and (
            force
            or use_sparse(
                [getattr(child, f"support_{i}") for i in range(child.n_fixed)],
                min_nodes=min_nodes,
                max_density=max_density,
            )
        )
    ]
    for name, child in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, SparseDiffusionGraphConv.from_dense(child))
    return model
