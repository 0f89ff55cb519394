"""The synthetic tasks of the parroting chapter: copying the present is tempting and wrong.

**The data is synthetic.** Each sequence of :class:`ParrotTask` is a noisy periodic signal
with period ``P``::

    s_t = Σ_{k=1..K} (a_k cos(2π k t / P) + b_k sin(2π k t / P)) / k,   a_k, b_k ~ N(0, 1)
    x_t = s_t + σ ε_t,                                                 ε_t ~ N(0, 1)

with fresh coefficients and a random phase for every sequence. At step ``t`` the model
must output the value the series showed one period before step ``t + 1``::

    y_t = x_{t − P + 1}        (for t ≥ P − 1; earlier steps are not scored)

which, for a periodic series, is the natural forecast of ``x_{t+1}``. The answer is
sitting in the input, ``lag = P − 1`` steps back, so attention can fetch it exactly. The
tempting shortcut is the present ``x_t``: neighbouring values of a smooth series are
correlated (about 0.5 for the defaults), so copying (a shrunk) ``x_t`` through the residual
connection lowers the error without any attention at all -- a *stochastic parrot*.

:class:`SeasonalTask` gives every step a *vector* of ``D`` values (like a snapshot of many
sensors) that repeats one season back with correlation ``ρ``::

    x_t = ρ x_{t−ℓ} + sqrt(1 − ρ²) ε_t,   ε_t ~ N(0, I_D),   y_t = x_{t−ℓ}

Random vectors in many dimensions are nearly orthogonal, so the step that looks most like
``x_t`` is ``x_t`` itself: here the parrot can live in the attention weights.

The models, the trainer and the measurements are in :mod:`diagsink.parroting`, which
re-exports everything here. Explained in the chapter "A task where parroting fails"
(``book/parroting.ipynb``). Shapes: inputs ``[batch, T, 1]`` (``[batch, T, D]`` for the
seasonal task), targets ``[batch, T − lag]`` (``[batch, T − lag, D]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .errors import ConfigError

__all__ = [
    "ParrotTask",
    "SeasonalTask",
    "Batch",
    "make_batch",
    "make_seasonal_batch",
    "draw_batch",
]


@dataclass(frozen=True)
class ParrotTask:
    """The synthetic task's knobs.

    Attributes:
        period: ``P``; the target lies ``lag = P − 1`` steps back.
        noise: ``σ``, standard deviation of the observation noise.
        harmonics: ``K``, number of harmonics of the periodic pattern (amplitudes ``1/k``).
    """

    period: int = 8
    noise: float = 0.3
    harmonics: int = 2

    def __post_init__(self) -> None:
        if not (isinstance(self.period, int) and self.period >= 2):
            raise ConfigError(f"period={self.period!r} must be an integer ≥ 2.")
        if not (self.noise >= 0 and math.isfinite(self.noise)):
            raise ConfigError(f"noise={self.noise!r} must be a finite number ≥ 0.")
        if not (isinstance(self.harmonics, int) and 1 <= self.harmonics <= self.period // 2):
            raise ConfigError(
                f"harmonics={self.harmonics!r} must be an integer in [1, period // 2 = {self.period // 2}]."
            )

    @property
    def lag(self) -> int:
        """``P − 1``: how many steps back the answer lies."""
        return self.period - 1


class Batch(NamedTuple):
    """One batch of the task, with four fields.

    * ``inputs`` ``[n, T, 1]``: the observed series ``x``;
    * ``target`` ``[n, T − lag]``: the targets ``y_t = x_{t−lag}`` for the scored steps ``t ≥ lag``;
    * ``last`` ``[n, T − lag]``: the last observed value ``x_t`` at the scored steps (what a parrot copies);
    * ``first``: ``lag``, the first scored step.

    For :class:`SeasonalTask` every step carries ``D`` values: ``inputs`` ``[n, T, D]``,
    ``target`` and ``last`` ``[n, T − lag, D]``.
    """

    inputs: torch.Tensor
    target: torch.Tensor
    last: torch.Tensor
    first: int


def make_batch(n: int, length: int, task: ParrotTask, generator: torch.Generator) -> Batch:
    """Draw ``n`` sequences of length ``T = length`` (see the module docstring).

    Raises:
        ConfigError: ``length ≤ lag`` (no step could be scored).
    """
    if length <= task.lag:
        raise ConfigError(
            f"length T={length} must exceed lag = period − 1 = {task.lag} so that some step is scored."
        )
    phase0 = torch.randint(0, task.period, (n, 1), generator=generator)
    angle = 2 * math.pi * (phase0 + torch.arange(length)[None]) / task.period  # [n, T]
    signal = torch.zeros(n, length)
    for k in range(1, task.harmonics + 1):
        a = torch.randn(n, 1, generator=generator) / k
        b = torch.randn(n, 1, generator=generator) / k
        signal = signal + a * torch.cos(k * angle) + b * torch.sin(k * angle)
    x = signal + task.noise * torch.randn(n, length, generator=generator)
    lag = task.lag
    return Batch(inputs=x[..., None], target=x[:, : length - lag], last=x[:, lag:], first=lag)


@dataclass(frozen=True)
class SeasonalTask:
    """The third design's task: vector-valued steps that repeat one season back.

    Attributes:
        dim: ``D``, values per step.
        season: ``ℓ``, the lag of the answer (and of the repetition).
        rho: ``ρ``, correlation of each value with the value one season back; the
            present ``x_t`` is correlated ``ρ`` with the answer ``x_{t−ℓ}``.
    """

    dim: int = 32
    season: int = 7
    rho: float = 0.8

    def __post_init__(self) -> None:
        if not (isinstance(self.dim, int) and self.dim >= 1):
            raise ConfigError(f"dim={self.dim!r} must be an integer ≥ 1 (values per step).")
        if not (isinstance(self.season, int) and self.season >= 1):
            raise ConfigError(
                f"season={self.season!r} must be an integer ≥ 1 (the lag of the answer)."
            )
        if not (0.0 <= self.rho < 1.0):
            raise ConfigError(
                f"rho={self.rho!r} must lie in [0, 1) (a correlation; 1 would copy without noise)."
            )

    @property
    def lag(self) -> int:
        """``ℓ``: how many steps back the answer lies."""
        return self.season


def make_seasonal_batch(
    n: int, length: int, task: SeasonalTask, generator: torch.Generator
) -> Batch:
    """Draw ``n`` sequences of :class:`SeasonalTask`: inputs ``[n, T, D]``, target and last ``[n, T − ℓ, D]``.

    The recursion ``x_t = ρ x_{t−ℓ} + sqrt(1 − ρ²) ε_t`` starts from ``ℓ`` standard normal
    vectors and runs ``3ℓ`` burn-in steps before the window, so every ``x_t`` is standard
    normal and ``corr(x_t, x_{t−kℓ}) = ρ^k``.

    Raises:
        ConfigError: ``length ≤ ℓ``.
    """
    lag = task.lag
    if length <= lag:
        raise ConfigError(
            f"length T={length} must exceed the season ℓ = {lag} so that some step is scored."
        )
    burn = 3 * lag
    x = torch.randn(n, length + burn, task.dim, generator=generator)
    e = torch.randn(n, length + burn, task.dim, generator=generator)
    scale = math.sqrt(1.0 - task.rho**2)
    for t in range(lag, length + burn):
        x[:, t] = task.rho * x[:, t - lag] + scale * e[:, t]
    x = x[:, burn:]
    return Batch(inputs=x, target=x[:, : length - lag], last=x[:, lag:], first=lag)


def draw_batch(
    n: int, length: int, task: ParrotTask | SeasonalTask, generator: torch.Generator
) -> Batch:
    """A batch of either task: :func:`make_batch` or :func:`make_seasonal_batch`."""
    if isinstance(task, SeasonalTask):
        return make_seasonal_batch(n, length, task, generator)
    return make_batch(n, length, task, generator)
