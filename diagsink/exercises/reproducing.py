"""Checks of the exercises in the appendix "Reproducing this book" (``book/reproducing.ipynb``).

* ``ex-reproducing-checksum``: ``artifact_checksum(artifact)``, the sha256 that protects a
  result artifact (:func:`diagsink.engine.artifacts.checksum`).
* ``ex-reproducing-differences``: ``differences(prov_a, prov_b)``, which of config, data, seed,
  commit and device two provenance records disagree on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import torch

from ..engine.artifacts import checksum
from . import fresh_generator, register

#: the provenance fields ``differences`` compares, and where each lives in a record
FIELDS = {
    "config": ("config_hash",),
    "data": ("data", "sha256"),
    "seed": ("seed",),
    "commit": ("git_commit",),
    "device": ("device",),
}


def _random_artifact(gen: torch.Generator) -> dict:
    n = int(torch.randint(2, 5, (1,), generator=gen))
    keys = [f"k{int(i)}" for i in torch.randperm(20, generator=gen)[:n]]
    art = {k: float(torch.rand((), generator=gen)) for k in keys}
    art["seed"] = int(torch.randint(0, 100, (1,), generator=gen))
    art["metrics"] = {"MAE@mean": float(torch.rand((), generator=gen)), "A": [1, 2]}
    art["checksum"] = "0" * 64
    art["_cache"] = "not stored"
    return art


@register("ex-reproducing-checksum")
def check_checksum(fn: Callable) -> str | None:
    """Fresh artifacts with keys in random order, a stale ``checksum`` and a private key."""
    gen = fresh_generator()
    for _ in range(3):
        art = _random_artifact(gen)
        got = fn(dict(art))
        if not isinstance(got, str):
            return f"return the hex digest as a str, not {type(got).__name__}."
        if got == checksum(art):
            continue
        body = {k: v for k, v in art.items() if k != "checksum" and not k.startswith("_")}
        with_checksum = {k: v for k, v in art.items() if not k.startswith("_")}
        if (
            got
            == hashlib.sha256(
                json.dumps(with_checksum, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
        ):
            return (
                "leave the `checksum` field out before hashing: the checksum cannot cover itself."
            )
        if got == hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest():
            return "sort the keys (json.dumps(..., sort_keys=True)): the same record must give one hash."
        if got == hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest():
            return 'use the compact separators (",", ":"): json.dumps adds spaces by default.'
        return (
            "the digest differs: sha256 of json.dumps(body, sort_keys=True, separators=(',', ':')) "
            "where body drops `checksum` and every key that starts with '_'."
        )
    return None


def _random_provenance(gen: torch.Generator) -> dict:
    def hexa(n: int) -> str:
        return "".join(
            "0123456789abcdef"[int(i)] for i in torch.randint(0, 16, (n,), generator=gen)
        )

    return {
        "config_hash": hexa(64),
        "data": {"file": "metr-la.h5", "sha256": hexa(64), "n_steps": 34272},
        "seed": int(torch.randint(0, 4, (1,), generator=gen)),
        "git_commit": hexa(40),
        "device": "cpu: x86_64, 1 threads",
        "date_utc": "2026-12-06T00:00:00Z",
    }


@register("ex-reproducing-differences")
def check_differences(fn: Callable) -> str | None:
    """Pairs of records that differ in a random subset of the five fields (and in the date)."""
    gen = fresh_generator()
    a = _random_provenance(gen)
    if set(fn(a, json.loads(json.dumps(a))) or ()) != set():
        return "a record compared with a copy of itself must give the empty set."
    for _ in range(4):
        a = _random_provenance(gen)
        b = json.loads(json.dumps(a))
        b["date_utc"] = "2026-12-07T00:00:00Z"  # never compared: reruns happen on other days
        changed = {name for name in FIELDS if bool(torch.rand((), generator=gen) < 0.5)}
        for name in changed:
            *head, last = FIELDS[name]
            target = b
            for key in head:
                target = target[key]
            target[last] = (target[last] + 1) if name == "seed" else target[last] + "x"
        got = fn(a, b)
        if not isinstance(got, (set, frozenset)):
            return f"return a set of field names, not {type(got).__name__}."
        if "date_utc" in got or "date" in got:
            return "the date is not part of the comparison: a rerun on another day is the same run."
        if got != changed:
            missing, extra = sorted(changed - got), sorted(got - changed)
            return (
                f"wrong fields (missing {missing}, not expected {extra}): compare config_hash, "
                "data['sha256'], seed, git_commit and device, and name them config, data, seed, commit, device."
            )
    return None


__all__ = ["FIELDS", "check_checksum", "check_differences"]
