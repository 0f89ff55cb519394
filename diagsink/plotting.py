"""One plotting style for the whole book, and the attention figures every chapter draws.

* :func:`use_style` -- colour-blind-safe defaults (Okabe–Ito lines, ``viridis`` maps),
  figures no wider than the content column; :func:`integer_steps` for step axes.
* :func:`average_attention` -- averages attention ``[..., T, T]`` over *named* axes and
  returns the description of what was averaged, so a figure can say it.
* :func:`attention_heatmap` -- one ``[T, T]`` map: rows = query step ``i``, columns = key
  step ``j``, integer ticks, labelled colour bar, a one-line title.
* :func:`variant_panel` -- the paper's Fig. 1, one map per variant in the figure's order
  with the table's letters ((a), (b), (c), (e) penalty, (d) dropout), in a grid of
  :func:`panel_grid` rows so that each map is at least :data:`MIN_PANEL_PX` wide on the page.
* :func:`head_grid` -- per-layer × per-head grids ``[L, H, T, T]`` (or ``[H, T, T]``).

Every figure function takes ``how``, the averaging in plain words; it becomes the caption
below the panels (:func:`caption`), because a heatmap of attention means little without it.
Used first in the chapter "A task where parroting fails" (``book/parroting.ipynb``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import matplotlib as mpl
import matplotlib.pyplot as plt
import torch
from cycler import cycler
from matplotlib.ticker import MaxNLocator

from .variants import FIGURE_ORDER, SHORT_LABELS

__all__ = [
    "OKABE_ITO", "HEATMAP_CMAP", "COLUMN_PX", "MIN_PANEL_PX", "DPI", "use_style",
    "integer_steps", "panel_grid", "caption", "caption_text", "rendered_panel_widths",
    "AveragedAttention", "average_attention", "attention_heatmap", "variant_panel", "map_grid", "head_grid",
]  # fmt: skip

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

#: Width of the book's content column in CSS pixels on a 1280 px wide page (the theme's
#: main column measures about 700-800 px; the smaller figure is the safe one).
COLUMN_PX = 740
#: The smallest width, in CSS pixels on the rendered page, of one heatmap panel (a 12 x 12
#: map is legible from about 220 px: ~18 px per cell).
MIN_PANEL_PX = 220
#: ``figure.dpi`` set by :func:`use_style`: one figure inch is this many CSS pixels inline.
DPI = 100
_CAPTION_SIZE = 8


def use_style() -> None:
    """Set the book's matplotlib defaults (call once at the top of a chapter).

    Lines cycle through the Okabe–Ito palette (yellow, hard to see on white, is moved to
    the end); images default to :data:`HEATMAP_CMAP`; light grids, no top/right spines; the
    default figure is no wider than the content column (:data:`COLUMN_PX` at :data:`DPI`).
    """
    lines = [c for c in OKABE_ITO if c != "#F0E442"] + ["#F0E442"]
    mpl.rcParams.update(
        {
            "axes.prop_cycle": cycler(color=lines),
            "image.cmap": HEATMAP_CMAP,
            "figure.dpi": DPI,
            "savefig.dpi": 150,
            "figure.figsize": (6.8, 3.8),
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


def integer_steps(ax: plt.Axes, which: str = "x") -> plt.Axes:
    """Put integer ticks on the step axes of ``ax`` (``which``: ``"x"``, ``"y"`` or ``"both"``).

    Steps, epochs and sequence positions are integers: a tick at 2.5 on such an axis is
    noise. Used by every chapter's line plots over steps, and by the heatmaps here.
    """
    if which not in ("x", "y", "both"):
        raise ValueError(f"which={which!r}; choose 'x', 'y' or 'both'.")
    axes = {"x": [ax.xaxis], "y": [ax.yaxis], "both": [ax.xaxis, ax.yaxis]}[which]
    for axis in axes:
        axis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    return ax


def panel_grid(
    n: int, *, max_cols: int = 3, min_px: int = MIN_PANEL_PX, column_px: int = COLUMN_PX
) -> tuple[int, int]:
    """Rows and columns for ``n`` heatmap panels, each at least ``min_px`` wide in the column.

    A row holds as many panels as fit into ``column_px`` next to the labels and one colour
    bar (about 150 px), at most ``max_cols``: for the book's column that is two panels per
    row, so five variants take three rows.

    Raises:
        ValueError: ``n < 1`` or ``max_cols < 1``.
    """
    if n < 1 or max_cols < 1:
        raise ValueError(f"n={n}, max_cols={max_cols}: both must be at least 1.")
    fit = max(1, (column_px - 150) // (min_px + 40))
    cols = min(n, max_cols, fit)
    return -(-n // cols), cols


def caption(fig: plt.Figure, text: str, *, width_chars: int | None = None) -> plt.Figure:
    """Write ``text`` (how the maps were obtained) as a caption below the figure's panels.

    Titles stay one line; the averaging procedure goes here. Several calls on one figure
    add lines (a text already there is not repeated). Wrapped to the figure's width.
    """
    if not text:
        raise ValueError("caption text is empty; say how the figure's maps were obtained.")
    lines: list[str] = getattr(fig, "_diagsink_caption", [])
    if text not in lines:
        lines.append(text)
    fig._diagsink_caption = lines
    # a character of the caption font is about 0.6 em wide; the figure is width x 72 points
    chars = width_chars or max(40, int(fig.get_figwidth() * 72 / (_CAPTION_SIZE * 0.6)) - 4)
    wrapped = "\n".join(textwrap.fill(line, chars) for line in lines)
    fig.supxlabel(wrapped, fontsize=_CAPTION_SIZE, x=0.02, ha="left", color="0.25")
    return fig


def caption_text(fig: plt.Figure) -> str:
    """The caption written by :func:`caption` (its lines joined by ``"; "``), or ``""``."""
    return "; ".join(getattr(fig, "_diagsink_caption", []))


def rendered_panel_widths(fig: plt.Figure, column_px: int = COLUMN_PX) -> list[float]:
    """Width in CSS pixels of each image panel of ``fig`` as the book's page shows it.

    The page shows the figure's tight bounding box at :data:`DPI`, shrunk to the column when
    wider (``max-width: 100 %``). Used by the tests (and chapters) to check legibility.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.get_tightbbox(renderer)
    scale = min(1.0, column_px / (box.width * fig.dpi))  # inline: the figure at fig.dpi
    return [
        ax.get_window_extent(renderer).width * scale
        for ax in fig.axes
        if ax.images and ax.get_visible() and ax.get_label() != "<colorbar>"
    ]


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


