"""benchmarks/attention.py writes the JSON that the appendix "Making it fast" loads.

The appendix (``book/fast.ipynb``) types no timing: it reads
``benchmarks/results/attention_<device>.json``. This runs the script at its ``--smoke`` sizes
(seconds; the timings themselves mean nothing) and checks that the file holds the provenance
and the tables the page reads, consistent with each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import diagsink as ds

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "attention.py"


def test_smoke_run_writes_tables_with_provenance(tmp_path: Path):
    out = tmp_path / "attention.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--rounds", "2", "--threads", "1"]
        + ["--device", "cpu", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    table = json.loads(out.read_text())
    for key in ("utc", "git_commit", "machine", "device", "torch", "threads", "clock"):
        assert table[key] not in (None, ""), key
    assert table["sizes"] == "smoke" and table["rounds"] == 2 and table["threads"] == 1
    # every shape, once without and once with attention dropout (the default rates 0, 0.1)
    assert [s["attn_dropout"] for s in table["shapes"]] == [0.0, 0.0, 0.1, 0.1]
    missed = []
    for shape in table["shapes"]:
        rows = shape["variants"]
        assert "nn.MultiheadAttention" in rows and "diag=None (fast path)" in rows
        mha, fast = rows["nn.MultiheadAttention"], rows["diag=None (fast path)"]
        for name, row in rows.items():
            assert len(row["rounds_ms"]) == 2 and row["best_ms"] == min(row["rounds_ms"])
            assert abs(row["over_mha"] - row["best_ms"] / mha["best_ms"]) < 1e-9
            assert abs(row["over_fast_path"] - row["best_ms"] / fast["best_ms"]) < 1e-9
            if row["met"] is False:
                missed.append(name)
        assert ("cause" in shape) == (shape["attn_dropout"] == 0.0)
    assert len(table["missed"]) == len(missed)  # the file's list matches its own rows
    # the METR-LA-like smoke shape (6 sequences of T = 12) is packed as the layer packs it
    first = table["shapes"][0]
    groups = ds._packing.pack_groups(first["n_seq"], first["T"], torch.device("cpu"))
    assert first["cause"]["groups"] == groups > 1
    assert f"written: {out}" in run.stdout
