"""Positional encodings: sinusoidal, tAPE (Foumani et al. 2024), learned, none (``book/attention.ipynb``)."""

from __future__ import annotations

import math

import pytest
import torch

import diagsink as ds
from diagsink.positional import POSITIONAL_OPTIONS, PositionalEncoding, positional_table


@pytest.mark.parametrize("table", [ds.sinusoidal_table, ds.tape_table])
@pytest.mark.parametrize("T, C", [(12, 72), (5, 8), (7, 9), (1, 4), (30, 2)])
def test_shape_and_first_row(table, T, C):
    P = table(T, C, dtype=torch.float64)
    assert P.shape == (T, C) and P.dtype == torch.float64
    first = torch.tensor([0.0, 1.0] * (C // 2) + [0.0] * (C % 2), dtype=torch.float64)
    torch.testing.assert_close(P[0], first, rtol=0, atol=0)  # P[0] = [0, 1, 0, 1, ...]
    assert float(P.abs().max()) <= 1.0


def _sinusoid(t: float, i: int, C: int) -> float:
    """Channel i of the sinusoid at (possibly fractional) position t, from the formula with math."""
    omega = 10000.0 ** (-(i - i % 2) / C)
    return math.sin(t * omega) if i % 2 == 0 else math.cos(t * omega)


@pytest.mark.parametrize("T, C", [(12, 72), (24, 16), (6, 7)])
def test_sinusoidal_known_values(T, C):
    P = ds.sinusoidal_table(T, C, dtype=torch.float64)
    for t in (1, 3, T - 1):
        for i in (0, 1, 2, 5, C - 1):
            assert P[t, i].item() == pytest.approx(_sinusoid(t, i, C), abs=1e-12)
    assert P[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-12)  # ω_0 = 1


@pytest.mark.parametrize("T, C", [(12, 72), (24, 16), (6, 7), (50, 8)])
def test_tape_scales_the_frequencies_by_C_over_T(T, C):
    P = ds.tape_table(T, C, dtype=torch.float64)
    for t in (1, 2, T - 1):
        for i in (0, 1, 4, C - 1):
            assert P[t, i].item() == pytest.approx(_sinusoid(t * C / T, i, C), abs=1e-12)
    assert P[1, 0].item() == pytest.approx(math.sin(C / T), abs=1e-12)


def test_tape_equals_sinusoidal_when_T_equals_C():
    torch.testing.assert_close(
        ds.tape_table(16, 16, dtype=torch.float64), ds.sinusoidal_table(16, 16, dtype=torch.float64)
    )


def test_tape_separates_neighbouring_steps_better_for_short_sequences():
    """The reason for tAPE: for T << C the plain sinusoid gives neighbouring steps nearly the same code."""
    T, C = 12, 72

    def neighbour_similarity(P):
        return torch.nn.functional.cosine_similarity(P[1:], P[:-1], dim=-1)

    sin_cos = neighbour_similarity(ds.sinusoidal_table(T, C, dtype=torch.float64))
    tape_cos = neighbour_similarity(ds.tape_table(T, C, dtype=torch.float64))
    assert bool((tape_cos < sin_cos).all())


def test_dtype_and_device_follow_the_arguments():
    assert ds.tape_table(4, 6).dtype == torch.float32
    assert ds.sinusoidal_table(4, 6, dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize("kind", ["sinusoidal", "tape"])
def test_module_adds_the_fixed_table(kind):
    pe = PositionalEncoding(kind, 8)
    x = torch.randn(2, 3, 10, 8, dtype=torch.float64)
    torch.testing.assert_close(pe(x), x + positional_table(kind, 10, 8, dtype=torch.float64))
    assert not list(pe.parameters()), "fixed tables have no parameters"


def test_none_is_the_identity():
    x = torch.randn(3, 5, 8)
    assert PositionalEncoding(None, 8)(x) is x


def test_learned_table_is_a_parameter_that_trains():
    pe = PositionalEncoding("learned", 8, max_len=20)
    assert pe.table.shape == (20, 8) and pe.table.requires_grad
    x = torch.randn(4, 6, 8)
    torch.testing.assert_close(pe(x), x + pe.table[:6])
    pe(x).sum().backward()
    assert pe.table.grad[:6].abs().sum() > 0 and pe.table.grad[6:].abs().sum() == 0
    with pytest.raises(ValueError, match=r"T=21 exceeds max_len=20"):
        pe(torch.randn(21, 8))


@pytest.mark.parametrize(
    "args, words",
    [
        (("rope", 8), ["pos_encoding='rope'", *[repr(o) for o in POSITIONAL_OPTIONS]]),
        (("learned", 0), ["d_model=0"]),
        (("learned", 8, 0), ["max_len=0"]),
    ],
)
def test_bad_arguments_raise(args, words):
    with pytest.raises(ValueError) as info:
        PositionalEncoding(*args)
    for word in words:
        assert word in str(info.value)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="length=0"):
        ds.tape_table(0, 8)
    with pytest.raises(ValueError, match="d_model=0"):
        ds.sinusoidal_table(4, 0)
    with pytest.raises(ValueError, match="'sinusoidal' or 'tape'"):
        positional_table("learned", 4, 8)


def test_layer_adds_the_encoding_before_the_projections():
    plain = ds.TemporalAttention(8, 2).double()
    tape = ds.TemporalAttention(8, 2, pos_encoding="tape").double()
    tape.load_state_dict(plain.state_dict())
    x = torch.randn(3, 12, 8, dtype=torch.float64)
    torch.testing.assert_close(tape(x), plain(x + ds.tape_table(12, 8, dtype=torch.float64)))


def test_positional_encoding_breaks_permutation_equivariance():
    """Without a positional encoding, attention does not know the order of the steps."""
    torch.manual_seed(0)
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    perm = torch.randperm(9)
    plain = ds.TemporalAttention(8, 2).double()
    torch.testing.assert_close(plain(x[:, perm]), plain(x)[:, perm])
    for kind in ("sinusoidal", "tape", "learned"):
        layer = ds.TemporalAttention(8, 2, pos_encoding=kind, max_len=16).double()
        assert not torch.allclose(layer(x[:, perm]), layer(x)[:, perm])
