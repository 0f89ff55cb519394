"""The T&S model and its graph convolution: shapes, variants, and real message passing."""

from __future__ import annotations

import pytest
import torch

import diagsink as ds  # noqa: F401  (the package must import cleanly)
from diagsink.data import load_metr_la
from diagsink.data.adjacency import diffusion_supports
from diagsink.errors import ConfigError
from diagsink.graphconv import (
    DiffusionGraphConv,
    adaptive_adjacency,
    receptive_field,
    released_code_contraction,
)
from diagsink.model import TSBlock, TSModel
from diagsink.variants import VARIANTS, attention_kwargs


def _path_graph(n: int) -> torch.Tensor:
    """Directed chain 0 -> 1 -> ... -> n-1 with self-loops."""
    a = torch.eye(n)
    for i in range(n - 1):
        a[i, i + 1] = 1.0
    return a


def _supports(a: torch.Tensor) -> list[torch.Tensor]:
    fwd = a / a.sum(1, keepdim=True)
    bwd = a.T / a.T.sum(1, keepdim=True)
    return [fwd, bwd]


def _block_output_change(block: TSBlock, n: int, sensor: int) -> torch.Tensor:
    """Max |change| of each sensor's block output when sensor ``sensor``'s input is perturbed."""
    block.eval()
    x = torch.randn(2, 12, n, 8)
    tod = torch.randn(2, 12, n, 8)
    x2 = x.clone()
    x2[:, :, sensor] += torch.randn(2, 12, 8)
    with torch.no_grad():
        diff = (block(x2, tod) - block(x, tod)).abs().amax(dim=(0, 1, 3))  # [N]
    return diff


def test_one_block_mixes_exactly_the_k_hop_neighbourhood():
    n, k = 7, 2
    a = _path_graph(n)
    block = TSBlock(8, 2, _supports(a), order=k, adaptive=False)
    diff = _block_output_change(block, n, sensor=3)
    reach = receptive_field(a, k)[3]  # sensors within 2 hops of sensor 3 (either direction)
    assert reach.tolist() == [False, True, True, True, True, True, False]
    assert (diff[reach] > 1e-4).all(), diff  # neighbours within K hops change
    assert (diff[~reach] == 0).all(), diff  # sensors 0 and 6 have no path within K hops: unchanged


def test_real_adjacency_pair(tmp_path):
    """A neighbour pair and an unreachable pair picked from the real METR-LA graph."""
    metr = load_metr_la()  # DIAGSINK_DATA (CI: the slice); missing data is an error, not a skip
    a = torch.as_tensor(metr.adjacency)
    n = a.shape[0]
    block = TSBlock(8, 2, diffusion_supports(metr.adjacency), order=1, adaptive=False)
    reach = receptive_field(a, 1)
    src = int(((reach.sum(1) > 1) & (reach.sum(1) < n)).nonzero()[0])
    diff = _block_output_change(block, n, sensor=src)
    neighbours = reach[src].clone()
    neighbours[src] = False
    assert neighbours.any() and (diff[neighbours] > 1e-4).all()
    assert (diff[~reach[src]] == 0).all()


def test_released_contraction_only_rescales_each_sensor():
    a = torch.rand(5, 5)
    x = torch.randn(2, 3, 5, 4)
    y = released_code_contraction(a, x)
    torch.testing.assert_close(y, torch.diagonal(a)[:, None] * x)
    x2 = x.clone()
    x2[:, :, 0] += 1.0
    change = (released_code_contraction(a, x2) - y).abs().amax(dim=(0, 1, 3))
    assert change[0] > 0 and (change[1:] == 0).all()
    # our diffusion step does mix: sensor 0's perturbation reaches every sensor linked to it
    ours = (a @ x2 - a @ x).abs().amax(dim=(0, 1, 3))
    assert (ours > 0).all()


def test_adaptive_adjacency_is_row_stochastic_and_dense():
    p = adaptive_adjacency(torch.randn(6, 3), torch.randn(6, 3))
    torch.testing.assert_close(p.sum(1), torch.ones(6))
    assert (p > 0).all()


def test_graphconv_rejects_no_mixing_and_bad_shapes():
    with pytest.raises(ValueError, match="could not mix sensors"):
        DiffusionGraphConv(4)
    conv = DiffusionGraphConv(4, _supports(_path_graph(3)))
    with pytest.raises(ValueError, match="nodes=3"):
        conv(torch.randn(1, 2, 5, 4))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_map_to_attention_arguments(variant):
    a = _path_graph(4)
    model = TSModel(
        4,
        _supports(a),
        variant=variant,
        d_model=8,
        n_heads=2,
        depth=2,
        diag_p=0.3,
        diag_penalty=-0.7,
    )
    att = model.blocks[0].attn
    expect = attention_kwargs(variant, diag_p=0.3, diag_penalty=-0.7)
    assert att.residual == expect["residual"] and att.diag == expect["diag"]
    if variant == "dropout":
        assert att.diag_p == 0.3
    if variant == "penalty":
        assert att.diag_penalty == -0.7
    x = torch.randn(3, 12, 4, 2)
    y, attn = model(x, return_attention=True)
    assert y.shape == (3, 12, 4) and torch.isfinite(y).all()
    assert attn.shape == (3, 4, 2, 12, 12)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 4, 2, 12))
    if variant == "mask":
        assert (torch.diagonal(attn, dim1=-2, dim2=-1) == 0).all()


