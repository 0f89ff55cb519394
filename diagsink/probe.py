"""Look inside anyone's PyTorch model: record its attention maps, measure its diagonal sink.

``with record(model) as rec: model(x)`` records the weights ``[..., H, T, T]`` (rows sum to 1,
before attention dropout) of every self-attention computed in the block, keyed by module name
(bare ``scaled_dot_product_attention`` calls: by enclosing module and call site):

* ``nn.MultiheadAttention`` (also after :func:`diagsink.regularize.regularize`), and inside
  ``nn.TransformerEncoderLayer`` even when its eval-mode fast path never calls ``self_attn``:
  weights recomputed from the module's own projections on its inputs;
* ``diagsink.attention.TemporalAttention``, with the regularizer's bias of that very call;
* ``torch.nn.functional.scaled_dot_product_attention`` with as many queries as keys (patched
  for the duration; code that imported the function by name is not seen).

No hook is attached to the modules (one would switch PyTorch's encoder fast path off and so
change the outputs): their ``forward`` is wrapped by an instance attribute, restored on exit.
The wrappers draw no random numbers and need no gradient: outputs are bit-identical.

:func:`table`: the book's statistics (``diagsink.stats``) of every map; :func:`sensitivity_profile`:
input-step sensitivity of any callable; :func:`report`: one figure and the table.
Chapter "Your own model" (``book/own_model.ipynb``, part "Beyond the paper").
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.ticker import MaxNLocator
from torch import nn
from torch.nn.modules import module as _module

from . import plotting, stats
from .attention import TemporalAttention, bias_from_diagonal
from .errors import DiagsinkError
from .regularize import SINK_ATTR, _same_tensor, is_regularized, mha_weights

__all__ = [
    "Recording",
    "record",
    "map_stats",
    "table",
    "Profile",
    "sensitivity_profile",
    "report",
]

_TORCH_DIR = os.path.dirname(torch.__file__)


class Recording:
    """What :func:`record` saw: ``calls[name]`` (one tensor per call), ``kinds``, ``skipped``.

    ``kinds[name]`` says what computed the map; ``skipped`` maps the names of attention calls
    that were not recorded (cross-attention) to the reason.
    """

    def __init__(self, names: dict[int, str] | None = None) -> None:
        self.calls: dict[str, list[torch.Tensor]] = {}
        self.kinds: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.names = names or {}  # id(module) -> its name in the model
        self.depth = 0  # > 0 inside a recorded attention module: its SDPA calls are not new
        self.stack: list[str] = []  # names of the modules being run, innermost last

    def add(self, name: str, kind: str, weights: torch.Tensor) -> None:
        """Store one call's weights ``[..., H, T, T]`` (detached) under ``name``."""
        self.calls.setdefault(name, []).append(weights.detach())
        self.kinds.setdefault(name, kind)

    @property
    def maps(self) -> dict[str, torch.Tensor]:
        """``name -> [..., H, T, T]``; several calls are concatenated on axis 0."""
        out = {}
        for name, calls in self.calls.items():
            if len({tuple(c.shape[1:]) for c in calls}) > 1:
                raise ValueError(
                    f"{name!r} was called {len(calls)} times with different shapes "
                    f"{[tuple(c.shape) for c in calls]}; read rec.calls[{name!r}] instead."
                )
            out[name] = calls[0] if len(calls) == 1 else torch.cat(calls, dim=0)
        return out


