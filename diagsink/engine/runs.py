"""Runs on disk: their paths, finished or not, checkpoints, and ``reproduce`` (every variant x seed).

A run is one variant x one protocol x one seed (:func:`diagsink.engine.train.train_run`); its
files live in ``<out_dir>/<protocol>/``. Explained in the chapters ``book/model.ipynb`` (resume)
and ``book/results.ipynb`` (the committed runs).
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._checks import is_int
from .._io import atomic_write_bytes, remove_stale_temporaries
from ..data import load_metr_la
from ..errors import ConfigError
from ..runtime import resolve_device
from ..variants import VARIANTS, check_variant
from .artifacts import ArtifactError, load_artifact
from .config import config_hash, load_config
from .epoch import SingleProcess

__all__ = [
    "run_name",
    "run_paths",
    "existing_run",
    "tidy_finished_run",
    "save_checkpoint",
    "RunState",
    "resume_checkpoint",
    "write_checkpoint",
    "keep_finished",
    "reproduce",
]


def run_name(variant: str, seed: int) -> str:
    """``"<variant>_seed<k>"`` for a known variant and a non-negative int seed."""
    check_variant(variant)
    if not (is_int(seed) and 0 <= seed < 2**31):
        raise ConfigError(f"seed {seed!r} must be an integer in [0, 2**31).")
    return f"{variant}_seed{seed}"


def run_paths(out_dir: str | Path, protocol: str, variant: str, seed: int) -> dict[str, Path]:
    """Artifact, state-dict and checkpoint paths of a run; all inside ``out_dir/<protocol>``.

    Raises:
        ConfigError: if a path would leave ``out_dir`` (e.g. a protocol name with ``..``).
    """
    base = Path(out_dir).resolve()
    folder = (base / protocol).resolve()
    if folder.parent != base or not protocol.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(
            f"protocol name {protocol!r} would write outside {base}; use a plain name like 'quick'."
        )
    name = run_name(variant, seed)
    paths = {
        "json": folder / f"{name}.json",
        "state": folder / f"{name}.pt",
        "checkpoint": folder / ".checkpoints" / f"{name}.ckpt.pt",
    }
    for p in paths.values():
        if not p.resolve().is_relative_to(base):
            raise ConfigError(f"{p} is outside the output folder {base}.")
    return paths


def existing_run(path: Path, cfg: dict[str, Any]) -> tuple[str, str]:
    """What the artifact file ``path`` holds for the configuration ``cfg``, as ``(status, detail)``.

    ``("absent", "")``, ``("finished", "")`` (a valid artifact of ``cfg``: skip the run),
    ``("other", <its config hash>)`` (a valid artifact of another configuration) or
    ``("invalid", <why>)``. :func:`reproduce` and :func:`diagsink.engine.sweeps.run_sweep` decide
    with it whether to skip or redo.
    """
    if not path.exists():
        return "absent", ""
    try:
        art = load_artifact(path)
    except ArtifactError as exc:
        return "invalid", str(exc)
    old = art["provenance"]["config_hash"]
    return ("finished", "") if old == config_hash(cfg) else ("other", str(old))


def tidy_finished_run(paths: dict[str, Path]) -> None:
    """Once a run's artifact is final: delete its checkpoint, the temporary files that a process
    killed mid-write left next to its files, and the ``.checkpoints`` folder if that leaves it empty.

    Called when a run finishes and when :func:`reproduce` skips a finished run (a process killed
    between writing the artifact and deleting the checkpoint leaves the checkpoint behind).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths["checkpoint"])
    for key in ("json", "state", "checkpoint"):
        remove_stale_temporaries(paths[key])
    with contextlib.suppress(OSError):
        paths["checkpoint"].parent.rmdir()


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` ``state`` into memory, then write it atomically (a kill never leaves half a file)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


@dataclass
class RunState:
    """Where a run stands after an epoch: what a checkpoint stores beside the weights."""

    epoch: int = 0
    best_val: float = math.inf
    best_epoch: int = -1
    bad_epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    train_time: float = 0.0
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)
    stopped: str = "max_epochs"
    resumed_from: int | None = None


def resume_checkpoint(
    path: Path,
    key: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device,
) -> RunState | None:
    """Load the checkpoint at ``path`` into ``model``/``optimizer`` if it belongs to this run."""
    if not path.exists():
        return None
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # damaged or foreign file (our own writes are atomic): start over
        warnings.warn(
            f"ignoring the unreadable checkpoint {path} ({type(exc).__name__}); "
            "the run starts from epoch 0.",
            stacklevel=3,
        )
        return None
    if any(ck.get(k) != v for k, v in key.items()):
        return None
    model.load_state_dict(ck["model"])
    optimizer.load_state_dict(ck["optimizer"])
    torch.set_rng_state(ck["rng_cpu"])
    if device.type == "cuda" and "rng_cuda" in ck:
        torch.cuda.set_rng_state(ck["rng_cuda"], device)
    fields = {f: ck[f] for f in RunState.__dataclass_fields__ if f in ck}
    return RunState(**fields, resumed_from=ck["epoch"])


def write_checkpoint(
    path: Path, key: dict[str, Any], state: RunState, model, optimizer, device
) -> None:
    """Write everything needed to resume after ``state.epoch`` epochs (atomically)."""
    ck = {**key, **{f: getattr(state, f) for f in RunState.__dataclass_fields__}}
    del ck["resumed_from"]
    ck.update(
        model=model.state_dict(), optimizer=optimizer.state_dict(), rng_cpu=torch.get_rng_state()
    )
    if device.type == "cuda":
        ck["rng_cuda"] = torch.cuda.get_rng_state(device)
    save_checkpoint(path, ck)


def _supersede(paths: dict[str, Path], old_hash: str) -> Path:
    """Move a finished run made with another configuration to ``<protocol>/superseded/``.

    A finished result is never deleted: the artifact and its state dict keep their names plus
    the old configuration hash, outside the folder that the chapters load.
    """
    folder = paths["json"].parent / "superseded"
    folder.mkdir(parents=True, exist_ok=True)
    tag = base = str(old_hash)[:12]
    n = 1
    while any(  # a run of the same configuration superseded before keeps its place too
        (folder / f"{paths[k].stem}.{tag}{paths[k].suffix}").exists() for k in ("json", "state")
    ):
        n += 1
        tag = f"{base}-{n}"
    for key in ("json", "state"):
        src = paths[key]
        if src.exists():
            os.replace(src, folder / f"{src.stem}.{tag}{src.suffix}")
    return folder / f"{paths['json'].stem}.{tag}.json"


def keep_finished(paths: dict[str, Path]) -> Path | None:
    """Before a run's files are replaced: a valid artifact at ``paths["json"]`` (any configuration)
    and its state dict move to ``<protocol>/superseded/`` (:func:`_supersede`); returns the kept
    artifact's path, ``None`` when there was none (a damaged artifact is redone, as by :func:`reproduce`).
    """
    if not paths["json"].exists():
        return None
    try:
        art = load_artifact(paths["json"])
    except ArtifactError:
        return None
    return _supersede(paths, art["provenance"]["config_hash"])


def reproduce(
    cfg: dict[str, Any] | str,
    seeds: int,
    *,
    variants: tuple[str, ...] = VARIANTS,
    device: str | None = None,
    out_dir: str | Path = "book/results",
    data: Any = None,
    progress: bool = True,
    low_memory: bool = False,
    processes: SingleProcess | None = None,
) -> list[Path]:
    """Train every variant x seed ``0..seeds-1``; skip runs whose valid artifact exists. Returns the JSON paths.

    ``processes`` goes to every run (:func:`diagsink.engine.train.train_run`): None for one process.
    """
    # reason: train imports this module (run_paths, save_checkpoint); reproduce is its caller
    from .train import prepare, train_run

    if isinstance(cfg, str):
        cfg = load_config(cfg)
    device_t = resolve_device(device)
    main = processes is None or processes.is_main  # only the main process moves or tidies files
    prepared = None
    done: list[Path] = []
    for seed in range(seeds):
        for variant in variants:
            paths = run_paths(out_dir, cfg["protocol"], variant, seed)
            status, detail = existing_run(paths["json"], cfg)
            if status == "finished":
                if progress:
                    print(f"skip {paths['json']} (finished)")
                if main:
                    tidy_finished_run(paths)
                done.append(paths["json"])
                continue
            if status == "other" and main:
                kept = _supersede(paths, detail)
                print(
                    f"redo {paths['json']}: it was made with another configuration of {cfg['protocol']!r} "
                    f"(the old result is kept as {kept})"
                )
            elif status == "invalid":
                print(f"redo {paths['json']}: {detail}")
            if prepared is None:
                prepared = prepare(
                    load_metr_la(speed_file=cfg["data"].get("speed_file"))
                    if data is None
                    else data,
                    cfg,
                    device_t,
                )
            train_run(
                copy.deepcopy(cfg),
                variant,
                seed,
                prepared=prepared,
                device=str(device_t),
                out_dir=out_dir,
                progress=progress,
                low_memory=low_memory,
                processes=processes,
            )
            done.append(paths["json"])
    return done
