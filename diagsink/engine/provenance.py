"""Provenance of a run: the code version, the device, the process's memory setting.

Every artifact of :mod:`diagsink.engine.artifacts` records these (``provenance``); explained in
the chapter "The T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

__all__ = [
    "COPIED_TREE_SUFFIX",
    "git_commit",
    "device_name",
    "machine",
    "release_freed_memory_to_os",
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


def release_freed_memory_to_os() -> bool:
    """Ask glibc to hand freed blocks of 128 KiB and more back to the OS at once (Linux only).

    glibc raises its mmap threshold dynamically (up to 32 MiB), after which the many
    activation-sized blocks of a training step are served from the heap and kept after being
    freed, so the resident memory of a CPU run grows far beyond what is alive at any moment
    (``benchmarks/training.py`` measures the peak of the paper model with and without it).
    Fixing the threshold (``mallopt(M_MMAP_THRESHOLD)``, the same as
    ``MALLOC_MMAP_THRESHOLD_=131072``) stops that. Every large block is then a fresh mapping
    whose pages fault in one by one, 4 KiB at a time, which makes a CPU training step markedly
    slower; so it also turns on PyTorch's transparent huge pages for CPU tensors of 2 MiB and more
    (``THP_MEM_ALLOC_ENABLE=1``, faults per 2 MiB instead of 4 KiB). PyTorch reads that
    variable once, at the process's first such allocation: call this before creating large
    tensors (:func:`diagsink.engine.train.train_run` calls it before preparing the data, for
    every CPU run). Returns whether the threshold could be set.
    """
    if not sys.platform.startswith("linux"):
        return False
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 128 * 1024) == 1
        return bool(ok and libc.mallopt(m_trim_threshold, 128 * 1024) == 1)
    except (OSError, AttributeError):
        return False