def _one_line(title: str | None) -> str:
    if title and "\n" in title:
        raise ValueError(
            f"title {title!r} has several lines; keep the title to one line and put the "
            "averaging into how= (it becomes the caption below the figure)."
        )
    return title or ""


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
        how: how the map was obtained (the averaging); written into the figure's caption
            below the panels (:func:`caption`), not into the title.
        title: the panel's title, one line (default: none).
        vmin, vmax: colour limits (default: the map's own range).
        colorbar: add a colour bar labelled ``label``.
        cmap: colour map (default :data:`HEATMAP_CMAP`).
        label: colour-bar label; the default ``attention weight α_ij`` suits attention maps,
            pass another for other ``[T, T]`` maps drawn the same way (e.g. sensitivities).
        axis_labels: ``(row label, column label)``; default query step ``i`` / key step ``j``.

    Returns:
        the :class:`matplotlib.axes.Axes`.

    Raises:
        ValueError: ``attn`` is not a square ``[T, T]`` map, ``how`` is empty, or ``title``
            has more than one line.
    """
    if not how:
        raise ValueError(
            "how='' -- say how the map was averaged (e.g. 'mean over batch (64), eval mode')."
        )
    ax = _draw(attn, ax, title, vmin, vmax, colorbar, cmap, label, axis_labels)
    caption(ax.figure, f"{title}: {how}" if title else how)
    return ax


def _draw(attn, ax, title, vmin, vmax, colorbar, cmap=None, label=_CBAR_LABEL,
          axis_labels=(_QUERY_LABEL, _KEY_LABEL)) -> plt.Axes:  # fmt: skip
    a = _as_matrix(attn)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.9), layout="constrained")
    length = a.shape[0]
    extent = (-0.5, length - 0.5, length - 0.5, -0.5)
    image = ax.imshow(
        a.numpy(), cmap=cmap or HEATMAP_CMAP, vmin=vmin, vmax=vmax, origin="upper",
        interpolation="nearest", extent=extent,
    )  # fmt: skip
    ax.set_ylabel(axis_labels[0])
    ax.set_xlabel(axis_labels[1])
    integer_steps(ax, "both")  # steps are integers: no 2.5 on a step axis
    ax.grid(False)
    ax.set_title(_one_line(title))
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label(label)
    return ax


def variant_panel(
    maps: Mapping[str, object],
    *,
    how: str,
    shared_scale: bool = True,
    title: str | None = None,
    panel_width: float = 2.5,
    max_cols: int = 3,
) -> plt.Figure:
    """The paper's Fig. 1: one attention map per variant, in a grid that fits the column.

    Args:
        maps: ``variant -> [T, T]``. The paper's variant names are drawn in the order of
            the paper's Figure 1 (:data:`diagsink.variants.FIGURE_ORDER`: penalty before
            dropout) and labelled with the letters of its results table
            (:data:`diagsink.variants.SHORT_LABELS`: ``(e) penalty`` then ``(d) dropout``);
            other names keep their order and are lettered ``(a)``, ``(b)``, … .
        how: the averaging, written as the caption below the panels.
        shared_scale: one colour scale (and one colour bar) for all panels, so brightness
            compares across variants; ``False``: each panel its own scale and colour bar
            (shows structure inside each map, but brightness no longer compares).
        title: optional one-line figure title.
        panel_width: inches per panel (at :data:`DPI`); rows hold :func:`panel_grid` panels.

    Returns:
        the :class:`matplotlib.figure.Figure` (``len(maps)`` heatmap axes, plus colour bars;
        unused grid cells are hidden).

    Raises:
        ValueError: no maps, a map that is not ``[T, T]``, maps of different sizes, or a
            title of several lines.
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
    return _grid(mats, labels, how, shared_scale, title, panel_width, max_cols)


