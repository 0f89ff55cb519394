"""benchmarks/training.py runs and writes the table that the appendix "Making it fast" loads.

Runs the script end to end at its smallest setting (the ``book@29`` row, one timed step; the
timings themselves mean nothing here) and checks that the file holds the provenance the page
prints, ratios consistent with its own rates, and the target verdicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "training.py"


def test_smoke_run_writes_table_with_provenance(tmp_path: Path):
    out = tmp_path / "training.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "book@29", "--steps", "1"]
        + ["--device", "cpu", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = json.loads(out.read_text())
    for key in ("utc", "git_commit", "machine", "device", "torch", "threads"):
        assert table[key] not in (None, ""), key
    assert table["steps"] == 1 and table["device"] == "cpu" and table["compile"] is False
    (row,) = table["rows"]
    assert row["row"] == "book@29" and row["sensors"] == 29 and row["batch"] == 64
    assert "29" in row["data"] and "released" not in row  # the released model: GPU rows only
    assert row["ours"] > 0 and row["straightforward"] > 0
    # the ratio is of the same run's step times, samples/s = batch / step time
    ratio = row["ours"] / row["straightforward"]
    assert abs(row["ours_over_straightforward"] - ratio) < 1e-9 * ratio
    ((what, met),) = table["targets"].items()
    assert "book@29" in what and met == (ratio >= 0.95)
    assert f"written: {out}" in run.stdout
