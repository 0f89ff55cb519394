"""A committed run brought back: its model from the saved weights, on the data it names.

The results and heatmaps chapters compute from the weights of committed runs (sensitivity, maps
of every block), and the tests recompute every committed artifact's test metrics with the
current code (:func:`recompute_metrics`), so a published number cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._io import sha256_file
from ..data import load_metr_la
from ..errors import DataError
from ..metrics import horizon_metrics
from ..model import TSModel
from ..sensitivity import run_sensitivity
from .artifacts import ArtifactError, load_artifact, write_artifact
from .prepare import Prepared, prepare
from .provenance import git_commit
from .train import build_model, predict

__all__ = [
    "LoadedRun",
    "load_run",
    "recompute_metrics",
    "metric_differences",
    "SENSITIVITY_SETTINGS",
    "attach_sensitivity",
]

#: The settings of the committed runs' sensitivity (first test windows, Hutchinson probes, seed,
#: and the windows x sensors, evenly spaced, whose per-block paths are differentiated).
SENSITIVITY_SETTINGS: dict[str, int] = {
    "windows": 32,
    "probes": 16,
    "seed": 0,
    "path_windows": 4,
    "path_nodes": 8,
}


@dataclass
class LoadedRun:
    """A committed run: its artifact, its config, its data on the device and its trained model."""

    path: Path
    artifact: dict[str, Any]
    cfg: dict[str, Any]
    prepared: Prepared
    model: TSModel


def _regenerate(path: Path, art: dict[str, Any]) -> str:
    return (
        f"regenerate it: `diagsink reproduce --protocol {art['protocol']}` (a "
        f"{art['protocol']!r} run; delete {path.name} first so that it is not skipped)"
    )


def load_run(
    path: str | Path,
    data: Any = None,
    device: str = "cpu",
    prepared: Prepared | None = None,
) -> LoadedRun:
    """Rebuild the run of the artifact ``path`` with its weights, in eval mode.

    Args:
        path: an artifact ``.json`` whose ``state_dict`` file lies next to it.
        data: the METR-LA it was trained on (default :func:`diagsink.data.metr_la.load_metr_la`).
        prepared: the data already prepared with this run's config (skips ``data``).

    Raises:
        ArtifactError: no weights, or weights whose sha256 differs from the recorded one.
        DataError: the data is not the file the run was trained on (sha256 or window counts).
    """
    path = Path(path)
    art = load_artifact(path)
    cfg = art["provenance"]["config"]
    file = art["state_dict"].get("file")
    if not file or not (path.parent / file).is_file():
        raise ArtifactError(
            f"{path} has no weights next to it ({file!r}); {_regenerate(path, art)}."
        )
    weights = path.parent / file
    if art["state_dict"].get("sha256") and sha256_file(weights) != art["state_dict"]["sha256"]:
        raise ArtifactError(
            f"{weights} is not the state dict {path.name} recorded; {_regenerate(path, art)}."
        )
    if prepared is None:
        prepared = prepare(
            load_metr_la(speed_file=cfg["data"].get("speed_file")) if data is None else data,
            cfg,
            device,
        )
    want = art["provenance"]["data"]
    if prepared.info["sha256"] != want["sha256"] or prepared.info["windows"] != want.get(
        "windows", prepared.info["windows"]
    ):
        raise DataError(
            f"{path.name} was trained on {want['file']} (sha256 {want['sha256'][:12]}...), not on "
            f"{prepared.info['file']}. Fix: point DIAGSINK_DATA at the folder holding that file."
        )
    model = build_model(cfg, art["variant"], prepared)
    model.load_state_dict(torch.load(weights, map_location=device, weights_only=True))
    model.eval()
    return LoadedRun(path=path, artifact=art, cfg=cfg, prepared=prepared, model=model)


def recompute_metrics(run: LoadedRun) -> dict[str, float]:
    """The test metrics of ``run``'s model, computed now with the current code."""
    pred, target = predict(run.model, run.prepared, run.prepared.test, run.cfg)
    return horizon_metrics(pred, target)


def metric_differences(
    recorded: dict[str, float], recomputed: dict[str, float], rtol: float = 1e-4
) -> list[str]:
    """The metrics that differ by more than ``rtol`` (relative), as readable lines."""
    return [
        f"{k}: recorded {recorded[k]:.6f}, recomputed {recomputed[k]:.6f}"
        for k in recorded
        if abs(recorded[k] - recomputed[k]) > rtol * max(abs(recorded[k]), 1e-12)
    ]


def attach_sensitivity(
    path: str | Path, data: Any = None, prepared: Prepared | None = None
) -> dict[str, Any]:
    """Compute the sensitivity of the run ``path`` from its weights and store it in the artifact.

    The field ``sensitivity`` holds :func:`diagsink.sensitivity.run_sensitivity` with
    :data:`SENSITIVITY_SETTINGS`, plus the commit of the code that computed it; the rest of the
    artifact (the training's provenance) is unchanged. Written atomically; returns the field.
    """
    run = load_run(path, data=data, prepared=prepared)
    field = {
        **run_sensitivity(run, **SENSITIVITY_SETTINGS),
        "settings": dict(SENSITIVITY_SETTINGS),
        "git_commit": git_commit(),
    }
    art = {k: v for k, v in run.artifact.items() if k != "checksum"}
    write_artifact(run.path, {**art, "sensitivity": field})
    return field
