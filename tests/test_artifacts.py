"""Result artifacts: schema, checksum, atomic writing, and every committed artifact validates."""

from __future__ import annotations

import json
import re

import pytest

from diagsink._io import sha256_file
from diagsink.data import toy_data
from diagsink.engine.artifacts import (
    ArtifactError,
    checksum,
    load_artifact,
    load_results,
    validate_artifact,
    write_artifact,
)
from diagsink.engine.by_day import attach_test_by_day, metrics_from_sums
from diagsink.engine.config import load_config, override
from diagsink.engine.provenance import COPIED_TREE_SUFFIX, page_note
from diagsink.engine.train import train_run

from conftest import ROOT

COMMITTED = sorted((ROOT / "book" / "results").glob("*/*.json"))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    cfg = override(
        load_config("quick"),
        {
            "model.d_model": 8,
            "model.n_heads": 2,
            "model.depth": 1,
            "train.epochs": 2,
            "train.max_train_windows": 32,
            "train.batch_size": 16,
        },
    )
    out = tmp_path_factory.mktemp("res")
    art = train_run(cfg, "mask", 1, data=toy_data(), device="cpu", out_dir=out, progress=False)
    return out / "quick" / "mask_seed1.json", art


def test_written_artifact_validates_and_has_provenance(artifact):
    path, art = artifact
    loaded = load_artifact(path)
    assert loaded["metrics"] == art["metrics"]
    prov = loaded["provenance"]
    assert prov["seed"] == 1 and prov["data"]["n_steps"] == 300 and prov["data"]["full"] is False
    assert len(loaded["attention"]["mean"]) == 12 and len(loaded["attention"]["per_head"]) == 2
    state = path.with_suffix(".pt")
    assert state.exists() and loaded["state_dict"]["sha256"] == sha256_file(state)
    # the mask variant's averaged attention has an empty diagonal
    assert all(loaded["attention"]["mean"][i][i] == 0 for i in range(12))


def test_tampered_artifact_fails(artifact, tmp_path):
    path, _ = artifact
    art = json.loads(path.read_text())
    art["metrics"]["MAE@12"] *= 0.9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(art))
    with pytest.raises(ArtifactError, match="checksum"):
        load_artifact(bad)


def test_schema_rejects_missing_fields_and_bad_values(artifact):
    _, art = artifact
    clean = {k: v for k, v in art.items() if not k.startswith("_")}
    clean["checksum"] = checksum(clean)
    validate_artifact(clean)
    broken = json.loads(json.dumps(clean))
    del broken["provenance"]["data"]["sha256"]
    with pytest.raises(ArtifactError, match="sha256"):
        validate_artifact(broken, check_sum=False)
    broken = json.loads(json.dumps(clean))
    broken["metrics"]["RMSE@6"] = -1.0
    with pytest.raises(ArtifactError, match="RMSE@6"):
        validate_artifact(broken, check_sum=False)
    broken = json.loads(json.dumps(clean))
    broken["attention"]["mean"][0][0] += 0.5
    with pytest.raises(ArtifactError, match="sums to"):
        validate_artifact(broken, check_sum=False)


def test_write_is_atomic_and_refuses_invalid(tmp_path, artifact):
    _, art = artifact
    bad = dict(art, variant="bogus")
    with pytest.raises(ArtifactError):
        write_artifact(tmp_path / "x.json", bad)
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


@pytest.mark.skipif(not COMMITTED, reason="no committed artifacts yet")
@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_artifact_is_valid(path):
    art = load_artifact(path)
    assert path.name == f"{art['variant']}_seed{art['seed']}.json"
    assert path.parent.name == art["protocol"]
    if art["state_dict"]["file"]:
        state = path.parent / art["state_dict"]["file"]
        assert state.exists() and sha256_file(state) == art["state_dict"]["sha256"]


@pytest.mark.skipif(not COMMITTED, reason="no committed artifacts yet")
def test_committed_results_load_per_protocol():
    for folder in {p.parent for p in COMMITTED}:
        arts = load_results(folder)
        # one config per protocol folder
        assert len({a["provenance"]["config_hash"] for a in arts}) == 1


def test_paired_comparison_and_t_quantile():
    from diagsink.engine.significance import paired_comparison, t_quantile

    assert t_quantile(0.975, 2) == pytest.approx(4.303, abs=2e-3)
    assert t_quantile(0.975, 30) == pytest.approx(2.042, abs=2e-3)
    arts = [
        {
            "variant": v,
            "seed": s,
            "metrics": {"MAE@3": base + (0.5 if v == "mask" else 0.0) + 0.01 * s * (v == "mask")},
        }
        for s, base in enumerate([3.0, 3.2, 2.9])
        for v in ("none", "mask")
    ]
    out = paired_comparison(arts, "mask", "MAE@3")
    assert out["n"] == 3 and out["mean_diff"] == pytest.approx(0.51) and out["exceeds_noise"] == 1.0


