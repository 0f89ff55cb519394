"""``diagsink sweep {length,penalty,dropout,order}``: the command of :mod:`diagsink.engine.sweeps`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .._io import ensure_writable_dir
from ..data import load_metr_la
from ..engine.sweeps import SWEEPS, run_sweep, sweep_points
from ._args import device, positive

__all__ = ["add_commands"]


def _values(text: str) -> list[float | str]:
    """Comma-separated numbers, or names (``ts,st`` for the order sweep; checked by :func:`~diagsink.engine.sweeps.sweep_points`)."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if items and all(v.isidentifier() for v in items):
        return items  # names, e.g. block orders
    try:
        return [float(v) for v in items]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers (e.g. 12,24,48) or of names (e.g. ts,st)"
        ) from None


def _cmd_sweep(args: argparse.Namespace) -> int:

    variants = tuple(args.variants.split(",")) if args.variants else None

    sweep_points(args.sweep, args.values, variants)  # bad values fail before the data is loaded
    ensure_writable_dir(args.out, "--out")  # and an unwritable --out before any training
    t0 = time.perf_counter()
    res = run_sweep(
        args.sweep,
        args.protocol,
        seeds=args.seeds,
        values=args.values,
        variants=variants,
        epochs=args.epochs,
        out_dir=args.out,
        data=load_metr_la(args.data),
        device=args.device,
        progress=not args.no_progress,
    )
    print(
        f"sweep {args.sweep}: {len(res['done'])} points done, {len(res['skipped'])} skipped "
        f"({time.perf_counter() - t0:.0f} s) -> {Path(args.out) / 'sweeps'}"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``diagsink sweep {length,penalty,dropout,order}``."""
    p = sub.add_parser(
        "sweep",
        help="train one setting at several values (input length, penalty, dropout p, block order); finished points are skipped",
    )
    p.add_argument("sweep", choices=tuple(SWEEPS), help="which setting to sweep")
    p.add_argument(
        "--protocol",
        default="quick",
        help="quick, book, paper, slice or a YAML file (default quick)",
    )
    p.add_argument("--seeds", type=positive, default=1, help="seeds 0..n-1 (default 1)")
    p.add_argument(
        "--epochs",
        type=positive,
        default=None,
        help="override train.epochs (default: the protocol's)",
    )
    p.add_argument(
        "--values",
        type=_values,
        default=None,
        help="comma-separated values, e.g. 12,24,48 or ts,st (default: see diagsink.engine.sweeps.default_values)",
    )
    p.add_argument(
        "--variants", default=None, help="comma-separated variants (length and order sweeps only)"
    )
    p.add_argument("--out", default="book/results", help="results folder (default book/results)")
    p.add_argument("--data", default=None, help="METR-LA folder (default: DIAGSINK_DATA)")
    p.add_argument("--device", default=None, type=device, help="cpu or cuda")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)
