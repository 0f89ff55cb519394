"""The input-step profile (exact and Hutchinson) and the per-sequence map statistics."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

from diagsink import jacobian as J
from diagsink.data import toy_data
from diagsink.depth import post_norm_entries
from diagsink.engine import artifacts
from diagsink.engine.artifacts import ArtifactError, validate_artifact
from diagsink.engine.config import load_config, override
from diagsink.engine.prepare import batch, prepare
from diagsink.engine.reload import load_run
from diagsink.engine.train import build_model
from diagsink.errors import ConfigError
from diagsink.sensitivity import (
    PATH_PARTS,
    attention_inputs,
    block_paths,
    describe_verdict,
    input_step_profile,
    path_rows,
    profile_json,
    run_sensitivity,
    sequence_block_norms,
    sink_verdicts,
)
from diagsink.stats import map_statistics

from conftest import ROOT


class StepMix(nn.Module):
    """``ŷ[b, h, n] = Σ_j W[h, j] x[b, j, n, 0]``: ``S_j^2 = Σ_h W[h, j]^2`` exactly."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("hj,bjn->bhn", self.w, x[..., 0]) + x[..., 1].mean(1, keepdim=True)


def test_exact_profile_of_a_linear_model_is_known():
    w = torch.randn(5, 7, dtype=torch.float64)
    x = torch.randn(3, 7, 4, 2, dtype=torch.float64)
    prof = input_step_profile(StepMix(w), x, "exact")
    torch.testing.assert_close(prof.values, w.pow(2).sum(0).sqrt().detach())
    assert prof.se is None and prof.method == "exact"
    assert (
        profile_json(prof, 3)["windows"] == 3 and profile_json(prof, 3)["S"] == prof.values.tolist()
    )


def test_one_implementation_behind_the_toolkit_and_the_trained_run_analysis():
    """``input_step_profile`` is the toolkit's ``probe.sensitivity_profile`` per sensor."""
    from diagsink import probe, sensitivity

    assert sensitivity.Profile is probe.Profile
    torch.manual_seed(0)
    model, x = StepMix(torch.randn(5, 7, dtype=torch.float64)), torch.randn(3, 7, 4, 2).double()
    ours = input_step_profile(model, x, "hutchinson", probes=6, seed=3)
    toolkit = probe.sensitivity_profile(
        lambda s: model(torch.cat([s.unsqueeze(-1), x[..., 1:]], -1)),
        x[..., 0],
        1,
        "hutchinson",
        6,
        batch_dim=0,
        seed=3,
    )
    torch.testing.assert_close(ours.values, toolkit.values / 2)  # / sqrt(N), N = 4
    torch.testing.assert_close(ours.se, toolkit.se / 2)


def test_hutchinson_agrees_with_the_exact_profile_of_a_ts_model():
    torch.manual_seed(0)
    cfg = override(load_config("quick"), {"model.d_model": 8, "model.depth": 1})
    prepared = prepare(toy_data(400, 5), cfg)
    model = build_model(cfg, "none", prepared).eval()
    x, _ = batch(prepared, prepared.test[:4], 12, 12)
    exact = input_step_profile(model, x, "exact")
    est = input_step_profile(model, x, "hutchinson", probes=200, seed=1)
    z = (est.values - exact.values).abs() / est.se
    assert (z < 4).all(), z  # within 4 standard errors at every step
    assert (est.se < 0.1 * est.values).all()  # and the errors are small
    # a wrong estimator (e.g. forgetting the square) would be far off: the check can fail
    assert not torch.allclose(est.values, exact.values.sqrt(), rtol=0.05)


def test_bad_arguments_are_refused():
    x = torch.randn(1, 3, 2, 2)
    with pytest.raises(ValueError, match="exact"):
        input_step_profile(StepMix(torch.randn(2, 3)), x, "hutch", probes=4)
    with pytest.raises(ValueError, match="probes"):
        input_step_profile(StepMix(torch.randn(2, 3)), x, probes=1)


