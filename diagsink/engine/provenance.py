"""Provenance of a run: the code version, the device and the machine.

Every artifact of :mod:`diagsink.engine.artifacts` records these (``provenance``); explained in
the chapter "The T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

import torch

__all__ = [
    "COPIED_TREE_SUFFIX",
    "git_commit",
    "device_name",
    "machine",
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
