"""Draw the README's figure from committed artifacts: ``python tools/readme_figure.py``.

One row of the five variants' last-block attention maps of the committed full-length runs
(protocol :data:`diagsink.results.FULL`: 29 of METR-LA's 207 sensors, all 34,272 steps, CPU),
averaged over the seeds that have every variant, in the order of the paper's Figure 1 with the letters of its
results table, as the chapter "Heatmaps on METR-LA" draws them. Writes ``book/_static/readme_heatmaps.png`` atomically (a small PNG).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from diagsink import plotting  # noqa: E402
from diagsink._io import atomic_write_bytes  # noqa: E402
from diagsink.engine.artifacts import load_results  # noqa: E402
from diagsink.results import FULL, complete_seeds, restrict  # noqa: E402
from diagsink.variants import FIGURE_ORDER, SHORT_LABELS, VARIANTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static" / "readme_heatmaps.png"


def one_row(maps: dict[str, torch.Tensor], how: str) -> plt.Figure:
    """The maps ``variant -> [T, T]`` in one row at the column's width (the first page's figure,
    short enough to leave the findings in view), one colour scale, every fourth step ticked."""
    names = [n for n in FIGURE_ORDER if n in maps]
    vmax = max(float(maps[n].max()) for n in names)
    fig, axs = plt.subplots(
        1, len(names), figsize=(plotting.COLUMN_PX / plotting.DPI, 2.3), layout="constrained"
    )
    for k, (ax, n) in enumerate(zip(axs, names)):
        t = maps[n].shape[-1]
        image = ax.imshow(maps[n].numpy(), cmap=plotting.HEATMAP_CMAP, vmin=0.0, vmax=vmax)
        ax.set_title(SHORT_LABELS[n].replace(" ", "\n", 1), fontsize=9)
        ax.set_xticks(range(0, t, 4))
        ax.set_yticks(range(0, t, 4) if k == 0 else [])
        ax.tick_params(labelsize=8)
        ax.grid(False)
        ax.set_xlabel("key $j$", fontsize=8)
    axs[0].set_ylabel("query $i$", fontsize=8)
    bar = fig.colorbar(image, ax=list(axs), fraction=0.02, pad=0.02)
    bar.ax.tick_params(labelsize=8)
    bar.set_label(r"$\alpha_{ij}$", fontsize=9)
    return plotting.caption(fig, how)


def main() -> int:
    """Write the figure; return the exit status."""
    arts = load_results(ROOT / "book" / "results" / FULL)
    seeds = complete_seeds(arts, VARIANTS)
    if not seeds:
        print(f"no seed of {FULL} has every variant yet; nothing drawn", file=sys.stderr)
        return 1
    arts = restrict(arts, seeds, VARIANTS)
    maps = {
        v: torch.tensor([a["attention"]["mean"] for a in arts if a["variant"] == v]).mean(0)
        for v in VARIANTS
    }
    data = arts[0]["provenance"]["data"]
    where = f"{data['n_nodes']} of 207 sensors, all {data['n_steps']:,} steps"
    plotting.use_style()
    fig = one_row(maps, f"{FULL}: METR-LA, {where}, CPU; last block, mean over seed(s) {seeds}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150)
    atomic_write_bytes(OUT, buf.getvalue())
    print(f"wrote {OUT.relative_to(ROOT)} ({len(buf.getvalue()) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
