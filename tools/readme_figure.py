"""Draw the README's figure from committed artifacts: ``python tools/readme_figure.py``.

The five variants' last-block attention maps of the committed full-length runs
(``book/results/full29``: 29 of METR-LA's 207 sensors, all 34,272 steps, CPU), averaged over
the seeds that have every variant, in the order of the paper's Figure 1 with the letters of its
results table, as the chapter "Heatmaps on METR-LA" draws them. Writes ``book/_static/readme_heatmaps.png`` atomically (a small PNG).
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
from diagsink.results import complete_seeds, restrict  # noqa: E402
from diagsink.variants import VARIANTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static" / "readme_heatmaps.png"
PROTOCOL = "full29"


def main() -> int:
    """Write the figure; return the exit status."""
    arts = load_results(ROOT / "book" / "results" / PROTOCOL)
    seeds = complete_seeds(arts, VARIANTS)
    if not seeds:
        print(f"no seed of {PROTOCOL} has every variant yet; nothing drawn", file=sys.stderr)
        return 1
    arts = restrict(arts, seeds, VARIANTS)
    maps = {
        v: torch.tensor([a["attention"]["mean"] for a in arts if a["variant"] == v]).mean(0)
        for v in VARIANTS
    }
    data = arts[0]["provenance"]["data"]
    where = f"{data['n_nodes']} of 207 sensors, all {data['n_steps']:,} steps"
    plotting.use_style()
    fig = plotting.variant_panel(
        maps,
        how=f"{PROTOCOL}: METR-LA, {where}, CPU; last block, mean over seed(s) {seeds}",
        panel_width=2.0,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    atomic_write_bytes(OUT, buf.getvalue())
    print(f"wrote {OUT.relative_to(ROOT)} ({len(buf.getvalue()) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
