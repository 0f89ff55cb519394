"""Checks of the exercises in the chapter ``book/metr_la.ipynb`` ("METR-LA").

* ``ex-metr-la-masked-mae``: ``masked_mae(pred, target)``, zeros in the target are missing.
* ``ex-metr-la-windows``: ``make_windows(series, t_in, t_out)``, every window of a series, stride 1.
* ``ex-metr-la-split``: ``dcrnn_split_sizes(n_windows)``, DCRNN's 70/10/20 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import compare_tensors, fresh_generator, register


def _reference_mae(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mask = target != 0
    return (pred - target).abs()[mask].mean()


@register("ex-metr-la-masked-mae")
def check_masked_mae(masked_mae: Callable) -> str | None:
    """Fresh speeds with ~20 % zeros; then a batch that is entirely missing must raise."""
    gen = fresh_generator()
    shape = tuple(int(v) for v in torch.randint(2, 7, (3,), generator=gen))
    target = 20 + 50 * torch.rand(shape, generator=gen, dtype=torch.float64)
    target[torch.rand(shape, generator=gen) < 0.2] = 0.0
    target.view(-1)[0] = 0.0  # at least one missing
    target.view(-1)[1] = 55.0  # at least one observed
    pred = target + 5 * torch.randn(shape, generator=gen, dtype=torch.float64)
    pred[target == 0] = 50 + 10 * torch.rand(
        int((target == 0).sum()), generator=gen, dtype=torch.float64
    )
    got = masked_mae(pred.clone(), target.clone())
    expected = _reference_mae(pred, target)
    got_t = (
        torch.as_tensor(got, dtype=torch.float64)
        if not isinstance(got, torch.Tensor)
        else got.to(torch.float64)
    )
    if got_t.numel() != 1:
        return f"masked_mae should return one number (a 0-d tensor), not a tensor of shape {list(got_t.shape)}."
    value = float(got_t)
    plain = float((pred - target).abs().mean())
    share = float((target != 0).double().mean())
    if abs(value - float(expected)) > 1e-6 * max(1.0, abs(float(expected))):
        if abs(value - plain) < 1e-9:
            return "your result equals the plain MAE: targets equal to 0 are missing readings and must be left out."
        if abs(value - float(expected) * share) < 1e-6:
            return (
                "you leave the missing entries out of the sum but still divide by the number of ALL entries: "
                "divide by the number of observed (non-zero) targets."
            )
        return "wrong value: the mean of |pred - target| over the entries whose target is not 0."
    hint = compare_tensors(
        torch.as_tensor(value), torch.as_tensor(float(expected)), name="masked_mae", atol=1e-6
    )
    if hint is not None:
        return hint
    try:
        empty = masked_mae(pred.clone(), torch.zeros(shape, dtype=torch.float64))
    except (ValueError, ZeroDivisionError, RuntimeError):
        return None
    return (
        f"for a batch whose targets are all 0 your function returned {float(torch.as_tensor(empty)):.3g}; "
        "there is nothing to average, so raise a ValueError instead of returning a number."
    )


@register("ex-metr-la-windows")
def check_make_windows(make_windows: Callable) -> str | None:
    """A fresh series ``[T, N]`` and fresh window lengths."""
    gen = fresh_generator()
    t = int(torch.randint(30, 60, (1,), generator=gen))
    n = int(torch.randint(2, 5, (1,), generator=gen))
    t_in = int(torch.randint(2, 6, (1,), generator=gen))
    t_out = int(torch.randint(2, 6, (1,), generator=gen))
    series = torch.randn(t, n, generator=gen)
    out = make_windows(series.clone(), t_in, t_out)
    if not isinstance(out, tuple) or len(out) != 2:
        return "make_windows should return a pair (x, y) of tensors."
    x, y = out
    w = t - t_in - t_out + 1
    starts = torch.arange(w)
    xr = series[starts[:, None] + torch.arange(t_in)[None, :]]
    yr = series[starts[:, None] + t_in + torch.arange(t_out)[None, :]]
    if (
        isinstance(x, torch.Tensor)
        and x.dim() == 3
        and x.shape[1:] == (t_in, n)
        and x.shape[0] != w
    ):
        return (
            f"you made {x.shape[0]} windows from {t} steps; with {t_in} inputs and {t_out} outputs there are "
            f"T - t_in - t_out + 1 of them: the last window's targets end exactly at the last step."
        )
    if (
        isinstance(y, torch.Tensor)
        and y.shape == yr.shape
        and torch.allclose(y, series[starts[:, None] + t_in - 1 + torch.arange(t_out)[None, :]])
    ):
        return "the targets start one step too early: y begins right AFTER the last input step, at s + t_in."
    return compare_tensors(x, xr, name="x (the inputs)") or compare_tensors(
        y, yr, name="y (the targets)"
    )


@register("ex-metr-la-split")
def check_split_sizes(dcrnn_split_sizes: Callable) -> str | None:
    """Fresh window counts, including the full METR-LA count 34249."""
    gen = fresh_generator()
    counts = [34249] + [int(v) for v in torch.randint(30, 100000, (20,), generator=gen)]
    for n in counts:
        got = dcrnn_split_sizes(n)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            return "return a tuple (n_train, n_val, n_test)."
        n_test = round(n * 0.2)
        n_train = round(n * 0.7)
        ref = (n_train, n - n_train - n_test, n_test)
        got = tuple(int(v) for v in got)
        if got == ref:
            continue
        if sum(got) != n:
            return f"for {n} windows your three parts add up to {sum(got)}: every window belongs to exactly one part."
        trunc = (int(n * 0.7), n - int(n * 0.7) - int(n * 0.2), int(n * 0.2))
        if got == trunc:
            return "DCRNN rounds (round(n * 0.2), round(n * 0.7)); int() truncates and is off by one for some n."
        return (
            f"for {n} windows you give {got}; the test part is round(n * 0.2), the training part "
            "round(n * 0.7), and validation gets what is left."
        )
    return None
