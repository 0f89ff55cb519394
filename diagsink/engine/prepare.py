"""Data on the device: the series, the targets and the window starts of a run, prepared once.

Step 1 of a run (:mod:`diagsink.engine.train`): the whole series goes to the device once as
``[T, N, 2]`` (scaled speed, time of day) plus the raw speeds ``[T, N]`` for the targets; a
batch is one vectorised :func:`diagsink.data.windows.gather` of its window starts (no
``Dataset``, no ``DataLoader``, no per-sample Python). Explained in ``book/model.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.adjacency import diffusion_supports
from ..data.windows import Scaler, gather, split_windows, time_of_day, train_steps
from ..errors import ConfigError

__all__ = ["Prepared", "prepare", "batch"]


@dataclass
class Prepared:
    """Everything a run needs from the data, already on the device.

    Attributes:
        series: ``[T, N, 2]`` float32: scaled speed (missing zeros scaled like any value)
            and time of day in ``[0, 1)``.
        speed: ``[T, N]`` float32 raw speeds (0 = missing): the targets.
        train, val, test: window starts (``LongTensor``) on the device.
        supports: ``[P_fwd, P_bwd]`` ``[N, N]``.
        mean, std: the scaler, fitted on the steps the training windows see.
        info: provenance of the data (path, sha256, steps, full or partial).
    """

    series: torch.Tensor
    speed: torch.Tensor
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    supports: list[torch.Tensor]
    mean: float
    std: float
    info: dict[str, Any]


def prepare(data: Any, cfg: dict[str, Any], device: str | torch.device = "cpu") -> Prepared:
    """Move a :class:`diagsink.data.metr_la.MetrLA` to ``device`` and split it as ``cfg["data"]`` says."""
    m = cfg["model"]
    wanted = cfg["data"].get("speed_file")
    got = Path(getattr(data, "path", "") or "").name
    if wanted is not None and got != wanted:
        raise ConfigError(
            f"the protocol {cfg['protocol']!r} trains on {wanted} (data.speed_file) but the data given was "
            f"read from {got or 'no file'}. Fix: pass ds.data.load_metr_la(speed_file={wanted!r}), or set "
            "data.speed_file to null in your own protocol."
        )
    splits = split_windows(
        data.n_steps,
        m["t_in"],
        m["t_out"],
        ratios=tuple(cfg["data"]["ratios"]),
        order=cfg["data"]["split_order"],
    )
    scaler = Scaler.fit(data.speed[: train_steps(splits, m["t_in"], m["t_out"])])
    speed = torch.as_tensor(data.speed, dtype=torch.float32)
    tod = torch.tensor(time_of_day(data.timestamps), dtype=torch.float32)[:, None].expand_as(speed)
    scaled = (speed - scaler.mean) / scaler.std
    if cfg["data"].get("missing_inputs", "as_reading") == "mean":
        scaled = scaled.masked_fill(speed == 0, 0.0)  # a missing input reads as the training mean
    series = torch.stack([scaled, tod], dim=-1)
    info = {
        "file": Path(data.path).name,
        "sha256": data.sha256,
        "n_steps": int(data.n_steps),
        "n_nodes": int(data.n_nodes),
        "full": bool(data.is_full),
        "describe": data.describe(),
        "split_order": splits.order,
        "windows": {
            k: int(len(v))
            for k, v in (("train", splits.train), ("val", splits.val), ("test", splits.test))
        },
        "scaler": {"mean": float(scaler.mean), "std": float(scaler.std)},
        "missing_inputs": cfg["data"].get("missing_inputs", "as_reading"),
    }
    return Prepared(
        series=series.to(device),
        speed=speed.to(device),
        train=splits.train.to(device),
        val=splits.val.to(device),
        test=splits.test.to(device),
        supports=[s.to(device) for s in diffusion_supports(data.adjacency)],
        mean=float(scaler.mean),
        std=float(scaler.std),
        info=info,
    )


def batch(
    prepared: Prepared, starts: torch.Tensor, t_in: int, t_out: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``[B, T_in, N, 2]`` and targets ``[B, T_out, N]`` (mph) of the windows ``starts``."""
    x = gather(prepared.series, starts, t_in)  # [B, T_in, N, 2]
    y = gather(prepared.speed, starts, t_out, offset=t_in)  # [B, T_out, N]
    return x, y
