"""The GPU script (tools/gpu_reproduce.sh) works offline: a dry run of it on the CPU.

The dry run trains one run through the same steps as the GPU call (reproduce, then the
sensitivity of every finished run) on a protocol file the size of a smoke test (the quick
protocol with one narrow block, one epoch of two batches), writes the provenance log, and
refuses to start without a data folder (exit 2, one line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from diagsink.engine.config import load_config, override

from conftest import ROOT

SCRIPT = ROOT / "tools" / "gpu_reproduce.sh"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DIAGSINK_DATA"}
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", **extra)
    return env


#: The quick protocol at the size of a smoke test: every step runs, on two batches of training.
TINY = {
    "protocol": "custom-tiny",
    "model.d_model": 8,
    "model.depth": 1,
    "model.node_embed_dim": 4,
    "train.epochs": 1,
    "train.warmup_epochs": 0,
    "train.max_train_windows": 32,
}


def test_dry_run_on_the_cpu_trains_and_attaches_sensitivity(tmp_path):
    data = os.environ.get("DIAGSINK_DATA")
    assert data, "set DIAGSINK_DATA to the METR-LA folder (CI does)"
    protocol = tmp_path / "custom-tiny.yaml"
    protocol.write_text(yaml.safe_dump(override(load_config("quick"), TINY), sort_keys=False))
    out_dir = tmp_path / "out"
    env = _env(DIAGSINK_DATA=data, DEVICE="cpu", STEPS=str(protocol), SEEDS="1", VARIANTS="none")
    out = subprocess.run(
        ["bash", str(SCRIPT), str(out_dir)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    art = json.loads((out_dir / "custom-tiny" / "none_seed0.json").read_text())
    assert art["epochs_run"] == 1 and art["provenance"]["config"]["model"]["d_model"] == 8
    assert "sensitivity" in art and art["provenance"]["device"].startswith("cpu")
    windows = art["provenance"]["data"]["windows"]["test"]
    assert sum(art["test_by_day"]["windows"]) == windows  # the test errors by day, every window
    log = (out_dir / "gpu_reproduce.log").read_text()
    assert "== provenance ==" in log and f"== {protocol} ==" in log and "wall time:" in log


def test_without_a_data_folder_it_stops_with_one_line(tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "DIAGSINK_DATA" in out.stderr
