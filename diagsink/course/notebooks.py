"""The chapters as course material: the table of contents, the exercises of a notebook, its editions.

Part of :mod:`diagsink.course` (the chapter for instructors: ``book/instructors.md``).
"""

from __future__ import annotations

import ast
import copy
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml
from nbconvert.preprocessors import ClearOutputPreprocessor, TagRemovePreprocessor

from ..exercises import labels as registered_labels

STUB_TAG = "exercise-stub"
SOLUTION_TAG = "exercise-solution"
CHECK_TAG = "exercise-check"
EXPORT_MARKER = ".diagsink-export"  # written into every folder the export owns

_FENCE = r"(?:`{3,}|:{3,})"
_EXERCISE_RE = re.compile(_FENCE + r"\{exercise(?:-start)?\}")
_LABEL_RE = re.compile(r"^:label:\s*(\S+)\s*$", re.MULTILINE)
_SOLUTION_START_RE = re.compile(r"^\s*" + _FENCE + r"\{solution-start\}\s*(\S+)", re.MULTILINE)
_SOLUTION_END_RE = re.compile(r"^\s*" + _FENCE + r"\{solution-end\}", re.MULTILINE)
_SOLUTION_RE = re.compile(r"^\s*" + _FENCE + r"\{solution\}", re.MULTILINE)
# a marker cell holds the directive and its options, nothing else
_START_ALONE_RE = re.compile(
    r"(`{3,}|:{3,})\{solution-start\}[ \t]*\S+[ \t]*\n(?:[ \t]*:[\w-]+:.*\n)*\s*\1"
)

__all__ = [
    "STUB_TAG",
    "SOLUTION_TAG",
    "CHECK_TAG",
    "EXPORT_MARKER",
    "Exercise",
    "find_book_root",
    "toc_entries",
    "toc_notebooks",
    "read_notebook",
    "exercises_of",
    "exercise_problems",
    "student_version",
    "instructor_version",
]
_END_ALONE_RE = re.compile(r"(`{3,}|:{3,})\{solution-end\}[ \t]*\n\s*\1")


# --------------------------------------------------------------------------- sources


def find_book_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding ``_toc.yml``: ``start`` or a parent of it, else the repository
    of this (editable) package.

    Raises:
        FileNotFoundError: no ``_toc.yml`` found (the message says how to point at one).
    """
    candidates: list[Path] = []
    if start is not None:
        candidates.append(Path(start).resolve())
    else:
        candidates.append(Path.cwd().resolve())
    for base in candidates:
        for folder in (base, *base.parents):
            if (folder / "_toc.yml").is_file():
                return folder
    here = Path(__file__).resolve().parents[2]
    if start is None and (here / "_toc.yml").is_file():
        return here
    raise FileNotFoundError(
        f"no _toc.yml in {candidates[0]} or its parents: run the command inside the diagsink "
        "repository or pass --source with the folder that holds _toc.yml."
    )


def toc_entries(root: str | os.PathLike[str]) -> list[str]:
    """Every ``file:`` entry of ``root/_toc.yml`` (the root first), in table-of-contents order.

    The one reader of the table of contents: the course export and the tests use it.
    """
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    entries: list[str] = [str(toc["root"])] if toc.get("root") else []

    def walk(items: Iterable[dict] | None) -> None:
        for item in items or []:
            if "file" in item:
                entries.append(str(item["file"]))
            walk(item.get("sections"))

    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return entries


def toc_notebooks(root: str | os.PathLike[str]) -> list[Path]:
    """The ``.ipynb`` chapters listed in ``root/_toc.yml``, in table-of-contents order."""
    root = Path(root)
    found: list[Path] = []
    for entry in toc_entries(root):
        stem = entry[: -len(".ipynb")] if entry.endswith(".ipynb") else entry
        path = root / f"{stem}.ipynb"
        if path.is_file() and path not in found:
            found.append(path)
    return found


def read_notebook(path: Path):
    """A notebook file as an ``nbformat`` v4 node."""
    return nbformat.read(str(path), as_version=4)


# --------------------------------------------------------------------------- structure


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []) or [])


def _src(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _stub_labels(source: str) -> list[str]:
    """Labels named by ``raise NotImplementedError("ex-...")`` in a cell."""
    labels: list[str] = []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.findall(r"NotImplementedError\(\s*[\"'](ex-[^\"']+)[\"']", source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            if isinstance(func, ast.Name) and func.id == "NotImplementedError" and node.exc.args:
                arg = node.exc.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    labels.append(arg.value)
    return labels


def _check_labels(source: str) -> list[str]:
    """Labels of ``...check("ex-...", ...)`` calls in a cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.findall(r"check\(\s*[\"'](ex-[^\"']+)[\"']", source)
    labels: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name == "check" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                labels.append(arg.value)
    return labels


