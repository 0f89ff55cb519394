"""benchmarks/training.py runs and writes the table that the appendix "Making it fast" loads.

The script broke once without any test noticing (a parameter shadowed a function it calls), so
this runs it end to end at the smallest setting (the ``quick`` protocol, one timed step, no
memory probe; about half a minute, the timings themselves mean nothing) and checks that the
file holds the provenance the page prints and ratios consistent with its own rates.
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
        [sys.executable, str(SCRIPT), "--protocols", "quick", "--steps", "1", "--no-memory"]
        + ["--device", "cpu", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = json.loads(out.read_text())
    for key in ("utc", "git_commit", "machine", "data", "device", "torch", "threads"):
        assert table[key] not in (None, ""), key
    assert table["steps"] == 1 and table["device"] == "cpu"
    assert "peak_gib_paper_batch32" not in table  # --no-memory
    (row,) = table["rows"]
    assert row["protocol"] == "quick"
    for key in ("ours", "reference", "no_graph", "inference_ours", "inference_reference"):
        assert row[key] > 0, key
    b = row["batch"]
    # the ratios are of the same run's step times, samples/s = batch / step time
    assert abs(row["ours_over_reference"] - row["ours"] / row["reference"]) < 1e-9 * b
    assert abs(row["ours_over_no_graph"] - row["ours"] / row["no_graph"]) < 1e-9 * b
    assert f"written: {out}" in run.stdout
