"""Course material from the book: student and instructor notebooks, and their structure.

Every chapter ``book/<name>.ipynb`` ends with exercises in one fixed cell pattern (see the
instructor page, ``book/instructors.md``)::

    markdown  ```{exercise} Title / :label: ex-<chapter>-<name> ...```
    code      tag "exercise-stub":      def f(...): raise NotImplementedError("ex-<chapter>-<name>")
    markdown  ```{solution-start} ex-<chapter>-<name> / :class: dropdown```
    code      tag "exercise-solution":  the reference solution (redefines f)
    markdown  ```{solution-end}```
    code      tag "exercise-check":     ds.exercises.check("ex-<chapter>-<name>", f, strict=True)

From this one source, :func:`export` writes

* ``DIR/student/<name>.ipynb``: the solution cells and the ``{solution-start}`` ...
  ``{solution-end}`` cells removed, stubs and checks kept, outputs empty;
* ``DIR/instructor/<name>.ipynb``: every cell, outputs empty.

Folders next to the chapters (``book/results/`` with the result artifacts, images) are
copied into both editions, so the notebooks' relative paths keep working there.

:func:`exercise_problems` checks the pattern statically (each stub has exactly one solution
and one check with the same label, the label is registered in :mod:`diagsink.exercises`,
the stub's ``NotImplementedError`` names it, no code hides between the solution markers
without the solution tag). The export refuses a notebook that breaks it, so a solution can
never leak into a student notebook through an untagged cell.

:func:`grade` runs a submitted student notebook and grades every exercise with the registered
checks. Command line: ``diagsink course export --out DIR [--no-solutions]``,
``diagsink course grade NOTEBOOK... [--json FILE]`` and ``diagsink course check``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._io import atomic_write_bytes, atomic_write_text
from .errors import ConfigError

__all__ = [
    "STUB_TAG",
    "SOLUTION_TAG",
    "CHECK_TAG",
    "Exercise",
    "ExportReport",
    "find_book_root",
    "toc_notebooks",
    "exercises_of",
    "exercise_problems",
    "student_version",
    "instructor_version",
    "export",
    "Grade",
    "grade",
    "add_commands",
]

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
    here = Path(__file__).resolve().parents[1]
    if start is None and (here / "_toc.yml").is_file():
        return here
    raise FileNotFoundError(
        f"no _toc.yml in {candidates[0]} or its parents: run the command inside the diagsink "
        "repository or pass --source with the folder that holds _toc.yml."
    )


def toc_notebooks(root: str | os.PathLike[str]) -> list[Path]:
    """The ``.ipynb`` chapters listed in ``root/_toc.yml``, in table-of-contents order."""
    import yaml

    root = Path(root)
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    entries: list[str] = []

    def walk(items: Iterable[dict] | None) -> None:
        for item in items or []:
            if "file" in item:
                entries.append(str(item["file"]))
            walk(item.get("sections"))

    entries.append(str(toc.get("root", "")))
    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    found: list[Path] = []
    for entry in entries:
        stem = entry[: -len(".ipynb")] if entry.endswith(".ipynb") else entry
        path = root / f"{stem}.ipynb"
        if path.is_file() and path not in found:
            found.append(path)
    return found


def _read(path: Path):
    import nbformat

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
        from .exercises import labels as registered_labels

        registered = registered_labels()
    registered = set(registered)
    problems: list[str] = []
    spans, span_problems = _solution_spans(nb)
    problems += [f"{name}: {p}" for p in span_problems]
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
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and _SOLUTION_RE.search(_src(cell)):
            problems.append(
                f"{name} cell {i}: use the gated {{solution-start}}/{{solution-end}} pattern, not {{solution}}"
            )
    for label, ex in exercises_of(nb).items():
        where = f"{name} [{label}]"
        if label.startswith("<"):
            problems.append(f"{name}: {label}")
            continue
        if not ex.stubs and not ex.solutions and not ex.checks:
            continue  # an {exercise} without code (a question to answer in words)
        if len(ex.stubs) != 1:
            problems.append(
                f"{where}: {len(ex.stubs)} stub cells (tag {STUB_TAG!r}), expected exactly 1"
            )
        if len(ex.solutions) != 1:
            problems.append(
                f"{where}: {len(ex.solutions)} solution cells (tag {SOLUTION_TAG!r}), expected exactly 1"
            )
        if len(ex.checks) != 1:
            problems.append(
                f"{where}: {len(ex.checks)} check cells (tag {CHECK_TAG!r}), expected exactly 1"
            )
        if ex.stubs and ex.stub_messages != [label]:
            problems.append(
                f"{where}: the stub must raise NotImplementedError({label!r}); it names {ex.stub_messages or 'nothing'}"
            )
        if label not in registered:
            problems.append(
                f"{where}: no check registered; add @register({label!r}) in diagsink/exercises/"
            )
        if not ex.directive:
            problems.append(f"{where}: no {{exercise}} markdown cell with ':label: {label}'")
        if len(ex.stubs) == 1 and len(ex.solutions) == 1:
            stub_names = _defined_names(_src(nb.cells[ex.stubs[0]]))
            sol_names = _defined_names(_src(nb.cells[ex.solutions[0]]))
            if not stub_names <= sol_names:
                problems.append(
                    f"{where}: the solution does not redefine {sorted(stub_names - sol_names)}"
                )
        order = ex.stubs[:1] + ex.solutions[:1] + ex.checks[:1]
        if len(order) == 3 and order != sorted(order):
            problems.append(f"{where}: the cells must come in the order stub, solution, check")
    return problems


# --------------------------------------------------------------------------- editions


def _cleared(nb, edition: str, source: str):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["diagsink"] = {"edition": edition, "source": source}
    return nb


def student_version(nb, source: str = ""):
    """The student edition: solution cells and the solution-start..solution-end cells removed,
    stubs and checks kept, outputs empty. ``nb`` is not modified."""
    spans, _ = _solution_spans(nb)
    drop = {i for s, e, _ in spans for i in range(s, e + 1)}
    drop |= {i for i, c in enumerate(nb.cells) if SOLUTION_TAG in _tags(c)}
    out = _cleared(nb, "student", source)
    out.cells = [c for i, c in enumerate(out.cells) if i not in drop]
    return out


def instructor_version(nb, source: str = ""):
    """The instructor edition: every cell, outputs empty. ``nb`` is not modified."""
    return _cleared(nb, "instructor", source)


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
        source: the folder holding ``_toc.yml`` (default: :func:`find_book_root`).
        solutions: also write ``out/instructor`` (with ``False`` an existing instructor
            folder is an error, so a student hand-out never carries solutions by accident).
        notebooks: export only these chapters (paths); default every ``.ipynb`` in the toc.

    Raises:
        ConfigError: a chapter breaks the exercise pattern (the message lists why), ``out``
            overlaps the book sources, or an existing folder is not ours.
        PermissionError: ``out`` is not writable.
    """
    root = find_book_root(source)
    out = _check_out_dir(Path(out))
    if _inside(out, root / "book"):
        raise ConfigError(
            f"--out {out} overlaps the book sources in {root}; choose a folder outside book/."
        )
    paths = [Path(p) for p in notebooks] if notebooks is not None else toc_notebooks(root)
    if not paths:
        raise ConfigError(f"no notebook chapters listed in {root / '_toc.yml'}; nothing to export.")
    if not solutions and (out / "instructor").exists():
        raise ConfigError(
            f"{out / 'instructor'} holds solutions from an earlier export; delete it or choose another --out "
            "before writing a student-only export."
        )

    from .exercises import labels as registered_labels

    registered = registered_labels()
    names: list[str] = []
    prepared: list[tuple[str, object, object]] = []
    problems: list[str] = []
    n_ex = 0
    for path in paths:
        nb = _read(path)
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

    import nbformat

    # folders next to the chapters (e.g. book/results/ with the result artifacts) travel with
    # them, so relative paths in the notebooks keep working; no symbolic links are followed
    book = root / "book"
    assets = sorted(
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
    editions = ["student"] + (["instructor"] if solutions else [])
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
    return ExportReport(out=out, editions=editions, notebooks=names, exercises=n_ex)


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
    import nbformat
    from nbclient import NotebookClient

    path = Path(notebook)
    root = find_book_root(source)
    submitted = _read(path)
    chapter = _read(_source_chapter(submitted, path, root))
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
    import json

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


# --------------------------------------------------------------------------- command line


def _cmd_export(args: argparse.Namespace) -> int:
    report = export(args.out, source=args.source, solutions=args.solutions)
    for edition in report.editions:
        print(f"{edition:10s} {report.out / edition}  ({len(report.notebooks)} notebooks)")
    print(f"{report.exercises} exercises; chapters: {', '.join(report.notebooks)}")
    if not args.solutions:
        print("no instructor notebooks written (--no-solutions)")
    return 0


def _cmd_grade(args: argparse.Namespace) -> int:
    import json

    report: dict[str, list[dict[str, str]]] = {}
    for notebook in args.notebooks:
        if not Path(notebook).is_file():
            raise FileNotFoundError(
                f"{notebook} does not exist: pass the path of a submitted .ipynb"
            )
        grades = grade(notebook, source=args.source, timeout=args.timeout)
        passed = sum(g.status == "pass" for g in grades)
        print(f"{notebook}: {passed}/{len(grades)} passed")
        for g in grades:
            print(f"  {g.status:14s} {g.label}  {g.message}")
        report[str(notebook)] = [
            {"label": g.label, "status": g.status, "message": g.message} for g in grades
        ]
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")
        print(f"grades written to {args.json}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    root = find_book_root(args.source)
    problems: list[str] = []
    count = 0
    for path in toc_notebooks(root):
        nb = _read(path)
        problems += exercise_problems(nb, os.path.relpath(path, root))
        count += sum(1 for ex in exercises_of(nb).values() if ex.stubs)
    if problems:
        raise ConfigError("the exercise pattern is broken:\n  " + "\n  ".join(problems))
    print(f"{count} exercises, each with one stub, one solution and one registered check.")
    return 0


def add_commands(subparsers) -> None:
    """Register ``diagsink course export``, ``grade`` and ``check``."""
    course = subparsers.add_parser("course", help="student and instructor notebooks for teaching")
    sub = course.add_subparsers(dest="course_command", metavar="ACTION")
    sub.required = True

    exp = sub.add_parser(
        "export",
        help="write DIR/student (solutions removed) and DIR/instructor notebooks",
        description="Write student notebooks (solution cells removed, stubs and checks kept, outputs "
        "empty) and instructor notebooks (everything) from the chapters in _toc.yml.",
    )
    exp.add_argument(
        "--out",
        default="course_export",
        metavar="DIR",
        help="output folder (default: course_export)",
    )
    exp.add_argument(
        "--solutions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write DIR/instructor with the solutions (default: yes)",
    )
    exp.add_argument(
        "--source",
        default=None,
        metavar="ROOT",
        help="folder holding _toc.yml (default: found from here)",
    )
    exp.set_defaults(func=_cmd_export)

    grd = sub.add_parser(
        "grade",
        help="grade submitted student notebooks with the registered checks",
        description="Run each submitted notebook (without its check cells) and then the registered "
        "check of every exercise of its chapter on the student's function; print pass / hint / "
        "not attempted / missing per exercise.",
    )
    grd.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="submitted .ipynb files")
    grd.add_argument("--json", default=None, metavar="FILE", help="also write the grades as JSON")
    grd.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    grd.add_argument(
        "--source",
        default=None,
        metavar="ROOT",
        help="folder holding _toc.yml (default: found from here)",
    )
    grd.set_defaults(func=_cmd_grade)

    chk = sub.add_parser("check", help="check the exercise pattern of every chapter (no execution)")
    chk.add_argument(
        "--source",
        default=None,
        metavar="ROOT",
        help="folder holding _toc.yml (default: found from here)",
    )
    chk.set_defaults(func=_cmd_check)
