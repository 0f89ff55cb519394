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

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
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


class _ConstantMatmul(torch.autograd.Function):
    """``P @ y`` for a constant ``P``: the backward pass is ``P^T @ g``; no gradient for ``P``.

    ``p`` and ``p_t`` (``P`` and ``P^T``, dense or sparse CSR, ``[N, N]``) are not saved
    tensors of the graph and nothing of ``y`` (``[N, M]``) is kept: the product is linear in
    ``y``, so its backward pass needs only the constant.
    """

    @staticmethod
    def forward(ctx, y: torch.Tensor, p: torch.Tensor, p_t: torch.Tensor) -> torch.Tensor:
        ctx.p_t = p_t
        return p.to(y.dtype) @ y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.p_t.to(grad.dtype) @ grad, None, None


#: dtypes whose sparse CSR products the CPU has (others use the dense supports)
_CSR_DTYPES = (torch.float32, torch.float64)


def _csr(p: torch.Tensor) -> torch.Tensor:
    """``p`` (dense or sparse ``[N, N]``) as a sparse CSR tensor, without torch's beta warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return (p.to_dense() if p.is_sparse else p).to_sparse_csr()


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

    #: cache the dense powers of the fixed supports as the buffer ``fixed_powers``
    _cache_powers: bool = True

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
        # the powers P, P^2, ..., P^K of the fixed supports, computed once (they are constants):
        # no rebuild per forward pass and no gradient for them in the backward pass
        cached = supports if self._cache_powers else []
        with torch.no_grad():
            self.register_buffer(
                "fixed_powers", _stacked_powers(cached, order, n_nodes), persistent=False
            )
        # (device, dtype) -> [(P_i, P_i^T)] as the forward pass applies them (see _operators)
        self._operator_cache: dict[tuple[torch.device, torch.dtype], list] = {}
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

        The fixed supports' powers come from the cache built at construction
        (``fixed_powers``); the adaptive support's are computed from the embeddings.
        """
        if not self.adaptive:
            return self.fixed_powers
        learned = self.adaptive_powers()
        return (
            torch.cat([self.fixed_powers.to(learned.dtype), learned]) if self.n_fixed else learned
        )

    def adaptive_powers(self) -> torch.Tensor:
        """``[A, A^2, ..., A^K]`` of the adaptive adjacency ``A`` as ``[K, N, N]`` (differentiable)."""
        return _stacked_powers([adaptive_adjacency(self.e1, self.e2)], self.order, self.n_nodes)

    def _operators(self, device: torch.device, dtype: torch.dtype) -> list:
        """``[(P_i, P_i^T)]`` for the fixed supports: sparse CSR on the CPU, else dense ``[N, N]``.

        On the CPU a road graph's walk (METR-LA: 1,722 non-zeros of 207 x 207) is applied about
        five times faster as CSR than dense (measured on a 2-core x86-64 CPU: 1.5 ms against
        7.5 ms for ``[207, 207] @ [207, 6912]``). The CSR copies are built once per device and
        dtype and kept (building them costs more than a forward pass); they are derived from
        the buffers ``support_i`` and are not part of the ``state_dict``.
        """
        key = (device, dtype)
        if key not in self._operator_cache:
            fixed = [getattr(self, f"support_{i}") for i in range(self.n_fixed)]
            if device.type == "cpu" and dtype in _CSR_DTYPES:
                ops = [(_csr(p.to(dtype)), _csr(p.to(dtype).T)) for p in fixed]
            else:
                dense = [(p.to_dense() if p.is_sparse else p).to(dtype) for p in fixed]
                ops = [(p, p.T.contiguous()) for p in dense]
            self._operator_cache = {key: ops}  # one entry: a model lives on one device
        return self._operator_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, N, C] -> [B, T, N, C]``; sensor ``n`` aggregates ``Σ_m P[n, m] x[..., m, :]``.

        The same function as ``self.mix(torch.cat([x, P_1 x, ..., P_S^K x], -1))`` followed by
        dropout, computed in an order that does less work. The mix is linear, so
        ``W_k (P^k x) = P^k (x W_k^T)``: the layer first multiplies ``x`` (laid out node-major,
        ``[N B T, C]``) by each term's weights ``W_k``, the self term's included (one GEMM per
        term, output ``[N, B T D]``; only this node-major copy of ``x`` is kept for the backward
        pass), then applies each support in Horner form,
        ``Σ_k P^k Y_k = P (Y_1 + P (Y_2 + ... + P Y_K))``: ``K`` products with ``P`` per
        support and no power ``P^k`` built. The fixed supports are constants
        (:class:`_ConstantMatmul`: no gradient for them, nothing saved), sparse CSR on the
        CPU; the adaptive support ``A`` is dense and differentiable. In training on the CPU the
        output dropout keeps a byte mask, drawn as ``F.dropout`` draws it (the same dropped
        entries for the same seed), instead of ``F.dropout``'s float one. The result may be a
        non-contiguous view (node-major memory).
        """
        if x.dim() != 4 or x.shape[-2] != self.n_nodes or x.shape[-1] != self.channels:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; DiffusionGraphConv expects [batch, time, nodes={self.n_nodes}, "
                f"channels={self.channels}]."
            )
        b, t, n, c = x.shape
        k_hops = self.order
        weight = self.mix.weight.to(x.dtype)  # [D, (1 + S K) C]
        bias = None if self.mix.bias is None else self.mix.bias.to(x.dtype)
        d = weight.shape[0]
        nodes_first = x.permute(2, 0, 1, 3).reshape(n * b * t, c)  # [N B T, C]
        # Y_j = x W_j^T for every term j (j = 0: the self term, with the bias), each [N, B T D]
        terms = [
            F.linear(nodes_first, weight[:, c * j : c * (j + 1)], bias if j == 0 else None).view(
                n, b * t * d
            )
            for j in range(weight.shape[1] // c)
        ]

        def horner(first: int, apply) -> torch.Tensor:
            # P (Y_first + P (Y_first+1 + ... + P Y_first+K-1))
            acc = terms[first + k_hops - 1]
            for k in range(k_hops - 2, -1, -1):
                acc = terms[first + k] + apply(acc)
            return apply(acc)

        out = terms[0]
        for i, (p, p_t) in enumerate(self._operators(x.device, x.dtype)):
            part = horner(1 + i * k_hops, lambda y, p=p, p_t=p_t: _ConstantMatmul.apply(y, p, p_t))
            out = out + part
        if self.adaptive:
            a = adaptive_adjacency(self.e1, self.e2).to(x.dtype)
            out = out + horner(1 + self.n_fixed * k_hops, lambda y: a @ y)
        out = out.view(n, b, t, d).permute(1, 2, 0, 3)  # [B, T, N, D], node-major in memory
        p_drop = self.dropout.p
        if not self.training or p_drop == 0.0:
            return out
        if out.device.type != "cpu":
            return self.dropout(out.contiguous())  # the fused kernel, drawn over [B, T, N, D]
        # F.dropout's draws over a contiguous [B, T, N, D] tensor, kept as bytes
        keep = torch.empty((b, t, n, d), dtype=torch.bool, device=out.device)
        keep.bernoulli_(1.0 - p_drop)
        return (out * keep).mul_(1.0 / (1.0 - p_drop))

    def extra_repr(self) -> str:
        return f"channels={self.channels}, nodes={self.n_nodes}, fixed_supports={self.n_fixed}, order={self.order}, adaptive={self.adaptive}"
