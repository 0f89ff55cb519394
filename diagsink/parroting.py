"""A task where copying the present is tempting and wrong: its models, trainer and measurements.

The tasks (:class:`ParrotTask`, a noisy periodic series whose answer lies ``lag = P − 1`` steps
back; :class:`SeasonalTask`, vector-valued steps that repeat one season back) live in
:mod:`diagsink.parrot_tasks` and are re-exported here. The model, :class:`ParrotNet`, is one
:class:`~diagsink.attention.TemporalAttention` layer (one head, sinusoidal positions) between an
input map ``1 → C`` and an output map ``C → 1``: linear, or with ``embedding="fourier"`` fixed
random Fourier features of the value (:class:`FourierFeatures`), so that "attend to the steps that
look like me" can single out the step itself. :class:`VectorParrotNet` is the same layer with ``D``
inputs and outputs for :class:`SeasonalTask`; :func:`train_task` and :func:`evaluate` take either.

Explained in the chapter "A task where parroting fails" (``book/parroting.ipynb``). Shapes: inputs
``[batch, T, 1]``, forecasts and targets ``[batch, T]``, attention ``[batch, H, T, T]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from .attention import TemporalAttention
from .engine.loop import fit_epoch
from .errors import ConfigError
from .jacobian import decompose
from .parrot_tasks import (
    Batch,
    ParrotTask,
    SeasonalTask,
    draw_batch,
    make_batch,
    make_seasonal_batch,
)
from .stats import attention_entropy, column_stripe_index, diagonal_mass, lag_mass, parroting_score
from .variants import attention_kwargs, check_variant

__all__ = [
    "ParrotTask",
    "SeasonalTask",
    "Batch",
    "make_batch",
    "make_seasonal_batch",
    "EMBEDDINGS",
    "FourierFeatures",
    "SELF_MATCH",
    "ParrotNet",
    "VectorParrotNet",
    "TrainResult",
    "train_task",
    "Evaluation",
    "evaluate",
    "BUDGETS",
    "scaled_steps",
    "length_sweep",
    "input_sensitivity",
    "path_sensitivity",
    "path_block_norms",
]


#: The default task of :func:`train_task` and :func:`evaluate` (a frozen dataclass, shared safely).
_DEFAULT_TASK = ParrotTask()

#: The input maps :class:`ParrotNet` knows: ``"linear"`` (``Linear(1 → C)``) and
#: ``"fourier"`` (:class:`FourierFeatures`, then ``Linear(C → C)``).
EMBEDDINGS = ("linear", "fourier")


class FourierFeatures(nn.Module):
    """Fixed random Fourier features of a scalar: ``[..., T, 1] -> [..., T, C]``.

    ``φ(x) = [cos(ω_1 x + b_1), ..., cos(ω_F x + b_F), sin(ω_1 x + b_1), ..., sin(ω_F x + b_F)]``
    with ``F = C / 2`` frequencies ``ω_f ~ N(0, scale²)`` and phases ``b_f ~ U(0, 2π)``,
    drawn once from ``seed`` and never trained. The dot product
    ``φ(x)·φ(x') = Σ_f cos(ω_f (x − x'))`` depends only on ``x − x'`` and is largest at
    ``x' = x`` (for many frequencies it approaches a Gaussian bump of width about
    ``1 / scale``): a query and a key built from these features can express "a step whose
    value is close to mine", which a scalar ``x_t · x_m`` cannot (that product is largest for
    the most extreme ``x_m``, not for ``x_m = x_t``).

    Args:
        d_model: ``C``, even.
        scale: standard deviation of the frequencies.
        seed: seed of the frequencies and phases (a private generator; the global random
            state is not touched).

    Explained in ``book/parroting.ipynb``.
    """

    def __init__(self, d_model: int, scale: float = 3.0, seed: int = 0) -> None:
        super().__init__()
        if not (isinstance(d_model, int) and d_model >= 2 and d_model % 2 == 0):
            raise ConfigError(
                f"d_model={d_model!r} must be an even integer ≥ 2 (C/2 frequencies, a cos and a sin each)."
            )
        if not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(
                f"scale={scale!r} must be a finite number > 0 (the spread of the frequencies)."
            )
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("freq", scale * torch.randn(d_model // 2, generator=g))
        self.register_buffer("phase", 2 * math.pi * torch.rand(d_model // 2, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., T, 1]`` -> ``[..., T, C]``."""
        z = x * self.freq + self.phase  # [..., T, C/2]
        return torch.cat([torch.cos(z), torch.sin(z)], dim=-1)


