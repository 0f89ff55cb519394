"""Sweep commands (diagsink.engine.sweeps), heatmap statistics on the committed artifacts, and the
exercise checks of the chapter "Heatmaps on METR-LA" (book/heatmaps.ipynb)."""

from __future__ import annotations

import pytest
import torch

import diagsink as ds
from diagsink.cli import main
from diagsink.data import toy_data
from diagsink.engine.artifacts import load_artifact, load_results
from diagsink.engine.config import load_config, override
from diagsink.engine.sweeps import load_sweep, point_path, run_sweep, sweep_points, sweep_rows
from diagsink.errors import ConfigError
from diagsink.stats import attention_entropy, column_stripe_index, diagonal_mass

from conftest import ROOT

TINY = {
    "model.d_model": 8,
    "model.n_heads": 2,
    "model.depth": 1,
    "model.node_embed_dim": 3,
    "train.epochs": 1,
    "train.warmup_epochs": 0,
    "train.batch_size": 16,
    "train.eval_batch_size": 64,
    "train.max_train_windows": 32,
}


def tiny():
    return override(load_config("quick"), TINY)


def test_sweep_writes_valid_artifacts_and_skips_finished_points(tmp_path):
    data = toy_data(120, 4)  # 120 steps: T_in = 100 leaves 9 windows, T_in = 110 none at all
    logs: list[str] = []
    res = run_sweep(
        "length",
        tiny(),
        values=[12, 24, 110],
        variants=("none",),
        out_dir=tmp_path,
        data=data,
        log=logs.append,
    )
    assert len(res["done"]) == 2 and [p.value for p, _ in res["skipped"]] == [110]
    assert "T_in = 110 on 120 steps" in res["skipped"][0][1] and any(
        "skip none_T110" in line for line in logs
    )
    for path, t in zip(res["done"], (12, 24)):
        art = load_artifact(path)  # schema, checksum, provenance
        assert path == point_path(tmp_path, "quick", sweep_points("length", [t], ("none",))[0], 0)
        assert art["sweep"]["value"] == t and art["provenance"]["config"]["model"]["t_in"] == t
        assert torch.tensor(art["attention"]["mean"]).shape == (t, t)
    mtimes = [p.stat().st_mtime_ns for p in res["done"]]
    logs.clear()
    again = run_sweep(
        "length",
        tiny(),
        values=[12, 24],
        variants=("none",),
        out_dir=tmp_path,
        data=data,
        log=logs.append,
    )
    assert again["done"] == res["done"] and [p.stat().st_mtime_ns for p in res["done"]] == mtimes
    assert sum("(finished)" in line for line in logs) == 2
    rows = sweep_rows(load_sweep(tmp_path, "quick", "length"))
    assert [r["value"] for r in rows] == [12, 24] and [r["uniform"] for r in rows] == [
        1 / 12,
        1 / 24,
    ]


def test_penalty_sweep_changes_only_the_penalty(tmp_path):
    res = run_sweep("penalty", tiny(), values=[-0.5], out_dir=tmp_path, data=toy_data(80, 3))
    art = load_artifact(res["done"][0])
    assert (
        art["variant"] == "penalty"
        and art["provenance"]["config"]["regularizers"]["diag_penalty"] == -0.5
    )
    assert art["provenance"]["config"]["model"] == tiny()["model"]
    (row,) = sweep_rows(load_sweep(tmp_path, "quick", "penalty"))
    assert row["value"] == -0.5 and row["uniform"] == pytest.approx(1 / 12)
    assert 0 <= row["diag_mass"] <= 1 and row["MAE@mean"] > 0


@pytest.mark.parametrize(
    ("name", "values", "variants", "match"),
    [
        ("width", None, None, "unknown sweep 'width'; choose one of length, penalty, dropout"),
        ("penalty", [0.1], None, "must be a negative logit offset"),
        ("dropout", [1.0], None, r"probability in \(0, 1\)"),
        ("length", [12.5], None, "whole number of steps"),
        ("length", [1000], None, r"in \[2, 288\]"),
        ("length", [float("nan")], None, "not a finite number"),
        ("penalty", [-0.1, -0.1], None, "repeat"),
        ("penalty", None, ("dropout",), "drop --variants"),
        ("length", [12], ("nope",), "unknown variant 'nope'"),
        ("order", ["sideways"], None, "'sideways' is not a block order; allowed: ts, st"),
        ("order", [1.0], None, "not a block order"),
        ("order", ["st", "st"], None, "repeat"),
        ("order", ["ts"], ("nope",), "unknown variant 'nope'"),
    ],
)
def test_bad_sweep_input_is_a_config_error(name, values, variants, match):
    with pytest.raises(ConfigError, match=match):
        sweep_points(name, values, variants)


