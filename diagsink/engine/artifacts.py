"""Result artifacts: one JSON file per training run, with its provenance and a checksum inside.

A run of :func:`diagsink.engine.train.train_run` writes ``<out>/<protocol>/<variant>_seed<k>.json``
(and, when small, the trained ``state_dict`` as ``<variant>_seed<k>.pt``). The JSON holds:

* ``metrics``: masked MAE/RMSE/MAPE at horizons 3, 6, 12 and over all 12 steps (``@mean``);
* ``best_epoch``, ``epochs_run``, ``stopped``, ``history`` (per-epoch train/val MAE), ``wall_time_s``;
* ``attention``: the last block's attention ``mean`` ``[T, T]`` and ``per_head`` ``[H, T, T]``
  and a sentence saying how it was averaged;
* ``provenance``: git commit, the full config and its hash, the data file, its sha256,
  number of steps and whether it is the full data set, device, torch version, UTC date, seed;
* ``sensitivity`` (optional, added later from the saved weights): the input-step profile, the
  last block's per-sequence map statistics and every block's Jacobian path norms on its real
  inputs (``paths``, :func:`diagsink.sensitivity.block_paths`), with the commit and settings
  that computed them;
* ``test_by_day`` (optional, added later from the saved weights): the error sums of every test
  day, which add up to ``metrics`` (:mod:`diagsink.engine.by_day`);
* ``checksum``: sha256 of the canonical JSON of everything else, so an edited file is detected.

Files are written atomically (:func:`diagsink._io.atomic_write_text`). The results chapter
(``book/results.ipynb``) loads them with :func:`load_results`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from .._io import atomic_write_text
from ..errors import DiagsinkError
from ..variants import VARIANTS
from .config import config_hash

__all__ = [
    "SCHEMA_VERSION",
    "METRIC_KEYS",
    "ArtifactError",
    "checksum",
    "artifact_json",
    "write_artifact",
    "validate_artifact",
    "load_artifact",
    "load_results",
]

SCHEMA_VERSION = 1
METRIC_KEYS: tuple[str, ...] = tuple(
    f"{m}@{h}" for h in ("3", "6", "12", "mean") for m in ("MAE", "RMSE", "MAPE")
)
_PROVENANCE_KEYS = (
    "git_commit",
    "config",
    "config_hash",
    "data",
    "device",
    "torch",
    "date_utc",
    "seed",
)
_DATA_KEYS = ("file", "sha256", "n_steps", "full")
_TOP_KEYS = {
    "schema_version": int,
    "protocol": str,
    "variant": str,
    "seed": int,
    "metrics": dict,
    "best_epoch": int,
    "epochs_run": int,
    "stopped": str,
    "history": list,
    "wall_time_s": (int, float),
    "attention": dict,
    "state_dict": dict,
    "provenance": dict,
    "checksum": str,
}


class ArtifactError(DiagsinkError):
    """A result artifact is missing fields, malformed, or its checksum does not match."""


def _canonical(obj: dict[str, Any]) -> bytes:
    body = {k: v for k, v in obj.items() if k != "checksum" and not k.startswith("_")}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def checksum(artifact: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``artifact`` without its ``checksum`` field."""
    return hashlib.sha256(_canonical(artifact)).hexdigest()


def _square(m: Any, size: int | None = None) -> int:
    if not (isinstance(m, list) and m and all(isinstance(r, list) and len(r) == len(m) for r in m)):
        raise ArtifactError("attention maps must be square lists of lists [T][T].")
    if size is not None and len(m) != size:
        raise ArtifactError(f"attention map has {len(m)} rows, expected {size}.")
    for row in m:
        if not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in row):
            raise ArtifactError("attention weights must be numbers in [0, 1].")
        if abs(sum(row) - 1) > 1e-3:
            raise ArtifactError(f"an attention row sums to {sum(row):.4f}, not 1.")
    return len(m)


