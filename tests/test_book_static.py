"""Static checks of the book sources (no build needed): figures have alt text, headings
form a proper hierarchy, and the API page documents every module of the package."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diagsink.course import toc_entries

from conftest import ROOT


def _toc_sources() -> list[Path]:
    entries = toc_entries(ROOT)
    found = []
    for entry in entries:
        stem = re.sub(r"\.(ipynb|md)$", "", entry)
        found += [p for p in (ROOT / f"{stem}.ipynb", ROOT / f"{stem}.md") if p.exists()]
    return found


SOURCES = _toc_sources()
NOTEBOOKS = [p for p in SOURCES if p.suffix == ".ipynb"]

# a code cell that draws: matplotlib/seaborn calls, or the drawing helpers of diagsink.plotting
# (add a helper here when diagsink/plotting.py gains one)
_DRAWS = re.compile(
    r"\bplt\.(show|subplots?|subplot_mosaic|figure|imshow|plot|bar|barh|hist|scatter|matshow|pcolormesh|contourf?|errorbar|fill_between)\s*\("
    r"|\bsns\.\w+\s*\("
    r"|\.(imshow|matshow|pcolormesh|heatmap|plot|scatter|errorbar|bar|barh|hist|fill_between)\s*\("
    r"|\bplotting\.(attention_heatmap|variant_panel|head_grid)\s*\("
    r"|(?:(?<![\w.])|\bprobe\.)report\s*\("
)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _strip_comments(code: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in code.splitlines())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_cell_has_alt_text(path: Path):
    """A cell that draws carries ``mystnb.image.alt``: one sentence saying what the figure shows."""
    missing, weak = [], []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code" or not _DRAWS.search(_strip_comments(_src(cell))):
            continue
        alt = ((cell.get("metadata", {}).get("mystnb") or {}).get("image") or {}).get("alt")
        first = _src(cell).strip().splitlines()[0][:60] if _src(cell).strip() else ""
        if not alt:
            missing.append(f"cell {i} ({first!r})")
        elif len(alt.split()) < 4 or alt.lower().endswith((".png", ".svg")):
            weak.append(f"cell {i}: alt {alt!r} is not a sentence describing the figure")
    assert not missing and not weak, (
        f"{path.name}: give every figure cell the metadata "
        '{"mystnb": {"image": {"alt": "<what the figure shows, one sentence>"}}}:\n  '
        + "\n  ".join(missing + weak)
    )


def _headings(path: Path) -> list[tuple[int, str]]:
    """Markdown headings (level, text) in order, outside fenced code and directives."""
    texts = (
        [_src(c) for c in _cells(path) if c["cell_type"] == "markdown"]
        if path.suffix == ".ipynb"
        else [path.read_text()]
    )
    out: list[tuple[int, str]] = []
    for text in texts:
        fence: str | None = None
        for line in text.splitlines():
            stripped = line.strip()
            m = re.match(r"^(`{3,}|~{3,}|:{3,})", stripped)
            if m:
                if fence is None:
                    fence = m.group(1)[0] * len(m.group(1))
                    continue
                if stripped.startswith(fence) and stripped.rstrip(fence[0]) == "":
                    fence = None
                    continue
            if fence is None:
                h = re.match(r"^(#{1,6})\s+(.*\S)", line)
                if h:
                    out.append((len(h.group(1)), h.group(2)))
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_headings_form_a_hierarchy(path: Path):
    """Exactly one ``#`` title, first; then no level skipped (``##`` before ``###``)."""
    heads = _headings(path)
    assert heads, f"{path.name}: no heading; start with one '# Title'"
    titles = [t for level, t in heads if level == 1]
    assert len(titles) == 1, (
        f"{path.name}: {len(titles)} '#' headings {titles}, expected exactly one title"
    )
    assert heads[0][0] == 1, f"{path.name}: the first heading must be the '#' title, got {heads[0]}"
    for (prev, _), (level, text) in zip(heads, heads[1:]):
        assert level <= prev + 1, (
            f"{path.name}: heading {'#' * level} {text!r} skips a level after a level-{prev} heading"
        )


def test_heading_parser_sees_through_code_fences(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n```bash\n# a comment, not a heading\n```\n\n## Part\n\n````md\n# also code\n````\n### Sub\n"
    )
    assert _headings(page) == [(1, "Title"), (2, "Part"), (3, "Sub")]


def test_figure_detector():
    assert _DRAWS.search("fig, ax = plt.subplots()\nax.imshow(a)\nplt.show()")
    assert _DRAWS.search("ds.plotting.attention_heatmap(maps)")
    assert _DRAWS.search("fig = report(rec, profile=prof)")
    assert _DRAWS.search("ds.probe.report(rec)")
    assert not _DRAWS.search("print(rec.report_table())")
    assert not _DRAWS.search(_strip_comments("x = torch.ones(3)  # plt.show() later"))
    assert not _DRAWS.search("ds.plotting.use_style()\navg = ds.plotting.average_attention(a)")


def test_api_page_documents_every_module():
    """``book/api.md`` has an ``automodule`` for every module of the package (not the
    per-chapter exercise checks, which hold the reference solutions)."""
    api = (ROOT / "book" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. automodule:: (diagsink[\w.]*)\s*$", api, re.MULTILINE))
    modules = {"diagsink"}
    for path in (ROOT / "diagsink").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[1:2] == ("exercises",) and len(parts) > 2:
            continue  # the per-chapter checks hold the reference solutions
        private = any(p.startswith("_") for p in parts[1:]) and parts != ("diagsink", "_io")
        if parts[-1] != "__main__" and not private:
            modules.add(".".join(parts))
    # the layout's groups are the page's sections, in the package's order
    sections = re.findall(r"^## `(diagsink\.\w+)`", api, re.MULTILINE)
    assert sections == ["diagsink.data", "diagsink.engine", "diagsink.course", "diagsink.cli"]
    missing = sorted(modules - documented)
    assert not missing, (
        f"book/api.md lacks an automodule for {missing} (see 'Adding a module to this page')"
    )
    extra = sorted(documented - modules)
    assert not extra, f"book/api.md documents modules that do not exist: {extra}"


_IMPORT = re.compile(r"^\s*(from\s+diagsink(\.[\w.]+)?\s+import\s.*|import\s+diagsink\b.*)$", re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapters_import_the_package_in_one_style(path: Path):
    """Chapters use ``import diagsink as ds`` and ``from diagsink.<module> import name``, nothing else.

    ``from diagsink import jacobian as J`` (a third style, with private aliases) is refused: the
    reader meets every module as ``ds.<module>`` or by the names imported from it.
    """
    bad = []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            continue
        for m in _IMPORT.finditer(_strip_comments(_src(cell))):
            line = m.group(0).strip()
            if line != "import diagsink as ds" and not re.match(
                r"from diagsink\.[\w.]+ import ", line
            ):
                bad.append(f"cell {i}: {line}")
    assert not bad, f"{path.name}: imports outside the book's style: {bad}"
