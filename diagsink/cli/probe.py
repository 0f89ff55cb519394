"""``diagsink probe ARTIFACT``: the probe's table (and figure) for a committed run.

Rebuilds the run from its weights (:func:`diagsink.engine.reload.load_run`), runs its model in
eval mode on the first test windows inside :func:`diagsink.probe.record`, and prints
:func:`diagsink.probe.table`: every self-attention the forward pass computed, with its
statistics per sequence and of the averaged map ("Your own model" chapter).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from .._io import ensure_writable_dir
from ..engine.prepare import batch
from ..engine.reload import load_run
from ..errors import ConfigError
from ..probe import record, report, table
from ._args import positive

__all__ = ["add_commands"]


def _cmd_probe(args: argparse.Namespace) -> int:
    if args.out is not None and not args.out.strip():  # before the run is loaded
        raise ConfigError(
            "--out is empty; it names the figure file. Fix: pass e.g. --out probe.png."
        )
    run = load_run(args.artifact)
    m = run.cfg["model"]
    x, _ = batch(run.prepared, run.prepared.test[: args.windows], m["t_in"], m["t_out"])
    with torch.no_grad(), record(run.model) as rec:
        run.model(x)
    rows = table(rec)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(pd.DataFrame(rows).set_index("name").round(4).to_string())
    print(
        f"{run.artifact['protocol']}/{run.artifact['variant']} seed {run.artifact['seed']}: "
        f"{len(rows)} attention maps recorded on the first {x.shape[0]} test windows (eval mode)"
    )
    if args.out:
        ensure_writable_dir(Path(args.out).parent, "--out")
        fig, _ = report(rec, title=f"{run.artifact['variant']} seed {run.artifact['seed']}")
        fig.savefig(args.out, dpi=120)
        print(f"figure written to {args.out}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``diagsink probe``."""
    p = sub.add_parser("probe", help="record and summarize every attention map of a committed run")
    p.add_argument("artifact", help="a result .json with weights next to it")
    p.add_argument("--windows", type=positive, default=16, help="test windows to run (default 16)")
    p.add_argument(
        "--out", default=None, metavar="FIG", help="also write the probe's figure (e.g. probe.png)"
    )
    p.set_defaults(func=_cmd_probe)