class ParrotNet(nn.Module):
    """Input map ``1 → C``, one :class:`~diagsink.attention.TemporalAttention` layer, linear output map ``C → 1``.

    Args:
        d_model: ``C``.
        n_heads: heads of the attention layer.
        embedding: ``"linear"`` (``Linear(1 → C)``) or ``"fourier"``
            (:class:`FourierFeatures` followed by ``Linear(C → C)``).
        **layer_kwargs: passed to :class:`~diagsink.attention.TemporalAttention` (``diag``, ``residual``, ...);
            the default positional encoding is ``"sinusoidal"`` (the only source of position).

    Raises:
        ConfigError: unknown ``embedding``.
    """

    def __init__(
        self, d_model: int = 16, n_heads: int = 1, embedding: str = "linear", **layer_kwargs
    ) -> None:
        super().__init__()
        if embedding not in EMBEDDINGS:
            raise ConfigError(f"embedding={embedding!r} is not known; choose one of {EMBEDDINGS}.")
        layer_kwargs.setdefault("pos_encoding", "sinusoidal")
        self.embedding = embedding
        if embedding == "linear":
            self.inp = nn.Linear(1, d_model)
        else:
            self.inp = nn.Sequential(FourierFeatures(d_model), nn.Linear(d_model, d_model))
        self.attn = TemporalAttention(d_model, n_heads, **layer_kwargs)
        self.out = nn.Linear(d_model, 1)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """``x`` ``[..., T, 1]`` -> forecasts ``[..., T]`` (and attention ``[..., H, T, T]``)."""
        y, attn = self.attn(self.inp(x), return_attention=True)
        pred = self.out(y).squeeze(-1)
        return (pred, attn) if return_attention else pred


class VectorParrotNet(nn.Module):
    """Linear input map ``D → C``, one :class:`~diagsink.attention.TemporalAttention` layer, linear output map ``C → D``.

    The model of the third design (:class:`SeasonalTask`); ``**layer_kwargs`` as in :class:`ParrotNet`.
    """

    def __init__(self, dim: int, d_model: int = 32, n_heads: int = 1, **layer_kwargs) -> None:
        super().__init__()
        layer_kwargs.setdefault("pos_encoding", "sinusoidal")
        self.inp = nn.Linear(dim, d_model)
        self.attn = TemporalAttention(d_model, n_heads, **layer_kwargs)
        self.out = nn.Linear(d_model, dim)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """``x`` ``[..., T, D]`` -> forecasts ``[..., T, D]`` (and attention ``[..., H, T, T]``)."""
        y, attn = self.attn(self.inp(x), return_attention=True)
        pred = self.out(y)
        return (pred, attn) if return_attention else pred


#: The second design of the chapter, as keyword arguments of :func:`train_task`: Fourier
#: features of the value (so that "a step that looks like me" can be expressed), no
#: residual connection and no output projection (so that the present can reach the
#: forecast through attention only), and a larger learning rate (sharp attention needs
#: large logits). Combine it with any of :data:`diagsink.variants.VARIANTS`; ``layer`` entries override
#: the variant's (e.g. a stronger penalty).
SELF_MATCH: dict = {
    "embedding": "fourier",
    "layer": {"residual": False, "out_proj": False},
    "lr": 1e-2,
}


