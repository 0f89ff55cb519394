"""diagsink.released re-states the released code's behaviour: split, graph layer, block, mask.

The expected numbers are worked out by hand in each test (int() truncation of 0.7 / 0.1 / 0.2
of 34272 steps; the diagonal-only contraction; the attn_mask rules), not produced by the code
under test.
"""

from __future__ import annotations

import pytest
import torch

from diagsink.data.files import FULL_STEPS
from diagsink.data.windows import split_windows as package_split
from diagsink.errors import ConfigError, DataError
from diagsink.released import (
    DEFAULTS,
    ReleasedBlock,
    ReleasedGCN,
    adaptive_supports,
    diag_attn_mask,
    split_bounds,
    split_windows,
)


def test_split_bounds_truncate_on_the_full_series():
    # int(23990.4) = 23990, int(3427.2) = 3427, int(6854.4) = 6854: the last step is never used
    assert FULL_STEPS == 34272
    assert split_bounds(FULL_STEPS) == ((0, 23990), (23990, 27417), (27417, 34271))
    # the package's split-first rounds instead: val 3428 steps, test from step 27418 to the end
    pkg = package_split(FULL_STEPS, order="split-first")
    assert int(pkg.val[0]) == 23990 and int(pkg.test[0]) == 27418
    assert int(pkg.test[-1]) + 24 == FULL_STEPS


def test_split_windows_counts_and_starts():
    s = split_windows(FULL_STEPS)
    assert s.counts() == {"train": 23990 - 23, "val": 3427 - 23, "test": 6854 - 23}
    assert s.counts()["test"] == 6831  # the same count as the package's split-first
    assert (
        int(s.test[0]) == 27417 and int(s.test[-1]) + 24 == 34271
    )  # one step earlier, last dropped
    assert int(s.val[-1]) + 24 == int(s.test[0])  # no window crosses a boundary
    # on the 1026-step slice: 718 / 102 / 205 steps, step 1025 unused
    assert split_bounds(1026) == ((0, 718), (718, 820), (820, 1025))
    assert split_windows(1026).counts() == {"train": 695, "val": 79, "test": 182}


@pytest.mark.bad_input
def test_split_rejects_bad_ratios():
    with pytest.raises(ConfigError, match="sum to 1"):
        split_bounds(1000, (0.7, 0.2, 0.2))


@pytest.mark.bad_input
def test_split_rejects_a_series_too_short():
    with pytest.raises(DataError, match="fewer than one window"):
        split_windows(100)


@pytest.mark.bad_input
def test_split_rejects_a_non_integer_length():
    with pytest.raises(ConfigError, match="positive integer"):
        split_bounds(-5)


def test_adaptive_supports_are_two_learned_random_walks():
    g = torch.Generator().manual_seed(1)
    e1, e2 = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g)
    fwd, bwd = adaptive_supports(e1, e2)
    by_hand = torch.softmax(torch.relu(e1 @ e2.T), dim=1)
    torch.testing.assert_close(fwd, by_hand)
    torch.testing.assert_close(bwd, torch.softmax(torch.relu(e2 @ e1.T), dim=1))
    torch.testing.assert_close(fwd.sum(1), torch.ones(7))
    torch.testing.assert_close(bwd.sum(1), torch.ones(7))
    assert not torch.allclose(bwd, fwd.T)  # the backward support is not the forward's transpose
    assert (fwd - torch.diag(torch.diagonal(fwd))).abs().sum() > 0  # dense off the diagonal


def test_released_gcn_reads_only_the_diagonal():
    gcn = ReleasedGCN(4, 6, dropout=0.0).eval()
    x = torch.randn(2, 3, 6, 4)
    fwd, bwd = adaptive_supports(gcn.source, gcn.target)
    df, db = torch.diagonal(fwd)[:, None], torch.diagonal(bwd)[:, None]
    expected = [x, df * x, df**2 * x, db * x, db**2 * x]
    for got, want in zip(gcn.terms(x), expected, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(gcn(x), gcn.mlp(torch.cat(expected, dim=-1)))
    # perturbing sensor 2 changes sensor 2's output only, although the supports are dense
    x2 = x.clone()
    x2[:, :, 2] += 1.0
    with torch.no_grad():
        changed = (gcn(x2) - gcn(x)).abs().amax(dim=(0, 1, 3)) > 0
    assert changed.tolist() == [False, False, True, False, False, False]
    # a contraction over m (the matrix product) would have moved it to every sensor
    mixed = torch.einsum("nm,btmc->btnc", fwd, x2) - torch.einsum("nm,btmc->btnc", fwd, x)
    assert bool((mixed.abs().amax(dim=(0, 1, 3)) > 0).all())


@pytest.mark.bad_input
def test_released_gcn_rejects_a_bad_order():
    with pytest.raises(ValueError, match="positive integer"):
        ReleasedGCN(4, 6, order=0)


def test_diag_attn_mask_rules():
    assert torch.equal(diag_attn_mask(4, mask=True), torch.eye(4, dtype=torch.bool))
    assert diag_attn_mask(4) is None  # (b) with the penalty set to 0: no mask at all
    # the released default penalty -0.05 is added even when no regularizer is meant
    m = diag_attn_mask(4, diag_penalty=DEFAULTS["diag_penalty"])
    torch.testing.assert_close(m, -0.05 * torch.eye(4))
    # a dropout run keeps the penalty: at evaluation only the penalty is left
    torch.testing.assert_close(
        diag_attn_mask(4, diag_p=0.2, diag_penalty=-0.05), -0.05 * torch.eye(4)
    )
    # in training with p = 1 every diagonal entry is -inf, the off-diagonal stays 0
    drop = diag_attn_mask(5, diag_p=1.0, diag_penalty=-0.05, training=True)
    off = ~torch.eye(5, dtype=torch.bool)
    assert torch.isinf(torch.diagonal(drop)).all() and drop[off].eq(0).all()
    # in eval mode, dropout alone gives a zero mask (nothing dropped)
    assert torch.equal(diag_attn_mask(5, diag_p=0.2), torch.zeros(5, 5))


def test_diag_attn_mask_drop_rate():
    g = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [
            torch.isinf(torch.diagonal(diag_attn_mask(12, diag_p=0.2, training=True, generator=g)))
            for _ in range(2000)
        ]
    ).float()
    # 24000 Bernoulli(0.2) draws: sd of the mean = sqrt(0.2 * 0.8 / 24000) = 0.0026; 4 sd = 0.011
    assert abs(float(draws.mean()) - 0.2) < 0.011