def test_unknown_variant_names_the_allowed_ones():
    with pytest.raises(ConfigError, match="no_residual, none, mask, dropout, penalty"):
        attention_kwargs("diag-mask")


def test_output_is_unscaled_speed():
    a = _path_graph(3)
    model = TSModel(3, _supports(a), d_model=8, n_heads=2, depth=1, speed_mean=60.0, speed_std=10.0)
    model2 = TSModel(3, _supports(a), d_model=8, n_heads=2, depth=1, speed_mean=0.0, speed_std=1.0)
    model2.load_state_dict(
        {k: v for k, v in model.state_dict().items() if k not in ("speed_mean", "speed_std")},
        strict=False,
    )
    model.eval(), model2.eval()
    x = torch.randn(2, 12, 3, 2)
    torch.testing.assert_close(model(x), model2(x) * 10.0 + 60.0)


def test_model_rejects_wrong_input_layout():
    model = TSModel(3, _supports(_path_graph(3)), d_model=8, n_heads=2, depth=1)
    with pytest.raises(ValueError, match="scaled speed, time of day"):
        model(torch.randn(2, 3, 12, 2))


def test_exercise_checks_accept_references_and_hint_typical_mistakes():
    from diagsink.exercises import check
    from diagsink.exercises.model import reference_diffusion_terms, reference_lr_schedule

    assert check("ex-model-diffusion", reference_diffusion_terms).passed
    transposed = check("ex-model-diffusion", lambda p, x, k: reference_diffusion_terms(p.T, x, k))
    assert not transposed.passed and "P^T" in transposed.message
    diag_only = check(
        "ex-model-diffusion",
        lambda p, x, k: torch.cat([x] + [torch.diagonal(p)[:, None] * x] * k, -1),
    )
    assert not diag_only.passed and "diagonal" in diag_only.message
    assert check("ex-model-schedule", reference_lr_schedule).passed
    to_zero = check(
        "ex-model-schedule", lambda e, lr, lo, w, n: reference_lr_schedule(e, lr, 0.0, w, n)
    )
    assert not to_zero.passed and "min_lr" in to_zero.message


def test_activation_checkpointing_gives_the_same_gradients():
    a = _path_graph(5)
    grads = []
    for flag in (False, True):
        torch.manual_seed(0)
        model = TSModel(
            5,
            _supports(a),
            variant="dropout",
            d_model=8,
            n_heads=2,
            depth=3,
            dropout=0.2,
            checkpoint_blocks=flag,
        )
        model.train()
        torch.manual_seed(1)
        x = torch.randn(4, 12, 5, 2)
        model(x).square().mean().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], msg=k)


# -- block order: "ts" (temporal attention then graph conv, the paper's) and "st" ---------------------------
def _pair(depth: int = 2, variant: str = "none", seed: int = 0):
    """A "ts" and an "st" model with the same weights (same modules, same initialisation)."""
    a = _path_graph(5)
    models = []
    for order in ("ts", "st"):
        torch.manual_seed(seed)
        models.append(
            TSModel(
                5,
                _supports(a),
                variant=variant,
                d_model=8,
                n_heads=2,
                depth=depth,
                block_order=order,
            ).eval()
        )
    return models


@pytest.mark.parametrize("order", ["ts", "st"])
def test_block_order_shapes_and_attention_path(order):
    a = _path_graph(5)
    model = TSModel(5, _supports(a), d_model=8, n_heads=2, depth=2, block_order=order).eval()
    assert model.block_order == order and all(b.block_order == order for b in model.blocks)
    x = torch.randn(3, 12, 5, 2)
    with torch.no_grad():
        y, attn = model(x, return_attention=True)
        y_plain = model(x)
    assert y.shape == (3, 12, 5) and attn.shape == (3, 5, 2, 12, 12)
    torch.testing.assert_close(y, y_plain)  # the explicit attention path computes the same forecast
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 5, 2, 12))
    block = TSBlock(8, 2, _supports(a), block_order=order).eval()
    h, tod = torch.randn(2, 12, 5, 8), torch.randn(2, 12, 5, 8)
    with torch.no_grad():
        out, att = block(h, tod, return_attention=True)
        torch.testing.assert_close(out, block(h, tod))
    assert out.shape == h.shape and att.shape == (2, 5, 2, 12, 12)


