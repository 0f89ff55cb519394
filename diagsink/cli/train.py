"""Commands ``diagsink train`` and ``diagsink reproduce`` (registered in :mod:`diagsink.cli`).

    diagsink train --variant penalty --protocol quick --seed 0 [--device cuda] [--out DIR]
    diagsink reproduce --protocol book --seeds 4 [--device cuda] [--out DIR]

Artifacts go to ``DIR/<protocol>/<variant>_seed<k>.json`` (default ``DIR = book/results``);
no path can leave ``DIR`` (an empty ``--out ""`` is refused). A finished artifact already at a
run's path is never overwritten: ``train`` and ``reproduce`` move it, with its state dict, to
``DIR/<protocol>/superseded/`` first. A protocol file is checked whole before anything runs
(:func:`diagsink.engine.config.load_config`: every value in its range, no key twice, no
shipped protocol's name on other contents). ``reproduce`` trains every variant for seeds ``0..seeds-1`` and
skips runs whose valid artifact with the same config already exists, so rerunning it after an
interruption finishes the missing runs (an interrupted run resumes from its checkpoint).
The engine is :mod:`diagsink.engine.train`; see ``book/model.ipynb`` and ``book/results.ipynb``.
"""

from __future__ import annotations

import argparse

from .._io import ensure_writable_dir
from ..data import load_metr_la
from ..engine.artifacts import load_artifact
from ..engine.by_day import attach_test_by_day
from ..engine.config import PROTOCOLS, load_config, override
from ..engine.epoch import SingleProcess
from ..engine.reload import attach_sensitivity
from ..engine.runs import reproduce, run_paths
from ..engine.train import train_run
from ..variants import VARIANTS
from ._args import device, seed
from .launch import add_distributed

__all__ = ["add_commands"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--protocol",
        default="quick",
        help=f"one of {', '.join(PROTOCOLS)} or a YAML file (default quick)",
    )
    p.add_argument(
        "--device",
        default=None,
        type=device,
        help="cpu or cuda (default: DIAGSINK_DEVICE, else cuda if available)",
    )
    p.add_argument("--out", default="book/results", help="results folder (default book/results)")
    p.add_argument("--data", default=None, help="METR-LA folder (default: DIAGSINK_DATA)")
    p.add_argument(
        "--speed-file",
        default=None,
        help="speed file in the data folder, e.g. metr-la_29sensors_allsteps.h5 (sets the "
        "protocol's data.speed_file; default: the protocol's)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--low-memory",
        action="store_true",
        help="activation checkpointing: same results, less memory, ~1/5 more compute",
    )


def _writable(args: argparse.Namespace, protocol: str, variant: str) -> None:
    """Fail before loading data or training: the artifact paths stay inside a writable ``--out``."""
    # a protocol name that would leave --out is refused here
    run_paths(args.out, protocol, variant, 0)
    ensure_writable_dir(args.out, "--out")


def _config(args: argparse.Namespace) -> dict:
    """The protocol, with ``--speed-file`` (if given) as its ``data.speed_file``."""
    cfg = load_config(args.protocol)
    if args.speed_file is not None:
        cfg = override(cfg, {"data.speed_file": args.speed_file})
    return cfg


def _data(args: argparse.Namespace, cfg: dict):
    """The METR-LA file the protocol names (``data.speed_file``) in ``--data``."""
    return load_metr_la(args.data, speed_file=cfg["data"].get("speed_file"))


def _cmd_train(args: argparse.Namespace, processes: SingleProcess | None = None) -> int:
    """Train one run (by ``processes``: None for one process) and print its summary line."""
    cfg = _config(args)
    _writable(args, cfg["protocol"], args.variant)
    art = train_run(
        cfg,
        args.variant,
        args.seed,
        data=_data(args, cfg),
        device=args.device,
        out_dir=args.out,
        progress=not args.no_progress,
        low_memory=args.low_memory,
        processes=processes,
    )
    path = run_paths(args.out, cfg["protocol"], args.variant, args.seed)["json"]
    m = art["metrics"]
    print(
        f"{args.variant} seed {args.seed}: MAE@3 {m['MAE@3']:.3f}  MAE@6 {m['MAE@6']:.3f}  MAE@12 {m['MAE@12']:.3f}  "
        f"(best epoch {art['best_epoch']}, {art['epochs_run']} epochs, {art['wall_time_s']:.1f} s) -> {path}"
    )
    return 0


def _cmd_reproduce(args: argparse.Namespace, processes: SingleProcess | None = None) -> int:
    """Train every variant x seed of the protocol (by ``processes``: None for one process)."""
    cfg = _config(args)
    seeds = args.seeds if args.seeds is not None else cfg["seeds"]
    if seeds < 1:
        raise ValueError("--seeds must be at least 1.")
    variants = tuple(args.variants.split(",")) if args.variants else VARIANTS
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)}.")
    _writable(args, cfg["protocol"], variants[0])
    paths = reproduce(
        cfg,
        seeds,
        variants=variants,
        device=args.device,
        out_dir=args.out,
        data=_data(args, cfg),
        progress=not args.no_progress,
        low_memory=args.low_memory,
        processes=processes,
    )
    print(f"{len(paths)} artifacts in {args.out}/{cfg['protocol']}")
    return 0


def _cmd_sensitivity(args: argparse.Namespace) -> int:
    for path in args.artifacts:
        cfg = load_artifact(path)["provenance"]["config"]  # the data file the run was trained on
        data = _data(args, cfg)
        field = attach_sensitivity(path, data=data)
        if args.by_day:
            days = attach_test_by_day(path, data)
            print(f"{path}: test errors of {len(days['days'])} days stored (test_by_day)")
        s = field["profile"]["S"]
        shares = [b["diagonal_share"]["attention"] for b in field["paths"]["blocks"]]
        print(
            f"{path}: S_j over the {len(s)} input steps {min(s):.3f} .. {max(s):.3f} (last step {s[-1]:.3f}); "
            f"diagonal share of the attention paths per block {', '.join(f'{v:.3f}' for v in shares)} "
            f"(uniform {field['paths']['uniform_share']:.3f})"
        )
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``train``, ``reproduce`` and ``sensitivity``."""
    s = sub.add_parser(
        "sensitivity",
        help="compute a run's input-step sensitivity, map statistics and per-block path norms from its weights, store them in its artifact",
    )
    s.add_argument(
        "artifacts", nargs="+", metavar="ARTIFACT", help="result .json files with weights"
    )
    s.add_argument("--data", default=None, help="METR-LA folder (default: DIAGSINK_DATA)")
    s.add_argument(
        "--by-day",
        action="store_true",
        help="also store the test errors of every test day (test_by_day), which add up to the metrics",
    )
    s.set_defaults(func=_cmd_sensitivity)

    p = sub.add_parser(
        "train", help="train one variant with one seed and write its result artifact"
    )
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--seed", type=seed, default=0)
    _common(p)
    p.set_defaults(func=_cmd_train)
    # --distributed N, and data-parallel under torchrun (diagsink.engine.distributed)
    add_distributed(p)

    r = sub.add_parser(
        "reproduce", help="train every variant x seed of a protocol (finished runs are skipped)"
    )
    r.add_argument(
        "--seeds", type=seed, default=None, help="number of seeds 0..n-1 (default: the protocol's)"
    )
    r.add_argument(
        "--variants", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}"
    )
    _common(r)
    r.set_defaults(func=_cmd_reproduce)
    add_distributed(r)