def _defined_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


@dataclass
class Exercise:
    """Where one exercise's cells sit in a notebook (cell indices)."""

    label: str
    directive: list[int] = field(default_factory=list)  # markdown {exercise} cells
    stubs: list[int] = field(default_factory=list)
    solutions: list[int] = field(default_factory=list)
    checks: list[int] = field(default_factory=list)
    stub_messages: list[str] = field(default_factory=list)  # labels in NotImplementedError(...)


def _solution_spans(nb) -> tuple[list[tuple[int, int, str]], list[str]]:
    """``(start, end, label)`` cell-index spans of gated solutions, plus structure problems."""
    spans: list[tuple[int, int, str]] = []
    problems: list[str] = []
    open_at: tuple[int, str] | None = None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        src = _src(cell)
        start = _SOLUTION_START_RE.search(src)
        end = _SOLUTION_END_RE.search(src)
        if start:
            if open_at is not None:
                problems.append(
                    f"cell {i}: solution-start inside the open solution of cell {open_at[0]}"
                )
            open_at = (i, start.group(1))
        if end:
            if open_at is None:
                problems.append(f"cell {i}: solution-end without a solution-start")
            else:
                spans.append((open_at[0], i, open_at[1]))
                open_at = None
        if (start or end) and start and end:
            problems.append(
                f"cell {i}: put solution-start and solution-end in separate markdown cells"
            )
    if open_at is not None:
        problems.append(f"cell {open_at[0]}: solution-start without a solution-end")
    return spans, problems


def exercises_of(nb) -> dict[str, Exercise]:
    """The exercises of a notebook, keyed by label (see :class:`Exercise`)."""
    found: dict[str, Exercise] = {}

    def get(label: str) -> Exercise:
        return found.setdefault(label, Exercise(label))

    spans, _ = _solution_spans(nb)
    current: str | None = None  # label of the last {exercise} directive
    for i, cell in enumerate(nb.cells):
        src = _src(cell)
        tags = _tags(cell)
        if cell.cell_type == "markdown" and _EXERCISE_RE.search(src):
            m = _LABEL_RE.search(src)
            if m:
                current = m.group(1)
                get(current).directive.append(i)
        if cell.cell_type != "code":
            continue
        if STUB_TAG in tags:
            messages = _stub_labels(src)
            label = current or (messages[0] if messages else f"<unlabelled stub, cell {i}>")
            ex = get(label)
            ex.stubs.append(i)
            ex.stub_messages.extend(messages)
        if SOLUTION_TAG in tags:
            span_label = next((lab for s, e, lab in spans if s < i < e), None)
            get(span_label or f"<solution outside solution-start/-end, cell {i}>").solutions.append(
                i
            )
        if CHECK_TAG in tags:
            labels = _check_labels(src)
            for label in labels or [f"<check without a label, cell {i}>"]:
                get(label).checks.append(i)
    return found


def exercise_problems(
    nb, name: str = "notebook", *, registered: Sequence[str] | None = None
) -> list[str]:
    """Everything wrong with the exercise pattern of a notebook (empty list: all fine).

    Checks: each stub has exactly one solution and one check with the same label; the
    stub's ``NotImplementedError`` message is the label; the stub and the solution define
    the same names; the label has a registered check (``registered``, by default
    :func:`diagsink.exercises.labels`); every code cell between ``{solution-start}`` and
    ``{solution-end}`` is tagged ``exercise-solution``; the gated markers are alone in
    their cells and pair up.
    """
    if registered is None:
        registered = registered_labels()
    registered = set(registered)
    problems = _span_problems(nb, name)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and _SOLUTION_RE.search(_src(cell)):
            problems.append(
                f"{name} cell {i}: use the gated {{solution-start}}/{{solution-end}} pattern, not {{solution}}"
            )
    for label, ex in exercises_of(nb).items():
        if label.startswith("<"):
            problems.append(f"{name}: {label}")
            continue
        if not ex.stubs and not ex.solutions and not ex.checks:
            continue  # an {exercise} without code (a question to answer in words)
        where = f"{name} [{label}]"
        problems += [f"{where}: {p}" for p in _exercise_problems(nb, label, ex, registered)]
    return problems


