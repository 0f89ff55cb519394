"""Small file helpers shared by the package: atomic writes and checksums.

Every file the package writes (downloads, checkpoints, result artifacts, exported
notebooks) goes through :func:`atomic_write_bytes` or :func:`atomic_write_text`, so a
run killed half-way never leaves a half-written file under the final name.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import tempfile
from pathlib import Path

from .errors import ConfigError

__all__ = ["atomic_write_bytes", "atomic_write_text", "sha256_file", "ensure_writable_dir"]


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable (POSIX: the folder entry is flushed too); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's file-mode creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary_affixes(path: Path) -> tuple[str, str]:
    """Prefix and suffix of the temporaries written next to ``path``: ``.<name>.<random>.tmp``."""
    return f".{path.name}.", ".tmp"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    Raises:
        OSError: (``PermissionError`` included) with the folder named, if it cannot be written.
    """
    path = Path(path)
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        prefix, suffix = _temporary_affixes(path)
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    except OSError as exc:
        raise type(exc)(
            exc.errno,
            f"cannot write into {folder}: {exc.strerror}. Choose a writable folder "
            "(e.g. pass --out or set DIAGSINK_DATA) or fix its permissions.",
        ) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
        _fsync_folder(folder)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(
            exc, OSError
        ):  # a full disk, a quota, an I/O error: name the file and the fix
            raise _write_error(exc, path) from exc
        raise
    return path


def _write_error(exc: OSError, path: Path) -> OSError:
    """``exc`` again (same type and errno), its message naming ``path`` and the fix."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        fix = "free space on that disk (the old file, if any, is intact) or choose another folder"
    else:
        fix = "check the disk and its permissions or choose another folder"
    return type(exc)(
        exc.errno,
        f"cannot write {path}: {exc.strerror or exc}. Fix: {fix} (e.g. with --out or DIAGSINK_DATA).",
    )


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that :func:`atomic_write_bytes` left next to ``path``.

    A process killed in the middle of a write (``kill -9``, a power cut) leaves its
    ``.<name>.<random>.tmp`` file behind; the target itself is intact (old or new, never half
    written). Call this once the file at ``path`` is final. Returns the deleted paths.
    """
    path = Path(path)
    removed = []
    prefix, suffix = _temporary_affixes(path)
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}"):
        try:
            tmp.unlink()
        except FileNotFoundError:
            continue
        removed.append(tmp)
    return removed


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode(encoding))


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (works on multi-GB files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_writable_dir(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """Create folder ``path`` if needed and prove it is writable (a probe file); return it.

    Called before long work starts, so an unwritable results folder fails at once and not
    after the first epoch. ``os.access`` alone is not enough (root passes it, read-only mounts
    fool it), so a probe file is really created and removed.

    Raises:
        ConfigError: ``path`` is empty (an empty ``--out ""`` would mean the current folder unasked).
        NotADirectoryError: the path, or a folder above it, is a file.
        PermissionError: the folder cannot be created or written; the message names it, ``option``
            (the setting that chose it) and the fix.
    """
    if not str(path).strip():
        raise ConfigError(
            f"{option} is empty; it names a folder. Fix: pass a folder, e.g. {option} results "
            f"(or {option} . for the current folder)."
        )
    folder = Path(os.path.abspath(path))
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise NotADirectoryError(
            f"{option} {folder}: {blocker} is a file, not a folder. Fix: choose another {option} folder."
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission for {folder}")
        fd, probe = tempfile.mkstemp(prefix=".diagsink-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PermissionError(
            f"{option} {folder} is not writable ({exc.strerror or exc}). Fix: choose a writable folder with "
            f"{option} or fix its permissions."
        ) from exc
    return folder