def _arguments(fn: Callable, args: tuple, kwargs: dict) -> dict:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _wrap_mha(state: Recording, mha: nn.MultiheadAttention, inner: Callable) -> Callable:
    name = state.names[id(mha)]

    def forward(*args, **kwargs):
        a = _arguments(inner, args, kwargs)
        self_attention = _same_tensor(a["query"], a["key"])
        sunk: list[torch.Tensor] = []
        regularized = self_attention and is_regularized(mha)
        if regularized:  # its forward reports the regularized weights
            setattr(mha, SINK_ATTR, sunk.append)
        state.depth += 1
        try:
            out = inner(*args, **kwargs)
        finally:
            state.depth -= 1
            if regularized:
                delattr(mha, SINK_ATTR)
        if not self_attention:
            state.skipped[name] = "cross-attention (query is not key)"
            return out
        if not sunk:
            q = a["query"]
            sunk.append(mha_weights(mha, q, q, q, a["key_padding_mask"], a["attn_mask"]))
        state.add(name, "nn.MultiheadAttention", sunk[0])
        return out

    return forward


def _wrap_encoder_layer(state: Recording, layer: nn.TransformerEncoderLayer, inner: Callable):
    name = state.names[id(layer.self_attn)]

    def forward(*args, **kwargs):
        before = len(state.calls.get(name, ()))
        out = inner(*args, **kwargs)
        if len(state.calls.get(name, ())) == before:  # the fast path bypassed self_attn
            a = _arguments(inner, args, kwargs)
            with torch.no_grad():
                h = layer.norm1(a["src"]) if layer.norm_first else a["src"]
            weights = mha_weights(
                layer.self_attn, h, h, h, a["src_key_padding_mask"], a["src_mask"]
            )
            state.add(name, "nn.MultiheadAttention (encoder fast path)", weights)
        return out

    return forward


def _wrap_temporal(state: Recording, layer: TemporalAttention, inner: Callable) -> Callable:
    name = state.names[id(layer)]

    def forward(*args, **kwargs):
        a = _arguments(inner, args, kwargs)
        got: list = []
        original = layer.diagonal

        def capture(x, dropped=None):  # the regularizer's diagonal of this very call
            b_ii = original(x, dropped)
            got.append(b_ii)
            return b_ii

        layer.diagonal = capture
        state.depth += 1
        try:
            out = inner(*args, **kwargs)
        finally:
            state.depth -= 1
            del layer.diagonal
        if a["return_attention"]:
            weights = out[1].detach().clone()
        else:
            with torch.no_grad():
                h = layer.pos(a["x"])
                h = layer.norm(h) if layer.norm_kind == "pre" else h
                b = bias_from_diagonal(got[-1] if got else None, h.shape[-2], h.dtype, h.device)
                weights = torch.softmax(layer._logits(h, b), dim=-1)
        state.add(name, "diagsink TemporalAttention", weights)
        return out

    return forward


_SDPA = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _sdpa_weights(a: dict) -> torch.Tensor:
    """The weights ``softmax(q kᵀ · scale + mask)`` of ``F.scaled_dot_product_attention``."""
    q, k, mask, scale = a["query"], a["key"], a.get("attn_mask"), a.get("scale")
    with torch.no_grad():
        if a.get("enable_gqa") and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        s = (q @ k.transpose(-2, -1)) * scale
        if a.get("is_causal"):
            keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~keep, -math.inf)
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
        return torch.softmax(s, dim=-1)


def _call_site() -> str:
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(_TORCH_DIR)
    ):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _patch_sdpa(state: Recording) -> Callable:
    original = F.scaled_dot_product_attention

    def scaled_dot_product_attention(*args, **kwargs):
        out = original(*args, **kwargs)
        if state.depth == 0:
            a = {**dict(zip(_SDPA, args)), **kwargs}
            where = state.stack[-1] if state.stack else "<model>"
            name = f"{where}:sdpa@{_call_site()}"
            if a["query"].is_nested or a["query"].shape[-2] != a["key"].shape[-2]:
                state.skipped[name] = "queries and keys differ in number (cross-attention)"
            else:
                state.add(name, "scaled_dot_product_attention", _sdpa_weights(a))
        return out

    F.scaled_dot_product_attention = scaled_dot_product_attention
    return original


