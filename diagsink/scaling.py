"""Memory and compute of the T&S model as the network and the input sequence grow.

Two ways to know what a training step costs, used side by side in the appendix
"Running it bigger" (``book/scaling.ipynb``):

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
from collections.abc import Callable
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
    """How many ``N T C`` float tensors one block keeps per sample (see :func:`activation_bytes`).

    ``9 + S K + a`` (``a = K`` with a learned graph, else 0; 17 for the paper's model): the
    attention keeps 6 (its input, ``q``, ``k``, ``v``, the merged heads and the residual sum),
    the graph layer ``1 + S K`` (the concatenated terms, the mix's input), ``a`` (the inputs
    of the learned graph's products), its dropout mask and the residual sum. The sparse layer
    (``sparse=True``) keeps as many: its ``S K`` stacked terms and its input in place of the
    concatenation.
    """
    learned = shape.order * int(shape.adaptive)
    return 9 + shape.supports * shape.order + learned


def activation_bytes(
    n_nodes: int,
    t: int,
    batch: int = 1,
    shape: Shape = PAPER_SHAPE,
    *,
    sparse: bool = False,
    bytes_per: int = 4,
) -> float:
    """Activations kept for the backward pass of a CPU training step, in bytes (formula; float32 by default).

    Per block and sample: ``linear_coefficient`` ``N T C`` numbers; ``4 N T`` for the two
    LayerNorms' means and inverse deviations; and ``3 N H T^2`` for the attention weights,
    their dropout mask and the dropped weights (the O(T^2) part). Per block and batch, with
    the learned adjacency, ``2 N^2`` (it and its softmax). Read-out: ``N T (C + 4)`` per sample.
    """
    c, h, layers = shape.d_model, shape.n_heads, shape.depth
    linear = linear_coefficient(shape, sparse=sparse)
    per_sample = bytes_per * layers * (linear * n_nodes * t * c + 4 * n_nodes * t)
    per_sample += bytes_per * layers * 3 * n_nodes * h * t * t
    per_sample += bytes_per * n_nodes * t * (c + 4)
    graph = 2 * n_nodes**2 if shape.adaptive else 0
    return float(batch * per_sample + bytes_per * layers * graph)


def forward_flops(
    n_nodes: int, t: int, batch: int = 1, shape: Shape = PAPER_SHAPE, *, nnz: int | None = None
) -> float:
    """Floating-point operations of one forward pass in matrix products (2 per multiply-add).

    Per block and sample: the Q, K, V and output projections ``8 N T C^2``; logits and the
    weighted sum ``4 N T^2 C``; the channel mix of the ``1 + S K`` diffusion terms
    ``2 (1 + S K) N T C^2``; the diffusion itself, ``K`` products with each support,
    ``2 S K N^2 T C`` counted dense, or ``2 K nnz T C`` for the fixed supports (``nnz``
    given: their non-zeros summed, the sparse layer) plus ``2 K N^2 T C`` for the learned one.
    No power ``P^k`` is formed. Per block and batch: the learned adjacency ``2 N^2 e``. Read-out:
    ``2 N T (2 C + C + 1 + T_out)``. A backward pass costs about twice the forward pass.
    """
    c, k, s, layers = shape.d_model, shape.order, shape.supports, shape.depth
    n = n_nodes
    block = 8 * n * t * c * c + 4 * n * t * t * c + 2 * (1 + s * k) * c * c * n * t
    per_batch = 2 * n * n * shape.embed_dim if shape.adaptive else 0
    if nnz is None:
        block += 2 * s * k * n * n * t * c
    else:
        block += 2 * k * nnz * t * c + (2 * k * n * n * t * c if shape.adaptive else 0)
    head = 2 * n * t * (2 * c + c + 1 + shape.t_out)
    return float(batch * (layers * block + head) + layers * per_batch)


def saved_activation_bytes(
    model: torch.nn.Module, x: torch.Tensor, forward: Callable | None = None
) -> int:
    """Bytes of the tensors one forward pass of ``model(x)`` saves for backward (measured).

    Each storage is counted once; parameters and buffers (which exist anyway) are not counted,
    nor are sparse tensors (the graph's constants). ``forward``: run ``forward(x)`` instead of
    ``model(x)``, e.g. a straightforward formula computed with ``model``'s weights.
    """
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {b.untyped_storage().data_ptr() for b in model.buffers() if b.layout == torch.strided}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout == torch.strided:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in skip:
                seen.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        (model if forward is None else forward)(x)
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
