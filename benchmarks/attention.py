"""Benchmark: forward + backward time of ``ds.TemporalAttention``, every ``diag``, against MHA.

MHA is ``nn.MultiheadAttention``.

Usage::

    python benchmarks/attention.py            # small sizes (quick; about a minute on 2 CPU cores)
    python benchmarks/attention.py --full     # 64 x 207 sequences of T = 12; T = 288, 1024
    python benchmarks/attention.py --rounds 9 --threads 2 --device cuda
    python benchmarks/attention.py --threads 1 --clock cpu   # steadier on a busy shared CPU
    python benchmarks/attention.py --out my.json   # where the JSON goes (default below)

Every run prints the tables and writes them, with their provenance (UTC time, git commit,
machine, torch, threads, clock), to ``benchmarks/results/attention_<device>.json``; the book's
appendix "Making it fast" (``book/fast.ipynb``) loads that file and types no number itself.

Shapes: METR-LA-like (batch x 207 nodes, T = 12, C = 64, 8 heads) and long sequences
(T = 288 and 1024, a smaller batch). For each shape every variant runs a training step's
forward and backward pass (``y.backward(g)``, train mode, our layer without the residual so
that it computes exactly what ``nn.MultiheadAttention`` computes).
The variants are timed in interleaved rounds (so a load spike on a shared machine hits all
of them alike); the table reports the best and the median round and the ratios of the best
rounds, all measured in this one run. ``--clock wall`` (default) measures elapsed time;
``--clock cpu`` measures the CPU time this process used (``time.process_time``), which
other processes on a busy machine disturb much less (use it with ``--threads 1``; on a GPU
only wall time is meaningful).

Every shape runs twice by default: without attention dropout (``--attn-dropout 0``: on the
CPU both sides then use the fused ``scaled_dot_product_attention`` kernel, whose masked code
path is slower than its unmasked one) and with attention dropout 0.1, as the book's and the
paper's models train. PyTorch has no fused CPU kernel with dropout: MHA then runs PyTorch's
unfused math path, and our layer its own explicit path (logits, softmax, dropout, weighted
sum), which is faster, and where adding a bias is one cheap elementwise operation.

Without attention dropout on the CPU, the layer packs short sequences (T <= 12) end to end
(``diagsink._packing.pack_groups``): the fused kernel's fixed cost per sequence and head is
paid fewer times, and the regularizer's diagonal rides on the ``-inf`` bias that keeps the
packed sequences apart. Longer sequences run unpacked, where every regularizer pays the
masked kernel's extra pass over the ``T x T`` scores; the ``cause:`` line measures it.

Targets (flagged in the output):

* the fast path (``diag=None`` without ``return_attention``) is no slower than
  ``nn.MultiheadAttention`` (``need_weights=False``, its fastest setting) on the same shapes;
* every regularizer is within 10 % of ``diag=None``.

The layer is explained in ``book/attention.ipynb``, its fast path in ``book/fast.ipynb``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import diagsink as ds
from diagsink._io import atomic_write_text
from diagsink.engine.provenance import (
    device_name,
    git_commit,  # the commit the artifacts record (DIAGSINK_GIT_COMMIT without .git)
    machine,
)

TARGET_MHA = 1.00  # fast path time / MHA time must not exceed this
TARGET_REG = 1.10  # regularizer time / diag=None time must not exceed this

QUICK_SHAPES = [  # (label, leading shape, T)
    ("METR-LA-like, batch 4 x 207 nodes", (4, 207), 12),
    ("long, T=288, batch 8", (8,), 288),
    ("long, T=1024, batch 2", (2,), 1024),
]
SMOKE_SHAPES = [  # seconds, for the tests of this script (timings meaningless)
    ("METR-LA-like, batch 1 x 6 nodes", (1, 6), 12),
    ("long, T=40, batch 2", (2,), 40),
]
FULL_SHAPES = [
    ("METR-LA-like, batch 64 x 207 nodes", (64, 207), 12),
    ("long, T=288, batch 64", (64,), 288),
    ("long, T=1024, batch 16", (16,), 1024),
]


def variants(d_model: int, n_heads: int, dropout: float = 0.0) -> dict[str, tuple[nn.Module, dict]]:
    """name -> (module, call options); ours share one set of weights; ``dropout``: attention's."""
    base = ds.TemporalAttention(d_model, n_heads, residual=False, dropout=dropout)
    out: dict[str, tuple[nn.Module, dict]] = {}
    mha = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
    out["nn.MultiheadAttention"] = (mha, {})
    out["diag=None (fast path)"] = (base, {})
    out["diag=None (explicit path)"] = (base, {"return_attention": True})
    for name, kw in [
        ("diag='mask'", {"diag": "mask"}),
        ("diag='dropout' (shared, p=0.2)", {"diag": "dropout", "diag_p": 0.2}),
        ("diag='dropout' (independent)", {"diag": "dropout", "diag_p": 0.2, "diag_shared": False}),
        ("diag='penalty'", {"diag": "penalty", "diag_penalty": -0.1}),
    ]:
        layer = ds.TemporalAttention(d_model, n_heads, residual=False, dropout=dropout, **kw)
        layer.load_state_dict(base.state_dict())
        out[name] = (layer, {})
    return out


