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

from . import export as _export_module
from . import grade as _grade_module
from . import notebooks
from .export import *  # noqa: F403
from .grade import *  # noqa: F403
from .notebooks import *  # noqa: F403

__all__ = [*notebooks.__all__, *_export_module.__all__, *_grade_module.__all__]
