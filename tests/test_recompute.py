"""Every committed run with weights recomputes its numbers with the current code, on any CPU.

What is recomputed: the test metrics of every run with weights (a full-length run, whose test
split of several thousand windows takes about half a minute to predict, through its stored sums
by day: every day's sums must add up to the recorded metrics, and one day, predicted again from
the weights, must give its stored sums; :func:`_day_of`); the stored ``sensitivity`` field
(input-step profile, last-block map statistics, per-block paths), which costs about three times
the metrics, of a fixed sample of ten (:func:`_sample`: in every protocol the runs with the
flattest and with the sharpest maps, and every variant at least once).

The tolerance rule. Each number is compared at a tolerance that follows its conditioning: the
size a float-rounding change (another CPU's vector width, another summation order in a
refactored layer) can give it, far below the size any change of the model or of the code that
computes it gives it. A line of :func:`differences` names each number outside its tolerance.

* **Metrics** (MAE, RMSE, MAPE, the means over the whole test split): well conditioned, so
  ``|Δ| ≤ 1e-5 |recorded|`` (float32 rounding moves them by about 1e-8 relative).
* **Map statistics** (diagonal ratio, normalized entropy, stripe index; their ``mean`` and
  ``std`` over the maps and ``of_mean`` of the averaged map): near-uniform maps make them
  differences and ratios of small numbers (the stripe index of a near-uniform map is a ratio of
  two sums of squared departures from ``1/T``), so rounding moves them in proportion to their
  spread over the maps, not to their value: ``|Δ| ≤ 1e-2 std + 1e-9`` with ``std`` the recorded
  spread of that statistic (the floor: exact zeros, e.g. the diagonal of the masked variant).
* **Input-step profile** ``S_j`` (Hutchinson's estimator): relative to the estimator's own
  noise, ``|Δ| ≤ 1e-2 se_j`` with ``se_j`` the recorded standard error (the scale only: it is
  not compared, the artifacts keep the one of the code that wrote them).
* **Per-block paths** (norms of the Jacobian blocks, float64 on float32 activations): relative
  to the block's scale, the norm of its total Jacobian ``s = total.diagonal +
  total.off_diagonal``: ``|Δ| ≤ 1e-5 s`` for the norms, ``|Δ| ≤ 1e-5 / T`` for the diagonal
  shares (``1/T`` = uniform).

Measured margin: on an Intel and an AMD CPU the largest change seen was 1.2e-4 of the spread
(``stripe_index.std`` of ``custom-depth4/no_residual_seed2``, whose maps are the most nearly
uniform), 1.1e-5 se for ``S_j``, 5e-9 relative for the metrics and 4e-9 of the block scale for
the paths; :func:`test_a_perturbed_run_fails` shows that a 2 % change of one attention layer's
temperature fails every group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from diagsink.data import load_metr_la, toy_data
from diagsink.engine.artifacts import ArtifactError
from diagsink.engine.by_day import SUMS, day_sums, metrics_from_sums
from diagsink.engine.prepare import prepare
from diagsink.engine.reload import (
    LoadedRun,
    load_run,
    metric_differences,
    recompute_metrics,
)
from diagsink.errors import DataError
from diagsink.results import PLANNED, convergence, run_counts
from diagsink.sensitivity import run_sensitivity
from diagsink.variants import VARIANTS

from conftest import ROOT

WITH_WEIGHTS = sorted(
    p
    for p in (ROOT / "book" / "results").glob("*/*.json")
    if json.loads(p.read_text())["state_dict"].get("file")
)
#: Runs with more test windows than this are recomputed one day at a time (the full-length ones).
BY_DAY_ABOVE = 2000
BY_DAY = [
    p
    for p in WITH_WEIGHTS
    if json.loads(p.read_text())["provenance"]["data"]["windows"]["test"] > BY_DAY_ABOVE
]
WHOLE = [p for p in WITH_WEIGHTS if p not in BY_DAY]

METRIC_RTOL = 1e-5  # of the recorded value
MAP_STD_FRACTION = 1e-2  # of the recorded spread over the maps
MAP_FLOOR = 1e-9  # absolute, for exact zeros
PROFILE_SE_FRACTION = 1e-2  # of the estimator's standard error
PATH_SCALE_FRACTION = 1e-5  # of the block's total Jacobian norm (of 1/T for the shares)
#: the committed run with the most nearly uniform maps (the worst-conditioned statistics)
NEAR_UNIFORM = ROOT / "book" / "results" / "custom-depth4" / "no_residual_seed2.json"


def _artifact(path: Path) -> dict:
    return json.loads(path.read_text())


def _sample(paths: list[Path]) -> list[Path]:
    """The runs whose sensitivity is recomputed: in every protocol, the run with the most nearly
    uniform maps (largest recorded ``entropy.mean``: the worst-conditioned map statistics) and
    the one with the sharpest maps (smallest); then every variant not in the sample yet, by
    its quick run with seed 0. Ten runs: every protocol, every variant, both extremes."""
    arts = {p: _artifact(p) for p in paths}
    flatness = lambda p: arts[p]["sensitivity"]["maps"]["entropy"]["mean"]  # noqa: E731
    chosen = set()
    for protocol in sorted({p.parent.name for p in paths}):
        runs = [p for p in paths if p.parent.name == protocol]
        chosen |= {max(runs, key=flatness), min(runs, key=flatness)}
    for variant in VARIANTS:
        if variant not in {arts[p]["variant"] for p in chosen}:
            chosen |= {
                p
                for p in paths
                if p.parent.name == "quick"
                and (arts[p]["variant"], arts[p]["seed"]) == (variant, 0)
            }
    return sorted(chosen)


SENSITIVITY_SAMPLE = _sample(WITH_WEIGHTS)


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.stem}"


# --------------------------------------------------------------------------- the tolerance rule


def _outside(name: str, recorded: float, again: float, tol: float) -> list[str]:
    if abs(recorded - again) <= tol:
        return []
    return [f"{name}: recorded {recorded:.9g}, recomputed {again:.9g} (tolerance {tol:.2g})"]


def metric_lines(recorded: dict, again: dict) -> list[str]:
    """Metrics outside ``METRIC_RTOL`` of their recorded value."""
    return metric_differences(recorded, again, rtol=METRIC_RTOL)


def sensitivity_lines(recorded: dict, again: dict) -> list[str]:
    """The ``sensitivity`` numbers (maps, profile, paths) outside their tolerance."""
    lines = []
    for stat, rec in recorded["maps"].items():
        tol = MAP_STD_FRACTION * rec["std"] + MAP_FLOOR
        for q, v in rec.items():
            lines += _outside(f"maps.{stat}.{q}", v, again["maps"][stat][q], tol)
    prof, prof_again = recorded["profile"], again["profile"]
    for j, se in enumerate(prof["se"]):
        tol = PROFILE_SE_FRACTION * se
        lines += _outside(f"profile.S[{j}]", prof["S"][j], prof_again["S"][j], tol)
    paths, paths_again = recorded["paths"], again["paths"]
    for b, (block, block_again) in enumerate(zip(paths["blocks"], paths_again["blocks"])):
        scale = block["total"]["diagonal"] + block["total"]["off_diagonal"]
        for part, d in block.items():
            tol = PATH_SCALE_FRACTION * (
                paths["uniform_share"] if part == "diagonal_share" else scale
            )
            for q, v in d.items():
                lines += _outside(f"paths.block{b}.{part}.{q}", v, block_again[part][q], tol)
    if len(paths_again["blocks"]) != len(paths["blocks"]):
        lines.append(f"paths: {len(paths_again['blocks'])} blocks, recorded {len(paths['blocks'])}")
    return lines


# --------------------------------------------------------------------------- the committed runs


@pytest.fixture(scope="module")
def data():
    """``speed_file -> MetrLA`` from DIAGSINK_DATA: each run names the file it was trained on
    (``data.speed_file``; ``None``: the first speed file there, the slice in CI)."""
    files: dict[str | None, object] = {}

    def get(speed_file: str | None):
        if speed_file not in files:
            files[speed_file] = load_metr_la(speed_file=speed_file)
        return files[speed_file]

    return get


@pytest.fixture(scope="module")
def loaded(data):
    """``path -> LoadedRun``, the data prepared once per model/data configuration."""
    cache: dict[str, object] = {}

    def get(path: Path) -> LoadedRun:
        cfg = _artifact(path)["provenance"]["config"]
        key = json.dumps(cfg["model"]) + json.dumps(cfg["data"])
        if key not in cache:
            cache[key] = prepare(data(cfg["data"].get("speed_file")), cfg)
        return load_run(path, prepared=cache[key])

    return get


def _regenerate(path: Path, lines: list[str]) -> str:
    return (
        f"regenerate {path.relative_to(ROOT)} (the code no longer gives its numbers): "
        + "; ".join(lines)
    )


def test_the_committed_runs_with_weights_are_found():
    protocols = {p.parent.name for p in WITH_WEIGHTS}
    assert {"quick", "slice"} <= protocols and len(WITH_WEIGHTS) >= 35
    sampled = [_artifact(p) for p in SENSITIVITY_SAMPLE]
    assert {p.parent.name for p in SENSITIVITY_SAMPLE} == protocols
    assert {a["variant"] for a in sampled} == set(VARIANTS)
    assert NEAR_UNIFORM in SENSITIVITY_SAMPLE


# One test per artifact: each takes a second or two, and a failure names its file.
@pytest.mark.parametrize("path", WHOLE, ids=map(_id, WHOLE))
def test_every_committed_run_recomputes_its_test_metrics(path, loaded):
    run = loaded(path)
    lines = metric_lines(run.artifact["metrics"], recompute_metrics(run))
    assert not lines, _regenerate(path, lines)


def _day_of(path: Path) -> str:
    """The day of ``path``'s test split that is predicted again: the run's position among the
    full-length runs, modulo the number of days, so that the runs together cover every day."""
    days = _artifact(path)["test_by_day"]["days"]
    return days[BY_DAY.index(path) % len(days)]


def day_lines(recorded: dict, again: dict) -> list[str]:
    """The sums of one day outside their tolerance: the counts exactly, the error sums (sums of
    positive terms, as well conditioned as the metrics) at ``METRIC_RTOL`` of their value."""
    lines = []
    for k in SUMS:
        for c, (v, w) in enumerate(zip(recorded[k], again[k])):
            tol = 0.0 if k == "n" else METRIC_RTOL * abs(v)
            lines += _outside(f"{k}[{c}]", v, w, tol)
    return lines


@pytest.mark.parametrize("path", BY_DAY, ids=map(_id, BY_DAY))
def test_every_full_length_run_recomputes_its_metrics_by_day(path, loaded, data):
    art = _artifact(path)
    assert "test_by_day" in art, (
        f"{_id(path)} has no test_by_day: run `diagsink sensitivity --by-day` on it"
    )
    by_day = art["test_by_day"]
    lines = metric_lines(art["metrics"], metrics_from_sums(by_day["sums"]))
    assert not lines, f"{_id(path)}: its days do not add up to its metrics: " + "; ".join(lines)
    day = _day_of(path)
    stamps = data(art["provenance"]["config"]["data"].get("speed_file")).timestamps
    again = day_sums(loaded(path), stamps, day)
    lines = day_lines(by_day["sums"][by_day["days"].index(day)], again)
    assert not lines, _regenerate(path, [f"{day}: {line}" for line in lines])


@pytest.mark.parametrize("path", SENSITIVITY_SAMPLE, ids=map(_id, SENSITIVITY_SAMPLE))
def test_the_sampled_runs_recompute_their_sensitivity(path, loaded):
    run = loaded(path)
    stored = run.artifact["sensitivity"]
    assert "paths" in stored, "sensitivity.paths is missing (run `diagsink sensitivity` on it)"
    lines = sensitivity_lines(stored, run_sensitivity(run, **stored["settings"]))
    assert not lines, _regenerate(path, lines)


# --------------------------------------------------------------------------- a regression fails


def test_the_tolerances_follow_the_recorded_scales():
    """Shifted by twice its tolerance, every stored number of the worst-conditioned run is
    reported; by half of it, none is."""
    stored = _artifact(NEAR_UNIFORM)["sensitivity"]
    map_tol = {k: MAP_STD_FRACTION * rec["std"] + MAP_FLOOR for k, rec in stored["maps"].items()}

    def shifted(k: float) -> dict:
        s = json.loads(json.dumps(stored))
        for stat, rec in s["maps"].items():
            for q in rec:
                rec[q] += k * map_tol[stat]
        se = stored["profile"]["se"]
        s["profile"]["S"] = [v + k * PROFILE_SE_FRACTION * e for v, e in zip(s["profile"]["S"], se)]
        for block in s["paths"]["blocks"]:
            scale = block["total"]["diagonal"] + block["total"]["off_diagonal"]
            for part, d in block.items():
                unit = s["paths"]["uniform_share"] if part == "diagonal_share" else scale
                for q in d:
                    d[q] += k * PATH_SCALE_FRACTION * unit
        return s

    n = sum(len(r) for r in stored["maps"].values()) + len(stored["profile"]["S"])
    n += sum(len(d) for b in stored["paths"]["blocks"] for d in b.values())
    assert len(sensitivity_lines(stored, shifted(2.0))) == n
    assert sensitivity_lines(stored, shifted(0.5)) == []
    metrics = _artifact(NEAR_UNIFORM)["metrics"]
    assert len(metric_lines(metrics, {k: v * (1 + 2 * METRIC_RTOL) for k, v in metrics.items()}))
    assert not metric_lines(metrics, {k: v * (1 + METRIC_RTOL / 2) for k, v in metrics.items()})


@pytest.mark.parametrize(
    "path", [NEAR_UNIFORM, ROOT / "book" / "results" / "slice" / "none_seed0.json"], ids=_id
)
def test_a_perturbed_run_fails(path, loaded):
    """The last block's queries scaled by 1.02 (its attention's temperature changed by 2 %):
    the metrics, every map statistic that is not scale-free, the profile and the paths of that
    block move outside their tolerances, even where the maps are nearly uniform."""
    run = loaded(path)
    last = run.model.blocks[-1].attn
    with torch.no_grad():
        last.q_proj.weight.mul_(1.02)
        last.q_proj.bias.mul_(1.02)
    stored = run.artifact["sensitivity"]
    lines = metric_lines(run.artifact["metrics"], recompute_metrics(run))
    lines += sensitivity_lines(stored, run_sensitivity(run, **stored["settings"]))
    names = {line.split(":")[0] for line in lines}
    last_block = f"paths.block{len(stored['paths']['blocks']) - 1}."
    assert {"maps.entropy.mean", "maps.entropy.std"} <= names
    assert any(n.startswith(last_block + "key") for n in names)
    assert not any(n.startswith("paths.block0.") for n in names)  # the blocks before: unchanged
    if path != NEAR_UNIFORM:  # near-uniform attention averages the values whatever its queries
        assert "MAE@mean" in names and any(n.startswith("profile.S") for n in names)


def test_a_perturbed_full_length_run_fails_its_day(loaded, data):
    """The same 2 % change of the last block's queries moves one day's error sums outside
    their tolerance; a day's sums changed by 2e-5 of their value (or one count) fail as well."""
    path = BY_DAY[0]
    art = _artifact(path)
    stored = art["test_by_day"]["sums"][art["test_by_day"]["days"].index(_day_of(path))]
    shifted = {
        k: [v + (1 if k == "n" else 2 * METRIC_RTOL * v) for v in vs] for k, vs in stored.items()
    }
    assert len(day_lines(stored, shifted)) == len(SUMS) * 4
    run = loaded(path)
    last = run.model.blocks[-1].attn
    with torch.no_grad():
        last.q_proj.weight.mul_(1.02)
        last.q_proj.bias.mul_(1.02)
    stamps = data(art["provenance"]["config"]["data"].get("speed_file")).timestamps
    lines = day_lines(stored, day_sums(run, stamps, _day_of(path)))
    assert {line.split("[")[0] for line in lines} == {"abs", "sq", "ape"}


