"""Course material from the book: student and instructor notebooks, and their structure.

Every chapter ``book/<name>.ipynb`` ends with exercises in one fixed cell pattern (see the
instructor page, ``book/instructors.md``)::

    markdown  ```{exercise} Title / :label: ex-<chapter>-<name> ...```
    code      tag "exercise-stub":      def f(...): raise NotImplementedError("ex-<chapter>-<name>")
    markdown  ```{solution-start} ex-<chapter>-<name> / :class: dropdown```
    code      tag "exercise-solution":  the reference solution (redefines f)
    markdown  ```{solution-end}```
    code      tag "exercise-check":     ds.exercises.check("ex-<chapter>-<name>", f, strict=True)

From this one source, :func:`~diagsink.course.export.export` writes

* ``DIR/student/<name>.ipynb``: the solution cells and the ``{solution-start}`` ...
  ``{solution-end}`` cells removed, stubs and checks kept, outputs empty;
* ``DIR/instructor/<name>.ipynb``: every cell, outputs empty.

Folders next to the chapters (``book/results/`` with the result artifacts, images) are
copied into both editions, so the notebooks' relative paths keep working there.

:func:`~diagsink.course.notebooks.exercise_problems` checks the pattern statically (each stub has exactly one solution
and one check with the same label, the label is registered in :mod:`diagsink.exercises`,
the stub's ``NotImplementedError`` names it, no code hides between the solution markers
without the solution tag). The export refuses a notebook that breaks it, so a solution can
never leak into a student notebook through an untagged cell.

:func:`~diagsink.course.grade.grade` runs a submitted student notebook and grades every exercise with the registered
checks. Command line: ``diagsink course export --out DIR [--no-solutions]``,
``diagsink course grade NOTEBOOK... [--json FILE]`` and ``diagsink course check``.
"""

from __future__ import annotations

from .export import ExportReport, export
from .grade import GRADE_STATUSES, Grade, grade
from .notebooks import (
    CHECK_TAG,
    EXPORT_MARKER,
    SOLUTION_TAG,
    STUB_TAG,
    Exercise,
    exercise_problems,
    exercises_of,
    find_book_root,
    instructor_version,
    read_notebook,
    student_version,
    toc_entries,
    toc_notebooks,
)

__all__ = [
    "STUB_TAG",
    "SOLUTION_TAG",
    "CHECK_TAG",
    "EXPORT_MARKER",
    "GRADE_STATUSES",
    "Exercise",
    "ExportReport",
    "find_book_root",
    "toc_entries",
    "toc_notebooks",
    "read_notebook",
    "exercises_of",
    "exercise_problems",
    "student_version",
    "instructor_version",
    "export",
    "Grade",
    "grade",
]
