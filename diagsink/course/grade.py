"""``diagsink course grade``: run a submitted notebook, then each exercise's registered check.

Part of :mod:`diagsink.course` (``book/instructors.md``).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from ..errors import ConfigError
from .notebooks import (
    CHECK_TAG,
    _defined_names,
    _src,
    _tags,
    exercises_of,
    find_book_root,
    read_notebook,
    toc_notebooks,
)

__all__ = ["GRADE_STATUSES", "Grade", "grade"]

# --------------------------------------------------------------------------- grading

GRADE_STATUSES = ("pass", "hint", "not attempted", "missing", "error")


@dataclass
class Grade:
    """The outcome of one exercise in a submitted notebook."""

    label: str
    status: str  # one of GRADE_STATUSES
    message: str = ""


def _source_chapter(nb, path: Path, root: Path) -> Path:
    source = (nb.metadata.get("diagsink") or {}).get("source")
    if source and (root / source).is_file():
        return root / source
    for chapter in toc_notebooks(root):
        if chapter.name == path.name:
            return chapter
    raise ConfigError(
        f"cannot tell which chapter {path} is: it has no diagsink.source metadata (written by "
        "`diagsink course export`) and no chapter in _toc.yml has its file name; rename it to the chapter's name."
    )


_GRADE_MARK = "DIAGSINK-GRADES "


def _grading_cell(targets: list[tuple[str, str]]) -> str:
    return (
        "import json as _json\n"
        "import diagsink as _ds\n"
        "_grades = {}\n"
        f"for _label, _name in {targets!r}:\n"
        "    _fn = globals().get(_name)\n"
        "    if _fn is None:\n"
        "        _grades[_label] = ['missing', f'no function {_name!r} is defined']\n"
        "        continue\n"
        "    try:\n"
        "        _r = _ds.exercises.check(_label, _fn)\n"
        "        _grades[_label] = ['pass' if _r.passed else 'hint', _r.message]\n"
        "    except NotImplementedError:\n"
        "        _grades[_label] = ['not attempted', 'the stub still raises NotImplementedError']\n"
        "    except Exception as _e:\n"
        "        _grades[_label] = ['error', f'{type(_e).__name__}: {_e}']\n"
        f"print({_GRADE_MARK!r} + _json.dumps(_grades))\n"
    )


def grade(
    notebook: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    timeout: int = 600,
) -> list[Grade]:
    """Grade a submitted student notebook with the registered checks.

    The notebook runs top to bottom in a fresh kernel (errors allowed, in its own folder),
    without its check cells: a student who edited a check cell cannot change the grade.
    Then, for every exercise of the chapter (taken from the book's source, not from the
    submission), the check runs on the function the stub defines, on fresh random inputs.

    Returns one :class:`Grade` per exercise: ``pass``, ``hint`` (wrong; the message says
    what), ``not attempted`` (the stub is unchanged), ``missing`` (the function is not
    defined) or ``error`` (the check could not run).
    """
    path = Path(notebook)
    root = find_book_root(source)
    submitted = read_notebook(path)
    chapter = read_notebook(_source_chapter(submitted, path, root))
    targets: list[tuple[str, str]] = []
    for label, ex in exercises_of(chapter).items():
        if ex.stubs:
            names = sorted(_defined_names(_src(chapter.cells[ex.stubs[0]])))
            if names:
                targets.append((label, names[0]))
    run = nbformat.v4.new_notebook(metadata=submitted.metadata)
    run.cells = [
        copy.deepcopy(c)
        for c in submitted.cells
        if not (c.cell_type == "code" and CHECK_TAG in _tags(c))
    ]
    run.cells.append(nbformat.v4.new_code_cell(_grading_cell(targets)))
    NotebookClient(
        run,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent.resolve())}},
    ).execute()
    printed = "".join(o.get("text", "") for o in run.cells[-1].outputs if o.output_type == "stream")
    line = next((ln for ln in printed.splitlines() if ln.startswith(_GRADE_MARK)), None)
    if line is None:
        errors = [
            f"{o.ename}: {o.evalue}" for o in run.cells[-1].outputs if o.output_type == "error"
        ]
        return [
            Grade(label, "error", "; ".join(errors) or "the grading cell printed nothing")
            for label, _ in targets
        ]
    found = json.loads(line[len(_GRADE_MARK) :])
    return [Grade(label, *found[label]) for label, _ in targets]
