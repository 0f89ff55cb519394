"""Checks of the exercises of the chapter "Results: every variant" (``book/results.ipynb``).

* ``ex-results-relative``: ``relative_change(values, baseline)``, the change of each value
  against the baseline in percent, ``100 (v - b) / b``.
* ``ex-results-paired``: ``paired_t(a, b)``, the paired t statistic of two equally long
  lists (seed-matched runs): ``mean(d) / (sd(d) / sqrt(n))`` with ``d = a - b`` and the
  sample standard deviation (``n - 1``).

Each check draws fresh random inputs and returns ``None`` or a hint (never the solution).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import fresh_generator, register

__all__ = ["check_relative_change", "check_paired_t"]


@register("ex-results-relative")
def check_relative_change(fn: Callable[[list[float], float], list[float]]) -> str | None:
    gen = fresh_generator()
    n = int(torch.randint(2, 7, (1,), generator=gen))
    base = float(2 + 3 * torch.rand((), generator=gen))
    values = [base * float(0.9 + 0.2 * torch.rand((), generator=gen)) for _ in range(n)]
    got = fn(list(values), base)
    ref = [100 * (v - base) / base for v in values]
    try:
        got = [float(g) for g in got]
    except (TypeError, ValueError):
        return "return one number per value (a list of floats)."
    if len(got) != n:
        return f"return one number per value: got {len(got)} for {n} values."
    if all(math.isclose(g, r, rel_tol=1e-9, abs_tol=1e-9) for g, r in zip(got, ref)):
        return None
    if all(math.isclose(g, r / 100, rel_tol=1e-9, abs_tol=1e-12) for g, r in zip(got, ref)):
        return "these are fractions; the exercise asks for percent (multiply by 100)."
    if all(math.isclose(g, -r, rel_tol=1e-9, abs_tol=1e-9) for g, r in zip(got, ref)):
        return "the sign is flipped: a value larger than the baseline is a positive change."
    if all(math.isclose(g, 100 * (v - base) / v, rel_tol=1e-9) for g, v in zip(got, values)):
        return "divide by the baseline, not by the value itself."
    return "the numbers differ from 100 (v - b) / b."


@register("ex-results-paired")
def check_paired_t(fn: Callable[[list[float], list[float]], float]) -> str | None:
    gen = fresh_generator()
    n = int(torch.randint(3, 9, (1,), generator=gen))
    b = [float(3 + torch.randn((), generator=gen)) for _ in range(n)]
    a = [v + float(0.05 + 0.1 * torch.randn((), generator=gen)) for v in b]
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
    ref = mean / (sd / math.sqrt(n))
    try:
        got = float(fn(list(a), list(b)))
    except (TypeError, ValueError):
        return "return one number (the t statistic)."
    if math.isclose(got, ref, rel_tol=1e-6):
        return None
    if math.isclose(got, -ref, rel_tol=1e-6):
        return "the sign is flipped: use d = a - b."
    if math.isclose(
        got, mean / (math.sqrt(sum((v - mean) ** 2 for v in d) / n) / math.sqrt(n)), rel_tol=1e-6
    ):
        return "use the sample standard deviation of the differences (divide by n - 1, not n)."
    sa = math.sqrt(sum((x - sum(a) / n) ** 2 for x in a) / (n - 1))
    sb = math.sqrt(sum((x - sum(b) / n) ** 2 for x in b) / (n - 1))
    if math.isclose(got, mean / math.sqrt(sa**2 / n + sb**2 / n), rel_tol=1e-6):
        return "this is the unpaired (Welch) statistic; pair the runs by seed and use the spread of the differences."
    return "the statistic differs from mean(d) / (sd(d) / sqrt(n)) with d = a - b."