def test_bad_seeds_and_cli_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="seeds"):
        run_sweep("dropout", tiny(), seeds=0, out_dir=tmp_path, data=toy_data(80, 3))
    assert main(["sweep", "penalty", "--values", "0.3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error:")
        and "negative logit offset" in err
        and len(err.strip().splitlines()) == 1
    )
    with pytest.raises(SystemExit):
        main(["sweep", "heads"])
    assert "invalid choice: 'heads'" in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def test_order_sweep_trains_both_block_orders(tmp_path):
    from diagsink.engine.config import config_hash

    data = toy_data(80, 3)
    logs: list[str] = []
    res = run_sweep(
        "order", tiny(), variants=("none", "mask"), out_dir=tmp_path, data=data, log=logs.append
    )
    names = sorted(p.name for p in res["done"])
    assert (
        names == [f"{v}_order{o}_seed0.json" for v in ("mask", "none") for o in ("st", "ts")]
        and not res["skipped"]
    )
    arts = {(a["variant"], a["sweep"]["value"]): a for a in load_sweep(tmp_path, "quick", "order")}
    for (_variant, order), a in arts.items():
        assert a["sweep"]["name"] == "order" and a["sweep"]["key"] == "model.block_order"
        assert a["provenance"]["config"]["model"]["block_order"] == order
        assert (
            a["provenance"]["config"]["model"]["t_in"] == 12 and len(a["attention"]["mean"]) == 12
        )
    # "ts" is the default: its point has the hash of the protocol without the key (an old run counts)
    assert arts[("none", "ts")]["provenance"]["config_hash"] == config_hash(tiny())
    assert arts[("none", "st")]["provenance"]["config_hash"] != config_hash(tiny())
    # same seed, same initial weights, another function: the two orders train to different models
    assert (
        arts[("none", "ts")]["metrics"]["MAE@mean"] != arts[("none", "st")]["metrics"]["MAE@mean"]
    )
    for order in ("ts", "st"):  # the full mask empties the diagonal in both orders
        mean = arts[("mask", order)]["attention"]["mean"]
        assert all(mean[i][i] == 0 for i in range(12))
    logs.clear()
    again = run_sweep(
        "order",
        tiny(),
        values=["st"],
        variants=("none",),
        out_dir=tmp_path,
        data=data,
        log=logs.append,
    )
    assert again["done"] == [tmp_path / "sweeps" / "quick" / "order" / "none_orderst_seed0.json"]
    assert logs == ["skip none_orderst_seed0.json (finished)"]


def test_order_sweep_cli(tmp_path, capsys):
    assert main(["sweep", "order", "--values", "ts,diagonal", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "'diagonal' is not a block order; allowed: ts, st" in err
    assert (
        main(
            [
                "sweep",
                "order",
                "--values",
                "st",
                "--variants",
                "penalty,nope",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "unknown variant 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def test_committed_artifacts_are_current_after_adding_block_order():
    """Adding the optional key model.block_order left every committed quick artifact current: its
    recorded hash is the one `reproduce` computes now for the same run, so nothing is redone and
    nothing is reported stale (the default order's sweep point: test_order_sweep_trains_both_block_orders)."""
    from diagsink.engine.config import config_hash

    quick = load_config("quick")
    arts = load_results(ROOT / "book" / "results" / "quick")
    assert arts and all(a["provenance"]["config_hash"] == config_hash(quick) for a in arts)
    assert all("block_order" not in a["provenance"]["config"]["model"] for a in arts)


# -- heatmap statistics on the committed artifacts -------------------------------------------------------
def _protocol_arts():
    folder = ROOT / "book" / "results"
    protocol = "book" if sorted((folder / "book").glob("*.json")) else "quick"
    return load_results(folder / protocol)


def test_heatmap_statistics_on_committed_artifacts():
    arts = _protocol_arts()
    for a in arts:
        m = torch.tensor(a["attention"]["mean"], dtype=torch.float64)
        heads = torch.tensor(a["attention"]["per_head"], dtype=torch.float64)
        t = m.shape[-1]
        # mean = average of the heads
        torch.testing.assert_close(heads.mean(0), m, atol=1e-6, rtol=0)
        dm = diagonal_mass(m)
        assert dm.uniform == 1 / t and 0 <= dm.mass <= 1
        assert 0 <= float(attention_entropy(m, normalized=True).mean()) <= 1 + 1e-9
        assert 0 <= column_stripe_index(m) <= 1 + 1e-9
        if a["variant"] == "mask":
            assert dm.mass == 0.0  # the full mask leaves nothing on the diagonal


# -- exercise checks -------------------------------------------------------------------------------------
def test_heatmap_exercise_references_pass():
    def off_range(attn):
        off = attn[~torch.eye(attn.shape[-1], dtype=torch.bool)]
        return float(off.min()), float(off.max())

    ds.exercises.check("ex-heatmaps-off-range", off_range, strict=True)
    ds.exercises.check("ex-heatmaps-stripes", column_stripe_index, strict=True)


def test_heatmap_exercise_wrong_answers_get_hints():
    r = ds.exercises.check("ex-heatmaps-off-range", lambda a: (float(a.min()), float(a.max())))
    assert not r.passed and "leave the diagonal out" in r.message
    r = ds.exercises.check("ex-heatmaps-off-range", lambda a: (float(a.max()), float(a.min())))
    assert not r.passed
    r = ds.exercises.check(
        "ex-heatmaps-stripes", lambda a: column_stripe_index(a.transpose(-2, -1))
    )
    assert not r.passed and "queries" in r.message
    r = ds.exercises.check("ex-heatmaps-stripes", lambda a: 0.5)
    assert not r.passed and "all rows equal must give 1" in r.message
