"""``diagsink course export``: student and instructor editions of every chapter, written atomically.

Part of :mod:`diagsink.course` (``book/instructors.md``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .._io import atomic_write_bytes, atomic_write_text
from ..errors import ConfigError
from ..exercises import labels as registered_labels
from .notebooks import (
    EXPORT_MARKER,
    exercise_problems,
    exercises_of,
    find_book_root,
    instructor_version,
    read_notebook,
    student_version,
    toc_notebooks,
)

__all__ = ["ExportReport", "export"]

# --------------------------------------------------------------------------- export


def _check_out_dir(out: Path) -> Path:
    out = Path(os.path.abspath(out))
    existing = out
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(
            f"--out {out}: {existing} is a file, not a folder; choose a folder for the export."
        )
    not_writable = PermissionError(
        f"cannot write into {out}: the folder is not writable. Choose a writable folder with --out "
        "(e.g. --out ~/course) or fix its permissions."
    )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise not_writable
    try:  # os.access says yes to root and knows nothing of read-only mounts: really try
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".diagsink-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise not_writable from exc
    for sub in ("student", "instructor"):
        target = out / sub
        if target.is_symlink():
            raise ConfigError(
                f"{target} is a symbolic link; the export writes only inside {out}. Remove the link or choose another --out."
            )
        if target.exists() and not (target / EXPORT_MARKER).is_file():
            raise ConfigError(
                f"{target} exists and was not written by `diagsink course export`; it is left alone. "
                "Move it away or choose another --out."
            )
    return out


def _inside(path: Path, folder: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(folder)))
    except ValueError:
        return False
    return True


@dataclass
class ExportReport:
    """What :func:`export` wrote: the output folder, the editions and the notebook names."""

    out: Path
    editions: list[str]
    notebooks: list[str]
    exercises: int


def export(
    out: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    solutions: bool = True,
    notebooks: Sequence[str | os.PathLike[str]] | None = None,
) -> ExportReport:
    """Write the student (and, with ``solutions=True``, the instructor) notebooks under ``out``.

    All notebooks are first written into a staging folder inside ``out``; only when every
    one was written are ``out/student`` (and ``out/instructor``) replaced, so an interrupted
    export leaves the previous one intact. Nothing is written outside ``out``; an existing
    ``student``/``instructor`` folder not made by this function is never touched.

    Args:
        out: the output folder (created if needed).
        source: the folder holding ``_toc.yml`` (default: :func:`~diagsink.course.notebooks.find_book_root`).
        solutions: also write ``out/instructor`` (with ``False`` an existing instructor
            folder is an error, so a student hand-out never carries solutions by accident).
        notebooks: export only these chapters (paths); default every ``.ipynb`` in the toc.

    Raises:
        ConfigError: a chapter breaks the exercise pattern (the message lists why), ``out``
            overlaps the book sources, or an existing folder is not ours.
        PermissionError: ``out`` is not writable.
    """
    if not str(out).strip():  # Path("") is "." (the current folder): refuse it before
        raise ConfigError(
            "--out is empty; it names the export folder. Fix: e.g. --out course_export."
        )
    root = find_book_root(source)
    out = _checked_out(Path(out), root)
    paths = [Path(p) for p in notebooks] if notebooks is not None else toc_notebooks(root)
    if not paths:
        raise ConfigError(f"no notebook chapters listed in {root / '_toc.yml'}; nothing to export.")
    if not solutions and (out / "instructor").exists():
        raise ConfigError(
            f"{out / 'instructor'} holds solutions from an earlier export; delete it or choose another --out "
            "before writing a student-only export."
        )
    prepared, n_ex = _editions_of(paths, root)
    editions = ["student"] + (["instructor"] if solutions else [])
    _write_editions(out, editions, prepared, root / "book", _assets(root / "book"))
    return ExportReport(
        out=out, editions=editions, notebooks=[name for name, _, _ in prepared], exercises=n_ex
    )


def _checked_out(out: Path, root: Path) -> Path:
    """``out`` as a writable folder outside the book sources in ``root``, or a one-line error."""
    out = _check_out_dir(out)
    if _inside(out, root / "book"):
        raise ConfigError(
            f"--out {out} overlaps the book sources in {root}; choose a folder outside book/."
        )
    return out


def _editions_of(paths: list[Path], root: Path) -> tuple[list[tuple[str, object, object]], int]:
    """``([(file name, student notebook, instructor notebook)], number of exercises)`` of ``paths``.

    Every chapter is checked against the exercise pattern first; any problem stops the export
    before anything is written.
    """
    registered = registered_labels()
    names: list[str] = []
    prepared: list[tuple[str, object, object]] = []
    problems: list[str] = []
    n_ex = 0
    for path in paths:
        nb = read_notebook(path)
        rel = os.path.relpath(path, root)
        name = path.name
        if name in names:
            raise ConfigError(f"two chapters are called {name}; rename one (the export is flat).")
        names.append(name)
        problems += exercise_problems(nb, rel, registered=registered)
        n_ex += sum(1 for ex in exercises_of(nb).values() if ex.stubs)
        prepared.append((name, student_version(nb, rel), instructor_version(nb, rel)))
    if problems:
        raise ConfigError(
            "the exercise pattern is broken, nothing was exported:\n  " + "\n  ".join(problems)
        )
    return prepared, n_ex


def _assets(book: Path) -> list[Path]:
    """The files in the folders next to the chapters (e.g. ``book/results/``), which travel with them.

    Relative paths in the notebooks keep working; hidden files, ``__pycache__``, folders whose
    name starts with ``_`` and symbolic links are left out.
    """
    return sorted(
        p
        for d in (book.iterdir() if book.is_dir() else [])
        if d.is_dir() and not d.is_symlink() and not d.name.startswith(("_", "."))
        for p in d.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and not any(
            part.startswith(".") or part == "__pycache__" for part in p.relative_to(book).parts
        )
    )


def _write_editions(
    out: Path,
    editions: list[str],
    prepared: list[tuple[str, object, object]],
    book: Path,
    assets: list[Path],
) -> None:
    """Write every edition into a staging folder inside ``out``, then move each to ``out/<edition>``.

    Only when every file of every edition is written are the previous editions replaced, so an
    interrupted export leaves them intact.
    """
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".diagsink-export-", dir=out))
    try:
        for edition in editions:
            folder = staging / edition
            for name, student, instructor in prepared:
                target = folder / name
                if not _inside(target, staging):
                    raise ConfigError(f"refusing to write {target}: it is outside {out}")
                nb = student if edition == "student" else instructor
                atomic_write_text(target, nbformat.writes(nb) + "\n")
            for asset in assets:
                rel = asset.relative_to(book)
                atomic_write_bytes(folder / rel, asset.read_bytes())
            atomic_write_text(
                folder / EXPORT_MARKER,
                f"written by `diagsink course export` ({edition} edition); safe to delete and re-export.\n",
            )
        for edition in editions:
            final = out / edition
            old = None
            if final.exists():
                old = staging / f"old-{edition}"
                os.replace(final, old)
            os.replace(staging / edition, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
