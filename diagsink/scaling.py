"""Memory and compute of the T&S model as the network and the input sequence grow.

Two ways to know what a training step costs, used side by side in the chapter
"Scaling up" (``book/scaling.ipynb``):

* **measured**: :func:`saved_activation_bytes` runs one forward pass and adds up the
  tensors autograd keeps for the backward pass (``torch.autograd.graph.saved_tensors_hooks``;
  each storage counted once; parameters and buffers excluded); :func:`time_step` times a
  forward + backward pass on this machine.
* **computed**: :func:`activation_bytes` and :func:`forward_flops` are the formulas; the
  chapter checks them against the measurements (and the FLOP formula against
  :class:`torch.utils.flop_counter.FlopCounterMode`) before using them where measuring is
  out of reach.

Notation: batch ``B``, sensors ``N``, input steps ``T``, width ``C``, heads ``H``, blocks
``L``, diffusion order ``K``, supports ``S`` (2 road-graph walks, +1 adaptive), node
embedding width ``e``, non-zeros ``nnz`` of the fixed supports (sparse path).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = [
    "Shape",
    "PAPER_SHAPE",
    "linear_coefficient",
    "activation_bytes",
    "forward_flops",
    "saved_activation_bytes",
    "time_step",
]


@dataclass(frozen=True)
class Shape:
    """Model sizes that set the cost (the paper's released configuration by default)."""

    d_model: int = 72
    n_heads: int = 8
    depth: int = 12
    order: int = 2
    adaptive: bool = True
    embed_dim: int = 10
    t_out: int = 12

    @property
    def supports(self) -> int:
        return 2 + int(self.adaptive)


#: The paper's T&S model (12 blocks, C = 72, 8 heads, order 2, learned adjacency).
PAPER_SHAPE = Shape()


def linear_coefficient(shape: Shape = PAPER_SHAPE, *, sparse: bool = False) -> int:
    """``9 + S K + a``: how many ``N T C`` tensors one block keeps per sample (see :func:`activation_bytes`)."""
    return 9 + shape.supports * shape.order + (shape.order if sparse else 1) * int(shape.adaptive)


def activation_bytes(
    n_nodes: int,
    t: int,
    batch: int = 1,
    shape: Shape = PAPER_SHAPE,
    *,
    sparse: bool = False,
    bytes_per: int = 4,
) -> float:
    """Activations kept for the backward pass, in bytes (formula; float32 by default).

    Per block and sample ``(9 + S K + a) N T C`` (projections, heads, residuals and norms,
    the ``S K`` diffusion terms, and the inputs of the learned graph's products: ``a = 1``
    dense, ``a = K`` sparse, ``a = 0`` without a learned graph; 16 for the paper's dense
    ``S K = 6``) plus ``3 N H T^2`` (the attention weights, the dropout mask and the weights
    after dropout: the O(T^2) part); with the learned
    adjacency, per block and once per batch, ``(K + 2) N^2`` for it and its stacked powers
    (the fixed supports' powers are a constant buffer, computed once; ``2 N^2`` in the sparse
    path, which stacks nothing); the read-out
    ``N T (C + 1)`` per sample.
    """
    c, h, layers = shape.d_model, shape.n_heads, shape.depth
    linear = linear_coefficient(shape, sparse=sparse)
    per_sample = layers * (linear * n_nodes * t * c + 3 * n_nodes * h * t * t) + n_nodes * t * (
        c + 1
    )
    graph = 0
    if shape.adaptive:
        graph = (2 if sparse else shape.order + 2) * n_nodes**2
    return float(bytes_per * (batch * per_sample + layers * graph))


def forward_flops(
    n_nodes: int, t: int, batch: int = 1, shape: Shape = PAPER_SHAPE, *, nnz: int | None = None
) -> float:
    """Floating-point operations of one forward pass in matrix products (2 per multiply-add).

    Per block and sample: the Q, K, V and output projections ``8 N T C^2``; logits and the
    weighted sum ``4 N T^2 C``; the channel mix of the ``1 + S K`` diffusion terms
    ``2 (1 + S K) N T C^2``; the diffusion itself ``2 S K N^2 T C`` (dense) or
    ``2 K nnz T C`` for the fixed supports (sparse, ``nnz`` given) plus ``2 K N^2 T C`` for the
    learned one. Per block and batch (dense path): the powers ``A^k`` of the learned adjacency,
    ``2 (K - 1) N^3`` (the fixed supports' powers are computed once, at construction), and
    the learned adjacency ``2 N^2 e``. Read-out: ``2 N T (2 C + C + 1 + T_out)``.
    A backward pass costs about twice the forward pass.
    """
    c, k, s, layers = shape.d_model, shape.order, shape.supports, shape.depth
    n = n_nodes
    block = 8 * n * t * c * c + 4 * n * t * t * c + 2 * (1 + s * k) * c * c * n * t
    per_batch = 2 * n * n * shape.embed_dim if shape.adaptive else 0
    if nnz is None:
        block += 2 * s * k * n * n * t * c
        per_batch += 2 * int(shape.adaptive) * (k - 1) * n**3
    else:
        block += 2 * k * nnz * t * c + (2 * k * n * n * t * c if shape.adaptive else 0)
    head = 2 * n * t * (2 * c + c + 1 + shape.t_out)
    return float(batch * (layers * block + head) + layers * per_batch)


def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors one forward pass of ``model(x)`` saves for backward (measured).

    Each storage is counted once; parameters and buffers (which exist anyway) are not counted.
    """
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {b.untyped_storage().data_ptr() for b in model.buffers() if not b.is_sparse}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_sparse:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in skip:
                seen.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x)
    return sum(seen.values())


def time_step(model: torch.nn.Module, x: torch.Tensor, repeats: int = 3) -> float:
    """Median seconds of one forward + backward pass of ``model(x).sum()`` (measured, after one warm-up)."""
    times = []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(x).sum().backward()
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
