"""One plotting style for the whole book, and the attention figures every chapter draws.

* :func:`use_style` -- colour-blind-safe defaults: the Okabe–Ito palette for lines,
  ``viridis`` for heatmaps (perceptually uniform, readable in grey scale).
* :func:`average_attention` -- averages attention ``[..., T, T]`` over *named* axes and
  returns the description of what was averaged, so a figure can say it.
* :func:`attention_heatmap` -- one ``[T, T]`` map: rows = query step ``i``, columns = key
  step ``j``, labelled axes, colour bar, and the averaging written into the title.
* :func:`variant_panel` -- the paper's Fig. 1: one map per variant, (a) no residual,
  (b) no regularization, (c) mask, (d) penalty, (e) dropout.
* :func:`head_grid` -- per-layer × per-head grids ``[L, H, T, T]`` (or ``[H, T, T]``).

Every figure function takes ``how``: a plain-language description of the averaging
(e.g. ``"last block, mean over batch, nodes and 8 heads, train mode"``); it is written
into the title, because a heatmap of attention means little without it.

Used first in the chapter "A task where parroting fails" (``book/parroting.ipynb``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import matplotlib as mpl
import matplotlib.pyplot as plt
import torch
from cycler import cycler
from matplotlib.ticker import MaxNLocator

from .variants import FIGURE_ORDER, SHORT_LABELS

__all__ = [
    "OKABE_ITO",
    "HEATMAP_CMAP",
    "use_style",
    "AveragedAttention",
    "average_attention",
    "attention_heatmap",
    "variant_panel",
    "head_grid",
]

#: The Okabe–Ito palette (Okabe and Ito 2008, "Color Universal Design"), eight colours that
#: stay distinguishable with the common forms of colour blindness (black first, as in the original).
OKABE_ITO = (
    "#000000",  # black
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#009E73",  # bluish green
    "#F0E442",  # yellow
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
)
#: colour map for attention heatmaps (``cividis`` is an alternative designed for CVD).
HEATMAP_CMAP = "viridis"

_QUERY_LABEL = "query step $i$"
_KEY_LABEL = "key step $j$"
_CBAR_LABEL = r"attention weight $\alpha_{ij}$"


def use_style() -> None:
    """Set the book's matplotlib defaults (call once at the top of a chapter).

    Lines cycle through the Okabe–Ito palette (yellow, hard to see on white, is moved to
    the end); images default to :data:`HEATMAP_CMAP`; light grids, no top/right spines.
    """
    lines = [c for c in OKABE_ITO if c != "#F0E442"] + ["#F0E442"]
    mpl.rcParams.update(
        {
            "axes.prop_cycle": cycler(color=lines),
            "image.cmap": HEATMAP_CMAP,
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "figure.figsize": (6.4, 4.0),
            "font.size": 10,
            "axes.titlesize": 10,
            "axes.labelsize": 10,
            "legend.fontsize": 9,
            "legend.frameon": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "lines.linewidth": 1.8,
            "lines.markersize": 5,
        }
    )


class AveragedAttention(NamedTuple):
    """Result of :func:`average_attention`: the averaged map and what was averaged."""

    attn: torch.Tensor
    how: str


def average_attention(
    attn: torch.Tensor,
    axes: Sequence[str],
    over: Sequence[str] = ("batch", "nodes", "heads"),
    *,
    context: str = "",
) -> AveragedAttention:
    """Average attention weights over named leading axes, and say so.

    Args:
        attn: ``[*lead, T, T]`` attention weights (rows = queries, columns = keys).
        axes: one name per leading axis, e.g. ``("batch", "heads")`` for ``[B, H, T, T]``
            or ``("batch", "nodes", "heads")`` for ``[B, N, H, T, T]``.
        over: the names to average over; names in ``over`` that are absent from ``axes``
            are an error (the averaging must be what the caption says).
        context: extra words for the description, e.g. ``"last block, eval mode"``.

    Returns:
        :class:`AveragedAttention` ``(attn, how)``: the map with the ``over`` axes removed
        (``[T, T]`` when every leading axis is averaged) and a description such as
        ``"mean over batch (64) and heads (8); last block, eval mode"``.

    Raises:
        ValueError: ``attn`` is not ``[*lead, T, T]``, ``axes`` does not name every leading
            axis, or ``over`` names an unknown axis.
    """
    if not isinstance(attn, torch.Tensor) or attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
        shape = tuple(attn.shape) if isinstance(attn, torch.Tensor) else type(attn).__name__
        raise ValueError(f"attn has shape {shape}; expected attention weights [*lead, T, T].")
    axes = tuple(axes)
    if len(axes) != attn.dim() - 2 or len(set(axes)) != len(axes):
        raise ValueError(
            f"axes={axes} must give one distinct name to each of the {attn.dim() - 2} leading axes of "
            f"attn {tuple(attn.shape)} (the last two axes are query and key)."
        )
    unknown = [name for name in over if name not in axes]
    if unknown:
        raise ValueError(f"over={tuple(over)} names {unknown}, which are not among axes={axes}.")
    dims = [axes.index(name) for name in axes if name in over]
    averaged = attn.mean(dim=dims) if dims else attn
    parts = [f"{name} ({attn.shape[axes.index(name)]})" for name in axes if name in over]
    if not parts:
        how = "no averaging"
    elif len(parts) == 1:
        how = f"mean over {parts[0]}"
    else:
        how = f"mean over {', '.join(parts[:-1])} and {parts[-1]}"
    if context:
        how = f"{how}; {context}"
    return AveragedAttention(averaged, how)


def _as_matrix(attn, name: str = "attn") -> torch.Tensor:
    a = torch.as_tensor(attn).detach().to("cpu", torch.float64)
    if a.dim() != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(
            f"{name} has shape {tuple(a.shape)}; expected one attention map [T, T] "
            "(average the leading axes first, e.g. with ds.plotting.average_attention)."
        )
    return a


def attention_heatmap(
    attn,
    ax: plt.Axes | None = None,
    *,
    how: str,
    title: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
    cmap: str | None = None,
    label: str = _CBAR_LABEL,
    axis_labels: tuple[str, str] = (_QUERY_LABEL, _KEY_LABEL),
) -> plt.Axes:
    """Draw one attention map ``[T, T]``: rows = query step ``i``, columns = key step ``j``.

    Args:
        attn: ``[T, T]`` tensor or array.
        ax: axes to draw into (a new figure when ``None``).
        how: how the map was obtained (the averaging); written into the title.
        title: optional title placed before ``how``.
        vmin, vmax: colour limits (default: the map's own range).
        colorbar: add a colour bar labelled ``label``.
        cmap: colour map (default :data:`HEATMAP_CMAP`).
        label: colour-bar label; the default ``attention weight α_ij`` suits attention maps,
            pass another for other ``[T, T]`` maps drawn the same way (e.g. sensitivities).
        axis_labels: ``(row label, column label)``; default query step ``i`` / key step ``j``.

    Returns:
        the :class:`matplotlib.axes.Axes`.

    Raises:
        ValueError: ``attn`` is not a square ``[T, T]`` map, or ``how`` is empty.
    """
    if not how:
        raise ValueError(
            "how='' -- say how the map was averaged (e.g. 'mean over batch (64), eval mode')."
        )
    a = _as_matrix(attn)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    length = a.shape[0]
    image = ax.imshow(
        a.numpy(),
        cmap=cmap or HEATMAP_CMAP,
        vmin=vmin,
        vmax=vmax,
        origin="upper",
        interpolation="nearest",
        extent=(-0.5, length - 0.5, length - 0.5, -0.5),
    )
    ax.set_ylabel(axis_labels[0])
    ax.set_xlabel(axis_labels[1])
    for axis in (ax.xaxis, ax.yaxis):  # steps are integers: no 2.5 on a step axis
        axis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.grid(False)
    ax.set_title(f"{title}\n{how}" if title else how)
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        if label:
            bar.set_label(label)
    return ax


def variant_panel(
    maps: Mapping[str, object],
    *,
    how: str,
    shared_scale: bool = True,
    title: str | None = None,
    panel_width: float = 2.6,
) -> plt.Figure:
    """The paper's Fig. 1: one attention map per variant, side by side.

    Args:
        maps: ``variant -> [T, T]``. The paper's variant names are drawn in the order of
            the paper's Figure 1 (:data:`diagsink.variants.FIGURE_ORDER`: penalty before
            dropout) and labelled with the letters of its results table
            (:data:`diagsink.variants.SHORT_LABELS`: ``(e) penalty`` then ``(d) dropout``);
            other names keep their order and are lettered ``(a)``, ``(b)``, … .
        how: the averaging, written into the figure title.
        shared_scale: one colour scale (and one colour bar) for all panels, so brightness
            compares across variants; ``False``: each panel its own scale and colour bar
            (shows structure inside each map, but brightness no longer compares).
        title: optional first line of the figure title.

    Returns:
        the :class:`matplotlib.figure.Figure` (``len(maps)`` heatmap axes, plus colour bars).

    Raises:
        ValueError: no maps, a map that is not ``[T, T]``, or maps of different sizes.
    """
    if not maps:
        raise ValueError("maps is empty; pass {variant: [T, T] attention map}.")
    names = list(maps)
    if set(names) <= set(FIGURE_ORDER):
        names = [n for n in FIGURE_ORDER if n in maps]
        labels = [SHORT_LABELS[n] for n in names]
    else:
        labels = [f"({chr(ord('a') + k)}) {n}" for k, n in enumerate(names)]
    mats = [_as_matrix(maps[n], name=f"maps[{n!r}]") for n in names]
    if len({m.shape for m in mats}) > 1:
        raise ValueError(
            f"the maps have different sizes {[tuple(m.shape) for m in mats]}; use one T for the panel."
        )
    vmin = min(float(m.min()) for m in mats) if shared_scale else None
    vmax = max(float(m.max()) for m in mats) if shared_scale else None
    width = (panel_width + (0.0 if shared_scale else 0.7)) * len(mats) + 0.8
    fig, axs = plt.subplots(
        1, len(mats), figsize=(width, panel_width + 0.9), squeeze=False, layout="constrained"
    )
    axs = axs[0]
    for k, (ax, m, label) in enumerate(zip(axs, mats, labels)):
        last = k == len(mats) - 1
        attention_heatmap(
            m,
            ax,
            how=label,
            vmin=vmin,
            vmax=vmax,
            colorbar=not shared_scale,
            label=_CBAR_LABEL if last else "",
        )
        if k:
            ax.set_ylabel("")
    if shared_scale:
        bar = fig.colorbar(axs[-1].images[0], ax=list(axs), fraction=0.02, pad=0.02)
        bar.set_label(_CBAR_LABEL)
    fig.suptitle(f"{title}\n{how}" if title else how)
    return fig


def head_grid(
    attn,
    *,
    how: str,
    shared_scale: bool = True,
    layer_names: Sequence[str] | None = None,
    cell: float = 1.8,
) -> plt.Figure:
    """Per-layer × per-head grid of attention maps.

    Args:
        attn: ``[L, H, T, T]`` (layers × heads) or ``[H, T, T]`` (one layer).
        how: the averaging over the remaining axes (batch, nodes, ...), in the title.
        shared_scale: one colour scale for all cells (one colour bar) or one per cell.
        layer_names: labels of the ``L`` rows (default ``"layer 1"`` …).

    Returns:
        the :class:`matplotlib.figure.Figure` with ``L × H`` heatmap axes (plus colour bars).

    Raises:
        ValueError: ``attn`` is not ``[L, H, T, T]`` or ``[H, T, T]``.
    """
    a = torch.as_tensor(attn).detach().to("cpu", torch.float64)
    if a.dim() == 3:
        a = a[None]
    if a.dim() != 4 or a.shape[-1] != a.shape[-2]:
        raise ValueError(
            f"attn has shape {tuple(torch.as_tensor(attn).shape)}; expected [L, H, T, T] "
            "(layers, heads, query, key) or [H, T, T]."
        )
    n_layers, n_heads = a.shape[:2]
    names = (
        list(layer_names)
        if layer_names is not None
        else [f"layer {k + 1}" for k in range(n_layers)]
    )
    if len(names) != n_layers:
        raise ValueError(f"layer_names has {len(names)} entries but attn has {n_layers} layers.")
    vmin = float(a.min()) if shared_scale else None
    vmax = float(a.max()) if shared_scale else None
    fig, axs = plt.subplots(
        n_layers, n_heads, figsize=(cell * n_heads + 1.0, cell * n_layers + 0.8), squeeze=False
    )
    for li in range(n_layers):
        for h in range(n_heads):
            ax = axs[li, h]
            ax.imshow(
                a[li, h].numpy(), cmap=HEATMAP_CMAP, vmin=vmin, vmax=vmax, interpolation="nearest"
            )
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
            if li == 0:
                ax.set_title(f"head {h + 1}")
            if h == 0:
                ax.set_ylabel(f"{names[li]}\n{_QUERY_LABEL}")
            if li == n_layers - 1:
                ax.set_xlabel(_KEY_LABEL)
            if not shared_scale:
                fig.colorbar(ax.images[0], ax=ax, fraction=0.046, pad=0.04)
    if shared_scale:
        bar = fig.colorbar(axs[0, 0].images[0], ax=axs.ravel().tolist(), fraction=0.02, pad=0.02)
        bar.set_label(_CBAR_LABEL)
    fig.suptitle(how)
    return fig
