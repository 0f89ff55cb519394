"""Sweeps beyond the paper: the diagonal sink against input length, penalty strength, dropout p, block order.

    diagsink sweep length  --protocol quick [--seeds N] [--epochs E] [--values 12,24,48,96] [--out DIR]
    diagsink sweep penalty --protocol quick [--values -0.01,-0.1,-1]
    diagsink sweep dropout --protocol quick [--values 0.05,0.2,0.5]
    diagsink sweep order   --protocol quick [--values ts,st] [--variants none,dropout]

Each *point* of a sweep is one training run (:func:`diagsink.engine.train.train_run`) of the
protocol with one setting changed:

* ``length``: ``model.t_in`` (the input length ``T``) for several variants; the forecast
  horizon stays ``model.t_out``. A length that leaves no training, validation or test window
  on the loaded series is skipped with a message (the short METR-LA slice limits this).
* ``penalty``: ``regularizers.diag_penalty`` of the ``penalty`` variant.
* ``dropout``: ``regularizers.diag_p`` of the ``dropout`` variant.
* ``order``: ``model.block_order`` (``ts``: temporal attention then graph conv in every
  block, the paper's T&S; ``st``: graph conv then temporal attention) for several variants.

A point writes ``DIR/sweeps/<protocol>/<sweep>/<variant>_<key><value>_seed<k>.json``: a
normal result artifact (:mod:`diagsink.engine.artifacts`: metrics, the last block's attention,
provenance with the changed config, checksum) plus a ``sweep`` field naming the sweep, the
changed key and its value. Files are written atomically; a point whose valid artifact with
the same configuration exists is skipped, so an interrupted sweep finishes by rerunning it.
No state dicts are written for sweep points (the JSON holds everything the book plots).

Sizes follow :func:`diagsink.runtime.pick`: quick mode sweeps fewer values and variants.
The chapter "Heatmaps on METR-LA" (``book/heatmaps.ipynb``) loads and plots the artifacts.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .._checks import is_int, is_real
from .._io import remove_stale_temporaries
from ..data import load_metr_la
from ..data.windows import split_windows
from ..errors import ConfigError, DataError
from ..model import BLOCK_ORDERS
from ..runtime import pick, resolve_device
from ..stats import attention_entropy, diagonal_mass
from ..variants import VARIANTS
from .artifacts import load_artifact, write_artifact
from .config import load_config, override
from .runs import existing_run, run_name, run_paths
from .train import prepare, train_run

__all__ = [
    "SWEEPS",
    "MULTI_VARIANT",
    "MAX_LENGTH",
    "SweepPoint",
    "default_values",
    "sweep_points",
    "point_path",
    "run_sweep",
    "compact",
    "load_sweep",
    "sweep_rows",
]

#: The longest input a length sweep accepts, one day of 5-minute steps (memory grows with T^2).
MAX_LENGTH = 288

#: sweep name -> (config key that changes, its short name in file names)
SWEEPS: dict[str, tuple[str, str]] = {
    "length": ("model.t_in", "T"),
    "penalty": ("regularizers.diag_penalty", "pen"),
    "dropout": ("regularizers.diag_p", "p"),
    "order": ("model.block_order", "order"),
}

#: sweeps that train several variants (``--variants``); the others change one variant's constant.
MULTI_VARIANT: tuple[str, ...] = ("length", "order")


class SweepPoint(NamedTuple):
    """One run of a sweep: ``variant`` trained with config ``key`` set to ``value``."""

    sweep: str
    variant: str
    key: str
    value: float | int | str


def _check_sweep(name: str) -> None:
    if name not in SWEEPS:
        raise ConfigError(f"unknown sweep {name!r}; choose one of {', '.join(SWEEPS)}.")


def default_values(name: str) -> tuple[list[float | int | str], tuple[str, ...]]:
    """The values and variants a sweep runs by default (smaller in quick mode, via ``ds.pick``)."""

    _check_sweep(name)
    if name == "length":
        return [12, 24, 48, 96], pick(("none", "dropout"), tuple(VARIANTS))
    if name == "order":
        return list(BLOCK_ORDERS), pick(("none", "dropout"), tuple(VARIANTS))
    if name == "penalty":
        return pick([-0.01, -0.1, -0.3, -1.0], [-0.01, -0.03, -0.1, -0.3, -0.5, -1.0]), ("penalty",)
    return pick([0.05, 0.2, 0.35, 0.5], [0.05, 0.1, 0.2, 0.3, 0.4, 0.5]), ("dropout",)


def _check_values(name: str, values: list[Any]) -> list[float | int | str]:
    if not values:
        raise ConfigError(f"sweep {name!r} needs at least one value.")
    out: list[float | int | str] = []
    if name == "order":
        for v in values:
            if v not in BLOCK_ORDERS or not isinstance(v, str):
                raise ConfigError(
                    f"sweep 'order': {v!r} is not a block order; allowed: {', '.join(BLOCK_ORDERS)} "
                    "(ts = temporal attention then graph conv, the paper's; st = graph conv first), e.g. --values ts,st."
                )
            out.append(v)
        if len(set(out)) != len(out):
            raise ConfigError(
                f"sweep 'order': the values {values} repeat one; list each value once."
            )
        return out
    for v in values:
        if not is_real(v) or not math.isfinite(v):
            raise ConfigError(f"sweep {name!r}: value {v!r} is not a finite number.")
        if name == "length":
            if int(v) != v or not 2 <= v <= MAX_LENGTH:
                raise ConfigError(
                    f"sweep 'length': input length {v!r} must be a whole number of steps in [2, {MAX_LENGTH}] (one day), "
                    "e.g. 12,24,48,96; the attention's memory grows with T^2 (book/scaling.ipynb)."
                )
            out.append(int(v))
        elif name == "penalty":
            if not -10 <= v < 0:
                raise ConfigError(
                    f"sweep 'penalty': {v!r} must be a negative logit offset in [-10, 0), e.g. -0.01,-0.1,-1."
                )
            out.append(float(v))
        else:
            if not 0 < v < 1:
                raise ConfigError(
                    f"sweep 'dropout': p = {v!r} must be a probability in (0, 1), e.g. 0.05,0.2,0.5."
                )
            out.append(float(v))
    if len(set(out)) != len(out):
        raise ConfigError(f"sweep {name!r}: the values {values} repeat one; list each value once.")
    return out


def sweep_points(
    name: str, values: list[Any] | None = None, variants: tuple[str, ...] | None = None
) -> list[SweepPoint]:
    """The points of sweep ``name`` (defaults from :func:`default_values`), checked.

    Raises:
        ConfigError: unknown sweep, a bad value (not finite, a non-integer length, a
            positive penalty, p outside (0, 1), a block order other than ``ts``/``st``),
            an unknown variant, or a variant the sweep does not apply to (a penalty sweep
            of the dropout variant).
    """
    _check_sweep(name)
    dv, dvar = default_values(name)
    vals = _check_values(name, list(dv if values is None else values))
    vars_ = tuple(dvar if variants is None else variants)
    for v in vars_:
        if v not in VARIANTS:
            raise ConfigError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}.")
    if name not in MULTI_VARIANT and vars_ != (name,):
        raise ConfigError(
            f"sweep {name!r} changes a constant of the {name!r} variant only; drop --variants."
        )
    key = SWEEPS[name][0]
    return [SweepPoint(name, var, key, val) for var in vars_ for val in vals]


def _fmt(value: float | int | str) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def point_path(out_dir: str | Path, protocol: str, point: SweepPoint, seed: int) -> Path:
    """``out_dir/sweeps/<protocol>/<sweep>/<variant>_<short><value>_seed<k>.json`` (inside ``out_dir``)."""

    run_paths(out_dir, protocol, point.variant, seed)  # refuses protocol names that leave out_dir
    name = f"{point.variant}_{SWEEPS[point.sweep][1]}{_fmt(point.value)}_seed{run_name(point.variant, seed).rsplit('seed', 1)[1]}"
    base = Path(out_dir).resolve()
    path = (base / "sweeps" / protocol / point.sweep / f"{name}.json").resolve()
    if not path.is_relative_to(base):
        raise ConfigError(f"{path} is outside the output folder {base}.")
    return path


def _windows(n_steps: int, cfg: dict[str, Any]) -> dict[str, int] | str:
    """Window counts of the split, or the reason there is no usable split."""

    m = cfg["model"]
    try:
        s = split_windows(
            n_steps,
            m["t_in"],
            m["t_out"],
            ratios=tuple(cfg["data"]["ratios"]),
            order=cfg["data"]["split_order"],
        )
    except DataError as exc:
        return str(exc)
    counts = {"train": len(s.train), "val": len(s.val), "test": len(s.test)}
    empty = [k for k, c in counts.items() if c < 1]
    return f"no {empty[0]} windows" if empty else counts


def run_sweep(
    name: str,
    cfg: dict[str, Any] | str = "quick",
    *,
    seeds: int = 1,
    values: list[Any] | None = None,
    variants: tuple[str, ...] | None = None,
    epochs: int | None = None,
    out_dir: str | Path = "book/results",
    data: Any = None,
    device: str | None = None,
    progress: bool = False,
    log=print,
) -> dict[str, list]:
    """Run (or finish) sweep ``name``; return ``{"done": [paths], "skipped": [(point, reason)]}``.

    ``epochs`` overrides ``train.epochs`` (and caps ``warmup_epochs`` below it) for every point.
    Finished points (a valid artifact with the same configuration) are not rerun.

    Raises:
        ConfigError: bad sweep name, values, variants, seeds or epochs (before any training).
    """

    points = sweep_points(name, values, variants)
    base = _sweep_config(cfg, seeds, epochs)
    device_t = resolve_device(device)
    done: list[Path] = []
    skipped: list[tuple[SweepPoint, str]] = []
    prepared: dict[int, Any] = {}  # one prepared data set per input length
    for seed in range(seeds):
        for point in points:
            pcfg = override(base, {point.key: point.value})
            path = point_path(out_dir, pcfg["protocol"], point, seed)
            if _finished_point(path, pcfg, log):
                done.append(path)
                continue
            if data is None:
                data = load_metr_la()
            counts = _windows(int(data.n_steps), pcfg)
            if isinstance(counts, str):
                reason = f"T_in = {pcfg['model']['t_in']} on {data.n_steps} steps: {counts}"
                log(f"skip {path.name}: {reason}")
                skipped.append((point, reason))
                continue
            t_in = pcfg["model"]["t_in"]
            if t_in not in prepared:
                prepared[t_in] = prepare(data, pcfg, device_t)
            _run_point(path, pcfg, point, seed, counts, prepared[t_in], progress, log)
            done.append(path)
    return {"done": done, "skipped": skipped}


def _sweep_config(cfg: dict[str, Any] | str, seeds: int, epochs: int | None) -> dict[str, Any]:
    """The sweep's base configuration (``epochs`` applied), after checking ``seeds`` and ``epochs``."""
    if not is_int(seeds) or not 1 <= seeds <= 100:
        raise ConfigError(f"seeds = {seeds!r} must be a whole number in [1, 100].")
    if epochs is not None and (not is_int(epochs) or epochs < 1):
        raise ConfigError(f"epochs = {epochs!r} must be a whole number >= 1.")
    base = load_config(cfg) if isinstance(cfg, (str, Path)) else copy.deepcopy(cfg)
    if epochs is None:
        return base
    return override(
        base,
        {
            "train.epochs": epochs,
            "train.warmup_epochs": min(base["train"]["warmup_epochs"], epochs - 1),
        },
    )