def validate_artifact(art: dict[str, Any], *, check_sum: bool = True) -> dict[str, Any]:
    """Check fields, types, value ranges and (``check_sum``) the checksum. Returns ``art``.

    Raises:
        ArtifactError: naming the first problem found.
    """
    if not isinstance(art, dict):
        raise ArtifactError("an artifact is a JSON object.")
    for key, kind in _TOP_KEYS.items():
        if key not in art:
            raise ArtifactError(
                f"artifact field {key!r} is missing; rerun the training command to regenerate it."
            )
        if not isinstance(art[key], kind) or isinstance(art[key], bool):
            raise ArtifactError(f"artifact field {key!r} has type {type(art[key]).__name__}.")
    if art["schema_version"] != SCHEMA_VERSION:
        raise ArtifactError(
            f"schema_version {art['schema_version']} is not {SCHEMA_VERSION}; regenerate the artifact."
        )
    if art["variant"] not in VARIANTS:
        raise ArtifactError(f"variant {art['variant']!r} is not one of {VARIANTS}.")
    for key in METRIC_KEYS:
        v = art["metrics"].get(key)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ArtifactError(
                f"metric {key} = {v!r} is missing or not a finite non-negative number."
            )
    if not 0 <= art["best_epoch"] < art["epochs_run"] or len(art["history"]) != art["epochs_run"]:
        raise ArtifactError("best_epoch / epochs_run / history disagree.")
    prov = art["provenance"]
    for key in _PROVENANCE_KEYS:
        if key not in prov:
            raise ArtifactError(f"provenance field {key!r} is missing.")
    for key in _DATA_KEYS:
        if key not in prov["data"]:
            raise ArtifactError(f"provenance.data field {key!r} is missing.")
    if prov["seed"] != art["seed"] or prov["config"].get("protocol") != art["protocol"]:
        raise ArtifactError("provenance seed/protocol disagree with the artifact's.")
    if config_hash(prov["config"]) != prov["config_hash"]:
        raise ArtifactError("provenance.config_hash does not match provenance.config.")
    att = art["attention"]
    t = _square(att.get("mean"))
    heads = att.get("per_head")
    if not isinstance(heads, list) or len(heads) != prov["config"]["model"]["n_heads"]:
        raise ArtifactError("attention.per_head must hold one [T][T] map per head.")
    for h in heads:
        _square(h, t)
    if not isinstance(att.get("how"), str):
        raise ArtifactError("attention.how (how the maps were averaged) is missing.")
    if "sensitivity" in art:
        model = prov["config"]["model"]
        _check_sensitivity(art["sensitivity"], model["t_in"], model["depth"])
    if "test_by_day" in art:
        _check_by_day(art["test_by_day"], prov["data"].get("windows", {}).get("test"))
    if check_sum and checksum(art) != art["checksum"]:
        raise ArtifactError(
            "checksum mismatch: the artifact was edited or corrupted; regenerate it."
        )
    return art


#: What :func:`diagsink.sensitivity.block_paths` reports per block of ``sensitivity.paths``:
#: the four paths of :func:`diagsink.jacobian.decompose`, ``"attention"`` (value + key + query:
#: the Jacobian without the residual's identity) and ``"total"`` (all four, the sublayer's
#: Jacobian). Defined here, where the validator needs it; the sensitivity module imports it.
PATH_PARTS: tuple[str, ...] = ("residual", "value", "key", "query", "attention", "total")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _paths_ok(paths: Any, depth: int) -> bool:
    """``sensitivity.paths``: one entry per block, each part's diagonal and off-diagonal norm."""
    if not (isinstance(paths, dict) and isinstance(paths.get("blocks"), list)):
        return False
    if len(paths["blocks"]) != depth or not _is_number(paths.get("uniform_share")):
        return False
    for block in paths["blocks"]:
        if not isinstance(block, dict) or not isinstance(block.get("diagonal_share"), dict):
            return False
        pairs = [block.get(k) for k in PATH_PARTS]
        if not all(
            isinstance(v, dict)
            and _is_number(v.get("diagonal"))
            and _is_number(v.get("off_diagonal"))
            for v in pairs
        ):
            return False
        if not all(_is_number(block["diagonal_share"].get(k)) for k in ("total", "attention")):
            return False
    return True