def test_released_block_time_of_day_never_enters_the_attention():
    block = ReleasedBlock(8, 2, 5, dropout=0.0, attn_dropout=0.0).eval()
    x = torch.randn(3, 6, 5, 8)
    tod, tod2 = torch.rand(3, 6, 5, 1), torch.rand(3, 6, 5, 1)
    with torch.no_grad():
        y, w = block(x, tod)
        y2, w2 = block(x, tod2)
    assert w.shape == (3, 5, 2, 6, 6)
    torch.testing.assert_close(w, w2)  # the weights ignore the time of day
    assert not torch.allclose(y, y2)  # the output does not
    # the block by hand from its own parts
    with torch.no_grad():
        seq = x.transpose(1, 2).reshape(15, 6, 8)
        a, _ = block.attn(seq, seq, seq)
        a = a.reshape(3, 5, 6, 8).transpose(1, 2)
        h = block.temp_norm(x + a + block.temporal_bias(tod))
        by_hand = block.space_norm(h + block.gcn(h) + block.spatial_bias(tod))
    torch.testing.assert_close(y, by_hand)


def test_released_block_without_residual_and_with_a_mask():
    block = ReleasedBlock(8, 2, 5, residual=False, dropout=0.0, attn_dropout=0.0).eval()
    x, tod = torch.randn(2, 6, 5, 8), torch.rand(2, 6, 5, 1)
    with torch.no_grad():
        y, w = block(x, tod, attn_mask=diag_attn_mask(6, mask=True))
        seq = x.transpose(1, 2).reshape(10, 6, 8)
        a, _ = block.attn(seq, seq, seq, attn_mask=torch.eye(6, dtype=torch.bool))
        h = block.temp_norm(a.reshape(2, 5, 6, 8).transpose(1, 2) + block.temporal_bias(tod))
    assert torch.diagonal(w, dim1=-2, dim2=-1).eq(0).all()  # the mask removes the diagonal
    torch.testing.assert_close(y, block.space_norm(h + block.gcn(h) + block.spatial_bias(tod)))


def test_the_released_graph_layer_switch_mixes_no_sensors():
    """``model.graph_layer: released``: every block's graph layer is the released one, so a
    sensor's forecast depends on its own inputs only; the book's diffusion layer mixes them."""
    from diagsink.data.adjacency import diffusion_supports
    from diagsink.model import TSModel
    from diagsink.released import ReleasedGCN

    adj = torch.eye(4) + torch.diag(torch.ones(3), 1)  # a chain 0 -> 1 -> 2 -> 3
    supports = diffusion_supports(adj.numpy())
    x = torch.randn(1, 12, 4, 2, dtype=torch.float64)
    for layer, mixes in (("released", False), ("diffusion", True)):
        torch.manual_seed(0)
        model = (
            TSModel(4, supports, d_model=8, n_heads=2, depth=2, graph_layer=layer).double().eval()
        )
        assert all(isinstance(b.gconv, ReleasedGCN) == (layer == "released") for b in model.blocks)

        def first_sensor(z, net=model):
            return net(z)[0, :, 0]

        jac = torch.autograd.functional.jacobian(first_sensor, x)  # [12, 1, 12, 4, 2]
        others = jac[..., 1:, :].abs().max().item()
        assert (others > 1e-8) == mixes, (layer, others)
    with pytest.raises(ConfigError, match="graph_layer.*diffusion.*released"):
        TSModel(4, supports, d_model=8, n_heads=2, depth=1, graph_layer="gcn")
