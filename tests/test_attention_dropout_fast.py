"""The CPU training path with attention dropout computes the layer's explicit formula.

``TemporalAttention`` in training mode with ``dropout > 0`` on the CPU calls
``_packing.dropout_attention`` (one QKV GEMM, the softmax written out, a boolean keep mask and a
hand-written backward pass). Written here without the package's fast code, the formula is
``y = x + W_O merge(dropout(softmax(q k^T / sqrt(d_h) + b)) v)``; with the same seed both draw
the same diagonal pattern and the same keep mask (the fast path draws ``bernoulli_(1 - p)``
as ``F.dropout`` does), so outputs and gradients must agree to float64 rounding.
"""

from __future__ import annotations

import pytest
import torch

from diagsink._packing import _DropoutAttention
from diagsink.attention import TemporalAttention, bias_from_diagonal
from diagsink.scaling import saved_activation_bytes


def explicit(layer: TemporalAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's formula in training mode, from its pieces: ``[..., T, C] -> [..., T, C]``."""
    x = layer.pos(x)
    h = layer.norm(x) if layer.norm_kind == "pre" else x
    b = bias_from_diagonal(layer.diagonal(h), h.shape[-2], h.dtype, h.device)
    attn = torch.softmax(layer._logits(h, b), dim=-1)  # [..., H, T, T]
    v = layer.split_heads(layer.v_proj(h))
    y = x + layer.out_proj(layer.merge_heads(torch.nn.functional.dropout(attn, layer.dropout) @ v))
    return layer.norm(y) if layer.norm_kind == "post" else y


@pytest.mark.parametrize(
    ("diag", "shared", "norm"),
    [
        (None, True, "post"),
        ("dropout", False, "post"),
        ("dropout", True, "pre"),
        ("mask", True, None),
    ]
    + [("penalty", True, "post")],
)
def test_outputs_and_gradients_equal_the_explicit_formula(diag, shared, norm):
    torch.manual_seed(0)
    kw = {"diag_p": 0.3, "diag_shared": shared} if diag == "dropout" else {}
    layer = TemporalAttention(12, 3, diag=diag, norm=norm, dropout=0.25, **kw).double().train()
    x = torch.randn(2, 5, 7, 12, dtype=torch.float64).transpose(1, 2).requires_grad_()  # strided
    weights = torch.randn(2, 7, 5, 12, dtype=torch.float64)
    params = list(layer.parameters())
    results = []
    for f in (layer, lambda z: explicit(layer, z)):
        torch.manual_seed(11)
        y = f(x)
        results.append((y, torch.autograd.grad((y * weights).sum(), [x, *params])))
    (fast, g_fast), (ref, g_ref) = results
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert not torch.equal(layer.eval()(x), fast)  # dropout was active in training


def test_core_gradcheck_with_a_masked_diagonal():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 6, 6, dtype=torch.float64, generator=g)  # M = 4 sequences, C = 6
    weight = torch.randn(18, 6, dtype=torch.float64, generator=g)
    b_qkv = torch.randn(18, dtype=torch.float64, generator=g)
    bias = torch.zeros(6, 6, dtype=torch.float64).fill_diagonal_(float("-inf"))

    def core(h, weight, b_qkv):
        torch.manual_seed(5)  # the same keep mask in every evaluation
        return _DropoutAttention.apply(h, weight, b_qkv, bias, 0.3, 2)

    inputs = tuple(t.requires_grad_() for t in (h, weight, b_qkv))
    assert torch.autograd.gradcheck(core, inputs)


def test_backward_keeps_the_input_not_q_k_v():
    """Saved: the projection's input ``h``, the weights ``α`` and a byte mask; ``q, k, v`` are
    recomputed in the backward pass (the straightforward path keeps them: 3 more copies of ``h``)."""
    torch.manual_seed(0)
    c, t = 16, 12
    layer = TemporalAttention(c, 4, dropout=0.1).train()
    x = torch.randn(3, 50, t, c, requires_grad=True)
    x_bytes = x.numel() * x.element_size()
    fast_units = saved_activation_bytes(layer, x) / x_bytes
    units = saved_activation_bytes(layer, x, lambda z: explicit(layer, z)) / x_bytes
    # fast: at most h, the LayerNorm input and W_O's input (3 copies of x), α (H T / C = 3 copies
    # of x here) and its byte mask (0.75), and the LayerNorm statistics
    assert fast_units < 7.0, fast_units
    assert units > fast_units + 2.5, (units, fast_units)  # the explicit path keeps q, k, v too


def test_dropped_share_matches_the_rate():
    torch.manual_seed(0)
    n = 200_000
    # q = k = 0 (uniform weights 1/4: a dropped entry is one output term lost), v = 1
    h = torch.ones(n, 4, 1)
    weight, b_qkv = torch.zeros(3, 1), torch.tensor([0.0, 0.0, 1.0])
    out = _DropoutAttention.apply(h, weight, b_qkv, None, 0.2, 1)  # = (kept keys / 4) / 0.8
    kept = out.flatten() * 0.8 * 4
    share = 1 - kept.mean().item() / 4
    # 4 n Bernoulli draws: standard error sqrt(0.2 * 0.8 / (4 n)) < 5e-4; 5 of them
    assert abs(share - 0.2) < 2.5e-3, share