@contextmanager
def record(model: nn.Module, *, sdpa: bool = True) -> Iterator[Recording]:
    """Record the attention maps of every self-attention ``model`` computes inside the block.

    Args:
        model: any ``nn.Module`` (left unchanged; restored on leaving the block).
        sdpa: also record bare ``torch.nn.functional.scaled_dot_product_attention`` calls.

    Yields:
        a :class:`Recording`; ``rec.maps[name]`` is ``[..., H, T, T]`` (``[N, H, T, T]`` for
        batched ``nn.MultiheadAttention``; ``[B, N, H, T, T]`` for the package's layer on
        ``[B, N, T, C]``). Maps are recomputed in the input's dtype, so they match the fused
        kernels' internal weights to rounding, not bit for bit; the outputs are untouched.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"record() takes an nn.Module, got {type(model).__name__}.")
    names: dict[int, str] = {}
    for name, m in model.named_modules():
        names.setdefault(id(m), name or "<model>")
    rec = state = Recording(names)
    wrappers = {
        nn.MultiheadAttention: _wrap_mha,
        nn.TransformerEncoderLayer: _wrap_encoder_layer,
        TemporalAttention: _wrap_temporal,
    }
    saved: list[tuple[nn.Module, object]] = []

    def push(m: nn.Module, args: tuple) -> None:
        state.stack.append(names.get(id(m), type(m).__name__))

    def pop(m: nn.Module, args: tuple, out: object) -> None:  # must return None: keeps `out`
        state.stack.pop()

    handles = [
        _module.register_module_forward_pre_hook(push),
        _module.register_module_forward_hook(pop, always_call=True),
    ]
    original_sdpa = _patch_sdpa(state) if sdpa else None
    try:
        for m in {id(m): m for m in model.modules()}.values():
            wrap = next((w for cls, w in wrappers.items() if isinstance(m, cls)), None)
            if wrap is not None:
                saved.append((m, m.__dict__.get("forward")))
                m.forward = wrap(state, m, m.forward)
        yield rec
    finally:
        for m, previous in reversed(saved):
            if previous is None:
                del m.forward
            else:
                m.forward = previous
        if original_sdpa is not None:
            F.scaled_dot_product_attention = original_sdpa
        for handle in handles:
            handle.remove()


# -- statistics -----------------------------------------------------------------------------------
def map_stats(attn: torch.Tensor) -> dict[str, float]:
    """The book's statistics of weights ``[..., T, T]``: per map (mean, SD) and of the mean map.

    Every ``[T, T]`` map (one per sequence and head) gets its diagonal mass ``mean_i α_ii``,
    its ratio to the uniform ``1/T``, its mean row entropy divided by ``log T`` and its
    column-stripe index (:mod:`diagsink.stats`); the keys without prefix are their means over
    the maps (equal to ``stats.diagonal_mass(attn).mass`` and ``stats.column_stripe_index(attn)``),
    ``*_sd`` their standard deviations, ``avg_*`` the statistics of the averaged map.
    """
    length = attn.shape[-1]
    if attn.dim() < 2 or attn.shape[-2] != length:
        raise ValueError(f"attn has shape {tuple(attn.shape)}; expected [..., T, T].")
    maps = attn.detach().double().reshape(-1, length, length)  # [maps, T, T]
    per = {
        "diag_mass": maps.diagonal(dim1=-2, dim2=-1).mean(-1),
        "entropy": stats.attention_entropy(maps, normalized=True).mean(-1),
        "stripe": stats.stripe_index_per_map(maps),
    }
    per["diag_ratio"] = per["diag_mass"] * length
    mean = maps.mean(0)
    row = {"T": length, "maps": maps.shape[0]}
    for key in ("diag_mass", "diag_ratio", "entropy", "stripe"):
        row[key] = float(per[key].mean())
        row[f"{key}_sd"] = float(per[key].std()) if maps.shape[0] > 1 else 0.0
    dm = stats.diagonal_mass(mean)
    row["avg_diag_mass"], row["avg_diag_ratio"] = dm.mass, dm.ratio
    row["avg_entropy"] = float(stats.attention_entropy(mean, normalized=True).mean())
    row["avg_stripe"] = stats.column_stripe_index(mean)
    return row


def table(rec: Recording) -> list[dict]:
    """One row per recorded name: ``name``, ``kind``, ``shape``, :func:`map_stats` (for pandas)."""
    rows = []
    for name, attn in rec.maps.items():
        if attn.shape[-1] != attn.shape[-2]:
            continue
        rows.append(
            {"name": name, "kind": rec.kinds[name], "shape": tuple(attn.shape), **map_stats(attn)}
        )
    return rows


# -- input-step sensitivity ------------------------------------------------------------
class Profile(NamedTuple):
    """Result of :func:`sensitivity_profile`: ``values[j] = S_j`` ``[T]``, standard error, how."""

    values: torch.Tensor
    se: torch.Tensor | None
    method: str
    n_samples: int
    time_dim: int
    batch_dim: int | None


def _slice_sq(
    g: torch.Tensor, time_dim: int, batch_dim: int | None, mean: bool = True
) -> torch.Tensor:
    """``Σ g²`` over every axis but time (and batch): ``[T]``, or ``[B, T]`` when ``mean`` is
    ``False`` (else the mean over the batch is taken)."""
    keep = [time_dim] if batch_dim is None else [batch_dim, time_dim]
    other = [d for d in range(g.dim()) if d not in keep]
    sq = g.pow(2).sum(other) if other else g.pow(2)
    if batch_dim is not None:
        sq = sq if batch_dim < time_dim else sq.T  # [B, T]
        sq = sq.mean(0) if mean else sq
    return sq


def sensitivity_profile(
    f: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    time_dim: int,
    method: str = "exact",
    n_samples: int = 64,
    *,
    batch_dim: int | None = None,
    seed: int = 0,
) -> Profile:
    """How strongly the output of ``f`` depends on each input step: ``S_j = ||∂f(x)/∂x_j||_F``.

    ``x_j`` is the slice of ``x`` at index ``j`` of ``time_dim``; the Frobenius norm runs over
    every output entry and every entry of the slice. With ``batch_dim`` (samples that ``f``
    treats independently) the slice is ``x_{b,j}`` and the profile is the root mean square
    over the batch, ``S_j = sqrt(mean_b ||∂f(x)/∂x_{b,j}||²_F)``.

    ``f`` is called once (in training mode its random draw is held fixed). ``method="exact"``
    builds the full Jacobian by reverse-mode autograd (one vectorised backward pass per output
    entry: small problems); ``"hutchinson"`` takes ``n_samples`` backward passes with
    Rademacher vectors ``v`` (private generator seeded with ``seed``), using
    ``E||vᵀ J_j||² = ||J_j||²_F``. Returns a :class:`Profile`: ``values`` ``[T]`` and, for
    Hutchinson, ``se`` ``[T]``, the standard error (delta method from the spread of the
    samples: one per probe, or with ``batch_dim`` one per probe and batch element).
    """
    if method not in ("exact", "hutchinson"):
        raise ValueError(f"method={method!r} is not known; choose 'exact' or 'hutchinson'.")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor (the input of f).")
    for name, dim in (("time_dim", time_dim), ("batch_dim", batch_dim)):
        if dim is not None and not (isinstance(dim, int) and -x.dim() <= dim < x.dim()):
            raise ValueError(
                f"{name}={dim!r} is not an axis of x, which has ndim={x.dim()} (shape "
                f"{tuple(x.shape)}); pass an axis in [{-x.dim()}, {x.dim() - 1}]."
            )
    time_dim, batch_dim = time_dim % x.dim(), None if batch_dim is None else batch_dim % x.dim()
    if batch_dim == time_dim:
        raise ValueError(f"batch_dim and time_dim are both axis {time_dim}; name two axes.")
    if method == "hutchinson" and (not isinstance(n_samples, int) or n_samples < 2):
        raise ValueError(f"n_samples={n_samples!r}: Hutchinson needs at least 2 samples.")
    x = x.detach().requires_grad_(True)
    y = f(x)
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        raise ValueError("f(x) must be a tensor that depends on x differentiably.")
    if method == "exact":
        rows = torch.eye(y.numel(), dtype=y.dtype, device=y.device).reshape(-1, *y.shape)
        (jac,) = torch.autograd.grad(y, x, rows, is_grads_batched=True)  # [n_out, *x.shape]
        values = _slice_sq(jac, time_dim + 1, None if batch_dim is None else batch_dim + 1)
        return Profile(values.sqrt(), None, method, 0, time_dim, batch_dim)
    gen = torch.Generator(device=y.device).manual_seed(seed)
    samples = []
    for k in range(n_samples):
        v = torch.randint(0, 2, y.shape, generator=gen, device=y.device).to(y.dtype) * 2 - 1
        (g,) = torch.autograd.grad(y, x, v, retain_graph=k < n_samples - 1)
        samples.append(_slice_sq(g, time_dim, batch_dim, mean=False))  # [T] or [B, T]
    q = torch.stack(samples).reshape(-1, samples[0].shape[-1])
    # [n_samples (x B), T]: unbiased draws of S_j² (of one element's ||J_{b,j}||² with batch_dim)
    values = q.mean(0).clamp_min(0).sqrt()
    se_sq = q.std(0) / math.sqrt(q.shape[0])
    se = torch.where(values > 0, se_sq / (2 * values.clamp_min(1e-30)), se_sq.sqrt())
    return Profile(values, se, method, n_samples, time_dim, batch_dim)


# -- report ----------------------------------------------------------------------
def report(
    rec: Recording, profile: Profile | None = None, *, title: str = "", columns: int = 4
) -> tuple[plt.Figure, list[dict]]:
    """One figure (every recorded map, averaged, and the sensitivity profile) and :func:`table`.

    Each panel is the mean of all maps recorded under a name (over sequences and heads);
    the profile panel draws ``S_j`` with ±2 standard errors when it has them.
    """
    if not isinstance(rec, Recording):
        raise DiagsinkError(
            f"report() takes the Recording of `with probe.record(model) as rec:`, got "
            f"{type(rec).__name__}; record the model's forward pass first and pass `rec`."
        )
    plotting.use_style()
    rows = table(rec)
    panels = len(rows) + (profile is not None)
    if not panels:
        raise DiagsinkError(
            "nothing was recorded: the model computed no self-attention inside "
            "`with record(model) as rec:` (it has no nn.MultiheadAttention, TemporalAttention "
            "or scaled_dot_product_attention call); probe a model with temporal attention."
        )
    ncol = min(columns, panels)
    nrow = math.ceil(panels / ncol)
    fig, axs = plt.subplots(
        nrow, ncol, figsize=(3.4 * ncol, 3.2 * nrow), squeeze=False, layout="constrained"
    )
    flat = list(axs.flat)
    maps = rec.maps
    for ax, row in zip(flat, rows):
        mean = maps[row["name"]].double().reshape(-1, row["T"], row["T"]).mean(0)
        how = f"mean of {row['maps']} maps; T·diag = {row['avg_diag_ratio']:.2f}"
        plotting.attention_heatmap(mean, ax, how=how, title=row["name"], colorbar=False)
    if profile is not None:
        ax = flat[len(rows)]
        steps = torch.arange(profile.values.numel())
        err = None if profile.se is None else 2 * profile.se.detach().cpu()
        ax.errorbar(steps, profile.values.detach().cpu(), yerr=err, marker="o", capsize=3)
        ax.set_xlabel("input step $j$")
        ax.set_ylabel(r"$S_j = \|\partial f / \partial x_j\|_F$")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        extra = f", {profile.n_samples} samples, ±2 SE" if profile.se is not None else ""
        ax.set_title(f"sensitivity ({profile.method}{extra})")
    for ax in flat[panels:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig, rows
