"""DiffusionGraphConv computes the formula its docstring states; the sparse layer equals it.

The formula is ``y = dropout(mix([x, P_1 x, ..., P_1^K x, ..., A x, ..., A^K x]))``. Written
here with the matrix powers ``P^k`` formed explicitly (the layer forms none: it applies
``P`` ``k`` times), so the test is independent of the layer's own loop. Explained in
``book/model.ipynb``.
"""

from __future__ import annotations

import pytest
import torch

from diagsink.graphconv import DiffusionGraphConv, adaptive_adjacency
from diagsink.sparse import SparseDiffusionGraphConv


def _random_supports(n: int, seed: int = 0) -> list[torch.Tensor]:
    """Forward and backward random walks of a random sparse directed graph with self-loops."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(n, n, generator=g) < 0.1).float() * torch.rand(n, n, generator=g) + torch.eye(n)
    return [a / a.sum(1, keepdim=True), a.T / a.T.sum(1, keepdim=True)]


def by_powers(layer: DiffusionGraphConv, x: torch.Tensor) -> torch.Tensor:
    """``mix([x, P_1 x, ..., P_S^K x])`` with ``P^k`` formed by ``matrix_power``: ``[B, T, N, C]``."""
    supports = [getattr(layer, f"support_{i}").to(x.dtype) for i in range(layer.n_fixed)]
    if layer.adaptive:
        supports.append(adaptive_adjacency(layer.e1, layer.e2))
    terms = [x]
    for p in supports:
        for k in range(1, layer.order + 1):
            terms.append(torch.linalg.matrix_power(p, k) @ x)  # [N, N] @ [B, T, N, C]
    return layer.mix(torch.cat(terms, dim=-1))


@pytest.mark.parametrize(
    ("n_fixed", "adaptive", "order"), [(2, True, 2), (2, False, 3), (0, True, 2), (1, True, 1)]
)
def test_outputs_and_gradients_equal_the_formula(n_fixed, adaptive, order):
    torch.manual_seed(0)
    n = 11
    layer = DiffusionGraphConv(
        5, _random_supports(n)[:n_fixed], order=order, adaptive=adaptive, n_nodes=n
    )
    layer = layer.double().eval()
    x = torch.randn(3, 4, n, 5, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 4, n, 5, dtype=torch.float64)
    results = []
    for f in (layer, lambda z: by_powers(layer, z)):
        y = f(x)
        results.append((y, *torch.autograd.grad((y * weights).sum(), [x, *layer.parameters()])))
    for a, b in zip(*results):  # float64: only the summation order differs
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_output_dropout_acts_in_training_only():
    torch.manual_seed(0)
    layer = DiffusionGraphConv(4, _random_supports(9), order=2, dropout=0.5)
    x = torch.randn(2, 3, 9, 4)
    torch.testing.assert_close(layer.eval()(x), by_powers(layer, x))
    y = layer.train()(x)
    zeros = (y == 0).float().mean().item()
    assert 0.35 < zeros < 0.65  # 216 entries dropped with p = 0.5


def test_supports_are_buffers_outside_the_state_dict_and_powers_are_stacked():
    n = 8
    sup = _random_supports(n)
    layer = DiffusionGraphConv(4, sup, order=3, adaptive=True)
    assert sorted(layer.state_dict()) == ["e1", "e2", "mix.bias", "mix.weight"]
    expected = torch.stack([torch.linalg.matrix_power(p, k) for p in sup for k in (1, 2, 3)])
    assert layer.powers().shape == (9, n, n)  # fixed powers then the adaptive A, A^2, A^3
    torch.testing.assert_close(layer.powers()[:6], expected)


def test_sparse_layer_equals_the_dense_one():
    torch.manual_seed(0)
    n = 12
    dense = DiffusionGraphConv(4, _random_supports(n), order=2, adaptive=True).eval()
    sparse = SparseDiffusionGraphConv.from_dense(dense).eval()
    assert sparse.support_0.is_sparse
    x = torch.randn(2, 3, n, 4)
    torch.testing.assert_close(sparse(x), dense(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse.powers(), dense.powers(), rtol=1e-5, atol=1e-6)
