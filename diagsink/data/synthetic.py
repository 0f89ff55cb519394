"""Toy data: a small synthetic stand-in for METR-LA, for fast tests and demonstrations.

Used by the chapter ``book/model.ipynb`` (the training loop on data that trains in seconds) and
by the tests. It has the attributes of :class:`diagsink.data.metr_la.MetrLA` that the engine reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .metr_la import MetrLA

__all__ = ["ToyData", "toy_data"]


@dataclass(frozen=True)
class ToyData:
    """A small synthetic stand-in for :class:`diagsink.data.metr_la.MetrLA` (same attributes used here)."""

    speed: Any
    timestamps: Any
    adjacency: Any
    path: Path
    sha256: str
    is_full: bool = False

    n_steps = MetrLA.n_steps
    n_nodes = MetrLA.n_nodes
    missing_fraction = MetrLA.missing_fraction

    def describe(self) -> str:
        return f"toy data: {self.n_steps} steps, {self.n_nodes} sensors on a ring (synthetic)"


def toy_data(n_steps: int = 300, n_nodes: int = 6, seed: int = 0) -> ToyData:
    """Synthetic speeds ``[n_steps, n_nodes]`` on a ring road graph, for fast tests and demos.

    Each sensor carries a daily cycle with its own phase, its neighbour's value one step
    earlier, and noise; about 2 % of the readings are 0 (missing), as in METR-LA.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps)[:, None]
    phase = rng.uniform(0, 2 * np.pi, n_nodes)[None, :]
    speed = 60 + 8 * np.sin(2 * np.pi * t / 288 + phase) + rng.normal(0, 1.5, (n_steps, n_nodes))
    speed[1:] = 0.7 * speed[1:] + 0.3 * np.roll(speed[:-1], 1, axis=1)
    speed[rng.random(speed.shape) < 0.02] = 0.0
    adj = np.eye(n_nodes, dtype=np.float32)
    for i in range(n_nodes):
        adj[i, (i + 1) % n_nodes] = 0.5
    stamps = pd.date_range("2012-03-01", periods=n_steps, freq="5min")
    return ToyData(
        speed=speed, timestamps=stamps, adjacency=adj, path=Path("toy.h5"), sha256="0" * 64
    )