def step(module: nn.Module, options: dict, x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    """One forward + backward pass as a closure."""
    if isinstance(module, nn.MultiheadAttention):
        x3 = x.reshape(-1, *x.shape[-2:])
        g3 = g.reshape(x3.shape)

        def run() -> None:
            y, _ = module(x3, x3, x3, need_weights=False)
            y.backward(g3)

    else:

        def run() -> None:
            y = module(x, **options)
            y = y[0] if isinstance(y, tuple) else y
            y.backward(g)

    return run


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCK = time.perf_counter  # set by --clock


def bench_shape(
    lead: tuple[int, ...],
    T: int,
    C: int,
    H: int,
    rounds: int,
    device: torch.device,
    dropout: float = 0.0,
) -> dict[str, list[float]]:
    torch.manual_seed(0)
    mods = variants(C, H, dropout)
    x = torch.randn(*lead, T, C, device=device, requires_grad=True)
    g = torch.randn(*lead, T, C, device=device)
    runs = {}
    for name, (module, options) in mods.items():
        module.to(device).train()
        runs[name] = step(module, options, x, g)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            x.grad = None
            for p in mods[name][0].parameters():
                p.grad = None
            sync(device)
            start = CLOCK()
            run()
            sync(device)
            times[name].append(CLOCK() - start)
    return times


def diagnose(
    lead: tuple[int, ...], T: int, C: int, H: int, rounds: int, device: torch.device
) -> tuple[str, dict[str, float | int]]:
    """Where a regularizer's extra time goes: the fused kernel with a mask, or building the bias.

    Times ``scaled_dot_product_attention`` alone (forward + backward, the layer's 4-D layout)
    without a mask and with the ``[T, T]`` float bias, and, where the layer packs sequences,
    on the packed layout with its block bias; and the time to build a bias once (what every
    forward pass does). Returns the ``cause:`` line and its numbers (milliseconds,
    microseconds, ``groups`` = the layer's ``G``).
    """
    torch.manual_seed(0)
    n_seq = 1
    for n in lead:
        n_seq *= n
    q, k, v = (
        torch.randn(n_seq, H, T, C // H, device=device, requires_grad=True) for _ in range(3)
    )
    g = torch.randn(n_seq, H, T, C // H, device=device)
    bias = ds.diagonal_bias(T, "penalty", diag_penalty=-0.1, device=device)
    cases = {
        "none": (q, k, v, None, g),
        "mask": (q, k, v, bias, g),
    }  # name -> (q, k, v, attn_mask, grad)
    groups = ds._packing.pack_groups(n_seq, T, device)
    if groups > 1:  # the layout and block bias the layer uses for short sequences
        qp, kp, vp, gp = (
            t.detach()
            .reshape(n_seq // groups, groups, H, T, C // H)
            .transpose(1, 2)
            .reshape(n_seq // groups, H, groups * T, C // H)
            for t in (q, k, v, g)
        )
        for t in (qp, kp, vp):
            t.requires_grad_(True)
        block = ds._packing.pack_diagonal_bias(torch.full((T,), -0.1, device=device), groups)
        cases["packed"] = (qp, kp, vp, block, gp)
    core: dict[str, list[float]] = {name: [] for name in cases}
    # interleaved, like the layer variants; the first round is a warm-up
    for _ in range(rounds + 1):
        for name, (q_, k_, v_, mask, grad) in cases.items():
            sync(device)
            start = CLOCK()
            torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask).backward(
                grad
            )
            sync(device)
            core[name].append(CLOCK() - start)
    best = {name: min(ts[1:]) for name, ts in core.items()}
    none, masked = best["none"], best["mask"]
    packed_note = ""
    if groups > 1:
        packed_note = (
            f"; the layer packs {groups} sequences of T={T} into one (pack_groups), where the "
            f"kernel with the packed bias takes {1e3 * best['packed']:.1f} ms "
            f"({best['packed'] / none:.2f} x the unpacked kernel without a mask)"
        )
    builds = {}
    for name, kw in (
        ("penalty", {"diag": "penalty"}),
        ("dropout", {"diag": "dropout", "training": True}),
    ):
        reps = 200
        sync(device)
        start = CLOCK()
        for _ in range(reps):
            ds.diagonal_bias(T, device=device, **kw)
        sync(device)
        builds[name] = (CLOCK() - start) / reps
    numbers: dict[str, float | int] = {
        "groups": groups,
        "kernel_ms": 1e3 * none,
        "kernel_masked_ms": 1e3 * masked,
        "build_penalty_us": 1e6 * builds["penalty"],
        "build_dropout_us": 1e6 * builds["dropout"],
    }
    if groups > 1:
        numbers["kernel_packed_ms"] = 1e3 * best["packed"]
    text = (
        f"cause: scaled_dot_product_attention alone (fwd+bwd) takes {1e3 * none:.1f} ms without "
        f"a mask and {1e3 * masked:.1f} ms with the [T, T] bias ({masked / none:.2f} x); "
        f"building the bias takes {1e6 * builds['penalty']:.0f} us (penalty, uncached) / "
        f"{1e6 * builds['dropout']:.0f} us (a fresh dropout pattern) per forward pass"
        f"{packed_note}."
    )
    return text, numbers


def report(
    label: str, lead: tuple[int, ...], T: int, C: int, H: int, times: dict[str, list[float]]
) -> tuple[list[str], dict[str, dict]]:
    """Print the table of one shape; return the missed targets and the table's rows.

    Rows: variant -> ``best_ms``, ``median_ms``, ``rounds_ms`` (every timed round),
    ``over_fast_path`` and ``over_mha`` (ratios of the best rounds), ``target`` and ``met``
    (``None`` where the variant has no target).
    """
    best = {name: min(ts) for name, ts in times.items()}
    ref, mha = best["diag=None (fast path)"], best["nn.MultiheadAttention"]
    n_seq = 1
    for n in lead:
        n_seq *= n
    print(f"\n## {label}: x {list((*lead, T, C))}, {H} heads ({n_seq} sequences of T={T})")
    print(
        f"{'variant':34s} {'best ms':>9s} {'median ms':>10s} {'/ diag=None':>12s} "
        f"{'/ MHA':>7s}  target"
    )
    missed, rows = [], {}
    for name, ts in times.items():
        ratio, vs_mha = best[name] / ref, best[name] / mha
        flag, target, ok = "", None, None
        if name == "diag=None (fast path)":
            target, ok = f"<= {TARGET_MHA:.2f} x MHA", vs_mha <= TARGET_MHA
            if not ok:
                missed.append(f"{label}: fast path {vs_mha:.2f} x MHA")
        elif name.startswith("diag='"):
            target, ok = f"<= {TARGET_REG:.2f} x diag=None", ratio <= TARGET_REG
            if not ok:
                missed.append(f"{label}: {name} {ratio:.2f} x diag=None")
        if target is not None:
            flag = f"{target}: {'OK' if ok else 'MISSED'}"
        print(
            f"{name:34s} {1e3 * best[name]:9.1f} {1e3 * statistics.median(ts):10.1f} "
            f"{ratio:12.2f} {vs_mha:7.2f}  {flag}"
        )
        rows[name] = {
            "best_ms": 1e3 * best[name],
            "median_ms": 1e3 * statistics.median(ts),
            "rounds_ms": [1e3 * t for t in ts],
            "over_fast_path": ratio,
            "over_mha": vs_mha,
            "target": target,
            "met": ok,
        }
    return missed, rows


def default_out(device: torch.device) -> str:
    """``benchmarks/results/attention_<device type>.json``, next to this script."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "results", f"attention_{device.type}.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (the default)")
    size.add_argument(
        "--full", action="store_true", help="the issue's sizes (64 x 207 sequences; T = 288, 1024)"
    )
    size.add_argument(
        "--smoke", action="store_true", help="tiny sizes for the tests (timings meaningless)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed rounds per variant (default 7 quick, 5 full)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)"
    )
    parser.add_argument(
        "--device", default=None, help="cpu or cuda (default: ds.settings().device)"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time or this process's CPU time",
    )
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument(
        "--attn-dropout",
        default="0,0.1",
        help="comma-separated attention-dropout rates to run every shape with (default 0,0.1: "
        "without, and as the book's and the paper's models train)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSON file of the tables (default benchmarks/results/attention_<device>.json)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rates = [float(r) for r in args.attn_dropout.split(",") if r.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    device = torch.device(args.device or ds.settings().device)
    sizes = "full" if args.full else "smoke" if args.smoke else "quick"
    shapes = {"full": FULL_SHAPES, "smoke": SMOKE_SHAPES, "quick": QUICK_SHAPES}[sizes]
    rounds = args.rounds or (5 if args.full else 7)
    table: dict = {
        "benchmark": "TemporalAttention vs nn.MultiheadAttention: forward + backward, float32, "
        "train mode",
        "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "git_commit": git_commit(),
        "machine": machine(),
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "sizes": sizes,
        "rounds": rounds,
        "clock": args.clock,
        "d_model": args.d_model,
        "heads": args.heads,
        "targets": {"fast_path_over_mha": TARGET_MHA, "regularizer_over_fast_path": TARGET_REG},
        "shapes": [],
    }
    print(f"# {table['benchmark']}")
    print(f"UTC {table['utc']}, git commit {table['git_commit']}, {table['machine']}")
    print(
        f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, "
        f"python {platform.python_version()}, {sizes} sizes, {rounds} rounds, "
        f"{args.clock} clock"
    )
    started = time.perf_counter()
    missed: list[str] = []
    for rate in rates:
        print(
            f"\n# attention dropout {rate:g}"
            + (
                "  (the CPU runs the fused kernel)"
                if rate == 0
                else "  (train mode: on the CPU, MHA runs PyTorch's unfused math path and our "
                "layer its explicit path)"
            )
        )
        for label, lead, T in shapes:
            times = bench_shape(lead, T, args.d_model, args.heads, rounds, device, rate)
            miss, rows = report(
                f"{label}, attention dropout {rate:g}", lead, T, args.d_model, args.heads, times
            )
            missed += miss
            entry = {"label": label, "lead": list(lead), "T": T, "attn_dropout": rate}
            entry["n_seq"] = int(torch.Size(lead).numel())
            entry["variants"] = rows
            if rate == 0:
                text, entry["cause"] = diagnose(lead, T, args.d_model, args.heads, rounds, device)
                print(text)
            table["shapes"].append(entry)
    table["wall_s"] = time.perf_counter() - started
    table["missed"] = missed
    print(f"\nwall time {table['wall_s']:.0f} s")
    if missed:
        print("targets missed:\n  " + "\n  ".join(missed))
    else:
        print("all targets met")
    out = args.out or default_out(device)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write_text(out, json.dumps(table, indent=1) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
