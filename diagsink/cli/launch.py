"""``--distributed N``: run a training command on N processes through ``torchrun``.

The command-line side of :mod:`diagsink.engine.distributed` (explained in the appendix "Running
it bigger", ``book/scaling.ipynb``): a command given ``--distributed N`` starts ``torchrun`` with
itself as the worker command; under ``torchrun`` each worker joins the process group
(:func:`~diagsink.engine.distributed.session`) and runs the command with this rank's
:class:`~diagsink.engine.distributed.DDPContext` as its ``processes`` argument
(:func:`~diagsink.engine.distributed.data_parallel`). A command function takes
``(args, processes=None)``; without torchrun it is called with ``args`` alone (one process).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import subprocess
import sys
from collections.abc import Callable

import torch

from ..engine.distributed import data_parallel, in_torchrun, session
from ._args import whole_number

__all__ = ["add_distributed", "launch_command"]


def launch_command(
    parser: argparse.ArgumentParser, args: argparse.Namespace, nproc: int
) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node=N -m diagsink <command> <options>``.

    The options are rebuilt from ``args`` (everything except ``--distributed``).
    """
    argv = [args.command]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "distributed"):
            continue
        value = getattr(args, action.dest, None)
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "diagsink",
        *argv,
    ]


_processes = whole_number(1, " of processes", "--distributed needs at least 1 process")


def _nproc(text: str) -> int | str:
    return text if text == "auto" else _processes(text)  # "auto": a bare --distributed


def _distributed_command(
    parser: argparse.ArgumentParser,
    func: Callable[..., int],
    args: argparse.Namespace,
) -> int:
    """Run ``func`` as this rank under torchrun, start torchrun for ``--distributed``, or run it plainly."""
    if in_torchrun():  # a worker: join the group, run the command as this rank on its device, leave
        with session(args.device) as ddp:
            args.device = str(ddp.device)
            if ddp.is_main:
                return data_parallel(func, ddp, args)
            with contextlib.redirect_stdout(io.StringIO()):  # one summary line, from rank 0
                return data_parallel(func, ddp, args)
    if args.distributed:  # start the workers
        nproc = args.distributed if args.distributed != "auto" else _default_nproc(args.device)
        return subprocess.run(launch_command(parser, args, nproc), check=False).returncode
    return func(args)


def _default_nproc(device: str | None) -> int:
    """One process per visible GPU when training on CUDA, else 2."""
    use_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    return max(1, torch.cuda.device_count()) if use_cuda else 2


def add_distributed(parser: argparse.ArgumentParser) -> None:
    """Give a command ``--distributed N`` and make it run under torchrun (see the module docstring)."""
    parser.add_argument(
        "--distributed",
        nargs="?",
        type=_nproc,
        const="auto",
        default=None,
        metavar="N",
        help="data-parallel training on N processes of this machine via torchrun (default N: one per GPU, "
        "2 on a CPU); under torchrun itself this is automatic",
    )
    func = parser.get_default("func")
    parser.set_defaults(func=functools.partial(_distributed_command, parser, func))