def _check_sensitivity(sens: Any, t_in: int, depth: int) -> None:
    """The optional ``sensitivity`` field (:func:`diagsink.engine.reload.attach_sensitivity`)."""
    ok = (
        isinstance(sens, dict)
        and isinstance(sens.get("git_commit"), str)
        and isinstance(sens.get("settings"), dict)
        and isinstance(sens.get("maps"), dict)
        and isinstance(sens.get("profile"), dict)
        and len(sens["profile"].get("S") or []) == t_in
        and ("paths" not in sens or _paths_ok(sens["paths"], depth))
    )
    if not ok:
        raise ArtifactError(
            "artifact field 'sensitivity' is malformed; recompute it with `diagsink sensitivity <artifact>`."
        )


def _check_by_day(field: Any, test_windows: int | None) -> None:
    """The optional ``test_by_day`` field (:func:`diagsink.engine.by_day.attach_test_by_day`):
    one entry of sums per day, four sums of four columns each, the windows adding up to the
    test split."""
    try:
        days, windows, sums = field["days"], field["windows"], field["sums"]
        ok = (
            isinstance(field.get("git_commit"), str)
            and len(field["columns"]) == 4
            and len(days) == len(windows) == len(sums) > 0
            and all(sorted(s) == ["abs", "ape", "n", "sq"] for s in sums)
            and all(len(v) == 4 for s in sums for v in s.values())
            and (test_windows is None or sum(windows) == test_windows)
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise ArtifactError(
            "artifact field 'test_by_day' is malformed; recompute it with "
            "`diagsink sensitivity --by-day <artifact>`."
        )


def _non_finite(obj: Any, where: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in ``obj`` (``None`` when every number is finite)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "(top level)"
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for key, value in items:
        found = _non_finite(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def artifact_json(artifact: dict[str, Any]) -> str:
    """The text :func:`write_artifact` writes: ``artifact`` with its checksum, validated, as JSON.

    Raises:
        ArtifactError: the artifact is invalid or holds a NaN or an infinity (JSON has none),
            naming the field; nothing is written, so a run never leaves a state dict without it.
    """
    bad = _non_finite(artifact)
    if bad is not None:
        raise ArtifactError(
            f"artifact field {bad} is not a finite number, which JSON cannot hold; nothing was written. "
            "Fix: check the run's configuration and data (`diagsink data verify`) and train again."
        )
    art = dict(artifact)
    art["checksum"] = checksum(art)
    validate_artifact(art)
    return json.dumps(art, indent=1, sort_keys=True, allow_nan=False) + "\n"


def write_artifact(path: str | Path, artifact: dict[str, Any]) -> Path:
    """Add the checksum, validate, and write ``artifact`` atomically as JSON (:func:`artifact_json`)."""
    return atomic_write_text(path, artifact_json(artifact))


def load_artifact(path: str | Path) -> dict[str, Any]:
    """Read and validate one artifact (raises :class:`ArtifactError` when invalid)."""
    path = Path(path)
    try:
        art = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"cannot read artifact {path}: {exc}") from exc
    try:
        return validate_artifact(art)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from exc


def load_results(folder: str | Path) -> list[dict[str, Any]]:
    """Every valid artifact ``*.json`` in ``folder`` (sorted by variant, seed)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(
            f"no results folder {folder}; run `diagsink reproduce --protocol <name>` to create it."
        )
    arts = [load_artifact(p) for p in sorted(folder.glob("*.json"))]
    if not arts:
        raise ArtifactError(f"{folder} holds no artifacts; run `diagsink reproduce` first.")
    return sorted(arts, key=lambda a: (VARIANTS.index(a["variant"]), a["seed"]))
