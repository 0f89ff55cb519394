"""Benchmark: the closed-form Jacobian (diagsink.jacobian.decompose) against torch.func.jacrev.

One temporal-attention layer (C = 16, 2 heads, residual, biases, output projection), one
sequence of T = 256 steps, float32 and float64. Prints the median wall time of each method
over a few repeats, the ratio, and the largest difference between the two Jacobians.
Run: ``python benchmarks/jacobian.py [--length 256] [--repeats 3]``. Chapter: book/jacobian.ipynb.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from diagsink import jacobian as J
from diagsink import toy


def _median_seconds(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    # jacrev through the fused CPU attention kernel falls back to a slow loop and says so; that is
    # exactly what is measured here, so the warning is silenced
    warnings.filterwarnings("ignore", message="There is a performance drop")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; T={args.length}, C={args.d_model}, H={args.heads}"
    )
    for dtype in (torch.float32, torch.float64):
        layer = toy.init_layer(args.d_model, args.heads, seed=0, dtype=dtype)
        x = torch.randn(
            args.length, args.d_model, generator=torch.Generator().manual_seed(1), dtype=dtype
        )
        t_closed, closed = _median_seconds(
            lambda layer=layer, x=x: J.total(J.decompose(layer, x)), args.repeats
        )
        t_auto, auto = _median_seconds(
            lambda layer=layer, x=x: J.autograd_jacobian(layer, x).detach(), args.repeats
        )
        err = float((closed - auto).abs().max())
        print(
            f"{str(dtype):14s} decompose {t_closed * 1e3:9.1f} ms   jacrev {t_auto * 1e3:9.1f} ms   "
            f"ratio jacrev/decompose {t_auto / t_closed:6.2f}x   max |difference| {err:.2e}"
        )


if __name__ == "__main__":
    main()
