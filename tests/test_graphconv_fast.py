"""The fast graph convolution computes the straightforward formula: outputs, gradients, saved weights.

The straightforward formulation (written here, not imported) is Graph WaveNet's:
``z = [x, P_1 x, ..., P_1^K x, ..., A x, ..., A^K x]`` by one dense ``einsum`` per hop, then
``y = dropout(mix(z))``. The package's layer multiplies by the mix weights first, applies each
support in Horner form (sparse CSR constants on the CPU, no gradient for them) and builds no
power ``P^k``; these tests check that it is the same function (float64), that it keeps only
what its backward pass needs, and that the committed ``book/results/quick`` weights load and
predict as with the formula.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from diagsink.graphconv import DiffusionGraphConv, adaptive_adjacency
from diagsink.model import TSModel
from diagsink.scaling import saved_activation_bytes
from diagsink.sparse import SparseDiffusionGraphConv

from conftest import ROOT


def _random_supports(n: int, seed: int = 0) -> list[torch.Tensor]:
    """Forward and backward random walks of a random sparse directed graph with self-loops."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(n, n, generator=g) < 0.1).float() * torch.rand(n, n, generator=g) + torch.eye(n)
    return [a / a.sum(1, keepdim=True), a.T / a.T.sum(1, keepdim=True)]


def straightforward(layer: DiffusionGraphConv, x: torch.Tensor) -> torch.Tensor:
    """``dropout(mix([x, P_1 x, ..., P_S^K x]))`` with one dense einsum per hop: ``[B, T, N, C]``."""
    supports = [getattr(layer, f"support_{i}") for i in range(layer.n_fixed)]
    supports = [p.to_dense() if p.is_sparse else p for p in supports]
    if layer.adaptive:
        supports.append(adaptive_adjacency(layer.e1, layer.e2))
    terms = [x]
    for p in supports:
        h = x
        for _ in range(layer.order):
            h = torch.einsum("nm,btmc->btnc", p.to(x.dtype), h)
            terms.append(h)
    return layer.dropout(layer.mix(torch.cat(terms, dim=-1)))


class Straightforward(nn.Module):
    """Wraps a layer so that a model computes its graph convolution by :func:`straightforward`."""

    def __init__(self, layer: DiffusionGraphConv) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return straightforward(self.layer, x)


def _grads(layer: nn.Module, x: torch.Tensor, out: torch.Tensor) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)  # drawn in logical order: out may be a strided view
    weights = torch.randn(out.shape, dtype=out.dtype, generator=g)
    params = [p for p in layer.parameters()]
    return list(torch.autograd.grad((out * weights).sum(), [x, *params]))


