"""Attention and forecast statistics on cases whose answers are known (diagsink/stats.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diagsink import stats


@pytest.mark.parametrize("T", [2, 5, 12])
def test_identity_attention(T):
    eye = torch.eye(T).expand(3, 2, T, T)
    dm = stats.diagonal_mass(eye)
    assert dm.mass == pytest.approx(1.0)
    assert dm.uniform == pytest.approx(1.0 / T)
    assert dm.ratio == pytest.approx(T)
    torch.testing.assert_close(stats.attention_entropy(eye), torch.zeros(3, 2, T))
    assert stats.column_stripe_index(eye) == pytest.approx(0.0, abs=1e-12)
    assert stats.self_share(eye) == pytest.approx(1.0)


@pytest.mark.parametrize("T", [2, 7, 16])
def test_uniform_attention(T):
    uni = torch.full((4, T, T), 1.0 / T)
    dm = stats.diagonal_mass(uni)
    assert dm.mass == pytest.approx(1.0 / T)
    assert dm.ratio == pytest.approx(1.0)
    torch.testing.assert_close(stats.attention_entropy(uni), torch.full((4, T), math.log(T)))
    torch.testing.assert_close(stats.attention_entropy(uni, normalized=True), torch.ones(4, T))
    assert stats.lag_mass(uni, 1) == pytest.approx(1.0 / T)
    assert stats.column_stripe_index(uni) == 0.0
    assert stats.self_share(uni) == pytest.approx(1.0 / T)


def test_masked_and_shifted_attention():
    T = 6
    shifted = torch.diag(torch.ones(T - 2), -2)  # α_{i, i-2} = 1 for i >= 2
    shifted[0, 3] = shifted[1, 4] = 1.0  # the first two rows look ahead
    assert stats.diagonal_mass(shifted).mass == 0.0
    assert stats.lag_mass(shifted, 2) == pytest.approx(1.0)
    assert stats.self_share(shifted, lag=2) == pytest.approx(1.0)
    assert stats.lag_mass(shifted, 1) == pytest.approx(0.0)


def test_column_stripes_are_one_when_every_row_is_the_same():
    T = 8
    row = torch.softmax(torch.randn(T) * 3, 0)
    assert stats.column_stripe_index(row.expand(T, T)) == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(2, 12), seed=st.integers(0, 10_000), scale=st.floats(0.1, 5.0))
def test_ranges_on_random_attention(T, seed, scale):
    g = torch.Generator().manual_seed(seed)
    attn = torch.softmax(scale * torch.randn(3, T, T, generator=g, dtype=torch.float64), -1)
    ent = stats.attention_entropy(attn, normalized=True)
    assert torch.all(ent >= -1e-12) and torch.all(ent <= 1 + 1e-9)
    assert 0.0 <= stats.column_stripe_index(attn) <= 1.0 + 1e-9
    assert 0.0 <= stats.diagonal_mass(attn).mass <= 1.0
    assert 0.0 <= stats.self_share(attn) <= 1.0


def test_parroting_score_known_cases():
    g = torch.Generator().manual_seed(1)
    last = torch.randn(50, generator=g)
    target = torch.randn(50, generator=g)
    assert stats.parroting_score(last.clone(), last, target) == pytest.approx(1.0)
    assert stats.parroting_score(target.clone(), last, target) == pytest.approx(0.0)
    for c in (0.25, 0.5, 0.9):
        assert stats.parroting_score(last + c * (target - last), last, target) == pytest.approx(
            1 - c
        )
    # further away than the truth: clipped at 0
    assert stats.parroting_score(last + 3 * (target - last), last, target) == 0.0


def test_bad_inputs_raise_with_the_expected_shape():
    with pytest.raises(ValueError, match=r"\[\.\.\., T, T\]"):
        stats.diagonal_mass(torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"\[\.\.\., T, T\]"):
        stats.attention_entropy(torch.ones(5))
    with pytest.raises(ValueError, match="lag"):
        stats.lag_mass(torch.eye(4), 4)
    with pytest.raises(ValueError, match="same shape"):
        stats.parroting_score(torch.zeros(3), torch.zeros(4), torch.zeros(3))
    with pytest.raises(ValueError, match="undefined"):
        stats.parroting_score(torch.zeros(3), torch.ones(3), torch.ones(3))