def test_results_exercise_checks():
    from diagsink.exercises import check

    def rel(values, base):
        return [100 * (v - base) / base for v in values]

    def paired(a, b):
        import math

        d = [x - y for x, y in zip(a, b)]
        m = sum(d) / len(d)
        return m / (math.sqrt(sum((v - m) ** 2 for v in d) / (len(d) - 1)) / math.sqrt(len(d)))

    assert check("ex-results-relative", rel).passed
    frac = check("ex-results-relative", lambda v, b: [x / 100 for x in rel(v, b)])
    assert not frac.passed and "percent" in frac.message
    assert check("ex-results-paired", paired).passed
    flipped = check("ex-results-paired", lambda a, b: paired(b, a))
    assert not flipped.passed and "sign" in flipped.message


EVERY_COMMITTED = sorted(
    p for p in (ROOT / "book" / "results").rglob("*.json") if "superseded" not in p.parts
)


def _commits(art: dict) -> list[str]:
    """The training's commit and, if present, the commits that computed the sensitivity and the
    test errors by day."""
    added = [art[k]["git_commit"] for k in ("sensitivity", "test_by_day") if k in art]
    return [art["provenance"]["git_commit"], *added]


def test_every_committed_artifact_comes_from_a_clean_commit():
    """A result must name the code that made it: a commit without uncommitted changes.

    On the GPU machine the tree travels without ``.git``; there the commit recorded by
    ``tools/device_prepare.sh`` (which refuses a dirty tree) is named as such, and accepted.
    """
    assert EVERY_COMMITTED, "book/results holds no artifacts"
    dirty = [
        p.relative_to(ROOT).as_posix()
        for p in EVERY_COMMITTED
        if not all(
            re.fullmatch(f"[0-9a-f]{{40}}({re.escape(COPIED_TREE_SUFFIX)})?", commit)
            for commit in _commits(json.loads(p.read_text()))
        )
    ]
    assert dirty == [], (
        f"{len(dirty)} committed artifacts were written from a dirty tree or an unknown commit "
        f"(first: {dirty[:3]}); regenerate them from a clean checkout (diagsink reproduce / sweep)"
    )


def test_test_by_day_adds_up_to_the_metrics_and_a_malformed_one_is_refused(artifact):
    """``attach_test_by_day`` stores one day's sums per test day; together they give the
    metrics the run recorded; a field whose windows do not add up to the split is refused."""
    path, art = artifact
    field = attach_test_by_day(path, toy_data())
    loaded = load_artifact(path)
    assert loaded["test_by_day"] == field and loaded["metrics"] == art["metrics"]
    assert sum(field["windows"]) == art["provenance"]["data"]["windows"]["test"]
    again = metrics_from_sums(field["sums"])
    assert again == pytest.approx(art["metrics"], rel=1e-6)
    bad = {k: v for k, v in loaded.items() if k != "checksum"}
    bad["test_by_day"] = {**field, "windows": [w + 1 for w in field["windows"]]}
    with pytest.raises(ArtifactError, match="test_by_day"):
        write_artifact(path.parent / "bad.json", bad)


def test_page_note_names_data_code_device_and_the_runs_read():
    """The collapsed provenance cell of every chapter: data, executed code, device, and for each
    protocol read its runs, seeds, devices and commits (short hashes, a +dirty mark kept)."""
    arts = load_results(ROOT / "book" / "results" / "slice")
    text = page_note("no data: random layers", arts)
    lines = text.splitlines()
    assert lines[0] == "Data: no data: random layers"
    assert (
        lines[1].startswith("Executed: ")
        and " mode; diagsink " in lines[1]
        and "torch " in lines[1]
    )
    assert lines[2].startswith("Device: ")
    seeds = sorted({a["seed"] for a in arts})
    commits = sorted({a["provenance"]["git_commit"][:7] for a in arts})
    assert f"Committed runs read: slice, {len(arts)} run(s), seed(s) {seeds}" in text
    assert all(c in text for c in commits) and "Reproducing this book" in lines[-1]
    dirty = [
        {**arts[0], "provenance": {**arts[0]["provenance"], "git_commit": "0123456789abcdef+dirty"}}
    ]
    assert "at commit(s) 0123456+dirty" in page_note("d", dirty)
    assert len(page_note("d").splitlines()) == 3  # no runs: no run lines
