"""Notebook and table-of-contents hygiene: what the book ships is clean and complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from diagsink.course import toc_entries

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "book").rglob("*.ipynb"))
NOTEBOOKS = [
    p for p in NOTEBOOKS if ".ipynb_checkpoints" not in p.parts and "_build" not in p.parts
]


def _toc_files() -> list[str]:
    return toc_entries(ROOT)


def _resolve(entry: str) -> list[Path]:
    return [p for p in (ROOT / f"{entry}{ext}" for ext in (".ipynb", ".md")) if p.exists()]


def test_there_are_chapters():
    assert NOTEBOOKS, "book/ holds no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped_and_uses_python3(path: Path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3", f"{path.name}: kernel must be python3"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs: strip them"
            assert cell.get("execution_count") is None, (
                f"{path.name} cell {i} has an execution count"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_unique_id(path: Path):
    """nbformat 4.5 cells carry ids (nbformat warns today and will refuse later; links and diffs use them)."""
    nb = json.loads(path.read_text())
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), (
        f"{path.name}: save it as nbformat 4.5 or later"
    )
    ids = [cell.get("id") for cell in nb["cells"]]
    missing = [i for i, cell_id in enumerate(ids) if not cell_id]
    assert not missing, (
        f"{path.name}: cells {missing} have no id (nbformat.validator.normalize adds them)"
    )
    assert len(set(ids)) == len(ids), f"{path.name}: cell ids repeat"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_path_hacks_or_installs(path: Path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        assert "sys.path" not in src, (
            f"{path.name}: no sys.path hacks, import the installed package"
        )
        assert "pip install" not in src, f"{path.name}: no pip install cells"
        assert "tqdm.auto" not in src, (
            f"{path.name}: use `from tqdm import tqdm` (widgets need a CDN)"
        )


def test_every_notebook_is_in_the_toc():
    listed = {(ROOT / f).with_suffix("").resolve() for f in _toc_files()}
    missing = [p.relative_to(ROOT) for p in NOTEBOOKS if p.with_suffix("").resolve() not in listed]
    assert not missing, f"notebooks not in _toc.yml: {missing}"


def test_every_toc_entry_exists():
    missing = [f for f in _toc_files() if not _resolve(f)]
    assert not missing, f"_toc.yml names files that do not exist: {missing}"


def test_toc_has_parts():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert toc["format"] == "jb-book" and toc.get("parts"), "_toc.yml must be a jb-book with parts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_display_math_has_no_line_that_markdown_reads_as_a_list(path: Path):
    """Inside a directive (a theorem, an exercise) MyST parses a ``$$`` line starting with
    ``+ `` or ``- `` as a list item, and the formula is shown as raw text. Write ``{}+``."""
    import re

    nb = json.loads(path.read_text())
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        in_math = False
        for line in "".join(cell["source"]).split("\n"):
            stripped = line.strip()
            if in_math and re.match(r"^[+\-*]\s", stripped):
                bad.append(f"cell {i}: {stripped[:50]!r}")
            if stripped.count("$$") % 2:
                in_math = not in_math
    assert not bad, (
        f"{path.name}: lines inside $$ read as list items (prefix them with {{}}): {bad}"
    )
