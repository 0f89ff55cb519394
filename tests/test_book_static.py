"""Static checks of the book sources (no build needed): figures have alt text, headings
form a proper hierarchy, and the API page documents every module of the package."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

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


# -- the site's logo and favicon, and the quiet-plumbing rule ---------------------------------


def _tool(name: str):
    """Load ``tools/<name>.py`` as a module (``tools/`` is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


draw_logo = _tool("draw_logo")
tag_plumbing = _tool("tag_plumbing")


def test_logo_files_are_what_the_script_draws():
    """``book/_static`` holds exactly what ``tools/draw_logo.py`` draws (pixels and SVG text)."""
    static = ROOT / "book" / "_static"
    assert (static / "logo.svg").read_text() == draw_logo.logo_svg(), (
        "book/_static/logo.svg differs from the script: run `python tools/draw_logo.py`"
    )
    with Image.open(static / "logo.png") as png:
        assert png.mode == "RGBA" and png.size == (192, 192)
        assert (draw_logo.np.asarray(png) == draw_logo.logo_pixels()).all(), "logo.png differs"
    with Image.open(static / "favicon.ico") as ico:
        assert ico.format == "ICO" and ico.info["sizes"] == {(s, s) for s in draw_logo.ICO_SIZES}
        for size in draw_logo.ICO_SIZES:
            ico.size = (size, size)
            pixels = draw_logo.np.asarray(ico.convert("RGBA"))
            assert (pixels == draw_logo.icon_pixels(size)).all(), f"favicon.ico {size} px differs"


def test_logo_shows_a_bright_diagonal():
    """The drawn map is an attention map (rows sum to 1) whose diagonal is the brightest entry."""
    a = draw_logo.attention_map()
    assert a.shape == (12, 12)
    draw_logo.np.testing.assert_allclose(a.sum(1), 1.0, rtol=1e-12)
    off = a[~draw_logo.np.eye(12, dtype=bool)].reshape(12, 11)
    assert (a.diagonal() > off.max(1)).all()
    rgb = draw_logo.colours(a).astype(int).sum(-1)  # brightness: the diagonal is the lightest
    assert (rgb.diagonal() > rgb[~draw_logo.np.eye(12, dtype=bool)].max()).all()


def test_config_references_the_logo_and_favicon():
    """``_config.yml`` points the logo and ``html.favicon`` at files that exist."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    logo, favicon = config.get("logo"), (config.get("html") or {}).get("favicon")
    assert logo and (ROOT / logo).is_file(), f"logo {logo!r} is missing: set it in _config.yml"
    assert favicon and (ROOT / favicon).is_file(), f"html.favicon {favicon!r} is missing"
    assert favicon.endswith(".ico"), "the favicon must be an .ico (copied to /favicon.ico)"


def test_plumbing_detector_matches_the_figure_detector():
    """``tools/tag_plumbing.py`` tags with the same figure detector as this module."""
    assert tag_plumbing.DRAWS.pattern == _DRAWS.pattern, (
        "tools/tag_plumbing.py DRAWS and tests/test_book_static.py _DRAWS differ: keep them equal"
    )


def _code(src: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "code", "metadata": {"tags": tags or []}, "source": src}


def test_plumbing_rule():
    """Plots, tables and provenance prints are plumbing; checks and computations are not."""
    cells = [
        _code("fig, ax = plt.subplots()\nax.plot(x, y)\nplt.show()"),  # 0 plot
        _code("rows = [dict(a=1)]\ndf = pd.DataFrame(rows)\ndf"),  # 1 table
        _code("print(ds.settings().mode)"),  # 2 provenance
        _code("ax = plt.gca()\nax.plot(x)\nassert len(x) == 3"),  # 3 checks a claim
        _code("z = torch.ones(3)\nplt.plot(z)"),  # 4 binds z, read below
        _code("def helper(a):\n    return a\nplt.plot(x)"),  # 5 defines a function
        _code("plt.plot(x)", ["exercise-solution"]),  # 6 an exercise
        _code("print(z.sum(), helper(1))"),  # 7 reads z and helper: not provenance
        _code("fig, ax = plt.subplots()\nax.imshow(m)", ["hide-input"]),  # 8 already hidden
        _code("for k in range(2):\n    fig = plt.figure()"),  # 9 plot; k, fig bound afresh
        _code("fig = plt.figure()\nfor k in ks:\n    print(k)"),  # 10 plot
        _code("torch.testing.assert_close(a, b)\nprint(ds.settings().mode)"),  # 11 check
        _code("table = metric_table(arts)\nprint(table)"),  # 12 prints: not a displayed table
        _code("%matplotlib inline\nplt.plot(x)"),  # 13 plot (the magic line is skipped)
        _code("def fmt(v):\n    return f'{v:.2f}'\npd.DataFrame(data).style.format(fmt)"),  # 14
    ]
    kinds = [tag_plumbing.plumbing_kind(cells, i) for i in range(len(cells))]
    assert kinds[:3] == ["plot", "table", "provenance"]
    assert kinds[3:8] == [None] * 5 and kinds[11:13] == [None, None] and kinds[14] is None
    assert kinds[9] == kinds[10] == kinds[13] == "plot"
    assert [i for i, _, _ in tag_plumbing.untagged(cells)] == [0, 1, 2, 9, 10, 13]


def test_tag_plumbing_is_idempotent(tmp_path: Path):
    """Writing tags twice changes nothing the second time; only the reported cells change."""
    path = tmp_path / "chapter.ipynb"
    nb = {
        "cells": [
            {**_code("plt.plot(x)"), "id": "a1", "outputs": [], "execution_count": None},
            {**_code("y = 2 * x"), "id": "b2", "outputs": [], "execution_count": None},
            {"cell_type": "markdown", "id": "c3", "metadata": {}, "source": "Größe"},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    original = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    path.write_text(original, encoding="utf-8")
    assert [i for i, _, _ in tag_plumbing.tag_notebook(path, write=True)] == [0]
    once = path.read_text(encoding="utf-8")
    assert tag_plumbing.tag_notebook(path, write=True) == []
    assert path.read_text(encoding="utf-8") == once
    cells = json.loads(once)["cells"]
    assert cells[0]["metadata"]["tags"] == ["hide-input"] and cells[1]["metadata"]["tags"] == []
    nb["cells"][0]["metadata"]["tags"] = ["hide-input"]
    assert once == json.dumps(nb, indent=1, ensure_ascii=False) + "\n"  # layout kept


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_plumbing_cells_carry_hide_input(path: Path):
    """Every cell that only plots, tabulates or prints provenance is tagged ``hide-input``.

    The rule is ``tools/tag_plumbing.py`` (its docstring); fails on a chapter until its owner
    (or the integrator) runs ``python tools/tag_plumbing.py --write book/<chapter>.ipynb``.
    """
    found = tag_plumbing.untagged(_cells(path))
    assert not found, (
        f"{path.name}: plumbing cells without 'hide-input' (run `python tools/tag_plumbing.py "
        f"--write book/{path.name}`):\n  "
        + "\n  ".join(f"cell {i} ({kind}): {first!r}" for i, kind, first in found)
    )


# -- the opening box of every chapter ------------------------------------------------------

_BOX_TITLES = ("What you will learn", "What this page shows")
_BOX_OPEN = re.compile(r"^(`{3,}|:{3,})\{admonition\}\s+(.*\S)\s*$")
# {glue}`key`, {glue:text}`key:.2f`, {glue:md}`key`, ...: the role and its content
_GLUE_ROLE = re.compile(r"\{glue(?::(\w+))?\}`([^`]*)`")
# a number typed into the box: a decimal (0.25) or a percentage (25 %, 25%)
_TYPED_NUMBER = re.compile(r"\d+\.\d+|\d\s*%")


def _opening_box(text: str) -> str | None:
    """The body of the first ``What you will learn``/``What this page shows`` admonition in
    ``text`` (fenced with backticks or colons), or None when there is none or it is not closed."""
    lines = text.splitlines()
    for k, line in enumerate(lines):
        m = _BOX_OPEN.match(line.strip())
        if m and m.group(2) in _BOX_TITLES:
            fence = m.group(1)
            for end in range(k + 1, len(lines)):
                if lines[end].strip() == fence:
                    return "\n".join(lines[k + 1 : end])
            return None
    return None


def _glue_keys(markdown: str) -> set[str]:
    """The keys of the glue roles in ``markdown`` (``{glue:text}`` content is ``key:format``)."""
    keys = set()
    for kind, content in _GLUE_ROLE.findall(markdown):
        keys.add(content.rsplit(":", 1)[0] if kind == "text" and ":" in content else content)
    return keys


def _box_problems(cells: list[dict]) -> list[str]:
    """What is wrong with a chapter's opening box and its glued numbers (empty: nothing)."""
    first = cells[0] if cells else None
    if first is None or first["cell_type"] != "markdown":
        return ["the first cell is not a markdown cell"]
    box = _opening_box(_src(first))
    if box is None:
        return [f"the first cell has no admonition titled {' or '.join(map(repr, _BOX_TITLES))}"]
    problems = [
        f"typed number {m.group(0)!r} in the box: glue it from the cell that computes it"
        for m in _TYPED_NUMBER.finditer(_GLUE_ROLE.sub("", box))
    ]
    code = "\n".join(_src(c) for c in cells if c["cell_type"] == "code")
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        for key in sorted(_glue_keys(_src(cell))):
            if not re.search(rf"\bglue\(\s*['\"]{re.escape(key)}['\"]", code):
                problems.append(
                    f"glue key {key!r} is used in markdown but no code cell calls glue({key!r}, ...)"
                )
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_opens_with_a_box_of_glued_numbers(path: Path):
    """The first cell holds a ``What you will learn``/``What this page shows`` admonition; the
    numbers in it that the page computes are inserted with myst-nb's ``{glue:text}`` (no decimal
    or percentage typed in), and every glue key in the markdown is glued by a code cell.

    A definition (T = 12 steps, 207 sensors) may be typed; a measured value may not.
    """
    problems = _box_problems(_cells(path))
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _cross_page_glue_problems(source: Path, markdown: str) -> list[str]:
    """What is wrong with the ``{glue...}`page.ipynb::key``` roles of ``markdown`` (in ``source``).

    myst-nb reads ``{glue:text}`` content as ``key:format``, split at the *last* colon, so a
    cross-page key without a format (``page.ipynb::key``) is read as the key ``page.ipynb:``.
    """
    problems = []
    for kind, content in _GLUE_ROLE.findall(markdown):
        if "::" not in content:
            continue
        page, rest = content.split("::", 1)
        if kind == "text" and ":" not in rest:
            problems.append(
                f"{{glue:text}}`{content}` has no format: write `{content}:d` (or :.2f, ...)"
            )
            continue
        key = rest.rsplit(":", 1)[0] if kind == "text" else rest
        target = source.parent / page
        if not target.exists():
            problems.append(f"{{glue}} `{content}` names {page}, which does not exist")
            continue
        code = "\n".join(_src(c) for c in _cells(target) if c["cell_type"] == "code")
        if not re.search(rf"\bglue\(\s*['\"]{re.escape(key)}['\"]", code):
            problems.append(f"`{content}`: {page} has no glue({key!r}, ...)")
    return problems


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_glue_from_another_page_names_a_key_that_page_glues(path: Path):
    """A ``page.ipynb::key`` glue role: the page exists and glues ``key``, and a ``{glue:text}``
    role carries a format (without one, myst-nb reads the key up to the last colon)."""
    if path.suffix == ".md":
        markdown = path.read_text()
    else:
        markdown = "\n".join(_src(c) for c in _cells(path) if c["cell_type"] == "markdown")
    problems = _cross_page_glue_problems(path, markdown)
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def test_cross_page_glue_checker_finds_a_missing_format_and_key():
    intro = ROOT / "book" / "intro.md"
    assert (
        _cross_page_glue_problems(intro, "{glue:text}`results.ipynb::results-budget-gain:.1f`")
        == []
    )
    assert (
        "has no format"
        in _cross_page_glue_problems(intro, "{glue:text}`results.ipynb::results-budget-gain`")[0]
    )
    assert (
        "has no glue" in _cross_page_glue_problems(intro, "{glue:text}`results.ipynb::nope:d`")[0]
    )


def test_box_checker_finds_typed_numbers_and_missing_keys():
    def md(text):
        return {"cell_type": "markdown", "metadata": {}, "source": text}

    good = "# T\n\n```{admonition} What this page shows\n:class: tip\n* MAE {glue:text}`c-mae:.2f` at $T = 12$\n```\n"
    glued = _code('glue("c-mae", 2.5, display=False)', ["remove-cell"])
    assert _box_problems([md(good), glued]) == []
    typed = good.replace("{glue:text}`c-mae:.2f`", "2.50")
    assert _box_problems([md(typed), glued]) == [
        "typed number '2.50' in the box: glue it from the cell that computes it"
    ]
    assert _box_problems([md(good.replace("at $T = 12$", "(12 %)")), glued])[0].startswith(
        "typed number '2 %'"
    )
    assert _box_problems([md(good), _code("x = 1")]) == [
        "glue key 'c-mae' is used in markdown but no code cell calls glue('c-mae', ...)"
    ]
    assert _box_problems([md("# T\n\nno box"), glued])[0].startswith(
        "the first cell has no admonition"
    )
    colons = ":::{admonition} What you will learn\n:class: tip\n* a {glue}`k` b\n:::\n"
    assert _opening_box(colons) == ":class: tip\n* a {glue}`k` b" and _glue_keys(colons) == {"k"}


# -- length, openings and the reading text (the edit to the standard of a textbook) -------------

#: a chapter's prose (its markdown cells) stays under this many words: split a longer chapter
PROSE_LIMIT = 3000
#: a chapter's opening (its first markdown cell, the title excluded: the question and the box)
OPENING_LIMIT = 160
#: the introduction answers the question on one page
INTRO_LIMIT = 1200
# no tracker words, issue numbers or commit hashes in the reading text: a reader of the book
# knows none of them; the changelog may name both
_TRACKER = re.compile(r"\b(the issue|issue.s|issues? \d+)\b|`[0-9a-f]{7,40}`", re.I)


def _markdown(path: Path) -> str:
    """The reading text of a page: the markdown cells of a notebook, the whole of a ``.md`` file."""
    if path.suffix == ".ipynb":
        return "\n".join(_src(c) for c in _cells(path) if c["cell_type"] == "markdown")
    return path.read_text(encoding="utf-8")


def prose_words(path: Path) -> int:
    """Words of a page's reading text (whitespace-separated, as the stop hook counts them)."""
    return len(_markdown(path).split())


def opening_words(cells: list[dict]) -> int:
    """Words of the first markdown cell without its ``#`` title line."""
    first = next((_src(c) for c in cells if c["cell_type"] == "markdown"), "")
    return len(re.sub(r"^#\s.*$", "", first, count=1, flags=re.M).split())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_prose_stays_under_the_limit(path: Path):
    """Reports the chapter's prose words; fails past :data:`PROSE_LIMIT` (aim at about 3,000)."""
    words = prose_words(path)
    print(f"{path.name}: {words} prose words")
    assert words <= PROSE_LIMIT, (
        f"{path.name}: {words} prose words, more than {PROSE_LIMIT}: split the chapter by "
        "cohesion or move the fine print to an appendix"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_opening_is_short(path: Path):
    """The opening says the question and what the reader will learn in at most about 150 words."""
    words = opening_words(_cells(path))
    assert words <= OPENING_LIMIT, (
        f"{path.name}: the first cell has {words} words after the title, more than {OPENING_LIMIT}: "
        "keep the question and the 'What you will learn' box; results belong after their definitions"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_closes_with_what_to_remember(path: Path):
    """Every chapter ends its reading text with a short "What to remember" box."""
    assert re.search(r"\{admonition\} What to remember", _markdown(path)), (
        f"{path.name}: no 'What to remember' box: close the chapter with a few lines the reader keeps"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_states_its_provenance_in_a_collapsed_cell(path: Path):
    """Which data, code, device and runs produced the page: one collapsed (``hide-cell``) code
    cell that prints :func:`diagsink.engine.provenance.page_note`, out of the reading path."""
    notes = [c for c in _cells(path) if c["cell_type"] == "code" and "print(page_note(" in _src(c)]
    assert len(notes) == 1, f"{path.name}: {len(notes)} page_note cells, want one"
    assert "hide-cell" in notes[0]["metadata"].get("tags", []), (
        f"{path.name}: the page_note cell must be tagged hide-cell (collapsed)"
    )


@pytest.mark.parametrize(
    "path", [p for p in SOURCES if p.name != "changelog.md"], ids=lambda p: p.stem
)
def test_reading_text_names_no_tracker_or_commit(path: Path):
    """No issue numbers, tracker words or commit hashes in the reading text (the changelog may)."""
    hits = [m.group(0) for m in _TRACKER.finditer(_markdown(path))]
    assert not hits, f"{path.name}: tracker words or commit hashes in the reading text: {hits[:5]}"


def test_the_introduction_fits_one_page():
    words = prose_words(ROOT / "book" / "intro.md")
    assert words <= INTRO_LIMIT, f"book/intro.md: {words} words, more than {INTRO_LIMIT}"


def test_length_and_tracker_rules_catch_what_they_should(tmp_path: Path):
    assert _TRACKER.search("as the issue's targets say") and _TRACKER.search("see issue 34")
    assert _TRACKER.search("an earlier version (commit `2c35c77`)")
    assert not _TRACKER.search("a released commit 1b6f5e2 of the paper's code, spelled out")
    cells = [
        {"cell_type": "markdown", "source": "# A title with many words in it\n\n" + "word " * 10},
        {"cell_type": "code", "source": "x = 1"},
        {"cell_type": "markdown", "source": "more " * 50},
    ]
    assert opening_words(cells) == 10
    page = tmp_path / "p.ipynb"
    page.write_text(json.dumps({"cells": cells}))
    assert prose_words(page) == 8 + 10 + 50  # the title line counts its '#'
