"""``diagsink course export | grade | check``: the commands of :mod:`diagsink.course`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .._io import atomic_write_text, ensure_writable_dir
from ..errors import ConfigError
from ._args import positive

__all__ = ["add_commands"]


def _cmd_export(args: argparse.Namespace) -> int:
    # reason: diagsink.course needs nbformat; train/reproduce must run without it (GPU machine)
    from ..course import export

    report = export(args.out, source=args.source, solutions=args.solutions)
    for edition in report.editions:
        print(f"{edition:10s} {report.out / edition}  ({len(report.notebooks)} notebooks)")
    print(f"{report.exercises} exercises; chapters: {', '.join(report.notebooks)}")
    if not args.solutions:
        print("no instructor notebooks written (--no-solutions)")
    return 0


def _json_target(text: str | None) -> Path | None:
    """``--json FILE`` checked before any grading: not empty, not a folder, in a writable folder."""
    if text is None:
        return None
    target = Path(text)
    if not text.strip() or target.is_dir():
        raise ConfigError(
            f"--json {text!r} is not a file name. Fix: pass the report's file, e.g. --json grades.json."
        )
    ensure_writable_dir(target.parent, "--json")
    if target.exists() and not os.access(target, os.W_OK):
        raise PermissionError(
            f"--json {target} exists and is not writable. Fix: choose another file or fix its permissions."
        )
    return target


def _grade_one_file(notebook: str, args: argparse.Namespace) -> list:
    """The grades of one submission; a submission that cannot be graded is one ``error`` grade."""
    # reason: diagsink.course needs nbformat; train/reproduce must run without it (GPU machine)
    from ..course import Grade, grade

    if not Path(notebook).is_file():
        return [Grade("(notebook)", "error", f"{notebook} does not exist or is not a file")]
    try:
        return grade(notebook, source=args.source, timeout=args.timeout)
    except Exception as exc:  # noqa: BLE001 - one bad submission never stops the batch
        return [Grade("(notebook)", "error", f"{type(exc).__name__}: {exc}")]


def _cmd_grade(args: argparse.Namespace) -> int:
    # reason: diagsink.course needs nbformat; train/reproduce must run without it (GPU machine)
    from ..course import find_book_root

    target = _json_target(args.json)
    find_book_root(args.source)  # no book: one error line before any notebook runs
    report: dict[str, list[dict[str, str]]] = {}
    failed: list[str] = []
    try:
        for notebook in args.notebooks:
            grades = _grade_one_file(notebook, args)
            passed = sum(g.status == "pass" for g in grades)
            print(f"{notebook}: {passed}/{len(grades)} passed")
            for g in grades:
                print(f"  {g.status:14s} {g.label}  {g.message}")
            if any(g.status == "error" for g in grades):
                failed.append(notebook)
            report[str(notebook)] = [
                {"label": g.label, "status": g.status, "message": g.message} for g in grades
            ]
    finally:  # written even when the batch is interrupted: what was graded is kept
        if target is not None:
            atomic_write_text(target, json.dumps(report, indent=2) + "\n")
            print(f"grades written to {target}")
    if failed:
        print(f"{len(failed)} of {len(args.notebooks)} submissions had errors: {', '.join(failed)}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    # reason: diagsink.course needs nbformat; train/reproduce must run without it (GPU machine)
    from ..course import exercise_problems, exercises_of, find_book_root, toc_notebooks
    from ..course.notebooks import read_notebook  # reason: as above

    root = find_book_root(args.source)
    problems: list[str] = []
    count = 0
    for path in toc_notebooks(root):
        nb = read_notebook(path)
        problems += exercise_problems(nb, os.path.relpath(path, root))
        count += sum(1 for ex in exercises_of(nb).values() if ex.stubs)
    if problems:
        raise ConfigError("the exercise pattern is broken:\n  " + "\n  ".join(problems))
    print(f"{count} exercises, each with one stub, one solution and one registered check.")
    return 0


def _source_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        default=None,
        metavar="ROOT",
        help="folder holding _toc.yml (default: found from here)",
    )


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
    _source_option(exp)
    exp.set_defaults(func=_cmd_export)

    grd = sub.add_parser(
        "grade",
        help="grade submitted student notebooks with the registered checks",
        description="Run each submitted notebook (without its check cells) in its own kernel, then "
        "the registered check of every exercise of its chapter, in this process, on the student's "
        "function; print pass / hint / not attempted / missing / error per exercise. A submission "
        "that cannot be graded is recorded as an error and the batch goes on. This EXECUTES the "
        "students' code: run it in a container or as a throwaway user (book/instructors.md).",
    )
    grd.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="submitted .ipynb files")
    grd.add_argument("--json", default=None, metavar="FILE", help="also write the grades as JSON")
    grd.add_argument(
        "--timeout", type=positive, default=600, help="seconds per cell (default: 600)"
    )
    _source_option(grd)
    grd.set_defaults(func=_cmd_grade)

    chk = sub.add_parser("check", help="check the exercise pattern of every chapter (no execution)")
    _source_option(chk)
    chk.set_defaults(func=_cmd_check)