@dataclass
class TrainResult:
    """What :func:`train_task` returns: the model (eval mode; :class:`ParrotNet` or :class:`VectorParrotNet`), the loss per step, the wall time."""

    model: nn.Module
    losses: list[float]
    seconds: float
    length: int
    variant: str
    seed: int


def train_task(
    length: int,
    variant: str = "none",
    *,
    task: ParrotTask | SeasonalTask = _DEFAULT_TASK,
    steps: int = 400,
    batch: int = 64,
    lr: float = 3e-3,
    d_model: int = 16,
    seed: int = 0,
    embedding: str = "linear",
    layer: dict | None = None,
) -> TrainResult:
    """Train a :class:`ParrotNet` on the task at sequence length ``T = length``.

    Adam, mean squared error on the scored steps, a fresh batch every step. Everything
    random (initial weights, data, diagonal-dropout patterns) follows ``seed``; the global
    random state is left as it was. The same budget (``steps × batch``) is used for every
    ``T``, so the curves show how hard the lag is to *find* at each length.

    Args:
        length: ``T``.
        variant: one of :data:`diagsink.variants.VARIANTS` (strengths as reported in the paper's text).
        task: a :class:`ParrotTask` (model :class:`ParrotNet`) or a :class:`SeasonalTask`
            (model :class:`VectorParrotNet`; ``embedding`` must stay ``"linear"``).
        embedding: the input map of :class:`ParrotNet` (``"linear"`` or ``"fourier"``).
        layer: keyword arguments of :class:`~diagsink.attention.TemporalAttention` that
            override (or add to) the variant's, e.g. ``{"residual": False, "out_proj": False}``
            or ``{"diag_penalty": -1.0}``.

    Raises:
        ConfigError: unknown variant or embedding, or ``length ≤ lag``.
    """
    layer_kwargs = {**attention_kwargs(check_variant(variant)), **(layer or {})}
    start = time.perf_counter()
    losses: list[float] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        if isinstance(task, SeasonalTask):
            if embedding != "linear":
                raise ConfigError(
                    f"embedding={embedding!r}: the seasonal task's model has a linear input map only."
                )
            model = VectorParrotNet(task.dim, d_model, **layer_kwargs)
        else:
            model = ParrotNet(d_model, embedding=embedding, **layer_kwargs)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        batches = (
            (b.inputs, b) for b in (draw_batch(batch, length, task, gen) for _ in range(steps))
        )
        # the book's one training loop (diagsink.engine.loop): the loss is on the scored steps
        fit_epoch(
            model,
            opt,
            batches,
            lambda pred, b: torch.mean((pred[:, b.first :] - b.target) ** 2),
            on_step=lambda loss: losses.append(float(loss)),
        )
    model.eval()
    return TrainResult(model, losses, time.perf_counter() - start, length, variant, seed)


@dataclass
class Evaluation:
    """Test-set numbers for one trained model (eval mode, fixed test seed).

    Attributes:
        mse: mean squared error on the scored steps.
        mse_parrot: error of the best *shrunk copy* ``c · x_t`` (least squares ``c``): the
            parrot's error, a reference line.
        mse_zero: error of predicting 0 (the series mean): the do-nothing reference.
        parroting: :func:`~diagsink.stats.parroting_score` of the forecasts.
        diag_mass: mean ``α_ii`` over all rows; ``uniform = 1/T``.
        lag_mass: mean ``α_{t, t−lag}`` over the scored rows (1 = attention exactly on the answer).
        entropy: mean row entropy divided by ``log T`` (1 = uniform).
        stripes: :func:`~diagsink.stats.column_stripe_index` of the averaged map.
        attention: ``[T, T]`` the map averaged over the test batch and heads.
        how: description of that averaging (for figure titles).
    """

    length: int
    variant: str
    mse: float
    mse_parrot: float
    mse_zero: float
    parroting: float
    diag_mass: float
    uniform: float
    lag_mass: float
    entropy: float
    stripes: float
    attention: torch.Tensor = field(repr=False)
    how: str = ""