def test_map_statistics_per_sequence_and_of_the_average():
    t = 6
    eye = torch.eye(t).expand(3, t, t)
    s = map_statistics(eye)
    assert s["diagonal_ratio"]["mean"] == pytest.approx(t) and s["entropy"][
        "mean"
    ] == pytest.approx(0)
    uniform = torch.full((2, t, t), 1 / t)
    assert map_statistics(uniform)["entropy"]["of_mean"] == pytest.approx(1)
    # two sharp maps attending to different keys: each has entropy 0, their average does not
    a = torch.zeros(2, t, t)
    a[0, :, 0] = 1
    a[1, :, 1] = 1
    s = map_statistics(a)
    assert s["entropy"]["mean"] == pytest.approx(0) and s["entropy"]["of_mean"] == pytest.approx(
        math.log(2) / math.log(t)
    )
    assert s["stripe_index"]["mean"] == pytest.approx(1) and s["stripe_index"]["std"] == 0


def test_run_sensitivity_on_a_committed_run():
    run = load_run(ROOT / "book" / "results" / "quick" / "none_seed0.json")
    out = run_sensitivity(run, windows=4, probes=4)
    assert len(out["profile"]["S"]) == 12 and all(v > 0 for v in out["profile"]["S"])
    assert all(0 < e < s for e, s in zip(out["profile"]["se"], out["profile"]["S"]))
    assert set(out["maps"]) == {"diagonal_ratio", "entropy", "stripe_index"}
    assert len(out["paths"]["blocks"]) == run.cfg["model"]["depth"]


class _Outputs(nn.Module):
    """``model`` with its forecasts restricted to the sensors ``nodes``: ``[B, T_out, len(nodes)]``."""

    def __init__(self, model: nn.Module, nodes: list[int]) -> None:
        super().__init__()
        self.model, self.nodes = model, nodes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[..., self.nodes]


