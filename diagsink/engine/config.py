"""Training protocols as YAML files: load, validate, override, hash.

A *protocol* fixes everything about a run except the variant and the seed: model size,
optimiser, schedule, early stopping, data split. Three ship with the package
(``diagsink/configs/<name>.yaml``):

* ``paper``: the released configuration of the paper (12 blocks, d = 72, 8 heads, ...);
* ``book``: smaller, a fixed 12 epochs for every variant; all five variants x 4 seeds are
  estimated at 5-13 minutes on one H200 (an estimate until a GPU run exists);
* ``quick``: a tiny model for 2 CPU cores (CI, readers without a GPU).

:func:`load_config` returns a plain nested ``dict``; a misspelt key, a missing key or an
unknown protocol raises :class:`~diagsink.errors.ConfigError` naming the key and the allowed
ones. A few keys are *optional* (:data:`OPTIONAL`): a protocol may leave them out, which
means their default, and :func:`config_hash` ignores them when they hold the default, so a
config that spells out a default hashes like one that leaves it out (committed artifacts made
before such a key existed stay current). Explained in the chapter "The T&S model and its
training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .._checks import is_real
from ..errors import ConfigError
from ..model import check_block_order
from ..positional import POSITIONAL_OPTIONS

__all__ = [
    "PROTOCOLS",
    "SCHEMA",
    "OPTIONAL",
    "MISSING_INPUTS",
    "GRAPH_LAYERS",
    "load_config",
    "validate_config",
    "override",
    "config_hash",
]

PROTOCOLS: tuple[str, ...] = ("paper", "book", "quick", "slice", "full29", "full29-released")

_NUM = (int, float)
#: key -> type (or nested schema). ``None`` in a tuple means the value may be null.
SCHEMA: dict[str, Any] = {
    "protocol": str,
    "description": str,
    "model": {
        "d_model": int,
        "n_heads": int,
        "depth": int,
        "dropout": _NUM,
        "pos_encoding": (str, type(None)),
        "graph_order": int,
        "adaptive_adjacency": bool,
        "node_embed_dim": int,
        "t_in": int,
        "t_out": int,
        "block_order": str,
        "graph_layer": str,
    },
    "regularizers": {"diag_p": _NUM, "diag_penalty": _NUM},
    "train": {
        "epochs": int,
        "batch_size": int,
        "eval_batch_size": int,
        "lr": _NUM,
        "min_lr": _NUM,
        "warmup_epochs": int,
        "weight_decay": _NUM,
        "clip": _NUM,
        "patience": int,
        "min_delta": _NUM,
        "max_train_windows": (int, type(None)),
        "time_limit_s": (*_NUM, type(None)),
        "epoch_parts": int,
    },
    "data": {
        "split_order": str,
        "ratios": list,
        "missing_inputs": str,
        "speed_file": (str, type(None)),
    },
    "seeds": int,
}

#: Optional keys and their defaults (nested like :data:`SCHEMA`). A protocol may leave them out,
#: and :func:`config_hash` drops them when they hold the default. ``model.block_order`` is
#: ``"ts"`` (temporal attention then graph conv, the paper's) or ``"st"``; ``model.graph_layer``
#: is one of :data:`GRAPH_LAYERS`. ``train.epoch_parts = k`` makes an epoch one k-th of a pass
#: over the training windows: each pass draws one permutation and its k epochs take its k
#: consecutive parts, so every window is used once per k epochs. ``data.speed_file`` names the
#: speed file in the data folder (``null``: the first of ``diagsink.data.SPEED_FILES``). ``data.missing_inputs``
#: says how a missing input reading (speed 0) enters the model: ``"as_reading"`` scales the 0
#: like any speed (about -mu/sigma), ``"mean"`` replaces it by the training mean (0 after
#: scaling); see :data:`MISSING_INPUTS` and the METR-LA chapter.
OPTIONAL: dict[str, Any] = {
    "model": {"block_order": "ts", "graph_layer": "diffusion"},
    "train": {"epoch_parts": 1},
    "data": {"missing_inputs": "as_reading", "speed_file": None},
}

#: The choices of ``model.graph_layer``: ``"diffusion"`` (this book's layer: road-graph diffusion
#: plus a learned adjacency, :class:`diagsink.graphconv.DiffusionGraphConv`) or ``"released"``
#: (the paper's released layer, which reads only the diagonals of two learned supports and so
#: mixes no sensors: :class:`diagsink.released.ReleasedGCN`).
GRAPH_LAYERS: tuple[str, ...] = ("diffusion", "released")

#: The choices of ``data.missing_inputs``.
MISSING_INPUTS: tuple[str, ...] = ("as_reading", "mean")


def _check(
    cfg: Any, schema: dict[str, Any], where: str, optional: dict[str, Any] | None = None
) -> None:
    optional = optional or {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping with keys {sorted(schema)}.")
    unknown = sorted(set(cfg) - set(schema))
    if unknown:
        raise ConfigError(
            f"unknown config key {where + '.' if where else ''}{unknown[0]!s}: allowed keys here are "
            f"{', '.join(sorted(schema))} (check the spelling)."
        )
    required = set(schema) - {k for k, v in optional.items() if not isinstance(v, dict)}
    missing = sorted(required - set(cfg))
    if missing:
        raise ConfigError(
            f"config key {where + '.' if where else ''}{missing[0]} is missing; every protocol sets "
            f"{', '.join(sorted(required))}."
        )
    for key, kind in schema.items():
        name = f"{where}.{key}" if where else key
        if key not in cfg:  # an optional key left out: its default applies
            continue
        value = cfg[key]
        if isinstance(kind, dict):
            _check(value, kind, name, optional.get(key))
            continue
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(f"config key {name} = {value!r} must be {names}.")


def validate_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Check keys, types and ranges; return ``cfg`` unchanged. Raises :class:`ConfigError`."""

    if (
        isinstance(cfg, dict)
        and isinstance(cfg.get("model"), dict)
        and "block_order" in cfg["model"]
    ):
        # before the type check: its message lists the choices
        check_block_order(cfg["model"]["block_order"])
    _check(cfg, SCHEMA, "", OPTIONAL)
    missing = cfg["data"].get("missing_inputs", "as_reading")
    if missing not in MISSING_INPUTS:
        raise ConfigError(
            f"data.missing_inputs = {missing!r} is not known; choose one of {', '.join(MISSING_INPUTS)}."
        )
    m, t, r, d = cfg["model"], cfg["train"], cfg["regularizers"], cfg["data"]
    if m.get("graph_layer", "diffusion") not in GRAPH_LAYERS:
        raise ConfigError(
            f"model.graph_layer = {m['graph_layer']!r} is not known; choose one of {', '.join(GRAPH_LAYERS)}."
        )
    if t.get("epoch_parts", 1) < 1:
        raise ConfigError(
            f"train.epoch_parts = {t['epoch_parts']} must be >= 1 (1 = a whole pass per epoch)."
        )
    speed_file = d.get("speed_file")
    if speed_file is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.h5", speed_file):
        raise ConfigError(
            f"data.speed_file = {speed_file!r} must be the plain name of an .h5 file in the data folder "
            "(e.g. metr-la_29sensors_allsteps.h5), or null for the first of diagsink.data.SPEED_FILES."
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", cfg["protocol"]):
        raise ConfigError(
            f"protocol {cfg['protocol']!r} names the results folder, so it must be a plain name (letters, digits, "
            "'-', '_'; no '/' or '..'); e.g. 'custom-small'."
        )
    if cfg["protocol"] not in PROTOCOLS and not cfg["protocol"].startswith("custom"):
        raise ConfigError(
            f"protocol {cfg['protocol']!r} is not known; choose one of {', '.join(PROTOCOLS)} "
            "(or name your own file's protocol 'custom-...')."
        )
    for key in ("d_model", "n_heads", "depth", "graph_order", "node_embed_dim", "t_in", "t_out"):
        if m[key] < 1:
            raise ConfigError(f"config key model.{key} = {m[key]} must be >= 1.")
    if m["d_model"] % m["n_heads"]:
        raise ConfigError(
            f"model.d_model = {m['d_model']} must be divisible by model.n_heads = {m['n_heads']}."
        )
    if m["pos_encoding"] not in POSITIONAL_OPTIONS:
        raise ConfigError(
            f"model.pos_encoding = {m['pos_encoding']!r}; allowed: {POSITIONAL_OPTIONS}."
        )
    if not 0 <= m["dropout"] < 1 or not 0 <= r["diag_p"] < 1:
        raise ConfigError("model.dropout and regularizers.diag_p must be probabilities in [0, 1).")
    if not math.isfinite(r["diag_penalty"]):
        raise ConfigError("regularizers.diag_penalty must be finite.")
    for key in ("epochs", "batch_size", "eval_batch_size"):
        if t[key] < 1:
            raise ConfigError(f"config key train.{key} = {t[key]} must be >= 1.")
    if not 0 < t["min_lr"] <= t["lr"]:
        raise ConfigError(f"need 0 < train.min_lr <= train.lr; got {t['min_lr']} and {t['lr']}.")
    if not 0 <= t["warmup_epochs"] < t["epochs"]:
        raise ConfigError(
            f"train.warmup_epochs = {t['warmup_epochs']} must be in [0, train.epochs)."
        )
    if t["max_train_windows"] is not None and t["max_train_windows"] < 1:
        raise ConfigError("train.max_train_windows must be null (all windows) or >= 1.")
    if t["time_limit_s"] is not None and t["time_limit_s"] <= 0:
        raise ConfigError("train.time_limit_s must be null (no limit) or > 0 seconds.")
    if d["split_order"] not in ("dcrnn", "split-first"):
        raise ConfigError(f"data.split_order = {d['split_order']!r}; allowed: dcrnn, split-first.")
    ratios_ok = all(is_real(x) and x >= 0 for x in d["ratios"])
    if len(d["ratios"]) != 3 or not ratios_ok or abs(sum(d["ratios"]) - 1) > 1e-9:
        raise ConfigError(
            f"data.ratios = {d['ratios']} must be three fractions (train, val, test) summing to 1."
        )
    if cfg["seeds"] < 1:
        raise ConfigError("seeds must be >= 1.")
    return cfg


def load_config(protocol: str | Path) -> dict[str, Any]:
    """Load and validate a protocol by name (``"paper"``, ``"book"``, ``"quick"``) or from a YAML path."""
    text: str
    if isinstance(protocol, Path) or str(protocol).endswith((".yaml", ".yml")):
        path = Path(protocol)
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist; pass one of {', '.join(PROTOCOLS)} or a YAML path."
            )
        text = path.read_text(encoding="utf-8")
    else:
        if protocol not in PROTOCOLS:
            raise ConfigError(
                f"protocol {protocol!r} is not known; choose one of {', '.join(PROTOCOLS)}."
            )
        text = (
            resources.files("diagsink")
            .joinpath("configs", f"{protocol}.yaml")
            .read_text(encoding="utf-8")
        )
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(
            f"config {protocol} is not valid YAML ({problem}{where}). Fix the file (compare with "
            "diagsink/configs/quick.yaml) or pass one of " + ", ".join(PROTOCOLS) + "."
        ) from exc
    return validate_config(cfg)