@torch.no_grad()
def evaluate(
    model: nn.Module,
    length: int,
    *,
    task: ParrotTask | SeasonalTask = _DEFAULT_TASK,
    n: int = 256,
    seed: int = 12345,
    variant: str = "",
) -> Evaluation:
    """Evaluate ``model`` on ``n`` fresh test sequences of length ``T = length`` (eval mode).

    In eval mode diagonal dropout is off, as at test time in the paper; the mask and the
    penalty act as in training.
    """
    model.eval()
    b = draw_batch(n, length, task, torch.Generator().manual_seed(seed))
    pred, attn = model(b.inputs, return_attention=True)  # [n, T], [n, H, T, T]
    pred = pred[:, b.first :]
    c = float((b.last * b.target).sum() / (b.last * b.last).sum())
    mean_map = attn.mean(dim=(0, 1))
    return Evaluation(
        length=length,
        variant=variant,
        mse=float(torch.mean((pred - b.target) ** 2)),
        mse_parrot=float(torch.mean((c * b.last - b.target) ** 2)),
        mse_zero=float(torch.mean(b.target**2)),
        parroting=parroting_score(pred, b.last, b.target),
        diag_mass=diagonal_mass(attn).mass,
        uniform=1.0 / length,
        lag_mass=lag_mass(attn, task.lag),
        entropy=float(attention_entropy(attn, normalized=True).mean()),
        stripes=column_stripe_index(mean_map),
        attention=mean_map,
        how=f"mean over {n} test sequences and {attn.shape[1]} head(s), eval mode, T = {length}",
    )


#: How :func:`length_sweep` sizes the training at each length: ``"fixed"`` (the same number of
#: steps at every ``T``) or ``"scaled"`` (steps proportional to ``T``, :func:`scaled_steps`).
BUDGETS = ("fixed", "scaled")


