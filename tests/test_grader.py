"""The course grader as instructors run it on a class: untrusted, sometimes broken submissions.

Small synthetic notebooks only (a one-chapter book in a temporary folder with three exercises
whose checks exercise every way a check calls the student's function: plain tensors, a tensor
the function must not change in place, and a loss that autograd differentiates). Each class of
failure has a case: a submission that cannot be read (bad JSON, a cell without ``source``, a
``source`` that is not text, a missing file, metadata pointing outside the book) is one error
grade naming the file; a kernel that dies or runs past ``--timeout`` is an error grade and the
batch goes on; ``--json`` is checked before anything runs and written whatever happens; a
notebook that replaces ``ds.exercises.check`` (or prints ``PASS``) is graded on its function.
Every registered check of the book is also run through the grader's call into the kernel (an
in-process stand-in for the kernel): the book's solution passes there as it does directly.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
from pathlib import Path

import nbformat
import pytest

import diagsink as ds
from diagsink import course
from diagsink.cli import main

from conftest import ROOT

grading = importlib.import_module(
    "diagsink.course.grade"
)  # the module (``course.grade`` is the function)

LABELS = ("ex-course-softmax", "ex-attention-mask", "ex-scaling-rank-loss")
STUBS = {
    "ex-course-softmax": "def row_softmax(scores):\n    raise NotImplementedError('ex-course-softmax')\n",
    "ex-attention-mask": "def diag_masked(scores):\n    raise NotImplementedError('ex-attention-mask')\n",
    "ex-scaling-rank-loss": (
        "def rank_loss(pred, target, count, world_size):\n"
        "    raise NotImplementedError('ex-scaling-rank-loss')\n"
    ),
}
SOLUTIONS = {
    "ex-course-softmax": (
        "def row_softmax(scores):\n"
        "    e = (scores - scores.amax(-1, keepdim=True)).exp()\n"
        "    return e / e.sum(-1, keepdim=True)\n"
    ),
    "ex-attention-mask": (
        "def diag_masked(scores):\n"
        "    eye = torch.eye(scores.shape[-1], dtype=torch.bool)\n"
        "    return torch.softmax(scores.masked_fill(eye, float('-inf')), dim=-1)\n"
    ),
    "ex-scaling-rank-loss": (
        "def rank_loss(pred, target, count, world_size):\n"
        "    observed = target != 0\n"
        "    err = torch.where(observed, (pred - target).abs(), torch.zeros_like(pred))\n"
        "    return err.sum() * world_size / count\n"
    ),
}
CALLS = {
    "ex-course-softmax": "row_softmax",
    "ex-attention-mask": "diag_masked",
    "ex-scaling-rank-loss": "rank_loss",
}


def _code(text: str, *tags: str):
    return nbformat.v4.new_code_cell(text, metadata={"tags": list(tags)} if tags else {})


KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _chapter():
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": KERNEL})
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Demo"),
        _code("import diagsink as ds\nimport torch"),
    ]
    for label in LABELS:
        nb.cells += [
            nbformat.v4.new_markdown_cell(
                f"```{{exercise}} {label}\n:label: {label}\n\nSolve it.\n```"
            ),
            _code(STUBS[label], course.STUB_TAG),
            nbformat.v4.new_markdown_cell(f"```{{solution-start}} {label}\n:class: dropdown\n```"),
            _code(SOLUTIONS[label], course.SOLUTION_TAG),
            nbformat.v4.new_markdown_cell("```{solution-end}\n```"),
            _code(f'ds.exercises.check("{label}", {CALLS[label]}, strict=True)', course.CHECK_TAG),
        ]
    return nb


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("book")
    (root / "book").mkdir()
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nparts:\n  - caption: Demo\n    chapters:\n      - file: book/demo\n"
    )
    (root / "book" / "intro.md").write_text("# Intro\n")
    nbformat.write(_chapter(), str(root / "book" / "demo.ipynb"))
    return root


def _student(book: Path):
    nb = nbformat.read(str(book / "book" / "demo.ipynb"), as_version=4)
    return course.student_version(nb, "book/demo.ipynb")


def _submission(book: Path, folder: Path, name: str, answers=None, extra: str = "", checks=None):
    """The student edition with some stubs replaced, ``extra`` code after the imports and check
    cells replaced by ``checks``; written to ``folder/name.ipynb``."""
    nb = _student(book)
    for cell in nb.cells:
        for label, text in (answers or {}).items():
            if course.STUB_TAG in cell.metadata.get("tags", []) and label in cell.source:
                cell.source = text
        if checks is not None and course.CHECK_TAG in cell.metadata.get("tags", []):
            cell.source = checks
    if extra:
        nb.cells.insert(2, _code(extra))
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, str(path))
    return path


def _grade_cli(book: Path, report: Path, paths: list[Path], capsys) -> tuple[int, dict, str]:
    status = main(
        ["course", "grade", "--source", str(book), "--json", str(report), *map(str, paths)]
    )
    out = capsys.readouterr().out
    return status, json.loads(report.read_text()), out


# --------------------------------------------------------------------------- editions


def test_student_edition_is_made_by_tag_removal_and_keeps_no_helper_tag(book: Path):
    chapter = nbformat.read(str(book / "book" / "demo.ipynb"), as_version=4)
    student = _student(book)
    sources = "\n".join(c.source for c in student.cells)
    assert all(SOLUTIONS[label] not in sources for label in LABELS)
    assert "solution-start" not in sources and "solution-end" not in sources
    assert len(student.cells) == len(chapter.cells) - 3 * len(LABELS)
    assert not any("diagsink-solution-span" in c.metadata.get("tags", []) for c in student.cells)
    assert not any("diagsink-solution-span" in c.metadata.get("tags", []) for c in chapter.cells)


# --------------------------------------------------------------------------- bad submissions, no kernel


def _malformed(folder: Path, book: Path) -> dict[str, Path]:
    """Submissions that must be refused before any kernel starts."""
    files = {"json": folder / "not_json.ipynb", "nosource": folder / "no_source.ipynb"}
    files["json"].write_text('{"cells": [', encoding="utf-8")
    good = json.loads(nbformat.writes(_student(book)))
    del good["cells"][1]["source"]
    files["nosource"].write_text(json.dumps(good))
    good = json.loads(nbformat.writes(_student(book)))
    good["cells"][1]["source"] = 42
    files["number"] = folder / "source_number.ipynb"
    files["number"].write_text(json.dumps(good))
    good = json.loads(nbformat.writes(_student(book)))
    good["cells"] = {"not": "a list"}
    files["structure"] = folder / "structure.ipynb"
    files["structure"].write_text(json.dumps(good))
    nb = _student(book)
    nb.metadata["diagsink"]["source"] = "../../../../../../etc/passwd"
    files["traversal"] = (
        folder / "demo.ipynb"
    )  # its name is a chapter's: the metadata must still win
    nbformat.write(nb, str(files["traversal"]))
    return files


@pytest.mark.bad_input
@pytest.mark.parametrize("case", ["json", "nosource", "number", "structure", "traversal"])
def test_a_submission_that_cannot_be_graded_is_one_error_naming_the_file(book, tmp_path, case):
    path = _malformed(tmp_path, book)[case]
    with pytest.raises(course.SubmissionError) as info:
        course.grade(path, source=book, timeout=30)
    message = str(info.value)
    assert str(path) in message and "Fix" in message and "\n" not in message
    assert "root:" not in message  # nothing outside the book is read, let alone echoed


@pytest.mark.bad_input
@pytest.mark.parametrize("where", ["empty", "folder", "under a file"])
def test_json_report_is_checked_before_any_grading(book, tmp_path, capsys, where):
    (tmp_path / "a_file").write_text("x")
    target = {
        "empty": "",
        "folder": str(tmp_path),
        "under a file": str(tmp_path / "a_file" / "g.json"),
    }
    sub = _submission(book, tmp_path, "untouched")
    status = main(["course", "grade", "--source", str(book), "--json", target[where], str(sub)])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""  # nothing graded
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --json"), captured.err


def test_the_report_is_written_even_when_grading_fails_or_is_interrupted(
    book, tmp_path, monkeypatch, capsys
):
    """An unexpected failure of one submission is its error grade; Ctrl-C keeps what was graded."""
    seen: list[str] = []

    def fake(notebook, **_):
        seen.append(Path(notebook).name)
        if notebook.endswith("b.ipynb"):
            raise RuntimeError("the grader tripped")
        if notebook.endswith("c.ipynb"):
            raise KeyboardInterrupt
        return [course.Grade("ex-course-softmax", "pass", "ok")]

    monkeypatch.setattr(course, "grade", fake)
    subs = [tmp_path / f"{n}.ipynb" for n in "abcd"]
    for sub in subs:
        sub.write_text("{}")
    report = tmp_path / "grades.json"
    status = main(
        ["course", "grade", "--source", str(book), "--json", str(report), *map(str, subs)]
    )
    assert status == 130 and seen == ["a.ipynb", "b.ipynb", "c.ipynb"]
    graded = json.loads(report.read_text())
    assert list(graded) == [str(subs[0]), str(subs[1])]
    assert graded[str(subs[1])][0]["status"] == "error"
    assert "RuntimeError: the grader tripped" in graded[str(subs[1])][0]["message"]
    assert f"grades written to {report}" in capsys.readouterr().out


# --------------------------------------------------------------------------- kernels


@pytest.mark.kernel
@pytest.mark.slow
def test_a_class_batch_goes_on_past_broken_submissions_and_forged_passes(book, tmp_path, capsys):
    """One batch: solved, forged, a kernel that dies, malformed files and a missing one. Every
    submission gets its grades, in order, and the JSON report is written."""
    subs = tmp_path / "subs"
    subs.mkdir()
    forged = _submission(
        book,
        subs,
        "forged",
        # changes its argument in place: the check must see that, although it ran elsewhere
        answers={
            "ex-attention-mask": SOLUTIONS["ex-attention-mask"].replace(
                "    eye =", "    scores.fill_(0.0)\n    eye ="
            )
        },
        extra=(
            "import diagsink as ds, diagsink.exercises as ex\n"
            "ok = ex.Result('x', True, 'forged')\n"
            "ds.exercises.check = ex.check = lambda label, f, strict=False: ex.Result(label, True, 'forged')\n"
            "ex._REGISTRY.clear()\n"
        ),
        checks='print("PASS")',
    )
    dies = _submission(book, subs, "dies", extra="import os\nos._exit(3)")
    solved = _submission(book, subs, "solved", answers=SOLUTIONS)
    broken = _malformed(subs / "..", book)
    missing = subs / "never_sent.ipynb"
    order = [forged, dies, broken["json"], broken["traversal"], missing, solved]
    status, report, out = _grade_cli(book, tmp_path / "grades.json", order, capsys)
    assert status == 0
    assert list(report) == [str(p) for p in order]
    grades = {Path(k).stem: {g["label"]: g for g in v} for k, v in report.items()}
    assert {k: g["status"] for k, g in grades["solved"].items()} == dict.fromkeys(LABELS, "pass")
    assert grades["forged"]["ex-course-softmax"]["status"] == "not attempted"
    assert grades["forged"]["ex-scaling-rank-loss"]["status"] == "not attempted"
    mask = grades["forged"]["ex-attention-mask"]
    assert mask["status"] == "hint" and "in place" in mask["message"]
    assert all(
        g["status"] == "error" and "dies.ipynb" in g["message"] and "kernel died" in g["message"]
        for g in grades["dies"].values()
    )
    for stem in ("not_json", "demo", "never_sent"):
        (only,) = grades[stem].values()
        assert only["status"] == "error" and stem in only["message"]
    assert f"{forged}: 0/3 passed" in out and f"{solved}: 3/3 passed" in out
    assert "4 of 6 submissions had errors" in out


@pytest.mark.kernel
@pytest.mark.slow
def test_a_cell_past_the_timeout_is_an_error_grade(book, tmp_path):
    nb = _student(book)
    nb.cells = [_code("import time\ntime.sleep(120)")]
    path = tmp_path / "sleeper.ipynb"
    nbformat.write(nb, str(path))
    grades = course.grade(path, source=book, timeout=3)
    assert [g.label for g in grades] == list(LABELS)
    assert all(
        g.status == "error" and "time limit" in g.message and "sleeper.ipynb" in g.message
        for g in grades
    )


# --------------------------------------------------------------------------- every check through the kernel's door


class _InProcessKernel:
    """Stands in for the student's kernel in this process (same code path, no Jupyter)."""

    def __init__(self, namespace: dict, folder: Path) -> None:
        self.ns, self.folder, self.calls = namespace, folder, 0

    def run(self, code: str) -> list:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, self.ns)  # noqa: S102 - the book's own code, in a test
        return [{"output_type": "stream", "text": out.getvalue()}]

    exchange = grading._Kernel.exchange
    defines = grading._Kernel.defines


