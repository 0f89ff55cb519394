"""Draw the README's figure from committed artifacts: ``python tools/readme_figure.py``.

The five variants' last-block attention maps of the committed ``quick`` runs
(``book/results/quick``, the 1026-step METR-LA slice, CPU), averaged over seeds, in the order
of the paper's Figure 1 with the letters of its results table, as the chapter "Heatmaps on
METR-LA" draws them. Writes ``book/_static/readme_heatmaps.png`` atomically (a small PNG).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

from diagsink import plotting  # noqa: E402
from diagsink._io import atomic_write_bytes  # noqa: E402
from diagsink.engine.artifacts import load_results  # noqa: E402
from diagsink.variants import VARIANTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static" / "readme_heatmaps.png"


def main() -> int:
    """Write the figure; return the exit status."""
    arts = load_results(ROOT / "book" / "results" / "quick")
    maps = {
        v: torch.tensor([a["attention"]["mean"] for a in arts if a["variant"] == v]).mean(0)
        for v in VARIANTS
    }
    seeds = len({a["seed"] for a in arts})
    plotting.use_style()
    fig = plotting.variant_panel(
        maps,
        how=f"quick protocol, METR-LA slice (1026 steps), CPU; last block, mean over {seeds} seeds",
        panel_width=2.0,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    atomic_write_bytes(OUT, buf.getvalue())
    print(f"wrote {OUT.relative_to(ROOT)} ({len(buf.getvalue()) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