def _finished_point(path: Path, cfg: dict[str, Any], log) -> bool:
    """True when ``path`` holds a valid artifact of ``cfg`` (the point is skipped); else say why it reruns."""
    status, detail = existing_run(path, cfg)
    if status == "finished":
        log(f"skip {path.name} (finished)")
        remove_stale_temporaries(path)
        return True
    if status != "absent":
        why = "made with another configuration" if status == "other" else detail
        log(f"redo {path.name}: {why}")
    return False


def _run_point(
    path: Path,
    cfg: dict[str, Any],
    point: SweepPoint,
    seed: int,
    counts: dict[str, int],
    prepared: Any,
    progress: bool,
    log,
) -> None:
    """Train one sweep point on ``prepared`` and write its artifact (with its ``sweep`` field) to ``path``."""
    t0 = time.perf_counter()
    art = train_run(
        copy.deepcopy(cfg),
        point.variant,
        seed,
        prepared=prepared,
        device=str(prepared.series.device),
        progress=progress,
        write=False,
    )
    art["state_dict"] = {
        **art["state_dict"],
        "file": None,
        "note": "not written for sweep points",
    }
    art["sweep"] = {"name": point.sweep, "key": point.key, "value": point.value, "windows": counts}
    write_artifact(path, compact(art))
    remove_stale_temporaries(path)  # left by an earlier process killed mid-write
    log(
        f"wrote {path.name}: MAE@mean {art['metrics']['MAE@mean']:.3f} ({time.perf_counter() - t0:.1f} s)"
    )


