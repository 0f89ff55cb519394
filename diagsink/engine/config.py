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
ones; so does every number outside its range (:data:`RANGES`: finite, positive where zero or a
negative value makes no sense, probabilities in [0, 1), a bounded diagonal penalty), a key given
twice in one mapping of the file, and a file that calls itself by a shipped protocol's name but
holds other contents (rename it ``custom-...``). A file may start from a shipped protocol with
``extends: <name>`` and list only what it changes (:func:`load_config`). A few keys are
*optional* (:data:`OPTIONAL`): a protocol may leave them out, which means their default, and
:func:`config_hash` ignores them when they hold the default, so a config that spells out a
default hashes like one that leaves it out (committed artifacts made before such a key existed
stay current). Explained in the chapter "The T&S model and its training loop"
(``book/model.ipynb``).
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
from ..model import check_block_order, check_graph_layer
from ..positional import POSITIONAL_OPTIONS

__all__ = [
    "PROTOCOLS",
    "SCHEMA",
    "OPTIONAL",
    "MISSING_INPUTS",
    "RANGES",
    "PENALTY_BOUND",
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
        "clip": (*_NUM, type(None)),
        "patience": int,
        "min_delta": _NUM,
        "max_train_windows": (int, type(None)),
        "time_limit_s": (*_NUM, type(None)),
        "epoch_parts": int,
        "compile": bool,
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
#: is one of :data:`diagsink.model.GRAPH_LAYERS`. ``train.epoch_parts = k`` makes an epoch one k-th of a pass
#: over the training windows: each pass draws one permutation and its k epochs take its k
#: consecutive parts, so every window is used once per k epochs. ``train.compile: true`` trains
#: under ``torch.compile`` (the same function, opt-in). ``data.speed_file`` names the
#: speed file in the data folder (``null``: the first of ``diagsink.data.SPEED_FILES``). ``data.missing_inputs``
#: says how a missing input reading (speed 0) enters the model: ``"as_reading"`` scales the 0
#: like any speed (about -mu/sigma), ``"mean"`` replaces it by the training mean (0 after
#: scaling); see :data:`MISSING_INPUTS` and the METR-LA chapter.
OPTIONAL: dict[str, Any] = {
    "model": {"block_order": "ts", "graph_layer": "diffusion"},
    "train": {"epoch_parts": 1, "compile": False},
    "data": {"missing_inputs": "as_reading", "speed_file": None},
}

#: The choices of ``data.missing_inputs``.
MISSING_INPUTS: tuple[str, ...] = ("as_reading", "mean")


#: ``|regularizers.diag_penalty|`` at most this: ``exp(-100)`` (about 4e-44) is below float32's
#: smallest number, so a larger penalty changes nothing a float32 softmax can represent and only
#: risks overflow in the logits (``tests/test_reliability.py`` runs the layer at both ends).
PENALTY_BOUND = 100.0


#: The allowed range of every numeric key, as dotted key -> (low, high, low allowed, high
#: allowed, the fix). Every number must also be finite; a key whose type allows ``null`` (see
#: :data:`SCHEMA`) may be null instead. ``regularizers.diag_penalty`` is bounded by
#: :data:`PENALTY_BOUND`. :func:`validate_config` checks them before anything runs.
RANGES: dict[str, tuple[float, float, bool, bool, str]] = {
    "model.d_model": (1, math.inf, True, False, "e.g. 16 (the model width)"),
    "model.n_heads": (1, math.inf, True, False, "e.g. 2 (a divisor of model.d_model)"),
    "model.depth": (1, math.inf, True, False, "e.g. 2 (the number of blocks)"),
    "model.dropout": (0, 1, True, False, "e.g. 0.1 (a probability)"),
    "model.graph_order": (1, math.inf, True, False, "e.g. 2 (diffusion steps)"),
    "model.node_embed_dim": (1, math.inf, True, False, "e.g. 10"),
    "model.t_in": (1, math.inf, True, False, "e.g. 12 (input steps)"),
    "model.t_out": (1, math.inf, True, False, "e.g. 12 (forecast steps)"),
    "regularizers.diag_p": (0, 1, True, False, "e.g. 0.2 (a probability)"),
    "regularizers.diag_penalty": (-PENALTY_BOUND, PENALTY_BOUND, True, True, "e.g. -0.1"),
    "train.epochs": (1, math.inf, True, False, "e.g. 30"),
    "train.batch_size": (1, math.inf, True, False, "e.g. 16"),
    "train.eval_batch_size": (1, math.inf, True, False, "e.g. 128"),
    "train.lr": (0, 1, False, True, "e.g. 5e-3"),
    "train.min_lr": (0, 1, False, True, "e.g. 1e-5 (at most train.lr)"),
    "train.warmup_epochs": (0, math.inf, True, False, "e.g. 1 (fewer than train.epochs)"),
    "train.weight_decay": (0, 1, True, False, "e.g. 0.01 (AdamW's decoupled weight decay)"),
    "train.clip": (0, math.inf, False, False, "e.g. 5.0, or null for no clipping"),
    "train.patience": (1, math.inf, True, False, "e.g. 5 (epochs without improvement)"),
    "train.min_delta": (0, math.inf, True, False, "e.g. 1e-4 (mph of validation MAE)"),
    "train.max_train_windows": (1, math.inf, True, False, "e.g. 256, or null for all windows"),
    "train.time_limit_s": (0, math.inf, False, False, "e.g. 3600 (seconds), or null for no limit"),
    "train.epoch_parts": (1, math.inf, True, False, "e.g. 1 (a whole pass per epoch) or 2"),
    "seeds": (1, math.inf, True, False, "e.g. 4"),
}


def _interval(low: float, high: float, low_in: bool, high_in: bool) -> str:
    return f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def _check_ranges(cfg: dict[str, Any]) -> None:
    """Every number finite and inside :data:`RANGES` (one line naming key, value, range and fix)."""
    for dotted, (low, high, low_in, high_in, fix) in RANGES.items():
        node: Any = cfg
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        if (
            leaf not in node or node[leaf] is None
        ):  # an optional key left out, or null where allowed
            continue
        value = node[leaf]
        inside = math.isfinite(value) and (
            (low < value or (low_in and value == low))
            and (value < high or (high_in and value == high))
        )
        if not inside:
            kinds = SCHEMA[parents[0]][leaf] if parents else SCHEMA[leaf]
            nullable = isinstance(kinds, tuple) and type(None) in kinds
            allowed = _interval(low, high, low_in, high_in) + (" or null" if nullable else "")
            what = "finite and in " if not math.isfinite(value) else "in "
            raise ConfigError(
                f"config key {dotted} = {value!r} is out of range: it must be {what}{allowed}. "
                f"Fix: set {dotted} to {fix}."
            )


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


def _check_names(cfg: dict[str, Any]) -> None:
    """The keys that hold names: choices, the speed file, the protocol (the results folder)."""
    missing = cfg["data"].get("missing_inputs", "as_reading")
    if missing not in MISSING_INPUTS:
        raise ConfigError(
            f"data.missing_inputs = {missing!r} is not known; choose one of {', '.join(MISSING_INPUTS)}."
        )
    m, d = cfg["model"], cfg["data"]
    check_graph_layer(m.get("graph_layer", "diffusion"))
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
    _check_names(cfg)
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    _check_ranges(cfg)
    if m["d_model"] % m["n_heads"]:
        raise ConfigError(
            f"model.d_model = {m['d_model']} must be divisible by model.n_heads = {m['n_heads']}."
        )
    if m["pos_encoding"] not in POSITIONAL_OPTIONS:
        raise ConfigError(
            f"model.pos_encoding = {m['pos_encoding']!r}; allowed: {POSITIONAL_OPTIONS}."
        )
    if t["min_lr"] > t["lr"]:
        raise ConfigError(
            f"config key train.min_lr = {t['min_lr']} is above train.lr = {t['lr']}: the cosine would "
            "rise. Fix: set train.min_lr <= train.lr."
        )
    if t["warmup_epochs"] >= t["epochs"]:
        raise ConfigError(
            f"config key train.warmup_epochs = {t['warmup_epochs']} must be in [0, train.epochs = "
            f"{t['epochs']}). Fix: fewer warm-up epochs or more epochs."
        )
    if d["split_order"] not in ("dcrnn", "split-first"):
        raise ConfigError(f"data.split_order = {d['split_order']!r}; allowed: dcrnn, split-first.")
    ratios_ok = all(is_real(x) and math.isfinite(x) and x >= 0 for x in d["ratios"])
    if len(d["ratios"]) != 3 or not ratios_ok or abs(sum(d["ratios"]) - 1) > 1e-9:
        raise ConfigError(
            f"data.ratios = {d['ratios']} must be three fractions (train, val, test) summing to 1."
        )
    return cfg


class _DuplicateKey(yaml.YAMLError):
    """A mapping in a protocol file names one key twice (raised by :class:`_UniqueKeyLoader`)."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"key {key!r} is given twice (lines {first} and {second})")
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (plain YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
            except TypeError:  # an unhashable key: the base loader reports it
                continue
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _parse(text: str, protocol: str | Path) -> Any:
    """The YAML ``text`` of ``protocol``; bad YAML and repeated keys raise :class:`ConfigError`."""
    loader = _UniqueKeyLoader(text)  # what yaml.load does, with the safe loader named here
    try:
        return loader.get_single_data()
    except _DuplicateKey as exc:
        raise ConfigError(
            f"config {protocol}: {exc}; YAML would silently keep the last one. Fix: remove one of them."
        ) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(
            f"config {protocol} is not valid YAML ({problem}{where}). Fix the file (compare with "
            "diagsink/configs/quick.yaml) or pass one of " + ", ".join(PROTOCOLS) + "."
        ) from exc
    finally:
        loader.dispose()


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    """The first dotted key where the configs ``a`` and ``b`` differ (defaults of OPTIONAL dropped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    return f"{where} = {a!r} (shipped: {b!r})"


def _shipped(name: str) -> dict[str, Any]:
    text = (
        resources.files("diagsink").joinpath("configs", f"{name}.yaml").read_text(encoding="utf-8")
    )
    return validate_config(_extend(_parse(text, name), name))


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` written over it, section by section (a copy)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _extend(raw: Any, path: Path | str) -> Any:
    """A parsed file with ``extends: <shipped protocol>``: that protocol with the file's keys over it."""
    if not isinstance(raw, dict) or "extends" not in raw:
        return raw
    changes = {k: v for k, v in raw.items() if k != "extends"}
    base = raw["extends"]
    if base not in PROTOCOLS:
        raise ConfigError(
            f"config file {path}: extends = {base!r} is not a shipped protocol; choose one of "
            f"{', '.join(PROTOCOLS)} (a file cannot extend another file)."
        )
    return _merged(_shipped(base), changes)


def load_config(protocol: str | Path) -> dict[str, Any]:
    """Load and validate a protocol by name (``"paper"``, ``"book"``, ``"quick"``) or from a YAML path.

    A file with ``extends: <name>`` (a shipped protocol) is that protocol with the file's keys
    written over it, section by section: ``train: {epochs: 32}`` changes one key of ``train``.

    A file that names itself after a shipped protocol (:data:`PROTOCOLS`) must hold exactly that
    protocol: otherwise its results would land in the shipped protocol's results folder.
    """
    if isinstance(protocol, Path) or str(protocol).endswith((".yaml", ".yml")):
        path = Path(protocol)
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist; pass one of {', '.join(PROTOCOLS)} or a YAML path."
            )
        cfg = validate_config(_extend(_parse(path.read_text(encoding="utf-8"), path), path))
        name = cfg["protocol"]
        if name in PROTOCOLS:
            shipped = _shipped(name)
            if config_hash(cfg) != config_hash(shipped):
                diff = _first_difference(
                    _without_defaults(cfg, OPTIONAL), _without_defaults(shipped, OPTIONAL)
                )
                raise ConfigError(
                    f"config file {path} calls itself protocol {name!r}, which ships with diagsink, but "
                    f"differs from it ({diff}); its results would mix with the shipped ones. Fix: rename "
                    f"its protocol to 'custom-{name}' (any name starting with 'custom-')."
                )
        return cfg
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"protocol {protocol!r} is not known; choose one of {', '.join(PROTOCOLS)}."
        )
    return _shipped(str(protocol))


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