def override(cfg: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A validated copy of ``cfg`` with dotted keys replaced, e.g. ``{"train.epochs": 2}``."""
    out = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node, schema = out, SCHEMA
        for p in parents:
            if p not in schema or not isinstance(schema[p], dict):
                raise ConfigError(
                    f"unknown config section {p!r} in {dotted!r}; sections: model, regularizers, train, data."
                )
            node, schema = node[p], schema[p]
        if leaf not in schema:
            raise ConfigError(
                f"unknown config key {dotted!r}; allowed here: {', '.join(sorted(schema))}."
            )
        node[leaf] = value
    return validate_config(out)


def _without_defaults(cfg: Any, optional: dict[str, Any]) -> Any:
    """``cfg`` without the optional keys that hold their default (a copy where anything is dropped)."""
    if not isinstance(cfg, dict):
        return cfg
    out = dict(cfg)
    for key, default in optional.items():
        if key not in out:
            continue
        if isinstance(default, dict):
            out[key] = _without_defaults(out[key], default)
        elif out[key] == default and type(out[key]) is type(default):
            del out[key]
    return out


def config_hash(cfg: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``cfg`` (sorted keys): equal configs, equal hashes.

    Optional keys (:data:`OPTIONAL`) that hold their default are left out first, so
    ``model.block_order: ts`` written out and left out give the same hash.
    """
    canon = _without_defaults(cfg, OPTIONAL)
    return hashlib.sha256(
        json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
