"""Provenance: the code version, the device and the machine of a run or of a page.

Every artifact of :mod:`diagsink.engine.artifacts` records these (``provenance``); explained in
the chapter "The T&S model and its training loop" (``book/model.ipynb``). Every chapter closes
with a collapsed cell that prints :func:`page_note`: which data, code, device and committed runs
produced its numbers (all of them in the appendix "Reproducing this book").
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..runtime import resolve_device, settings

__all__ = [
    "COPIED_TREE_SUFFIX",
    "git_commit",
    "device_name",
    "machine",
    "page_note",
]

#: Appended to a commit that was not read from ``.git`` but given in ``DIAGSINK_GIT_COMMIT``.
COPIED_TREE_SUFFIX = " (DIAGSINK_GIT_COMMIT, no .git)"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The repository's commit (``+dirty`` if tracked files changed), or ``"unknown"``.

    Read once per process (at the start of its first run) and cached: the code that runs is
    the code imported then, even if the repository moves on while a long ``reproduce`` runs.
    A copy of the tree without ``.git`` (e.g. on a remote GPU machine) has no commit to read;
    there the value of ``DIAGSINK_GIT_COMMIT``, recorded by whoever copied the tree, is used and
    marked as such (``"<sha> (DIAGSINK_GIT_COMMIT, no .git)"``).
    """
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        if sha.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=here,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    given = os.environ.get("DIAGSINK_GIT_COMMIT", "").strip()
    return given + COPIED_TREE_SUFFIX if given else "unknown"


def device_name(device: torch.device) -> str:
    """``"cuda: NVIDIA H200"`` or ``"cpu: <processor>, <k> threads"``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    proc = platform.processor() or platform.machine()
    return f"cpu: {proc}, {torch.get_num_threads()} threads"


def machine() -> str:
    """The CPU's model name (``/proc/cpuinfo``) and core count, else what ``platform`` knows."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            models = [ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")]
        if models:
            name = models[0]
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical cores, {platform.system()} {platform.machine()}"


def page_note(data: str, runs: Iterable[Mapping[str, Any]] = ()) -> str:
    """Which data, code, device and committed runs produced a page's numbers (several lines).

    Args:
        data: what the page computes on, in words: a data file's ``describe()``, or e.g.
            ``"no data: random layers and inputs, seeds in the cells"``.
        runs: the committed result artifacts the page reads (any number): each protocol is
            listed with its runs, seeds, devices and commits.

    The first lines say where the page was executed: date (UTC), package version and commit,
    torch, the device of :func:`diagsink.runtime.settings`, the machine, quick or full mode.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    device = resolve_device(settings().device)
    lines = [
        f"Data: {data}",
        f"Executed: {stamp} UTC, {settings().mode} mode; diagsink {__version__} at commit "
        f"{_short(git_commit())}, torch {torch.__version__}",
        f"Device: {device_name(device)} ({machine()})",
    ]
    protocols: dict[str, list[Mapping[str, Any]]] = {}
    for art in runs:
        protocols.setdefault(str(art["protocol"]), []).append(art)
    for name, arts in sorted(protocols.items()):
        seeds = sorted({int(a["seed"]) for a in arts})
        devices = sorted({str(a["provenance"]["device"]) for a in arts})
        commits = sorted({_short(str(a["provenance"]["git_commit"])) for a in arts})
        lines.append(
            f"Committed runs read: {name}, {len(arts)} run(s), seed(s) {seeds}; trained on "
            f"{'; '.join(devices)} at commit(s) {', '.join(commits)}"
        )
    if protocols:
        lines.append("Each run's full provenance: the appendix 'Reproducing this book'.")
    return "\n".join(lines)


def _short(commit: str) -> str:
    """A commit as its first 7 hex digits, keeping a ``+dirty`` mark (``"unknown"`` unchanged)."""
    sha, _, rest = commit.partition("+")
    if len(sha) < 7 or any(c not in "0123456789abcdef" for c in sha):
        return commit
    return sha[:7] + ("+" + rest if rest else "")