def scaled_steps(length: int, base_steps: int = 400, base_length: int = 12) -> int:
    """Adam steps at ``T = length`` for a budget proportional to ``T``: ``base_steps · T / base_length``.

    The control of the chapter's length sweep: the gradient that pulls attention towards the
    lag is proportional to the weight already there, about ``1/T`` at the start, so a budget
    that grows like ``T`` gives every length about the same total pull (rounded up).
    """
    if length < 1 or base_steps < 1 or base_length < 1:
        raise ConfigError(
            f"length={length}, base_steps={base_steps}, base_length={base_length}: all must be >= 1."
        )
    return -(-base_steps * length // base_length)


def length_sweep(
    lengths: list[int],
    seeds: list[int],
    *,
    budget: str = "fixed",
    base_steps: int = 400,
    base_length: int | None = None,
    variant: str = "none",
    task: ParrotTask | SeasonalTask = _DEFAULT_TASK,
    n_test: int = 256,
    **train_kwargs,
) -> dict[tuple[int, int], tuple[TrainResult, Evaluation]]:
    """One trained and evaluated model per length and seed (the chapter's length sweeps).

    Returns ``{(T, seed): (TrainResult, Evaluation)}``, each evaluated on ``n_test`` test sequences.

    ``budget="fixed"``: ``base_steps`` at every length (the chapter's first sweeps); ``"scaled"``:
    :func:`scaled_steps` from ``base_length`` (default ``min(lengths)``), the control that
    separates an effect of ``T`` from the speed of optimisation. ``task`` is a
    :class:`ParrotTask` or a :class:`SeasonalTask`; ``**train_kwargs`` (``batch``, ``d_model``,
    ``lr``, ``layer``, ...) go to :func:`train_task` unchanged, at every length. Raises
    :class:`ConfigError` for an unknown budget or an empty list of lengths or seeds.
    """
    if budget not in BUDGETS:
        raise ConfigError(f"budget={budget!r} is not known; choose one of {', '.join(BUDGETS)}.")
    if not lengths or not seeds:
        raise ConfigError("length_sweep needs at least one length and one seed.")
    base = min(lengths) if base_length is None else base_length
    out = {}
    for length in lengths:
        steps = base_steps if budget == "fixed" else scaled_steps(length, base_steps, base)
        for seed in seeds:
            run = train_task(length, variant, task=task, seed=seed, steps=steps, **train_kwargs)
            ev = evaluate(run.model, length, task=task, n=n_test, variant=variant)
            out[length, seed] = (run, ev)
    return out


def input_sensitivity(model: ParrotNet, x: torch.Tensor) -> torch.Tensor:
    """``S[t, j] = ∂ forecast_t / ∂ x_j`` for one sequence ``x`` ``[T]`` (or ``[T, 1]``), by autograd.

    The end-to-end sensitivity of each forecast to each input step: a parrot has a large
    diagonal ``S[t, t]``; a model that found the lag has a large ``S[t, t − lag]``.

    Returns:
        ``[T, T]`` (rows = forecast step, columns = input step).
    """
    x = x.reshape(-1, 1).detach().to(next(model.parameters()).dtype)
    return torch.func.jacrev(lambda inp: model(inp))(x)[..., 0].detach()


def path_sensitivity(model: ParrotNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``input_sensitivity`` split into the four Jacobian paths of the attention layer.

    Uses :func:`diagsink.jacobian.decompose` on the layer input ``u = inp(x)`` and
    projects each ``[T, C, T, C]`` path with the input and output maps::

        S^path[t, j] = w_outᵀ · J^path[t, :, j, :] · ∂u_j/∂x_j

    ``∂u_j/∂x_j`` ``[C]`` is the input map's derivative at step ``j`` (the weight column
    ``w_in`` for the linear map, the same at every step; it depends on ``x_j`` for Fourier
    features). The input map acts on each step alone, so ``∂u_j/∂x_m = 0`` for ``m ≠ j``.

    Returns:
        ``{"residual", "value", "key", "query"}`` -> ``[T, T]``; they sum to
        :func:`input_sensitivity` (the bias terms do not depend on ``x``).
    """
    x = x.reshape(-1, 1).detach().to(next(model.parameters()).dtype)
    with torch.no_grad():
        # u = inp(x) [T, C] and its step-wise derivative du_j/dx_j [T, C] (forward mode)
        u, du = torch.func.jvp(model.inp, (x,), (torch.ones_like(x),))
        paths = decompose(model.attn, u)
        w_out = model.out.weight[0]  # [C]
        return {
            name: torch.einsum("c,icjd,jd->ij", w_out, block, du) for name, block in paths.items()
        }


def path_block_norms(model: VectorParrotNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four Jacobian paths of :class:`VectorParrotNet` for one sequence ``x`` ``[T, D]``, as block norms.

    Each path's block of the end-to-end Jacobian, ``∂ŷ_t/∂x_j = W_out · J^path[t, :, j, :] · W_in``
    (``D × D``), is summarised by its Frobenius norm divided by ``sqrt(D)`` (1 for the
    identity); ``"total"`` is the norm of the sum of the four blocks.

    Returns:
        ``{"residual", "value", "key", "query", "total"}`` -> ``[T, T]`` (rows = forecast
        step, columns = input step).
    """
    x = x.detach().to(next(model.parameters()).dtype)
    with torch.no_grad():
        paths = decompose(model.attn, model.inp(x))  # [T, C, T, C] each
        w_out, w_in = model.out.weight, model.inp.weight  # [D, C], [C, D]
        blocks = {
            name: torch.einsum("ac,icjd,db->iajb", w_out, J, w_in) for name, J in paths.items()
        }
        blocks["total"] = sum(blocks.values())
        scale = math.sqrt(x.shape[-1])
        return {
            name: torch.linalg.matrix_norm(b.permute(0, 2, 1, 3)) / scale
            for name, b in blocks.items()
        }
