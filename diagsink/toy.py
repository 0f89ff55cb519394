"""Toy layers, toy inputs and sweeps over the sequence length ``T`` for the Jacobian chapters.

The closed-form Jacobian and its bounds are in :mod:`diagsink.jacobian`; this module makes
the layers and inputs they are evaluated on, and measures how the block norms of every path
change with ``T``:

* :func:`init_layer` -- a freshly initialised layer, with a knob for how sharp attention is;
* :func:`train_toy_layer` -- a layer trained to predict the next step of :func:`toy_series`;
* :func:`sphere_inputs`, :func:`gaussian_inputs`, :func:`toy_series` -- inputs ``[T, C]``;
* :func:`sensitivity_vs_length` -- mean (and largest) block norms of each path against
  ``T``, with the bounds and log-log slopes (:class:`Sweep`, :func:`loglog_slope`).

Used in the chapters ``book/jacobian.ipynb`` ("The Jacobian of a temporal-attention layer")
and ``book/bends.ipynb`` ("Where the 1/T law bends").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .attention import TemporalAttention
from .engine.loop import fit_epoch
from .errors import ConfigError
from .jacobian import KINDS, PATHS, block_norms, bound

__all__ = [
    "init_layer",
    "sphere_inputs",
    "gaussian_inputs",
    "toy_series",
    "train_toy_layer",
    "loglog_slope",
    "Sweep",
    "sensitivity_vs_length",
]


# ----------------------------------------------------------------------------------------
# layers and inputs for the sweeps
# ----------------------------------------------------------------------------------------
def init_layer(
    d_model: int = 16,
    n_heads: int = 1,
    *,
    qk_scale: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    **layer_kwargs,
) -> TemporalAttention:
    """A freshly initialised layer (PyTorch's default init) in eval mode.

    ``qk_scale`` multiplies ``W_Q``, ``W_K`` and their biases, so the logits scale by
    ``qk_scale²``: a small value (e.g. 0.1) gives near-uniform attention, a large one
    (e.g. 3) sharp attention. ``W_V`` and ``W_O`` keep the default init.
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layer = TemporalAttention(d_model, n_heads, **layer_kwargs).to(dtype)
    finally:
        torch.random.set_rng_state(gen_state)
    with torch.no_grad():
        for lin in (layer.q_proj, layer.k_proj):
            lin.weight.mul_(qk_scale)
            if lin.bias is not None:
                lin.bias.mul_(qk_scale)
    return layer.eval()


def sphere_inputs(
    length: int, d_model: int, generator: torch.Generator, dtype=torch.float64
) -> torch.Tensor:
    """``[T, C]`` random directions scaled to norm ``sqrt(C)`` -- what a LayerNorm (unit gain,
    zero shift) hands to the next block, and a bounded input set for every ``T``."""
    g = torch.randn(length, d_model, generator=generator, dtype=dtype)
    return g / g.norm(dim=-1, keepdim=True) * math.sqrt(d_model)


def gaussian_inputs(
    length: int, d_model: int, generator: torch.Generator, dtype=torch.float64
) -> torch.Tensor:
    """``[T, C]`` standard normal entries (unbounded: ``max_j ‖x_j‖`` grows slowly with ``T``)."""
    return torch.randn(length, d_model, generator=generator, dtype=dtype)


def toy_series(
    batch: int, length: int, d_model: int, generator: torch.Generator, dtype=torch.float32
) -> torch.Tensor:
    """Toy multichannel series ``[batch, length + 1, C]`` for :func:`train_toy_layer`.

    Each channel is a sinusoid with a random frequency and phase plus a random level and
    noise; the task is to predict step ``length`` from the first ``length`` steps.
    """
    t = torch.arange(length + 1, dtype=dtype)[None, :, None]
    freq = 0.2 + 0.6 * torch.rand(batch, 1, d_model, generator=generator, dtype=dtype)
    phase = 2 * math.pi * torch.rand(batch, 1, d_model, generator=generator, dtype=dtype)
    level = torch.randn(batch, 1, d_model, generator=generator, dtype=dtype)
    noise = 0.3 * torch.randn(batch, length + 1, d_model, generator=generator, dtype=dtype)
    return level + torch.sin(freq * t + phase) + noise


def train_toy_layer(
    d_model: int = 16,
    n_heads: int = 1,
    *,
    steps: int = 300,
    length: int = 12,
    batch: int = 64,
    lr: float = 1e-2,
    seed: int = 0,
    **layer_kwargs,
) -> tuple[TemporalAttention, list[float]]:
    """Train a layer (plus a linear read-out) to predict the next step of :func:`toy_series`.

    The read-out maps the layer's output at the last step to the next input step. Takes a
    few seconds on a CPU for the defaults. Returns the layer (float64, eval mode) and the
    training losses (mean squared error per step).
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    layer = TemporalAttention(d_model, n_heads, **layer_kwargs)
    readout = nn.Linear(d_model, d_model)
    opt = torch.optim.Adam([*layer.parameters(), *readout.parameters()], lr=lr)
    losses: list[float] = []
    layer.train()
    series = (toy_series(batch, length, d_model, gen) for _ in range(steps))
    # the book's one training loop (diagsink.engine.loop): predict step T from steps 0..T-1
    fit_epoch(
        lambda s: readout(layer(s[:, :length])[:, -1]),
        opt,
        ((s, s[:, length]) for s in series),
        lambda pred, target: torch.mean((pred - target) ** 2),
        on_step=lambda loss: losses.append(float(loss)),
    )
    return layer.double().eval(), losses


# ----------------------------------------------------------------------------------------
# the sweep over sequence lengths
# ----------------------------------------------------------------------------------------
def loglog_slope(lengths, values) -> float:
    """Least-squares slope of ``log(values)`` against ``log(lengths)``.

    NaN if any value is ≤ 0 or not finite, or if there are fewer than two distinct lengths.
    """
    v = np.asarray(values, dtype=float)
    if np.any(~np.isfinite(v)) or np.any(v <= 0) or len(set(np.asarray(lengths).tolist())) < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(lengths, dtype=float)), np.log(v), 1)[0])


@dataclass
class Sweep:
    """Result of :func:`sensitivity_vs_length`.

    ``mean[kind][path]`` and ``max[kind][path]`` are arrays over ``lengths`` (``kind`` is
    ``"off"`` or ``"diag"``, ``path`` one of :data:`~diagsink.jacobian.PATHS` or ``"total"``):
    the mean and the largest block norm over the blocks of that kind, averaged over the
    samples; where ``max_exact[li]`` is ``False`` (``T > max_rows``) it is the largest over a
    random subset of query rows (a subset maximum, at most the true maximum).
    ``bound[kind][path]`` is the per-entry bound of :func:`~diagsink.jacobian.bound` and
    ``bound_average[path]`` the bound on the average over ``j ≠ i`` (both averaged over
    samples). ``slope[kind][path]`` / ``max_slope[kind][path]`` are fitted log-log slopes.
    """

    lengths: list[int]
    norm: str
    mean: dict[str, dict[str, np.ndarray]]
    max: dict[str, dict[str, np.ndarray]]
    bound: dict[str, dict[str, np.ndarray]]
    bound_average: dict[str, np.ndarray]
    alpha_max: np.ndarray
    slope: dict[str, dict[str, float]]
    max_slope: dict[str, dict[str, float]]
    seconds: float = 0.0
    max_exact: list[bool] = field(default_factory=list)


def sensitivity_vs_length(
    lengths,
    *,
    layer: TemporalAttention | None = None,
    layer_factory: Callable[[int], TemporalAttention] | None = None,
    inputs: str | Callable[[int, torch.Generator], torch.Tensor] = "sphere",
    n_samples: int = 2,
    seed: int = 0,
    norm: str = "spectral",
    max_rows: int | None = 128,
) -> Sweep:
    """Mean block norms of every path, off the diagonal and on it, for each ``T`` in ``lengths``.

    Args:
        lengths: sequence lengths ``T`` (each ≥ 2).
        layer: one fixed layer (e.g. trained weights) used for every sample.
        layer_factory: ``seed -> layer``; sample ``s`` uses ``layer_factory(seed + s)``, the
            same layer for every ``T``. Default: :func:`init_layer` (``C = 16``, one head).
        inputs: ``"sphere"`` (:func:`sphere_inputs`), ``"gaussian"`` or a callable
            ``(T, generator) -> [T, C]``.
        n_samples: independent (layer, input) draws per length.
        norm: ``"spectral"`` or ``"fro"`` (see :func:`~diagsink.jacobian.block_norms`); the
            bounds are for the spectral norm.
        max_rows: evaluate at most this many query rows ``i`` per sequence (a random
            subset; all rows when ``T ≤ max_rows``): an unbiased estimate of the mean over
            blocks that keeps ``T = 1024`` affordable. ``None``: all rows. When rows are
            subsampled, ``Sweep.max`` is the largest block over the *evaluated rows* (a
            subset maximum, a lower estimate of the true maximum), and
            ``Sweep.max_exact[li]`` is ``False`` for that length.

    Returns:
        a :class:`Sweep`. Explained in ``book/bends.ipynb``.
    """
    start = time.perf_counter()
    if layer is not None and layer_factory is not None:
        raise ConfigError("pass either layer= (fixed weights) or layer_factory=, not both.")
    lengths = [int(t) for t in lengths]
    if any(t < 2 for t in lengths):
        raise ConfigError(
            f"lengths={lengths}: every T must be ≥ 2 (off-diagonal blocks need two steps)."
        )
    factory = layer_factory or (lambda s: init_layer(seed=s))
    layers = (
        [layer] * n_samples if layer is not None else [factory(seed + s) for s in range(n_samples)]
    )
    make = _input_maker(inputs, layers[0])
    dtype = next(layers[0].parameters()).dtype
    acc = _Totals(len(lengths))
    gen = torch.Generator().manual_seed(seed)
    for li, T in enumerate(lengths):
        for s in range(n_samples):
            x = make(T, gen).to(dtype)
            if max_rows is not None and T > max_rows:
                rows = torch.randperm(T, generator=gen)[:max_rows]
            else:
                rows = torch.arange(T)
            acc.add(li, layers[s], x, rows, norm, n_samples)
    names = (*PATHS, "total")
    slope = {k: {n: loglog_slope(lengths, acc.mean[k][n]) for n in names} for k in KINDS}
    max_slope = {k: {n: loglog_slope(lengths, acc.mx[k][n]) for n in names} for k in KINDS}
    return Sweep(
        lengths,
        norm,
        acc.mean,
        acc.mx,
        acc.bnd,
        acc.bavg,
        acc.amax,
        slope,
        max_slope,
        time.perf_counter() - start,
        [max_rows is None or T <= max_rows for T in lengths],
    )


def _input_maker(
    inputs: str | Callable[[int, torch.Generator], torch.Tensor], layer: TemporalAttention
) -> Callable[[int, torch.Generator], torch.Tensor]:
    """``(T, generator) -> [T, C]`` inputs for ``layer``: ``"sphere"``, ``"gaussian"`` or ``inputs`` itself."""
    C = layer.d_model
    dtype = next(layer.parameters()).dtype
    if inputs == "sphere":
        return lambda t, g: sphere_inputs(t, C, g, dtype)
    if inputs == "gaussian":
        return lambda t, g: gaussian_inputs(t, C, g, dtype)
    if callable(inputs):
        return inputs
    raise ConfigError(
        f"inputs={inputs!r}: use 'sphere', 'gaussian' or a callable (T, generator) -> [T, C]."
    )


class _Totals:
    """The sums of :func:`sensitivity_vs_length`, one entry per length: block norms and bounds."""

    def __init__(self, n_lengths: int) -> None:
        names = (*PATHS, "total")
        self.mean = {k: {n: np.zeros(n_lengths) for n in names} for k in KINDS}
        self.mx = {k: {n: np.zeros(n_lengths) for n in names} for k in KINDS}
        self.bnd = {k: {n: np.zeros(n_lengths) for n in names} for k in KINDS}
        self.bavg = {n: np.zeros(n_lengths) for n in names}
        self.amax = np.zeros(n_lengths)

    def add(
        self,
        li: int,
        layer: TemporalAttention,
        x: torch.Tensor,
        rows: torch.Tensor,
        norm: str,
        n_samples: int,
    ) -> None:
        """Add one of ``n_samples`` samples (``x`` ``[T, C]``, query ``rows``) to length ``li``'s means."""
        T = x.shape[0]
        norms = block_norms(layer, x, norm=norm, rows=rows)
        is_diag = rows[:, None] == torch.arange(T)[None, :]
        b = bound(layer, x)
        for n in (*PATHS, "total"):
            vals = norms[n]
            self.mean["off"][n][li] += float(vals[~is_diag].mean()) / n_samples
            self.mean["diag"][n][li] += float(vals[is_diag].mean()) / n_samples
            self.mx["off"][n][li] += float(vals[~is_diag].max()) / n_samples
            self.mx["diag"][n][li] += float(vals[is_diag].max()) / n_samples
            self.bnd["off"][n][li] += b.off[n] / n_samples
            self.bnd["diag"][n][li] += b.diag[n] / n_samples
            self.bavg[n][li] += b.off_average[n] / n_samples
        with torch.no_grad():
            alpha = torch.softmax(layer.scores(layer.pos(x)), dim=-1)
        self.amax[li] += float(alpha.max()) / n_samples
