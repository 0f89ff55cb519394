"""Every committed artifact with weights recomputes its test metrics with the current code."""

from __future__ import annotations

import json

import pytest

from diagsink.data import load_metr_la, toy_data
from diagsink.engine.artifacts import ArtifactError
from diagsink.engine.prepare import prepare
from diagsink.engine.reload import load_run, metric_differences, recompute_metrics
from diagsink.errors import DataError
from diagsink.sensitivity import run_sensitivity
from diagsink.variants import VARIANTS

from conftest import ROOT

WITH_WEIGHTS = sorted(
    p
    for p in (ROOT / "book" / "results").glob("*/*.json")
    if json.loads(p.read_text())["state_dict"].get("file")
)


def test_the_committed_runs_with_weights_are_found():
    protocols = {p.parent.name for p in WITH_WEIGHTS}
    assert {"quick", "slice"} <= protocols and len(WITH_WEIGHTS) >= 35


@pytest.fixture(scope="module")
def data():
    return load_metr_la()  # DIAGSINK_DATA: the runs name the slice they were trained on


@pytest.fixture(scope="module")
def prepared_for(data):
    """``cfg -> prepared data``, built once per model/data configuration."""
    cache: dict[str, object] = {}

    def get(cfg: dict):
        key = json.dumps(cfg["model"]) + json.dumps(cfg["data"])
        if key not in cache:
            cache[key] = prepare(data, cfg)
        return cache[key]

    return get


# One test per artifact: each takes seconds, and a failure names its file.
@pytest.mark.parametrize(
    "path", WITH_WEIGHTS, ids=[f"{p.parent.name}/{p.stem}" for p in WITH_WEIGHTS]
)
def test_every_committed_run_recomputes_its_test_metrics(path, prepared_for):
    cfg = json.loads(path.read_text())["provenance"]["config"]
    run = load_run(path, prepared=prepared_for(cfg))
    diff = metric_differences(run.artifact["metrics"], recompute_metrics(run))
    if "sensitivity" in run.artifact:
        diff += _sensitivity_differences(run)
    assert not diff, (
        f"regenerate {path.relative_to(ROOT)} (the code no longer gives its numbers): "
        + "; ".join(diff)
    )


def _sensitivity_differences(run) -> list[str]:
    """The stored sensitivity numbers that the current code no longer gives."""
    stored = run.artifact["sensitivity"]
    if "paths" not in stored:
        return ["sensitivity.paths is missing (run `diagsink sensitivity` on it)"]
    again = run_sensitivity(run, **stored["settings"])
    flat = lambda s: {  # noqa: E731
        **{f"S_{j}": v for j, v in enumerate(s["profile"]["S"])},
        **{f"{k}.{q}": v for k, d in s["maps"].items() for q, v in d.items()},
        **{
            f"paths.block{b}.{part}.{q}": v
            for b, block in enumerate(s["paths"]["blocks"])
            for part, d in block.items()
            for q, v in d.items()
        },
    }
    return metric_differences(flat(stored), flat(again), rtol=1e-4)


def test_the_converged_runs_carry_their_sensitivity():
    """5 variants x 4 seeds of the slice protocol, each with the numbers the pages show."""
    slice_runs = [p for p in WITH_WEIGHTS if p.parent.name == "slice"]
    arts = [json.loads(p.read_text()) for p in slice_runs]
    assert sorted((a["variant"], a["seed"]) for a in arts) == sorted(
        (v, s) for v in VARIANTS for s in range(4)
    )
    assert all("sensitivity" in a for a in arts), (
        "run `diagsink sensitivity book/results/slice/*.json`"
    )
    assert all(
        a["stopped"] == "early_stopping" or a["best_epoch"] < a["epochs_run"] - 1 for a in arts
    )


def test_the_four_block_runs_are_complete_and_converged():
    """The depth chapter's trained stacks: 5 variants x 3 seeds of custom-depth4, 4 blocks each."""
    deep = [json.loads(p.read_text()) for p in WITH_WEIGHTS if p.parent.name == "custom-depth4"]
    assert sorted((a["variant"], a["seed"]) for a in deep) == sorted(
        (v, s) for v in VARIANTS for s in range(3)
    ), "run `diagsink reproduce --protocol diagsink/configs/custom-depth4.yaml --device cpu`"
    assert all(a["provenance"]["config"]["model"]["depth"] == 4 for a in deep)
    assert all(
        a["stopped"] == "early_stopping" or a["best_epoch"] < a["epochs_run"] - 1 for a in deep
    )


def test_changed_weights_or_other_data_are_refused(tmp_path, data):
    src = WITH_WEIGHTS[0]
    art = json.loads(src.read_text())
    (tmp_path / src.name).write_text(src.read_text())
    weights = tmp_path / art["state_dict"]["file"]
    good = (src.parent / art["state_dict"]["file"]).read_bytes()
    weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit changed
    with pytest.raises(ArtifactError, match="regenerate"):
        load_run(tmp_path / src.name, data=data)
    weights.unlink()
    with pytest.raises(ArtifactError, match="no weights"):
        load_run(tmp_path / src.name, data=data)
    with pytest.raises(DataError, match="DIAGSINK_DATA"):
        load_run(src, data=toy_data(1026, 207))


def test_a_changed_metric_is_reported():
    assert metric_differences({"MAE@3": 2.0}, {"MAE@3": 2.0 + 1e-7}) == []
    assert metric_differences({"MAE@3": 2.0}, {"MAE@3": 2.01}) == [
        "MAE@3: recorded 2.000000, recomputed 2.010000"
    ]