def test_block_orders_are_different_functions_of_the_same_weights():
    ts, st = _pair()
    assert ts.state_dict().keys() == st.state_dict().keys()
    for k, v in ts.state_dict().items():
        # same initialisation from the same seed
        torch.testing.assert_close(st.state_dict()[k], v, msg=k)
    x = torch.randn(2, 12, 5, 2)
    with torch.no_grad():
        assert (ts(x) - st(x)).abs().max() > 1e-3
        st.load_state_dict(ts.state_dict())  # a state dict of one order loads into the other
        assert (ts(x) - st(x)).abs().max() > 1e-3


def _by_hand(block: TSBlock, x: torch.Tensor, tod: torch.Tensor, order: str):
    """One block written out: ``order`` = "ts" or "st"; returns (output, attention weights)."""

    def spatial(h):
        return block.norm(h + block.gconv(h))

    def temporal(h):
        y, att = block.attn(h.transpose(1, 2), return_attention=True)
        return y.transpose(1, 2), att

    h = x + tod
    if order == "st":
        y, att = temporal(spatial(h))
    else:
        y, att = temporal(h)
        y = spatial(y)
    return y, att


@pytest.mark.parametrize("order", ["ts", "st"])
def test_block_applies_its_sublayers_in_the_stated_order(order):
    """The block equals its order written by hand, and differs from the other order."""
    torch.manual_seed(1)
    block = TSBlock(8, 2, _supports(_path_graph(5)), block_order=order).eval()
    x, tod = torch.randn(2, 12, 5, 8), torch.randn(2, 12, 5, 8)
    other = "ts" if order == "st" else "st"
    with torch.no_grad():
        y, att = block(x, tod, return_attention=True)
        want, want_att = _by_hand(block, x, tod, order)
        swapped, swapped_att = _by_hand(block, x, tod, other)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(att, want_att)
    assert (y - swapped).abs().max() > 1e-3 and (att - swapped_att).abs().max() > 1e-4


def test_st_attention_already_sees_the_neighbours():
    """Graph conv first: the first block's attention weights of sensor 0 depend on its neighbour
    (sensor 1) in "st" and not at all in "ts" (where attention is per sensor before any mixing)."""
    torch.manual_seed(2)
    a = _path_graph(5)
    x = torch.randn(2, 12, 5, 8)
    tod = torch.zeros_like(x)
    x2 = x.clone()
    x2[:, :, 1] += torch.randn(2, 12, 8)  # perturb sensor 1 only
    change = {}
    for order in ("ts", "st"):
        torch.manual_seed(3)
        block = TSBlock(8, 2, _supports(a), adaptive=False, block_order=order).eval()
        with torch.no_grad():
            _, att = block(x, tod, return_attention=True)
            _, att2 = block(x2, tod, return_attention=True)
        change[order] = (att2 - att)[:, 0].abs().max()  # sensor 0's attention map
    assert change["ts"] == 0 and change["st"] > 1e-4, change


@pytest.mark.parametrize("bad", ["TS", "s&t", "", None, 1])
def test_bad_block_order_is_a_config_error(bad):
    from diagsink.engine.config import load_config, override

    for make in (
        lambda: TSModel(
            5, _supports(_path_graph(5)), d_model=8, n_heads=2, depth=1, block_order=bad
        ),
        lambda: TSBlock(8, 2, _supports(_path_graph(5)), block_order=bad),
        lambda: override(load_config("quick"), {"model.block_order": bad}),
    ):
        with pytest.raises(ConfigError) as err:
            make()
        msg = str(err.value)
        assert (
            "model.block_order" in msg
            and "'ts'" in msg
            and "'st'" in msg
            and "protocol YAML" in msg
        )


def test_block_order_is_optional_and_the_default_keeps_the_hash():
    from diagsink.data import toy_data
    from diagsink.engine.config import OPTIONAL, PROTOCOLS, config_hash, load_config, override
    from diagsink.engine.prepare import prepare
    from diagsink.engine.train import build_model
    from diagsink.model import BLOCK_ORDERS

    assert OPTIONAL["model"]["block_order"] == BLOCK_ORDERS[0] == "ts"
    for name in PROTOCOLS:
        cfg = load_config(name)
        assert "block_order" not in cfg["model"]  # the shipped protocols leave it out: "ts"
        ts, st = (
            override(cfg, {"model.block_order": "ts"}),
            override(cfg, {"model.block_order": "st"}),
        )
        assert ts["model"]["block_order"] == "ts"
        assert config_hash(ts) == config_hash(cfg) != config_hash(st)
    cfg = override(load_config("quick"), {"model.d_model": 8, "model.depth": 1})
    prepared = prepare(toy_data(60, 3), cfg)
    assert build_model(cfg, "none", prepared).block_order == "ts"
    assert (
        build_model(override(cfg, {"model.block_order": "st"}), "none", prepared).block_order
        == "st"
    )
