"""The one place where run-time switches are read (quick mode, data folder, device).

Chapters, tests and the command line all ask :func:`settings` and never read the
environment themselves, so one switch changes the whole book consistently.

``DIAGSINK_QUICK=1`` selects *quick mode*: the same code paths with smaller sizes
(fewer sequence lengths, fewer epochs, fewer seeds), so every chapter runs in a
minute or two on a laptop CPU. Anything else (or unset) selects *full mode*.
Explained in the introduction (``book/intro.md``, "Three ways to use this book").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

__all__ = [
    "Settings",
    "settings",
    "pick",
    "glue",
    "default_device",
    "check_device",
    "resolve_device",
]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class Settings:
    """Run-time switches, read from the environment by :func:`settings`.

    Attributes:
        quick: ``True`` when ``DIAGSINK_QUICK`` is set to 1/true/yes/on.
        data_root: folder holding METR-LA (``DIAGSINK_DATA``, else a per-user cache).
        device: ``DIAGSINK_DEVICE`` if set, else ``"cuda"`` when available, else ``"cpu"``.
    """

    quick: bool
    data_root: Path
    device: str

    @property
    def mode(self) -> str:
        """``"quick"`` or ``"full"``: the word chapters print next to their numbers."""
        return "quick" if self.quick else "full"


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "diagsink"


def default_device() -> str:
    """``"cuda"`` if PyTorch sees a GPU, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(name: str, source: str = "--device") -> str:
    """Return ``name`` if PyTorch can run on it here (``cpu``, ``cuda``, ``cuda:<k>``, ``mps``).

    Raises:
        ValueError: an unknown device name or a GPU this machine does not have; the message
            says which devices work (``source`` names where the value came from).
    """
    value = str(name).strip().lower()
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", value):
        raise ValueError(
            f"{source}={name!r} is not a device; use cpu or cuda (cuda:<k> for the k-th GPU)."
        )
    if value.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        k = int(value.partition(":")[2] or 0)
        if k >= count:
            raise ValueError(
                f"{source}={name!r}: this PyTorch sees {count} CUDA GPU(s). Fix: use cpu, or install a CUDA build "
                "of PyTorch on a machine with a GPU (see the README, section GPU)."
            )
    if value == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(
                f"{source}={name!r}: MPS (Apple GPU) is not available here. Fix: use cpu."
            )
    return value


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` checked by :func:`check_device`, or the one :func:`settings` chooses if ``None``."""
    return torch.device(check_device(str(device)) if device else settings().device)


def _parse_quick(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"DIAGSINK_QUICK={raw!r} is not understood: set it to 1 for quick mode "
        "or 0 (or leave it unset) for full mode."
    )


def settings() -> Settings:
    """Read the switches from the environment (cheap; call it whenever you need them).

    Raises:
        ValueError: if ``DIAGSINK_QUICK`` holds something other than 0/1/true/false, or
            ``DIAGSINK_DEVICE`` names a device that is unknown or absent (:func:`check_device`).
    """
    quick = _parse_quick(os.environ.get("DIAGSINK_QUICK", ""))
    data_env = os.environ.get("DIAGSINK_DATA", "").strip()
    data_root = Path(data_env).expanduser() if data_env else _user_cache_dir() / "metr-la"
    device_env = os.environ.get("DIAGSINK_DEVICE", "").strip()
    device = check_device(device_env, "DIAGSINK_DEVICE") if device_env else default_device()
    return Settings(quick=quick, data_root=data_root, device=device)


def glue(name: str, value: object, display: bool = False) -> object:
    """Hand a number the page computed to the page's text (myst-nb's ``glue``); return it.

    A chapter's "What this page shows" box quotes values with myst-nb's ``glue:text`` role; the
    cell that computes one calls ``glue("name", value)``. NumPy and torch scalars become Python
    numbers (a format spec cannot read ``np.float64(...)``). Without myst-nb (the package
    installed without its ``book`` extra, as in a student's environment) the value is only
    returned, so exported notebooks run there too.
    """
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    try:
        # reason: myst-nb is optional (the book extra) and slow to import; only pages need it
        from myst_nb import glue as myst_glue
    except ImportError:
        return value
    myst_glue(name, value, display=display)
    return value


def pick(quick: T, full: T) -> T:
    """Return ``quick`` in quick mode and ``full`` otherwise.

    This is how sizes are chosen everywhere, e.g. ``lengths = pick([4, 16, 64], [4, ..., 1024])``:
    only the numbers differ between the modes, never the code that uses them.
    """
    return quick if settings().quick else full
