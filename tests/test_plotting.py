"""The book's figures: right number of panels, labelled axes, the averaging in the title (diagsink/plotting.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from diagsink import plotting  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _maps(n, T=6):
    return [torch.softmax(torch.randn(T, T), -1) for _ in range(n)]


def test_use_style_sets_colour_blind_safe_defaults():
    plotting.use_style()
    colours = [c.upper() for c in matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]]
    assert set(colours) == {c.upper() for c in plotting.OKABE_ITO}
    assert matplotlib.rcParams["image.cmap"] == plotting.HEATMAP_CMAP


def test_heatmap_labels_colourbar_and_caption():
    ax = plotting.attention_heatmap(_maps(1)[0], how="mean over batch (4)", title="T = 6")
    assert ax.get_xlabel().startswith("key step")
    assert ax.get_ylabel().startswith("query step")
    # one-line title; the averaging goes into the caption below the figure
    assert ax.get_title() == "T = 6"
    assert plotting.caption_text(ax.figure) == "T = 6: mean over batch (4)"
    assert "mean over batch (4)" in ax.figure._supxlabel.get_text()
    assert len(ax.figure.axes) == 2  # the map and its colour bar
    assert ax.figure.axes[1].get_ylabel().startswith("attention weight")


def test_heatmap_rejects_bad_shapes_missing_how_and_long_titles():
    with pytest.raises(ValueError, match=r"\[T, T\]"):
        plotting.attention_heatmap(torch.ones(2, 6, 6), how="x")
    with pytest.raises(ValueError, match=r"\[T, T\]"):
        plotting.attention_heatmap(torch.ones(3, 4), how="x")
    with pytest.raises(ValueError, match="how"):
        plotting.attention_heatmap(torch.eye(3), how="")
    with pytest.raises(ValueError, match="one line"):
        plotting.attention_heatmap(torch.eye(3), how="x", title="two\nlines")


@pytest.mark.parametrize("shared", [True, False])
def test_variant_panel_paper_order_and_scales(shared):
    names = ["dropout", "none", "mask", "no_residual", "penalty"]  # deliberately shuffled
    fig = plotting.variant_panel(
        dict(zip(names, _maps(5))), how="mean over heads (1)", shared_scale=shared
    )
    heat = [ax for ax in fig.axes if ax.images and ax.get_visible() and ax.get_xlabel()]
    # the paper's Figure 1 order (penalty before dropout), the letters of its results table
    titles = ["(a) no residual", "(b) no regularization", "(c) mask", "(e) penalty", "(d) dropout"]
    assert [ax.get_title() for ax in heat] == titles
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == (1 if shared else 5)
    assert all(bar.get_ylabel().startswith("attention weight") for bar in bars[-1:])
    assert plotting.caption_text(fig) == "mean over heads (1)"  # once, not once per panel
    if shared:
        limits = {ax.images[0].get_clim() for ax in heat}
        assert len(limits) == 1


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("T", [12, 24])
def test_variant_panel_is_legible_in_the_book_column(shared, T):
    """Legible on the page: every 12 x 12 map at least 220 px wide, the figure within the column."""
    plotting.use_style()
    maps = {
        v: m for v, m in zip(["no_residual", "none", "mask", "dropout", "penalty"], _maps(5, T))
    }
    fig = plotting.variant_panel(maps, how="mean over seeds", shared_scale=shared, title="one line")
    widths = plotting.rendered_panel_widths(fig)
    assert len(widths) == 5
    assert min(widths) >= plotting.MIN_PANEL_PX, widths
    assert fig.get_figwidth() * fig.dpi <= plotting.COLUMN_PX
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes if ax.images and ax.get_visible()}
    assert len(rows) == 3  # two panels per row: three rows for five variants


def test_rendered_widths_shrink_a_figure_wider_than_the_column():
    plotting.use_style()
    fig, axs = plt.subplots(1, 4, figsize=(16, 4))
    for ax in axs:
        ax.imshow(torch.eye(12).numpy())
    widths = plotting.rendered_panel_widths(fig)
    assert len(widths) == 4 and max(widths) < plotting.MIN_PANEL_PX  # four in a row: too small


def test_panel_grid_fits_the_column():
    assert plotting.panel_grid(5) == (3, 2)
    assert plotting.panel_grid(1) == (1, 1)
    assert plotting.panel_grid(4, column_px=2000) == (2, 3)  # max_cols caps a wide page
    with pytest.raises(ValueError, match="at least 1"):
        plotting.panel_grid(0)


def test_variant_panel_other_names_and_bad_sizes():
    fig = plotting.variant_panel({"x": torch.eye(4), "y": torch.eye(4)}, how="h")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["(a) x", "(b) y"]
    with pytest.raises(ValueError, match="different sizes"):
        plotting.variant_panel({"x": torch.eye(4), "y": torch.eye(5)}, how="h")
    with pytest.raises(ValueError, match=r"\[T, T\]"):
        plotting.variant_panel({"x": torch.ones(2, 4, 4)}, how="h")
    with pytest.raises(ValueError, match="one line"):
        plotting.variant_panel({"x": torch.eye(4)}, how="h", title="a\nb")


def test_caption_adds_distinct_lines_and_wraps():
    fig, ax = plt.subplots(figsize=(4, 3))
    plotting.caption(fig, "first")
    plotting.caption(fig, "first")
    plotting.caption(fig, "second " * 30)
    assert plotting.caption_text(fig).startswith("first; second")
    text = fig._supxlabel.get_text()
    assert text.count("first") == 1 and text.count("\n") >= 2  # wrapped to the figure width
    with pytest.raises(ValueError, match="empty"):
        plotting.caption(fig, "")


@pytest.mark.parametrize("shape,n", [((2, 3, 5, 5), 6), ((4, 5, 5), 4)])
def test_head_grid(shape, n):
    fig = plotting.head_grid(torch.rand(shape), how="mean over batch (8), eval mode")
    heat = [ax for ax in fig.axes if ax.images and not ax.get_label() == "<colorbar>"]
    assert len(heat) == n
    assert len(fig.axes) == n + 1
    assert "eval mode" in plotting.caption_text(fig)
    assert fig.get_figwidth() * fig.dpi <= plotting.COLUMN_PX + 1e-6
    with pytest.raises(ValueError, match=r"\[L, H, T, T\]"):
        plotting.head_grid(torch.rand(5, 5), how="h")


def test_average_attention_is_explicit():
    attn = torch.rand(4, 3, 2, 5, 5)
    avg = plotting.average_attention(attn, axes=("batch", "nodes", "heads"), context="last block")
    torch.testing.assert_close(avg.attn, attn.mean(dim=(0, 1, 2)))
    assert avg.how == "mean over batch (4), nodes (3) and heads (2); last block"
    part = plotting.average_attention(attn, axes=("batch", "nodes", "heads"), over=("batch",))
    assert part.attn.shape == (3, 2, 5, 5) and part.how == "mean over batch (4)"
    with pytest.raises(ValueError, match="leading axes"):
        plotting.average_attention(attn, axes=("batch", "heads"))
    with pytest.raises(ValueError, match="not among axes"):
        plotting.average_attention(attn, axes=("batch", "nodes", "heads"), over=("time",))
    with pytest.raises(ValueError, match=r"\[\*lead, T, T\]"):
        plotting.average_attention(torch.rand(3, 4), axes=())


def test_heatmap_labels_can_be_changed_for_other_maps():
    ax = plotting.attention_heatmap(
        torch.rand(5, 5),
        how="sensitivity",
        label="|dy/dx|",
        axis_labels=("forecast step", "input step"),
    )
    assert ax.get_ylabel() == "forecast step" and ax.get_xlabel() == "input step"
    assert ax.figure.axes[1].get_ylabel() == "|dy/dx|"


def test_step_axes_have_integer_ticks():
    ax = plotting.attention_heatmap(torch.full((12, 12), 1 / 12), how="uniform").axes
    ax.figure.canvas.draw()
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        inside = [t for t in ticks if -0.5 <= t <= 11.5]
        assert len(inside) >= 3 and all(float(t).is_integer() for t in inside), ticks


def test_integer_steps_on_a_line_plot():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2, 3, 4], [1.0, 0.5, 0.2, 0.1, 0.05])
    plotting.integer_steps(ax)
    fig.canvas.draw()
    inside = [t for t in ax.get_xticks() if 0 <= t <= 4]
    assert len(inside) >= 3 and all(float(t).is_integer() for t in inside)
    with pytest.raises(ValueError, match="which"):
        plotting.integer_steps(ax, "z")


def test_a_long_caption_does_not_widen_the_figure():
    plotting.use_style()
    maps = {
        v: m for v, m in zip(["no_residual", "none", "mask", "dropout", "penalty"], _maps(5, 12))
    }
    fig = plotting.variant_panel(maps, how="averaged over many things, " * 12, shared_scale=False)
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    assert box.width * fig.dpi <= plotting.COLUMN_PX + 5  # the caption wraps inside the figure