def _span_problems(nb, name: str) -> list[str]:
    """What is wrong with the ``{solution-start}``/``{solution-end}`` spans of ``nb``.

    The markers must pair up and be alone in their markdown cells; every code cell between
    them must be tagged ``exercise-solution`` and be neither a stub nor a check.
    """
    spans, span_problems = _solution_spans(nb)
    problems = [f"{name}: {p}" for p in span_problems]
    for start, end, label in spans:
        for idx, pattern in ((start, _START_ALONE_RE), (end, _END_ALONE_RE)):
            if not pattern.fullmatch(_src(nb.cells[idx]).strip()):
                problems.append(
                    f"{name} cell {idx}: the solution marker must be alone in its markdown cell "
                    "(the student notebook drops that whole cell)"
                )
        for i in range(start + 1, end):
            cell = nb.cells[i]
            if cell.cell_type == "code" and SOLUTION_TAG not in _tags(cell):
                problems.append(
                    f"{name} cell {i}: code between solution-start and solution-end of {label} must be "
                    f"tagged {SOLUTION_TAG!r} (otherwise it would leak into the student notebook)"
                )
            if cell.cell_type == "code" and (STUB_TAG in _tags(cell) or CHECK_TAG in _tags(cell)):
                problems.append(
                    f"{name} cell {i}: a stub or check cell sits inside the solution of {label}"
                )
    return problems


def _exercise_problems(nb, label: str, ex: Exercise, registered: set[str]) -> list[str]:
    """What is wrong with exercise ``label`` (its cells ``ex``): counts, stub message, check, order."""
    problems: list[str] = []
    for count, tag, what in (
        (len(ex.stubs), STUB_TAG, "stub"),
        (len(ex.solutions), SOLUTION_TAG, "solution"),
        (len(ex.checks), CHECK_TAG, "check"),
    ):
        if count != 1:
            problems.append(f"{count} {what} cells (tag {tag!r}), expected exactly 1")
    if ex.stubs and ex.stub_messages != [label]:
        problems.append(
            f"the stub must raise NotImplementedError({label!r}); it names {ex.stub_messages or 'nothing'}"
        )
    if label not in registered:
        problems.append(f"no check registered; add @register({label!r}) in diagsink/exercises/")
    if not ex.directive:
        problems.append(f"no {{exercise}} markdown cell with ':label: {label}'")
    if len(ex.stubs) == 1 and len(ex.solutions) == 1:
        stub_names = _defined_names(_src(nb.cells[ex.stubs[0]]))
        sol_names = _defined_names(_src(nb.cells[ex.solutions[0]]))
        if not stub_names <= sol_names:
            problems.append(f"the solution does not redefine {sorted(stub_names - sol_names)}")
    order = ex.stubs[:1] + ex.solutions[:1] + ex.checks[:1]
    if len(order) == 3 and order != sorted(order):
        problems.append("the cells must come in the order stub, solution, check")
    return problems


# --------------------------------------------------------------------------- editions


#: A tag set, on a copy only, on the cells from ``{solution-start}`` to ``{solution-end}`` (the
#: markers are markdown cells without tags), so that one :class:`TagRemovePreprocessor` drops
#: them together with the ``exercise-solution`` code cells.
_SPAN_TAG = "diagsink-solution-span"


def _cleared(nb, edition: str, source: str):
    """A copy of ``nb`` with every output and execution count cleared (nbconvert's
    :class:`ClearOutputPreprocessor`, also dropping the ``execution`` timing metadata), marked
    with its edition and its chapter (``metadata.diagsink``)."""
    nb = copy.deepcopy(nb)
    nb, _ = ClearOutputPreprocessor(remove_metadata_fields={"execution"}).preprocess(nb, {})
    for cell in nb.cells:  # markdown cells too (the preprocessor clears code cells only)
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["diagsink"] = {"edition": edition, "source": source}
    return nb


def student_version(nb, source: str = ""):
    """The student edition: solution cells and the solution-start..solution-end cells removed,
    stubs and checks kept, outputs empty. ``nb`` is not modified.

    Made with nbconvert's preprocessors: :class:`ClearOutputPreprocessor` (outputs) and
    :class:`TagRemovePreprocessor` (the cells tagged ``exercise-solution``, and the gated
    span, tagged on the copy)."""
    spans, _ = _solution_spans(nb)
    out = _cleared(nb, "student", source)
    for start, end, _ in spans:
        for cell in out.cells[start : end + 1]:
            cell.metadata["tags"] = [*_tags(cell), _SPAN_TAG]
    remover = TagRemovePreprocessor(remove_cell_tags={SOLUTION_TAG, _SPAN_TAG})
    out, _ = remover.preprocess(out, {})
    return out


def instructor_version(nb, source: str = ""):
    """The instructor edition: every cell, outputs empty. ``nb`` is not modified."""
    return _cleared(nb, "instructor", source)