def map_grid(
    maps: Mapping[str, object],
    *,
    how: str,
    shared_scale: bool = True,
    title: str | None = None,
    panel_width: float = 2.5,
) -> plt.Figure:
    """Titled attention maps ``title -> [T, T]`` in the grid of :func:`variant_panel`, in the
    given order and titled by their keys (e.g. the heads or blocks of one run), each map at
    least :data:`MIN_PANEL_PX` wide on the page. Raises ``ValueError`` as :func:`variant_panel`.
    """
    if not maps:
        raise ValueError("maps is empty; pass {title: [T, T] attention map}.")
    mats = [_as_matrix(m, name=f"maps[{n!r}]") for n, m in maps.items()]
    return _grid(mats, list(maps), how, shared_scale, title, panel_width, 3)


def _grid(mats, labels, how, shared_scale, title, panel_width, max_cols) -> plt.Figure:
    if len({m.shape for m in mats}) > 1:
        sizes = [tuple(m.shape) for m in mats]
        raise ValueError(f"the maps have different sizes {sizes}; use one T for the panel.")
    title = _one_line(title)
    vmin = min(float(m.min()) for m in mats) if shared_scale else None
    vmax = max(float(m.max()) for m in mats) if shared_scale else None
    rows, cols = panel_grid(len(mats), max_cols=max_cols)
    width = min(COLUMN_PX / DPI, (panel_width + (0.0 if shared_scale else 0.8)) * cols + 1.5)
    fig, axs = plt.subplots(
        rows, cols, figsize=(width, (panel_width + 0.7) * rows + 0.6), squeeze=False,
        layout="constrained",
    )  # fmt: skip
    flat = list(axs.flat)
    for k, (ax, m, label) in enumerate(zip(flat, mats, labels)):
        _draw(m, ax, label, vmin, vmax, colorbar=not shared_scale)
        if k % cols:
            ax.set_ylabel("")
    for ax in flat[len(mats) :]:
        ax.set_visible(False)
    if shared_scale:
        bar = fig.colorbar(flat[0].images[0], ax=flat, fraction=0.03, pad=0.03, shrink=0.8)
        bar.set_label(_CBAR_LABEL)
    if title:
        fig.suptitle(title)
    return caption(fig, how)


def head_grid(
    attn,
    *,
    how: str,
    shared_scale: bool = True,
    layer_names: Sequence[str] | None = None,
    cell: float = 2.4,
) -> plt.Figure:
    """Per-layer × per-head grid of attention maps ``[L, H, T, T]`` (or ``[H, T, T]``).

    Args:
        attn: ``[L, H, T, T]`` (layers × heads) or ``[H, T, T]`` (one layer).
        how: the averaging over the remaining axes (batch, nodes, ...), as the caption.
        shared_scale: one colour scale for all cells (one colour bar) or one per cell.
        layer_names: labels of the ``L`` rows (default ``"layer 1"`` …).
        cell: inches per cell, shrunk so that the figure fits the column (:data:`COLUMN_PX`).

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
    names = list(layer_names) if layer_names is not None else [
        f"layer {k + 1}" for k in range(n_layers)
    ]  # fmt: skip
    if len(names) != n_layers:
        raise ValueError(f"layer_names has {len(names)} entries but attn has {n_layers} layers.")
    vmin = float(a.min()) if shared_scale else None
    vmax = float(a.max()) if shared_scale else None
    cell = min(cell, (COLUMN_PX / DPI - 1.6) / n_heads)
    fig, axs = plt.subplots(
        n_layers, n_heads, figsize=(cell * n_heads + 1.6, (cell + 0.35) * n_layers + 0.8),
        squeeze=False, layout="constrained",
    )  # fmt: skip
    for li in range(n_layers):
        for h in range(n_heads):
            ax = axs[li, h]
            im = ax.imshow(a[li, h].numpy(), cmap=HEATMAP_CMAP, vmin=vmin, vmax=vmax,
                           interpolation="nearest")  # fmt: skip
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
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).set_label(
                    _CBAR_LABEL if h == n_heads - 1 else ""
                )
    if shared_scale:
        bar = fig.colorbar(axs[0, 0].images[0], ax=axs.ravel().tolist(), fraction=0.03, pad=0.03)
        bar.set_label(_CBAR_LABEL)
    caption(fig, how)
    return fig
