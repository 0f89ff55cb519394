"""Graph convolution over sensors: diffusion on the road graph, plus an optional learned graph.

A layer maps ``x`` of shape ``[batch, time, nodes, channels]`` to the same shape. It mixes
*sensors* (the node axis) and leaves time alone; the temporal mixing is done by
:class:`diagsink.TemporalAttention`. With supports ``P_1, ..., P_S`` (``[N, N]`` each,
row-stochastic) and order ``K``, the layer computes the diffusion convolution of
Li et al. (DCRNN) and Wu et al. (Graph WaveNet)::

    z = [x, P_1 x, P_1^2 x, ..., P_1^K x, ..., P_S x, ..., P_S^K x]      (concatenated on channels)
    y = W z + b                                                          (a linear channel mix)

where ``(P x)[b, t, n, :] = Σ_m P[n, m] x[b, t, m, :]``: every sensor receives a weighted
average of the sensors it is connected to, so after one layer a sensor "sees" everything
within ``K`` hops. The supports are the forward and backward random walks of the road
graph, ``D_out^-1 A`` and ``D_in^-1 A^T`` (see :func:`diagsink.data.adjacency.diffusion_supports`),
and optionally an *adaptive* adjacency learned from two node-embedding tables,
``softmax(relu(E_1 E_2^T))`` (row-wise softmax; Graph WaveNet).

The paper's released code applies its adjacency with ``einsum('nn,btnc->btnc', a, x)``:
a repeated index on one operand takes the *diagonal* of ``a``, so each sensor is only
rescaled by its own self-weight and no information moves between sensors.
:func:`released_code_contraction` re-implements just that contraction for the book to show
the flaw. Explained in the chapter "The T&S model and its training loop"
(``book/model.ipynb``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "DiffusionGraphConv",
    "adaptive_adjacency",
    "released_code_contraction",
    "receptive_field",
]


def adaptive_adjacency(e1: torch.Tensor, e2: torch.Tensor) -> torch.Tensor:
    """Graph WaveNet's learned adjacency ``softmax(relu(E_1 E_2^T))``, row-wise.

    Args:
        e1, e2: node embeddings ``[N, e]``.

    Returns:
        ``[N, N]``, every row sums to 1 (a random-walk matrix over a dense learned graph).
    """
    return torch.softmax(torch.relu(e1 @ e2.T), dim=1)


def released_code_contraction(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``einsum('nn,btnc->btnc', a, x)``: the contraction in the paper's released graph layer.

    Re-implemented here (not copied) only to demonstrate its effect: it equals
    ``diag(a)[n] * x[b, t, n, c]``, so the off-diagonal entries of ``a`` are ignored.

    Args:
        a: ``[N, N]`` adjacency; x: ``[batch, time, nodes, channels]``.
    """
    return torch.einsum("nn,btnc->btnc", a, x)


def receptive_field(adj: torch.Tensor, hops: int) -> torch.Tensor:
    """Boolean ``[N, N]``: ``[n, m]`` is True when sensor ``m``'s input can change sensor ``n``'s
    output after one diffusion layer of order ``hops`` over the forward *and* backward walks.

    The forward walk ``D_out^-1 A`` lets ``n`` read ``m`` when ``A^k[n, m] != 0``; the backward
    walk ``D_in^-1 A^T`` when ``(A^T)^k[n, m] != 0``; for ``k = 0..hops``. (The two walks are
    not composed inside one layer, so a forward-then-backward path does not count.)
    """
    link = (adj != 0).float()
    eye = torch.eye(adj.shape[0], dtype=torch.bool, device=adj.device)
    reach = eye.clone()
    for a in (link, link.T):
        power = eye.float()
        for _ in range(hops):
            power = ((power @ a) > 0).float()
            reach |= power > 0
    return reach


def _stacked_powers(supports: Sequence[torch.Tensor], order: int, n_nodes: int) -> torch.Tensor:
    """``[P_1, ..., P_1^K, P_2, ..., P_S^K]`` as ``[S K, N, N]`` (dense; ``[0, N, N]`` for no supports)."""
    out = []
    for p in supports:
        p = p.to_dense() if p.is_sparse else p
        power = p
        for k in range(order):
            if k:
                power = power @ p
            out.append(power)
    return torch.stack(out) if out else torch.zeros(0, n_nodes, n_nodes)