def _exact_by_one_hot_rows(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``‖∂ŷ_b/∂x_{b,j}‖_F^2`` ``[B, T_in]``, independently of the package: every output row at once.

    Each window is repeated once per forecast entry and one backward pass takes a one-hot
    cotangent per copy (windows do not interact in eval mode), so copy ``k`` receives row
    ``k`` of the Jacobian of the speed channel.
    """
    out = []
    for b in range(x.shape[0]):
        n_out = model(x[b : b + 1]).numel()
        rep = x[b : b + 1].expand(n_out, *x.shape[1:]).clone()
        speed = rep[..., 0].clone().requires_grad_(True)
        pred = model(torch.cat([speed.unsqueeze(-1), rep[..., 1:]], dim=-1))  # [n_out, T_out, n]
        one_hot = torch.eye(n_out, dtype=pred.dtype).reshape(pred.shape)
        (rows,) = torch.autograd.grad(pred, speed, one_hot)  # [n_out, T_in, N]: the Jacobian's rows
        out.append(rows.pow(2).sum(dim=(0, 2)))
    return torch.stack(out)


@pytest.fixture
def one_thread():
    """One torch thread for the test (many small backward passes), the previous count restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_hutchinson_profile_of_a_committed_run_matches_the_exact_one(one_thread):
    """The estimator behind the stored profiles, on trained weights, against an exact Jacobian.

    The committed quick run ``none`` seed 0 on its first test windows, forecasts restricted
    to a few sensors (all ``N`` inputs still count) so that the exact Jacobian stays small.
    """
    run = load_run(ROOT / "book" / "results" / "quick" / "none_seed0.json")
    m = run.cfg["model"]
    x, _ = batch(run.prepared, run.prepared.test[:3], m["t_in"], m["t_out"])  # [3, 12, N, 2]
    model = _Outputs(run.model, [0, 69, 138, 206]).eval()
    exact_sq = _exact_by_one_hot_rows(model, x).detach()  # [B, T_in]
    # the package's exact route (one backward pass per output entry) gives the same numbers
    by_package = input_step_profile(model, x[:1], "exact").values.pow(2) * x.shape[2]
    torch.testing.assert_close(by_package, exact_sq[0], rtol=1e-4, atol=0)
    exact = (exact_sq.mean(0) / x.shape[2]).sqrt()  # S_j as input_step_profile defines it
    est = input_step_profile(model, x, "hutchinson", probes=32, seed=0)
    z = (est.values - exact).abs() / est.se
    assert (z < 4).all(), z  # within 4 standard errors at every input step
    assert (est.se < 0.1 * est.values).all()  # and the errors are small
    # the steps differ: a profile of the wrong step, or without the square, would be far off
    assert (exact.max() / exact.min()) > 1.5
    assert not torch.allclose(est.values, exact.flip(0), rtol=0.1)
    assert not torch.allclose(est.values, exact.sqrt(), rtol=0.1)


# ----------------------------------------------------------------------------------------
# per-block paths on the blocks' real inputs
# ----------------------------------------------------------------------------------------
def _toy_model(variant: str = "none", order: str = "ts", depth: int = 2):
    torch.manual_seed(0)
    cfg = override(
        load_config("quick"),
        {"model.d_model": 8, "model.depth": depth, "model.block_order": order},
    )
    prepared = prepare(toy_data(400, 5), cfg)
    model = build_model(cfg, variant, prepared).eval()
    x, _ = batch(prepared, prepared.test[:3], 12, 12)
    return model, x


@pytest.mark.parametrize("order", ["ts", "st"])
def test_the_captured_input_is_what_each_block_attention_sees(order):
    model, x = _toy_model(order=order)
    inputs, outputs = attention_inputs(model, x)
    assert len(inputs) == len(model.blocks) and inputs[0].shape == (3, 5, 12, 8)  # [B, N, T, C]
    with torch.no_grad():
        # rebuilt by hand from the model's pieces: speed embedding + tAPE, then per block h = x + tod
        h = model.pos(model.speed_embed(x[..., :1]).transpose(1, 2)).transpose(1, 2)
        tod = model.tod_embed(x[..., 1:])
        for block, seen, out in zip(model.blocks, inputs, outputs):
            want = h + tod
            if order == "st":
                want = block.norm(want + block.gconv(want))
            torch.testing.assert_close(seen, want.transpose(1, 2))
            # the attention's output is reproduced from the captured input alone
            torch.testing.assert_close(block.attn(seen), out)
            h = block(h, tod)


def test_the_closed_form_total_is_the_autograd_jacobian_of_the_sublayer():
    """On a committed run's real inputs: u -> u + attn(u), the LayerNorm after it left out."""
    run = load_run(ROOT / "book" / "results" / "quick" / "none_seed0.json")
    x, _ = batch(run.prepared, run.prepared.test[:2], 12, 12)
    inputs, outputs = attention_inputs(run.model, x)
    for b, block in enumerate(run.model.blocks):
        ref = copy.deepcopy(block.attn).double().eval()
        ln, ref.norm = ref.norm, nn.Identity()  # the sublayer with its residual, before the norm
        seq = inputs[b][1, 3].double()  # window 1, sensor 3: [T, C]
        torch.testing.assert_close(ln(ref(seq)).float(), outputs[b][1, 3], atol=1e-5, rtol=1e-5)
        jac = J.autograd_jacobian(ref, seq).detach()  # [T, C, T, C], autograd
        closed = sequence_block_norms(post_norm_entries(block.attn)[0], seq)
        auto = torch.linalg.matrix_norm(jac.permute(0, 2, 1, 3), ord="fro")  # [T, T]
        torch.testing.assert_close(closed["total"], auto, atol=1e-10, rtol=1e-10)
        eye = torch.eye(seq.numel(), dtype=torch.float64).reshape(jac.shape)
        attn_only = torch.linalg.matrix_norm((jac - eye).permute(0, 2, 1, 3), ord="fro")
        torch.testing.assert_close(closed["attention"], attn_only, atol=1e-10, rtol=1e-10)
        spectral = sequence_block_norms(post_norm_entries(block.attn)[0], seq, "spectral")
        torch.testing.assert_close(
            spectral["total"], torch.linalg.matrix_norm(jac.permute(0, 2, 1, 3), ord=2)
        )
    # the summary of one window x one sensor is that Jacobian's diagonal / off-diagonal mean
    one = block_paths(run.model, x[1:2], windows=1, nodes=1)
    last = one["blocks"][-1]["total"]
    seq = attention_inputs(run.model, x[1:2])[0][-1][0, 0].double()
    ref = copy.deepcopy(run.model.blocks[-1].attn).double().eval()
    ref.norm = nn.Identity()
    jac = J.autograd_jacobian(ref, seq).detach()
    auto = torch.linalg.matrix_norm(jac.permute(0, 2, 1, 3), ord="fro")
    off = ~torch.eye(12, dtype=torch.bool)
    assert last["diagonal"] == pytest.approx(float(auto.diagonal().mean()), rel=1e-9)
    assert last["off_diagonal"] == pytest.approx(float(auto[off].mean()), rel=1e-9)


def test_block_paths_layout_and_the_residual_path():
    model, x = _toy_model("none")
    out = block_paths(model, x, windows=2, nodes=3)
    assert out["windows"] == [0, 2] and out["nodes"] == [0, 2, 4] and out["norm"] == "fro"
    assert out["uniform_share"] == pytest.approx(1 / 12) and len(out["blocks"]) == 2
    for block in out["blocks"]:
        assert set(block) == {*PATH_PARTS, "diagonal_share"}
        assert block["residual"] == {"diagonal": pytest.approx(math.sqrt(8)), "off_diagonal": 0.0}
        assert block["query"]["off_diagonal"] == 0.0  # the query path is block diagonal
        assert 1 / 12 < block["diagonal_share"]["total"] <= 1
    json.dumps(out, allow_nan=False)  # JSON-ready


def test_no_residual_has_a_zero_residual_path():
    model, x = _toy_model("no_residual")
    for block in block_paths(model, x, windows=2, nodes=2)["blocks"]:
        assert block["residual"] == {"diagonal": 0.0, "off_diagonal": 0.0}
        assert block["total"] == block["attention"]
        assert block["diagonal_share"]["total"] == block["diagonal_share"]["attention"]


def test_block_paths_refuses_bad_input():
    model, x = _toy_model()
    with pytest.raises(ConfigError, match="windows"):
        block_paths(model, x, windows=4)  # only 3 windows
    with pytest.raises(ConfigError, match="nodes"):
        block_paths(model, x, windows=1, nodes=0)
    with pytest.raises(ConfigError, match=r"\[batch, T_in, nodes, 2\]"):
        block_paths(model, x[..., 0])
    with pytest.raises(ConfigError, match="TSModel"):
        attention_inputs(nn.Linear(2, 2), x)
    with pytest.raises(ConfigError, match="norm"):
        sequence_block_norms(post_norm_entries(model.blocks[0].attn)[0], x[0, :, 0], "nuc")


COMMITTED = sorted(
    p
    for p in (ROOT / "book" / "results").glob("*/*.json")
    if json.loads(p.read_text())["state_dict"].get("file")
)


def test_every_committed_run_carries_its_block_paths():
    """``sensitivity.paths`` in every committed artifact with weights (the pages read it)."""
    assert len(COMMITTED) >= 35
    missing = []
    for path in COMMITTED:
        art = json.loads(path.read_text())
        paths = art.get("sensitivity", {}).get("paths")
        if paths is None or len(paths["blocks"]) != art["provenance"]["config"]["model"]["depth"]:
            missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, f"run `diagsink sensitivity` on: {missing}"
    no_res = [json.loads(p.read_text()) for p in COMMITTED if p.name.startswith("no_residual")]
    assert no_res and all(
        b["residual"] == {"diagonal": 0.0, "off_diagonal": 0.0}
        for a in no_res
        for b in a["sensitivity"]["paths"]["blocks"]
    )


def test_a_malformed_paths_field_is_refused():
    assert artifacts.PATH_PARTS == PATH_PARTS == (*J.PATHS, "attention", "total")
    art = json.loads((ROOT / "book" / "results" / "quick" / "none_seed0.json").read_text())
    depth = art["provenance"]["config"]["model"]["depth"]
    pair = {"diagonal": 1.0, "off_diagonal": 0.0}
    block = {**dict.fromkeys(PATH_PARTS, pair), "diagonal_share": {"total": 0.5, "attention": 0.1}}
    art["sensitivity"]["paths"] = {"uniform_share": 1 / 12, "blocks": [block] * depth}
    validate_artifact(copy.deepcopy(art), check_sum=False)  # well formed
    broken = copy.deepcopy(art)
    del broken["sensitivity"]["paths"]["blocks"][0]["key"]
    with pytest.raises(ArtifactError, match="sensitivity"):
        validate_artifact(broken, check_sum=False)
    broken = copy.deepcopy(art)
    broken["sensitivity"]["paths"]["blocks"].pop()
    with pytest.raises(ArtifactError, match="sensitivity"):
        validate_artifact(broken, check_sum=False)


def _fake(variant: str, seed: int, ratio: float, share: float, depth: int = 2) -> dict:
    """An artifact's fields that :func:`sink_verdicts` reads: ``T x`` diag of the maps, of the paths."""
    pair = {"diagonal": 1.0, "off_diagonal": 0.5}
    block = {
        **dict.fromkeys(PATH_PARTS, pair),
        "diagonal_share": {"total": 0.5, "attention": share / 12},
    }
    return {
        "variant": variant,
        "seed": seed,
        "sensitivity": {
            "maps": {"diagonal_ratio": {"mean": ratio}},
            "paths": {"uniform_share": 1 / 12, "blocks": [block] * depth},
        },
    }


def test_sink_verdicts_weights_paths_both_neither_mixed():
    arts = [
        *(_fake("none", s, 0.7, 2.5) for s in range(3)),  # paths only
        *(_fake("mask", s, 0.0, 1.0) for s in range(3)),  # neither
        *(_fake("penalty", s, 2.0, 2.0) for s in range(3)),  # both
        *(_fake("dropout", s, 1.6, 1.2) for s in range(3)),  # weights only
        _fake("no_residual", 0, 1.0, 1.6),
        _fake("no_residual", 1, 1.0, 1.4),  # one seed passes, one does not
    ]
    got = {v: r["verdict"] for v, r in sink_verdicts(arts).items()}
    assert got == {
        "none": "paths",
        "mask": "neither",
        "penalty": "both",
        "dropout": "weights",
        "no_residual": "mixed",
    }
    assert sink_verdicts(arts)["no_residual"]["in_paths"] == "mixed"
    assert sink_verdicts(arts)["no_residual"]["by_seed"] == {0: "paths", 1: "neither"}
    assert describe_verdict(sink_verdicts(arts)["no_residual"]) == "paths: seed 0; neither: seed 1"
    assert describe_verdict(sink_verdicts(arts)["none"]) == "paths, every seed"
    assert sink_verdicts(arts)["none"]["paths"] == pytest.approx([2.5] * 3)
    assert sink_verdicts(arts, threshold=3)["none"]["verdict"] == "neither"
    rows = path_rows(arts[:1])
    assert [r["block"] for r in rows] == [1, 2] and rows[0][
        "T x share (attention)"
    ] == pytest.approx(2.5)
    with pytest.raises(ConfigError, match="diagsink sensitivity"):
        sink_verdicts([{"variant": "none", "seed": 0, "sensitivity": {}}])
