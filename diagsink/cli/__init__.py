"""The ``diagsink`` command line.

Every command reports bad input as one line starting with ``error:`` (no traceback) and
exits with status 2; a successful command exits with 0. Subcommands are registered in
:func:`build_parser`; each command group has its module here (``data``, ``train``,
``sweep``, ``course``, ``probe``; ``launch`` gives training commands ``--distributed N``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

import torch

from .. import __version__
from ..errors import DiagsinkError
from ..runtime import settings
from . import course, data, probe, sweep, train

__all__ = ["main", "build_parser"]

# The modules of this package that contribute subcommands: each defines ``add_commands``.
# Add a module here when it gains a command (keep this the only registry).
COMMAND_MODULES: tuple[ModuleType, ...] = (course, data, train, sweep, probe)


def _cmd_info(args: argparse.Namespace) -> int:
    s = settings()
    print(f"diagsink {__version__}")
    print(f"mode:      {s.mode} (DIAGSINK_QUICK)")
    print(f"data root: {s.data_root} (DIAGSINK_DATA)")
    print(f"device:    {s.device} (torch {torch.__version__})")
    return 0


class _Parser(argparse.ArgumentParser):
    """``argparse`` with the package's error format: one ``error:`` line, status 2 (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(
        prog="diagsink",
        description="Temporal attention and its diagonal sink: data, training, figures, course material.",
    )
    parser.add_argument("--version", action="version", version=f"diagsink {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    info = sub.add_parser("info", help="show the mode, data folder and device in use")
    info.set_defaults(func=_cmd_info)

    for module in COMMAND_MODULES:
        module.add_commands(sub)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``diagsink`` console script. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DiagsinkError, ValueError, OSError) as exc:  # OSError: unwritable or missing paths
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: finished work is kept; rerun the same command to continue.",
            file=sys.stderr,
        )
        return 130
