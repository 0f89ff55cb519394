"""``diagsink course export | grade | check``: the commands of :mod:`diagsink.course`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .._io import atomic_write_text
from ..errors import ConfigError

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


def _cmd_grade(args: argparse.Namespace) -> int:
    # reason: diagsink.course needs nbformat; train/reproduce must run without it (GPU machine)
    from ..course import grade

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