@pytest.mark.parametrize(
    ("n_fixed", "adaptive", "order"), [(2, True, 2), (2, False, 3), (0, True, 2), (1, True, 1)]
)
def test_outputs_and_gradients_equal_the_straightforward_formula(n_fixed, adaptive, order):
    torch.manual_seed(0)
    n = 11
    layer = DiffusionGraphConv(
        5, _random_supports(n)[:n_fixed], order=order, adaptive=adaptive, n_nodes=n
    )
    layer = layer.double().eval()
    x = torch.randn(3, 4, n, 5, dtype=torch.float64, requires_grad=True)
    fast, ref = layer(x), straightforward(layer, x)
    # float64 throughout (the supports too, after .double()): only the summation order differs
    tol = {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(fast, ref, **tol)
    for g_fast, g_ref in zip(_grads(layer, x, fast), _grads(layer, x, ref)):
        torch.testing.assert_close(g_fast, g_ref, **tol)


def test_cpu_operators_are_csr_constants_rebuilt_per_dtype():
    n = 10
    layer = DiffusionGraphConv(3, _random_supports(n), order=2)
    x = torch.randn(2, 3, n, 3)
    layer(x)
    ((p, p_t),) = [ops for ops in layer._operator_cache.values()][0][:1]
    assert p.layout == torch.sparse_csr and p_t.layout == torch.sparse_csr
    torch.testing.assert_close(p.to_dense(), layer.support_0)
    torch.testing.assert_close(p_t.to_dense(), layer.support_0.T)
    layer.double()
    layer(x.double())
    assert list(layer._operator_cache) == [(torch.device("cpu"), torch.float64)]
    assert not any(b.requires_grad for b in layer.buffers())


def test_backward_keeps_only_the_node_major_input_not_the_diffusion_terms():
    """What autograd saves: one node-major copy of ``x`` for all the term GEMMs, not the terms.

    The straightforward formula keeps every term ``P^k x`` (and their concatenation) for the
    backward pass of the mix; here the weights come first, the self term's included, and the
    products with the constant supports save nothing, so the layer keeps one copy of ``x``
    (the parameters are not counted). With output dropout in training on the CPU it adds a
    byte per output entry (``F.dropout`` would keep a float).
    """
    n, c = 13, 8
    layer = DiffusionGraphConv(c, _random_supports(n), order=3).train()  # 6 diffusion terms
    x = torch.randn(4, 5, n, c, requires_grad=True).transpose(1, 2).contiguous().transpose(1, 2)
    x_bytes = x.numel() * x.element_size()
    assert saved_activation_bytes(layer, x) == x_bytes  # the node-major copy, nothing else
    ref_bytes = saved_activation_bytes(layer, x, lambda z: straightforward(layer, z))
    assert ref_bytes > 4 * x_bytes  # the check can tell the two apart
    layer.dropout.p = 0.3
    assert saved_activation_bytes(layer, x) == x_bytes + x.numel()  # + a one-byte keep mask
    # the learned adjacency's K products keep their inputs (K copies) and A, relu(E_1 E_2^T)
    adaptive = DiffusionGraphConv(c, _random_supports(n), order=3, adaptive=True).train()
    assert saved_activation_bytes(adaptive, x) <= 4 * x_bytes + 2 * n * n * 4


@pytest.mark.parametrize("adaptive", [True, False])
def test_training_dropout_draws_outputs_and_gradients_equal_the_formula(adaptive):
    """In training (output dropout 0.3, float64) the same seed drops the same entries as
    ``nn.Dropout`` in the straightforward formula, and outputs and gradients agree."""
    torch.manual_seed(0)
    n = 9
    layer = DiffusionGraphConv(6, _random_supports(n), order=2, adaptive=adaptive, dropout=0.3)
    layer = layer.double().train()
    x = torch.randn(2, n, 5, 6, dtype=torch.float64).transpose(1, 2).requires_grad_()
    results = []
    for f in (layer, lambda z: straightforward(layer, z)):
        torch.manual_seed(7)
        out = f(x)
        results.append((out, _grads(layer, x, out)))
    (fast, g_fast), (ref, g_ref) = results
    assert torch.equal(fast == 0, ref == 0) and (ref == 0).double().mean() > 0.2
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_transposed_input_and_training_dropout_match():
    """The block feeds a transposed view of the attention output; dropout draws stay the same."""
    torch.manual_seed(0)
    n = 9
    layer = DiffusionGraphConv(6, _random_supports(n), order=2, adaptive=True, dropout=0.3).train()
    x = torch.randn(2, n, 5, 6).transpose(1, 2)  # [B, T, N, C], not contiguous
    torch.manual_seed(7)
    fast = layer(x)
    torch.manual_seed(7)
    ref = straightforward(layer, x)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    assert (fast == 0).float().mean() > 0.1  # dropout was active in both


def test_fixed_powers_are_constant_buffers_and_state_dict_keys_unchanged():
    n = 8
    sup = _random_supports(n)
    layer = DiffusionGraphConv(4, sup, order=3, adaptive=True)
    assert sorted(layer.state_dict()) == ["e1", "e2", "mix.bias", "mix.weight"]
    assert not layer.fixed_powers.requires_grad
    expected = torch.stack(
        [
            sup[0],
            sup[0] @ sup[0],
            sup[0] @ sup[0] @ sup[0],
            sup[1],
            sup[1] @ sup[1],
            sup[1] @ sup[1] @ sup[1],
        ]
    )
    torch.testing.assert_close(layer.fixed_powers, expected)
    assert layer.powers().shape == (9, n, n)  # fixed powers then the adaptive A, A^2, A^3
    torch.testing.assert_close(layer.powers()[:6], expected)


def test_sparse_layer_still_equals_the_dense_one():
    torch.manual_seed(0)
    n = 12
    dense = DiffusionGraphConv(4, _random_supports(n), order=2, adaptive=True).eval()
    sparse = SparseDiffusionGraphConv.from_dense(dense).eval()
    assert sparse.fixed_powers.shape[0] == 0  # no dense O(N^2) cache on the sparse path
    x = torch.randn(2, 3, n, 4)
    torch.testing.assert_close(sparse(x), dense(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse.powers(), dense.powers(), rtol=1e-5, atol=1e-6)


def test_committed_quick_weights_load_and_predict_as_the_straightforward_model():
    """``book/results/quick/none_seed0.pt`` loads strictly; predictions equal the formula's."""
    state = torch.load(
        ROOT / "book/results/quick/none_seed0.pt", map_location="cpu", weights_only=True
    )
    n = state["blocks.0.gconv.e1"].shape[0]
    d = state["speed_embed.weight"].shape[0]
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    model = TSModel(n, _random_supports(n), variant="none", d_model=d, n_heads=2, depth=depth)
    model.load_state_dict(state, strict=True)
    reference = copy.deepcopy(model)
    for block in reference.blocks:
        block.gconv = Straightforward(block.gconv)
    model.eval()
    reference.eval()
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randn(4, 12, n, generator=g), torch.rand(4, 12, n, generator=g)], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-4)