def compact(art: dict[str, Any], digits: int = 6) -> dict[str, Any]:
    """``art`` with its attention maps rounded to ``digits`` decimals (rows still sum to 1 within 1e-4).

    Keeps the JSON of long inputs small: a ``T = 96`` point holds ``(1 + H) * 96 * 96`` weights.
    """
    att = dict(art["attention"])
    for key in ("mean", "per_head"):
        att[key] = _round(att[key], digits)
    return {**art, "attention": att}


def _round(x: Any, digits: int) -> Any:
    return [_round(v, digits) for v in x] if isinstance(x, list) else round(float(x), digits)


def load_sweep(out_dir: str | Path, protocol: str, name: str) -> list[dict[str, Any]]:
    """Every valid artifact of sweep ``name`` (sorted by variant, value, seed); ``[]`` if none exist."""

    _check_sweep(name)
    folder = Path(out_dir) / "sweeps" / protocol / name
    arts = [load_artifact(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted(arts, key=lambda a: (a["variant"], a["sweep"]["value"], a["seed"]))


def sweep_rows(arts: list[dict[str, Any]], metric: str = "MAE@mean") -> list[dict[str, Any]]:
    """One row per (variant, value): mean over seeds of ``metric``, diagonal mass, ``1/T``, entropy.

    Diagonal mass and entropy come from each artifact's ``attention.mean`` ``[T, T]``
    (:func:`diagsink.stats.diagonal_mass`, :func:`diagsink.stats.attention_entropy`).
    """

    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for a in arts:
        groups.setdefault((a["variant"], a["sweep"]["value"]), []).append(a)
    rows = []
    for (variant, value), group in sorted(groups.items()):
        mats = [torch.tensor(a["attention"]["mean"], dtype=torch.float64) for a in group]
        dm = [diagonal_mass(m) for m in mats]
        rows.append(
            {
                "variant": variant,
                "value": value,
                "seeds": len(group),
                metric: sum(float(a["metrics"][metric]) for a in group) / len(group),
                "diag_mass": sum(d.mass for d in dm) / len(dm),
                "uniform": dm[0].uniform,
                "entropy": sum(float(attention_entropy(m).mean()) for m in mats) / len(mats),
                "train_windows": group[0]["sweep"]["windows"]["train"],
            }
        )
    return rows
