"""Dropout in ``TemporalAttention``: the statistics of both kinds of draw, on the fused path.

Two random draws act in training: the *diagonal dropout* regularizer (``diag="dropout"``: each
diagonal logit is ``-inf`` with probability ``diag_p``, one pattern ``torch.rand(T) < p`` per
forward pass shared by every sequence and head, as in the paper's released code) and the
*attention dropout* (each weight is zeroed with probability ``dropout`` and the others scaled
by ``1 / (1 - dropout)``). The fused path passes the first as the additive ``attn_mask`` and
the second as ``dropout_p`` of ``scaled_dot_product_attention``; these tests check that what it
computes has the distribution the formula says, without looking at how it is computed.
Explained in ``book/attention.ipynb``.
"""

from __future__ import annotations

import math

import torch

from diagsink.attention import TemporalAttention


def _uniform_layer(t_heads: int = 1, **kw) -> TemporalAttention:
    """``q = k = 0`` (uniform weights ``1/T``), ``v = 1`` per channel, no output projection:
    the output of step ``i`` is the (dropped, rescaled) sum of its weights, no residual."""
    layer = TemporalAttention(t_heads, t_heads, residual=False, out_proj=False, **kw).double()
    with torch.no_grad():
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj):
            proj.weight.zero_()
            proj.bias.zero_()
        layer.v_proj.bias.fill_(1.0)
    return layer.train()


def test_attention_dropout_drops_a_share_p_and_rescales():
    torch.manual_seed(0)
    T, p, n = 4, 0.2, 50_000
    layer = _uniform_layer(dropout=p)
    y = layer(torch.zeros(n, T, 1, dtype=torch.float64))  # Σ_j keep_ij / (T (1 - p))
    kept = (y * T * (1 - p)).round()  # kept keys of each row: an integer in 0..T
    torch.testing.assert_close(kept, y * T * (1 - p), rtol=0, atol=1e-9)
    share = 1 - kept.mean().item() / T
    # n T Bernoulli draws: standard error sqrt(p (1 - p) / (n T)) < 1e-3; 5 of them
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / (n * T)), share
    assert abs(y.mean().item() - 1.0) < 5e-3  # unbiased: E[y] = 1 (the weights' sum)
    assert torch.equal(layer.eval()(torch.zeros(3, T, 1, dtype=torch.float64)), torch.ones(3, T, 1))


def test_diagonal_dropout_is_one_pattern_per_pass_with_rate_p():
    """Each pass drops diagonal entry ``i`` with probability ``diag_p``, the same entries in every
    sequence and head; a dropped row gives its self-key weight 0 and the others ``1 / (T - 1)``."""
    torch.manual_seed(1)
    T, p, passes = 6, 0.3, 4000
    layer = _uniform_layer(2, diag="dropout", diag_p=p)
    x = torch.zeros(5, 3, T, 2, dtype=torch.float64)
    dropped_rows = []
    for _ in range(passes):
        _, attn = layer(x, return_attention=True)  # [5, 3, H, T, T]
        diag = attn.diagonal(dim1=-2, dim2=-1)  # 0 where dropped, 1/T where kept
        assert bool(((diag == 0) == (diag[0, 0, 0] == 0)).all())  # shared by sequences, heads
        dropped_rows.append(diag[0, 0, 0] == 0)
    rate = torch.stack(dropped_rows).double().mean(0)  # per step i
    # `passes` draws per step: standard error sqrt(p (1 - p) / passes) < 7.3e-3; 5 of them
    assert (rate - p).abs().max().item() < 5 * math.sqrt(p * (1 - p) / passes), rate
    assert layer.eval()(x, return_attention=True)[1].diagonal(dim1=-2, dim2=-1).min() > 0


def test_fused_path_has_the_same_diagonal_dropout_distribution():
    """The fused path (no weights returned) with diagonal dropout: a dropped step's output loses
    its own value; with ``v_j = e_j`` (one channel per step) its mean over passes is
    ``(1 - p) / T`` on the diagonal and ``(1 - p) / T + p / (T - 1)`` off it."""
    torch.manual_seed(2)
    T, p, passes = 4, 0.25, 6000
    layer = TemporalAttention(T, 1, diag="dropout", diag_p=p, residual=False, out_proj=False)
    layer = layer.double().train()
    with torch.no_grad():
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj):
            proj.bias.zero_()
        layer.q_proj.weight.zero_()
        layer.k_proj.weight.zero_()
        layer.v_proj.weight.copy_(torch.eye(T))  # v_j = x_j = e_j: output i holds row i of α
    x = torch.eye(T, dtype=torch.float64).expand(3, T, T)
    mean = sum(layer(x) for _ in range(passes)) / passes  # [3, T, T]: E[α]
    expect = torch.full((T, T), (1 - p) / T + p / (T - 1), dtype=torch.float64)
    expect.fill_diagonal_((1 - p) / T)
    # one shared pattern per pass: `passes` draws per entry, standard error < 0.006; 5 of them
    torch.testing.assert_close(mean, expect.expand(3, T, T), rtol=0, atol=0.03)