# --------------------------------------------------------------------------- the protocols


def test_the_slice_runs_are_complete_and_carry_their_sensitivity():
    """5 variants x 4 seeds of the slice protocol, each with the numbers the pages show, each
    ended by early stopping or with its best validation epoch before its last (whether a run meets
    the convergence rule is the results page's count, not asserted here)."""
    arts = [_artifact(p) for p in WITH_WEIGHTS if p.parent.name == "slice"]
    assert sorted((a["variant"], a["seed"]) for a in arts) == sorted(
        (v, s) for v in VARIANTS for s in range(4)
    )
    assert all("sensitivity" in a for a in arts), (
        "run `diagsink sensitivity book/results/slice/*.json`"
    )
    assert all(
        a["stopped"] == "early_stopping" or a["best_epoch"] < a["epochs_run"] - 1 for a in arts
    )


def test_the_reported_full_length_runs_are_complete_and_converged():
    """The runs the pages report (:data:`diagsink.results.PLANNED`): every planned variant with
    every seed of its protocol, each with its sensitivity and its test errors by day, and each
    validation curve meeting the convergence rule the results page states."""
    for protocol in PLANNED:
        arts = [_artifact(p) for p in WITH_WEIGHTS if p.parent.name == protocol]
        counts = run_counts(arts, protocol)  # every planned run present, and no other
        rerun = f"diagsink/configs/{protocol}.yaml --variants {','.join(counts['variants'])}"
        assert counts["present"] == counts["planned"] == len(arts), (
            f"run `diagsink reproduce --protocol {rerun} --device cpu`"
        )
        assert all("sensitivity" in a and "test_by_day" in a for a in arts), (
            f"run `diagsink sensitivity --by-day book/results/{protocol}/*_seed*.json`"
        )
        late = [
            (a["variant"], a["seed"]) for a in arts if not convergence(a["history"])["converged"]
        ]
        assert not late, f"{protocol}: still improving at the end: {late}"


def test_the_four_block_runs_are_complete_and_stopped_improving():
    """The depth chapter's trained stacks: 5 variants x 3 seeds of custom-depth4, 4 blocks each,
    each ended by early stopping or with its best validation epoch before its last."""
    deep = [_artifact(p) for p in WITH_WEIGHTS if p.parent.name == "custom-depth4"]
    assert sorted((a["variant"], a["seed"]) for a in deep) == sorted(
        (v, s) for v in VARIANTS for s in range(3)
    ), "run `diagsink reproduce --protocol diagsink/configs/custom-depth4.yaml --device cpu`"
    assert all(a["provenance"]["config"]["model"]["depth"] == 4 for a in deep)
    assert all(
        a["stopped"] == "early_stopping" or a["best_epoch"] < a["epochs_run"] - 1 for a in deep
    )


def test_changed_weights_or_other_data_are_refused(tmp_path, data):
    src = WITH_WEIGHTS[0]
    art = _artifact(src)
    data = data(art["provenance"]["config"]["data"].get("speed_file"))
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
