"""Draw the book's logo and favicon: ``python tools/draw_logo.py`` (``--check`` to compare).

The picture is the book's subject: a 12 x 12 temporal attention map ``[T, T]`` (rows: queries,
columns: keys, T = 12 steps as on METR-LA) whose diagonal is the bright "sink". The weights
are a row softmax of logits ``-|i - j| / 2`` plus ``1.5`` on the diagonal, shown with a fixed
five-stop palette (no matplotlib colormap, so the pixels do not change with a library
version). Nothing is random: the same script always draws the same pixels.

Writes under ``book/_static/`` (the site's static folder, see ``_config.yml``):

- ``logo.svg``: the logo in the navigation bar (12 x 12 squares, crisp at any size);
- ``logo.png``: the same at 192 x 192 pixels (16 pixels per entry, 1-pixel gaps);
- ``favicon.ico``: 16, 32 and 48 pixel icons (the browser tab; ``html.favicon``).

``--check`` writes nothing and exits 1 when a committed file differs from what the script
draws (the test ``tests/test_site.py::test_logo_files_are_what_the_script_draws`` does the
same comparison).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "book" / "_static"
T = 12  # steps of the map: the paper's input length on METR-LA
CELL = 16  # pixels per map entry in logo.png
ICO_SIZES = (16, 32, 48)
BACKGROUND = (17, 24, 39)  # the gaps between entries: a dark slate
# palette stops (value in [0, 1] -> RGB): deep blue, teal, green, amber, pale yellow
STOPS = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
COLOURS = np.array(
    [[30, 41, 89], [31, 104, 140], [53, 163, 120], [232, 164, 44], [255, 244, 176]], dtype=float
)


def attention_map(steps: int = T) -> np.ndarray:
    """The logo's attention weights, ``[T, T]``, rows summing to 1, a bright diagonal."""
    i = np.arange(steps)
    logits = -np.abs(i[:, None] - i[None, :]) / 2.0 + 1.5 * np.eye(steps)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def colours(weights: np.ndarray) -> np.ndarray:
    """RGB colours, ``[T, T, 3]`` uint8, of the weights scaled by their maximum (square root)."""
    value = np.sqrt(weights / weights.max())  # the off-diagonal band stays visible
    rgb = [np.interp(value, STOPS, COLOURS[:, c]) for c in range(3)]
    return np.rint(np.stack(rgb, axis=-1)).astype(np.uint8)


def logo_pixels() -> np.ndarray:
    """The 192 x 192 logo, ``[H, W, 4]`` RGBA uint8: 16-pixel entries with 1-pixel gaps."""
    rgb = colours(attention_map())
    size = T * CELL
    img = np.zeros((size, size, 4), dtype=np.uint8)
    img[..., :3], img[..., 3] = BACKGROUND, 255
    for r in range(T):
        for c in range(T):
            img[r * CELL + 1 : (r + 1) * CELL, c * CELL + 1 : (c + 1) * CELL, :3] = rgb[r, c]
    return img


def icon_pixels(size: int) -> np.ndarray:
    """One favicon image, ``[size, size, 4]`` RGBA: the map, whole pixels per entry, centred."""
    cell = size // T
    rgb = np.repeat(np.repeat(colours(attention_map()), cell, axis=0), cell, axis=1)
    img = np.zeros((size, size, 4), dtype=np.uint8)  # transparent margin
    pad = (size - cell * T) // 2
    img[pad : pad + cell * T, pad : pad + cell * T, :3] = rgb
    img[pad : pad + cell * T, pad : pad + cell * T, 3] = 255
    return img


def logo_svg() -> str:
    """The logo as SVG text: one ``<rect>`` per map entry on a dark square."""
    rgb = colours(attention_map())
    rects = [
        f'<rect x="{c + 0.04:.2f}" y="{r + 0.04:.2f}" width="0.92" height="0.92" '
        f'fill="#{rgb[r, c, 0]:02x}{rgb[r, c, 1]:02x}{rgb[r, c, 2]:02x}"/>'
        for r in range(T)
        for c in range(T)
    ]
    bg = "#{:02x}{:02x}{:02x}".format(*BACKGROUND)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {T} {T}" width="192" '
        f'height="192" role="img">\n<title>A 12 x 12 attention map with a bright diagonal'
        f'</title>\n<rect width="{T}" height="{T}" fill="{bg}"/>\n'
        + "\n".join(rects)
        + "\n</svg>\n"
    )


def png_bytes(pixels: np.ndarray) -> bytes:
    """PNG file bytes of ``[H, W, 4]`` RGBA pixels (no time stamp or other metadata)."""
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def ico_bytes() -> bytes:
    """ICO file bytes holding the favicon at 16, 32 and 48 pixels."""
    largest = Image.fromarray(icon_pixels(max(ICO_SIZES)), "RGBA")
    extra = [Image.fromarray(icon_pixels(s), "RGBA") for s in ICO_SIZES if s != max(ICO_SIZES)]
    buf = io.BytesIO()
    largest.save(
        buf,
        format="ICO",
        sizes=[(s, s) for s in ICO_SIZES],
        append_images=extra,
        bitmap_format="png",
    )
    return buf.getvalue()


def drawn() -> dict[str, bytes]:
    """Every file the script writes: name under ``book/_static`` -> bytes."""
    return {
        "logo.svg": logo_svg().encode(),
        "logo.png": png_bytes(logo_pixels()),
        "favicon.ico": ico_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the logo files; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--out", type=Path, default=STATIC, help="folder (default book/_static)")
    args = parser.parse_args(argv)
    differ = []
    for name, data in drawn().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                differ.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    if differ:
        print(f"differ from the script's drawing: {differ}; run `python tools/draw_logo.py`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