class DiffusionGraphConv(nn.Module):
    """Diffusion graph convolution over the node axis of ``[batch, time, nodes, channels]``.

    Args:
        channels: ``C`` (input and output channels).
        supports: fixed ``[N, N]`` transition matrices (e.g. ``[P_fwd, P_bwd]``); stored as
            non-persistent buffers (moved with the module, not trained, not in the
            ``state_dict``: rebuild the model from the same graph). May be empty when ``adaptive``.
        order: diffusion steps ``K`` per support.
        adaptive: add the learned adjacency ``softmax(relu(E_1 E_2^T))`` as one more support.
        n_nodes: ``N`` (required when there are no fixed supports).
        embed_dim: width of the node embeddings of the adaptive adjacency.
        dropout: dropout on the mixed output (training only).

    Shapes:
        ``x``: ``[B, T, N, C]`` -> ``[B, T, N, C]``.
    """

    def __init__(
        self,
        channels: int,
        supports: Sequence[torch.Tensor] = (),
        *,
        order: int = 2,
        adaptive: bool = False,
        n_nodes: int | None = None,
        embed_dim: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not (isinstance(order, int) and order >= 1):
            raise ValueError(
                f"order={order!r} must be a positive integer (the number of diffusion hops)."
            )
        supports = [torch.as_tensor(s, dtype=torch.float32) for s in supports]
        if not supports and not adaptive:
            raise ValueError(
                "DiffusionGraphConv got no supports and adaptive=False, so it could not mix sensors; "
                "pass supports (e.g. diagsink.data.adjacency.diffusion_supports(adj)) or adaptive=True."
            )
        sizes = {tuple(s.shape) for s in supports}
        if n_nodes is None:
            if not supports:
                raise ValueError(
                    "adaptive-only DiffusionGraphConv needs n_nodes (the number of sensors)."
                )
            n_nodes = supports[0].shape[0]
        if any(shape != (n_nodes, n_nodes) for shape in sizes):
            raise ValueError(
                f"every support must be [N, N] with N={n_nodes}; got shapes {sorted(sizes)}."
            )
        self.channels = channels
        self.order = order
        self.n_nodes = n_nodes
        self.n_fixed = len(supports)
        for i, s in enumerate(supports):
            # not persistent: derived from the road graph, so state dicts stay small
            self.register_buffer(f"support_{i}", s, persistent=False)
        self.adaptive = adaptive
        if adaptive:
            self.e1 = nn.Parameter(torch.randn(n_nodes, embed_dim))
            self.e2 = nn.Parameter(torch.randn(n_nodes, embed_dim))
        n_terms = 1 + order * (self.n_fixed + int(adaptive))
        self.mix = nn.Linear(n_terms * channels, channels)
        self.dropout = nn.Dropout(dropout)

    def supports(self) -> list[torch.Tensor]:
        """The ``[N, N]`` matrices diffused over: the fixed ones, then the adaptive one."""
        out = [getattr(self, f"support_{i}") for i in range(self.n_fixed)]
        if self.adaptive:
            out.append(adaptive_adjacency(self.e1, self.e2))
        return out

    def powers(self) -> torch.Tensor:
        """All diffusion matrices stacked: ``[P_1, P_1^2, ..., P_1^K, P_2, ..., P_S^K]`` as ``[S K, N, N]``.

        Built on each call (dense); the forward pass never forms them.
        """
        return _stacked_powers(self.supports(), self.order, self.n_nodes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, N, C] -> [B, T, N, C]``: ``dropout(mix(cat[x, P_1 x, ..., P_1^K x, ..., P_S^K x]))``.

        Sensor ``n`` of ``P x`` is ``Σ_m P[n, m] x[..., m, :]``; ``P^k x`` is computed as
        ``P (P^(k-1) x)``, so no power ``P^k`` is formed.
        """
        if x.dim() != 4 or x.shape[-2] != self.n_nodes or x.shape[-1] != self.channels:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; DiffusionGraphConv expects [batch, time, nodes={self.n_nodes}, "
                f"channels={self.channels}]."
            )
        terms = [x]
        for p in self.supports():
            h = x
            for _ in range(self.order):
                h = torch.einsum("nm,btmc->btnc", p.to(x.dtype), h)  # one diffusion step
                terms.append(h)
        return self.dropout(self.mix(torch.cat(terms, dim=-1)))

    def extra_repr(self) -> str:
        return f"channels={self.channels}, nodes={self.n_nodes}, fixed_supports={self.n_fixed}, order={self.order}, adaptive={self.adaptive}"
