"""Course tooling: exercise checks, the exercise cell pattern, and the student/instructor export.

No test here runs a whole chapter (nbval does, once per `make test`). A one-chapter synthetic
book in a temporary folder is exported, executed in both editions and graded in kernels. Of the
real chapters, what the editions change is checked: each chapter is exported, the instructor
edition must be the chapter cell for cell, the student edition the chapter less its solutions;
the student's exercise cells are extracted and run in this process after the chapter's imports
(every check must stop at its stub's ``NotImplementedError``); the grader runs once on one real
chapter's exercise cells.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import diagsink as ds
from diagsink import course
from diagsink.cli import main
from diagsink.errors import ConfigError

from conftest import ROOT

CHAPTERS = course.toc_notebooks(ROOT)
LABEL = "ex-course-softmax"  # the worked example of book/instructors.md, checked in diagsink/exercises/course.py


# --------------------------------------------------------------------------- a tiny book


def _md(text: str):
    return nbformat.v4.new_markdown_cell(text)


def _code(text: str, *tags: str):
    cell = nbformat.v4.new_code_cell(text)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


STUB = f'def row_softmax(scores):\n    raise NotImplementedError("{LABEL}")\n'
SOLUTION = (
    "def row_softmax(scores):\n"
    "    shifted = scores - scores.amax(dim=-1, keepdim=True)\n"
    "    e = shifted.exp()\n"
    "    return e / e.sum(dim=-1, keepdim=True)\n"
)


def demo_notebook(*, solution_tags=("exercise-solution",), stub=STUB, check_label=LABEL):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        _md("# Demo chapter\n\nSome text."),
        _code("import diagsink as ds\nimport torch\nprint(ds.settings().mode)"),
        _code("x = torch.ones(3)\nassert x.sum() == 3"),
        _md(
            f"## Exercises\n\n```{{exercise}} Softmax over rows\n:label: {LABEL}\n\nWrite `row_softmax`.\n```"
        ),
        _code(stub, "exercise-stub"),
        _md(f"```{{solution-start}} {LABEL}\n:class: dropdown\n```"),
        _code(SOLUTION, *solution_tags),
        _md("```{solution-end}\n```"),
        _code(f'ds.exercises.check("{check_label}", row_softmax, strict=True)', "exercise-check"),
    ]
    return nb


@pytest.fixture
def mini_book(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "book").mkdir(parents=True)
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nparts:\n  - caption: Demo\n    chapters:\n      - file: book/demo\n"
    )
    (root / "book" / "intro.md").write_text("# Intro\n")
    # artifacts the chapters read by relative path
    (root / "book" / "results" / "quick").mkdir(parents=True)
    (root / "book" / "results" / "quick" / "run.json").write_text('{"mae": 1.0}')
    (root / "book" / "_static").mkdir()
    (root / "book" / "_static" / "site.css").write_text("")
    nbformat.write(demo_notebook(), str(root / "book" / "demo.ipynb"))
    return root


def _sources(nb) -> str:
    return "\n".join("".join(c.source) for c in nb.cells)


# --------------------------------------------------------------------------- checks framework


def test_worked_example_reference_passes_and_wrong_answers_get_hints(capsys):
    ns: dict = {}
    exec(SOLUTION, ns)
    assert ds.exercises.check(LABEL, ns["row_softmax"]).passed
    wrong_dim = ds.exercises.check(LABEL, lambda s: torch.softmax(s, dim=-2))
    naive = ds.exercises.check(LABEL, lambda s: s.exp() / s.exp().sum(-1, keepdim=True))
    assert not wrong_dim.passed and "last dimension" in wrong_dim.message
    assert not naive.passed and "NaN or inf" in naive.message
    out = capsys.readouterr().out
    assert "PASS" in out and "HINT" in out
    assert "amax" not in out and "softmax(" not in out  # a hint never shows the solution


def test_check_strict_raises_and_stub_error_propagates():
    with pytest.raises(ds.exercises.ExerciseFailed):
        ds.exercises.check(LABEL, lambda s: s, strict=True)
    ns: dict = {}
    exec(STUB, ns)
    with pytest.raises(NotImplementedError, match=LABEL):
        ds.exercises.check(LABEL, ns["row_softmax"])


def test_compare_tensors_names_the_mistake():
    x = torch.randn(2, 5, 5)
    cmp = ds.exercises.compare_tensors
    assert cmp(x.clone(), x) is None
    assert "shape" in cmp(x[0], x)
    assert "transpose" in cmp(x.transpose(-1, -2), x)
    assert "constant factor" in cmp(x / 8**0.5, x)
    assert "torch.Tensor" in cmp(x.tolist(), x)
    assert "wrong values" in cmp(x + torch.randn(2, 5, 5), x)
    assert ds.exercises.first_hint(None, "b", "c") == "b" and ds.exercises.first_hint(None) is None


def test_fresh_generator_gives_fresh_inputs_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = torch.randn(4, generator=ds.exercises.fresh_generator())
    b = torch.randn(4, generator=ds.exercises.fresh_generator())
    assert not torch.equal(a, b)
    assert torch.equal(state, torch.get_rng_state())


# --------------------------------------------------------------------------- pattern and editions


def test_student_version_drops_solutions_keeps_stubs_and_checks():
    nb = demo_notebook()
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="quick\n")]
    nb.cells[1].execution_count = 3
    student = course.student_version(nb, "book/demo.ipynb")
    text = _sources(student)
    assert "amax" not in text and "solution-start" not in text and "solution-end" not in text
    assert (
        f'NotImplementedError("{LABEL}")' in text
        and f'check("{LABEL}"' in text
        and "{exercise}" in text
    )
    assert len(student.cells) == len(nb.cells) - 3
    assert all(
        c.outputs == [] and c.execution_count is None
        for c in student.cells
        if c.cell_type == "code"
    )
    assert student.metadata["diagsink"]["edition"] == "student"
    assert nb.cells[1].outputs, "the source notebook must not be modified"
    instructor = course.instructor_version(nb)
    assert _sources(instructor) == _sources(nb)
    assert all(c.outputs == [] for c in instructor.cells if c.cell_type == "code")


def test_pattern_is_valid_for_the_demo():
    assert course.exercise_problems(demo_notebook(), "demo") == []
    (ex,) = course.exercises_of(demo_notebook()).values()
    assert (ex.label, ex.stubs, ex.solutions, ex.checks) == (LABEL, [4], [6], [8])


@pytest.mark.parametrize(
    "broken, expected",
    [
        (dict(solution_tags=()), "must be tagged"),  # untagged solution would leak to students
        (
            dict(stub='def row_softmax(s):\n    raise NotImplementedError("ex-course-other")\n'),
            "must raise",
        ),
        (dict(check_label="ex-course-typo"), "0 check cells"),
        (
            dict(stub="def other(s):\n    raise NotImplementedError('ex-course-softmax')\n"),
            "does not redefine",
        ),
    ],
)
def test_pattern_problems_are_found(broken, expected):
    problems = course.exercise_problems(demo_notebook(**broken), "demo")
    assert any(expected in p for p in problems), problems


def test_unregistered_label_is_reported():
    problems = course.exercise_problems(demo_notebook(), "demo", registered=[])
    assert any("no check registered" in p for p in problems)


# --------------------------------------------------------------------------- export


def test_export_cli_writes_student_and_instructor(mini_book: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["course", "export", "--out", str(out), "--source", str(mini_book)]) == 0
    student = nbformat.read(str(out / "student" / "demo.ipynb"), as_version=4)
    instructor = nbformat.read(str(out / "instructor" / "demo.ipynb"), as_version=4)
    assert "amax" not in _sources(student) and "amax" in _sources(instructor)
    assert sorted(p.name for p in out.iterdir()) == ["instructor", "student"]  # no staging left
    for edition in ("student", "instructor"):  # folders next to the chapters travel with them
        assert json.loads((out / edition / "results" / "quick" / "run.json").read_text()) == {
            "mae": 1.0
        }
        assert not (out / edition / "_static").exists()
    # a second export replaces the first (the folders are ours: they carry the marker)
    (out / "student" / "stale.ipynb").write_text("{}")
    assert main(["course", "export", "--out", str(out), "--source", str(mini_book)]) == 0
    assert not (out / "student" / "stale.ipynb").exists()
    assert "1 exercises" in capsys.readouterr().out


def test_export_no_solutions_writes_only_students(mini_book: Path, tmp_path: Path):
    out = tmp_path / "handout"
    report = course.export(out, source=mini_book, solutions=False)
    assert report.editions == ["student"] and not (out / "instructor").exists()
    course.export(out, source=mini_book)  # with solutions
    with pytest.raises(ConfigError, match="holds solutions"):
        course.export(out, source=mini_book, solutions=False)


def test_export_refuses_folders_it_does_not_own(mini_book: Path, tmp_path: Path):
    out = tmp_path / "out"
    (out / "student").mkdir(parents=True)
    (out / "student" / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not written by"):
        course.export(out, source=mini_book)
    assert (out / "student" / "mine.txt").read_text() == "keep me"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out2 = tmp_path / "out2"
    out2.mkdir()
    (out2 / "instructor").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match="symbolic link"):
        course.export(out2, source=mini_book)
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(ConfigError, match="overlaps the book"):
        course.export(mini_book / "book" / "export", source=mini_book)


def test_export_refuses_a_broken_pattern_and_writes_nothing(mini_book: Path, tmp_path: Path):
    nbformat.write(demo_notebook(solution_tags=()), str(mini_book / "book" / "demo.ipynb"))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="leak"):
        course.export(out, source=mini_book)
    assert not (out / "student").exists()


def test_export_refuses_a_non_writable_folder(mini_book: Path, tmp_path: Path, capsys):
    if os.geteuid() == 0:  # root writes anywhere permissions allow; use a read-only file system
        if not Path("/proc/self").is_dir():
            pytest.skip("running as root without /proc: no unwritable folder to test with")
        out = Path("/proc/diagsink-course-export")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        out = locked / "out"
    try:
        assert main(["course", "export", "--out", str(out), "--source", str(mini_book)]) == 2
    finally:
        if os.geteuid() != 0:
            (tmp_path / "locked").chmod(0o755)
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write into") and "--out" in err


def test_export_cli_reports_a_file_as_out(mini_book: Path, tmp_path: Path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert main(["course", "export", "--out", str(f), "--source", str(mini_book)]) == 2
    assert "is a file" in capsys.readouterr().err


# --------------------------------------------------------------------------- the real chapters


def _chapter_ids(p: Path) -> str:
    return p.stem


@pytest.mark.parametrize("path", CHAPTERS, ids=_chapter_ids)
def test_chapter_follows_the_exercise_pattern(path: Path):
    """Every stub has exactly one solution and one check with its label, registered, named in
    the NotImplementedError, and no untagged code between the solution markers."""
    nb = nbformat.read(str(path), as_version=4)
    problems = course.exercise_problems(nb, path.name)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", CHAPTERS, ids=_chapter_ids)
def test_chapter_ends_with_two_to_four_exercises(path: Path):
    nb = nbformat.read(str(path), as_version=4)
    exercises = [ex for ex in course.exercises_of(nb).values() if ex.stubs]
    assert 2 <= len(exercises) <= 4, (
        f"{path.name}: {len(exercises)} exercises with code, expected 2-4"
    )
    first = min(i for ex in exercises for i in ex.directive + ex.stubs)
    later_code = [
        i
        for i, c in enumerate(nb.cells[first:], start=first)
        if c.cell_type == "code"
        and not set(c.metadata.get("tags", []))
        & {course.STUB_TAG, course.SOLUTION_TAG, course.CHECK_TAG}
    ]
    assert not later_code, (
        f"{path.name}: the exercises must end the chapter; untagged code cells {later_code} follow them"
    )


def test_every_registered_check_belongs_to_an_exercise():
    used = set()
    for path in CHAPTERS:
        used |= set(course.exercises_of(nbformat.read(str(path), as_version=4)))
    used |= (
        {LABEL} if f":label: {LABEL}" in (ROOT / "book" / "instructors.md").read_text() else set()
    )
    orphans = sorted(set(ds.exercises.labels()) - used)
    assert not orphans, f"checks registered for exercises that no chapter has: {orphans}"


# --------------------------------------------------------------------------- execution


def _run_both_editions(student_path: Path, instructor_path: Path, cwd: Path) -> list[str]:
    """Execute a student and an instructor notebook in ONE kernel; return the problems.

    The editions differ only from the first exercise on, so the shared prefix runs once,
    then the student tail (errors allowed only if NotImplementedError; every check must
    raise it, proving the stubs are stubs), then the instructor tail (no error allowed:
    it re-runs every stub, solution and check, overwriting what the student tail defined).
    """
    student = nbformat.read(str(student_path), as_version=4)
    instructor = nbformat.read(str(instructor_path), as_version=4)
    p = 0
    while (
        p < min(len(student.cells), len(instructor.cells))
        and student.cells[p].source == instructor.cells[p].source
        and student.cells[p].cell_type == instructor.cells[p].cell_type
    ):
        p += 1
    n_student_tail = len(student.cells) - p
    combined = nbformat.v4.new_notebook(metadata=instructor.metadata)
    combined.cells = instructor.cells[:p] + student.cells[p:] + instructor.cells[p:]
    NotebookClient(
        combined,
        timeout=600,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(cwd)}},
    ).execute()
    problems = []
    for i, cell in enumerate(combined.cells):
        if cell.cell_type != "code":
            continue
        part = "shared" if i < p else ("student" if i < p + n_student_tail else "instructor")
        errors = [o for o in cell.outputs if o.output_type == "error"]
        tags = cell.metadata.get("tags", [])
        for err in errors:
            if part == "student" and err.ename == "NotImplementedError":
                continue
            problems.append(f"{student_path.name} ({part} cell {i}): {err.ename}: {err.evalue}")
        if part == "student" and course.CHECK_TAG in tags:
            labels = course.notebooks._check_labels("".join(cell.source))
            if not any(e.ename == "NotImplementedError" and e.evalue in labels for e in errors):
                problems.append(
                    f"{student_path.name}: the student's check of {labels} did not hit the stub's NotImplementedError"
                )
    return problems


@pytest.mark.kernel
def test_mini_book_editions_execute(mini_book: Path, tmp_path: Path):
    out = tmp_path / "out"
    course.export(out, source=mini_book)
    assert (
        _run_both_editions(
            out / "student" / "demo.ipynb", out / "instructor" / "demo.ipynb", out / "student"
        )
        == []
    )
    # and the harness really catches a wrong solution
    nbformat.write(demo_notebook(), str(mini_book / "book" / "demo.ipynb"))
    nb = nbformat.read(str(mini_book / "book" / "demo.ipynb"), as_version=4)
    nb.cells[
        6
    ].source = (
        "def row_softmax(scores):\n    return scores.exp() / scores.exp().sum(-1, keepdim=True)\n"
    )
    nbformat.write(nb, str(mini_book / "book" / "demo.ipynb"))
    course.export(out, source=mini_book)
    problems = _run_both_editions(
        out / "student" / "demo.ipynb", out / "instructor" / "demo.ipynb", out / "student"
    )
    assert len(problems) == 1 and "instructor" in problems[0] and "ExerciseFailed" in problems[0]


def _import_prelude(cells) -> str:
    """The top-level ``import`` statements of ``cells``' code, in order: what a tail needs."""
    lines = []
    for cell in cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # an IPython magic: nbval runs that cell
            continue
        lines += [
            ast.get_source_segment(cell.source, node)
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
    return "\n".join(lines)


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def _export_one(path: Path, out: Path) -> tuple:
    """``(source, student, instructor)`` of the chapter ``path`` exported on its own into ``out``
    (so one broken chapter does not hide the others)."""
    course.export(out, source=ROOT, notebooks=[path])
    read = lambda p: nbformat.read(str(p), as_version=4)  # noqa: E731
    return read(path), read(out / "student" / path.name), read(out / "instructor" / path.name)


def _is_solution_part(cell) -> bool:
    """A solution cell or a marker of its gate: what the student edition leaves out."""
    if cell.cell_type == "code":
        return course.SOLUTION_TAG in cell.metadata.get("tags", [])
    return "{solution-start}" in cell.source or "{solution-end}" in cell.source


@pytest.mark.parametrize("path", CHAPTERS, ids=_chapter_ids)
def test_the_editions_differ_by_the_solutions_only(path: Path, tmp_path: Path):
    """Instructor edition: the chapter cell for cell. Student edition: the chapter without its
    solution cells and their gates (stubs and checks kept, in order), no solution's code
    anywhere; both without outputs. Nothing is executed: nbval runs the chapter itself."""
    source, student, instructor = _export_one(path, tmp_path / "export")
    assert instructor.metadata["diagsink"]["edition"] == "instructor"
    assert student.metadata["diagsink"]["edition"] == "student"
    assert _cells(instructor) == _cells(source), f"{path.name}: the instructor edition differs"
    kept = [c for c in source.cells if not _is_solution_part(c)]
    assert _cells(student) == [(c.cell_type, c.source) for c in kept], (
        f"{path.name}: the student edition is not the chapter less its solutions"
    )
    solutions = [c.source for c in source.cells if _is_solution_part(c) and c.cell_type == "code"]
    assert not set(solutions) & {c.source for c in student.cells}  # (how many: the test above)
    for edition in (student, instructor):
        assert all(
            not c.outputs and c.execution_count is None
            for c in edition.cells
            if c.cell_type == "code"
        )


def _exercise_tail(source, student) -> tuple[int, list]:
    """``(first, cells)``: the index of the chapter's first exercise and the student's cells from it."""
    directives = [i for ex in course.exercises_of(source).values() for i in ex.directive]
    first = min(directives, default=len(source.cells))  # no exercises: nothing to run
    assert _cells(student)[:first] == _cells(source)[:first]
    return first, student.cells[first:]


@pytest.mark.parametrize("path", CHAPTERS, ids=_chapter_ids)
def test_every_student_stub_reaches_its_check(path: Path, tmp_path: Path, monkeypatch):
    """The student's exercise cells, extracted and run in this process after the chapter's
    imports (in the export folder, where the relative paths hold): every stub defines its
    function and every check stops at that stub's ``NotImplementedError``, nothing else fails.
    The chapter before its exercises is nbval's; the solutions passing their checks too."""
    source, student, _ = _export_one(path, tmp_path / "export")
    first, tail = _exercise_tail(source, student)
    monkeypatch.chdir(tmp_path / "export" / "student")
    namespace: dict = {"__name__": "__main__"}
    exec(compile(_import_prelude(source.cells[:first]), f"{path.name} imports", "exec"), namespace)
    problems = []
    for i, cell in enumerate(tail, start=first):
        if cell.cell_type != "code":
            continue
        is_check = course.CHECK_TAG in cell.metadata.get("tags", [])
        labels = course.notebooks._check_labels(cell.source) if is_check else []
        try:
            exec(compile(cell.source, f"{path.name} student cell {i}", "exec"), namespace)
        except NotImplementedError as e:
            if str(e) not in labels:
                problems.append(f"student cell {i}: NotImplementedError({e}) outside its check")
            continue
        except Exception as e:  # noqa: BLE001 - every error is reported, with its cell
            problems.append(f"student cell {i}: {type(e).__name__}: {e}")
            continue
        if is_check:
            problems.append(f"student cell {i}: the check of {labels} did not hit the stub")
    assert not problems, f"{path.name}: " + "\n".join(problems)


@pytest.mark.slow
@pytest.mark.kernel
def test_grade_a_real_chapter_from_its_exercise_cells(tmp_path: Path):
    """The grader on a real chapter's student edition, cut to its exercise cells (after the
    chapter's imports): the first exercise solved with the chapter's own solution passes, the
    other stubs are "not attempted" (one kernel, no whole chapter)."""
    path = ROOT / "book" / "attention.ipynb"  # self-contained solutions, checks of a second
    source, student, _ = _export_one(path, tmp_path / "export")
    first, tail = _exercise_tail(source, student)
    exercises = [ex for ex in course.exercises_of(source).values() if ex.stubs]
    solved = exercises[0]
    stub_source = source.cells[solved.stubs[0]].source
    submission = nbformat.v4.new_notebook(metadata=student.metadata)
    submission.cells = [nbformat.v4.new_code_cell(_import_prelude(source.cells[:first]))]
    for cell in tail:
        cell = nbformat.from_dict(json.loads(json.dumps(cell)))
        if cell.source == stub_source:
            cell.source = source.cells[solved.solutions[0]].source
        submission.cells.append(cell)
    target = tmp_path / "export" / "student" / path.name
    nbformat.write(submission, str(target))
    grades = {g.label: g.status for g in course.grade(target, source=ROOT)}
    assert grades == {ex.label: "pass" if ex is solved else "not attempted" for ex in exercises}


@pytest.mark.slow
@pytest.mark.kernel
def test_grade_submissions(mini_book: Path, tmp_path: Path, capsys):
    """Three submissions of the exported student notebook: untouched, solved, wrong (and with
    a tampered check cell, which must not change the grade)."""
    out = tmp_path / "out"
    course.export(out, source=mini_book, solutions=False)
    student = nbformat.read(str(out / "student" / "demo.ipynb"), as_version=4)
    stub_index = next(
        i for i, c in enumerate(student.cells) if course.STUB_TAG in c.metadata.get("tags", [])
    )
    check_index = next(
        i for i, c in enumerate(student.cells) if course.CHECK_TAG in c.metadata.get("tags", [])
    )
    subs = tmp_path / "submissions"
    subs.mkdir()
    nbformat.write(student, str(subs / "untouched.ipynb"))
    solved = nbformat.from_dict(json.loads(nbformat.writes(student)))
    solved.cells[stub_index].source = SOLUTION
    nbformat.write(solved, str(subs / "solved.ipynb"))
    wrong = nbformat.from_dict(json.loads(nbformat.writes(student)))
    wrong.cells[
        stub_index
    ].source = "def row_softmax(scores):\n    return torch.softmax(scores, dim=-2)\n"
    wrong.cells[
        check_index
    ].source = 'print("PASS [ex-course-softmax]")'  # tampering changes nothing
    nbformat.write(wrong, str(subs / "wrong.ipynb"))
    report = tmp_path / "grades.json"
    args = ["course", "grade", "--source", str(mini_book), "--json", str(report)]
    assert (
        main(args + [str(subs / n) for n in ("untouched.ipynb", "solved.ipynb", "wrong.ipynb")])
        == 0
    )
    grades = {Path(k).stem: v[0] for k, v in json.loads(report.read_text()).items()}
    assert grades["untouched"]["status"] == "not attempted"
    assert grades["solved"]["status"] == "pass"
    assert grades["wrong"]["status"] == "hint" and "last dimension" in grades["wrong"]["message"]
    assert "1/1 passed" in capsys.readouterr().out


def test_course_check_cli(mini_book: Path, capsys):
    assert main(["course", "check", "--source", str(mini_book)]) == 0
    assert "1 exercises" in capsys.readouterr().out
    nbformat.write(
        demo_notebook(check_label="ex-course-typo"), str(mini_book / "book" / "demo.ipynb")
    )
    assert main(["course", "check", "--source", str(mini_book)]) == 2
    assert "0 check cells" in capsys.readouterr().err