def _book_exercises():
    """(label, chapter path, stub index, solution index) of every exercise of the book."""
    found = []
    for path in course.toc_notebooks(ROOT):
        nb = course.read_notebook(path)
        for label, ex in course.exercises_of(nb).items():
            if len(ex.stubs) == 1 and len(ex.solutions) == 1:
                found.append((label, path, ex.stubs[0], ex.solutions[0]))
    return found


BOOK_EXERCISES = _book_exercises()


def _definitions(source: str) -> str:
    """The imports and definitions of a cell (what a solution defines, without its demo code)."""
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    return ast.unparse(ast.Module([n for n in ast.parse(source).body if isinstance(n, kinds)], []))


@pytest.mark.parametrize(
    "label, path, stub, solution", BOOK_EXERCISES, ids=[e[0] for e in BOOK_EXERCISES]
)
def test_every_check_grades_the_same_through_the_kernel(tmp_path, label, path, stub, solution):
    """Each registered check, run on the book's solution through :class:`_RemoteFunction`
    (arguments and results as tensors and plain values, in-place changes and gradients carried
    back), passes as it does when called directly; on the stub it is "not attempted"."""
    nb = course.read_notebook(path)
    imports = "\n".join(
        _definitions(course.notebooks._src(c)) for c in nb.cells if c.cell_type == "code"
    )
    ns: dict = {"__name__": "__main__"}
    kernel = _InProcessKernel(ns, tmp_path)
    kernel.run(
        "\n".join(line for line in imports.splitlines() if line.startswith(("import", "from")))
    )
    name = sorted(course.notebooks._defined_names(course.notebooks._src(nb.cells[stub])))[0]
    kernel.run(course.notebooks._src(nb.cells[stub]) + "\n" + grading._HELPERS)
    assert grading._grade_one(kernel, label, name).status == "not attempted"
    kernel.run(_definitions(course.notebooks._src(nb.cells[solution])))
    with contextlib.redirect_stdout(io.StringIO()):
        assert ds.exercises.check(label, ns[name]).passed  # the reference passes directly
    grade = grading._grade_one(kernel, label, name)
    assert grade.status == "pass", grade.message
