"""The book's Sphinx extension (``book/_ext/diagsink_site.py``) on a two-page mini site.

Builds with Sphinx directly (no notebook execution): the real extension set of the book
(myst-nb, sphinx-exercise, sphinx-thebe, sphinx-togglebutton, the book theme) plus
``diagsink_site``, and checks what reaches the HTML: no thebe script or CDN address and no
duplicate inline script when thebe is off; solutions as dropdowns, or gone entirely (code
included) with ``hide_solutions``; short names in docstrings resolved; the favicon linked and
copied to the site root; a figure's ``heatmap-cols-N`` class (the browser test's panel rule)
reaching its ``<img>``.
"""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from conftest import ROOT

BOOK_CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
LABEL = "ex-course-softmax"
SECRET = "shifted_by_the_row_maximum"  # appears only in the solution cell
STATIC = ROOT / "book" / "_static"
FIGURE_ALT = "Three attention heatmaps side by side, one per variant."


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }

    def code(src, tag):
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["tags"] = [tag]
        return cell

    nb.cells = [
        nbformat.v4.new_markdown_cell("# Demo\n\nSome math $x^2$.\n\n## Exercises"),
        nbformat.v4.new_markdown_cell(f"```{{exercise}} Rows\n:label: {LABEL}\n\nWrite it.\n```"),
        code(f'def f(s):\n    raise NotImplementedError("{LABEL}")', "exercise-stub"),
        nbformat.v4.new_markdown_cell(f"```{{solution-start}} {LABEL}\n:class: dropdown\n```"),
        code(
            f"def f(s):\n    {SECRET} = s - s.amax(-1, keepdim=True)\n    return {SECRET}",
            "exercise-solution",
        ),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```"),
        code(f'ds.exercises.check("{LABEL}", f, strict=True)', "exercise-check"),
    ]
    figure = nbformat.v4.new_code_cell("fig = plt.figure()")  # its output: a stored PNG
    figure.metadata["mystnb"] = {"image": {"alt": FIGURE_ALT, "classes": "heatmap-cols-3"}}
    png = base64.b64encode((STATIC / "logo.png").read_bytes()).decode()
    figure.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png})]
    nb.cells.append(figure)
    return nb


def _build(tmp_path: Path, *, hide: bool) -> dict[str, str]:
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "index.md").write_text("# Home\n\n```{toctree}\ndemo\napi\n```\n")
    (src / "api.md").write_text(
        "# API\n\n```{eval-rst}\n.. automodule:: diagsink.runtime\n   :members: Settings\n\n"
        ".. py:function:: demo_ref()\n\n   Uses :class:`Settings` and :class:`diagsink.Settings`.\n```\n"
    )
    nbformat.write(_notebook(), str(src / "demo.ipynb"))
    (src / "conf.py").write_text("")
    ext = str(ROOT / "book" / "_ext")
    if ext not in sys.path:
        sys.path.insert(0, ext)
    out = tmp_path / "html"
    app = Sphinx(
        str(src),
        str(src),
        str(out),
        str(tmp_path / "doctrees"),
        "html",
        confoverrides={
            "extensions": [
                "myst_nb",
                "sphinx_exercise",
                "sphinx_thebe",
                "sphinx_togglebutton",
                "sphinx.ext.autodoc",
                "sphinx_book_theme",
                "diagsink_site",
            ],
            "html_theme": "sphinx_book_theme",
            "html_theme_options": {"launch_buttons": {"thebe": False}},
            "nb_execution_mode": "off",
            "myst_enable_extensions": ["dollarmath", "colon_fence"],
            "hide_solutions": hide,
            "html_favicon": str(STATIC / "favicon.ico"),
            "html_logo": str(STATIC / "logo.svg"),
            "nitpicky": True,
            "nitpick_ignore_regex": [tuple(x) for x in BOOK_CONFIG["nitpick_ignore_regex"]],
        },
        status=None,
        warning=(tmp_path / "warnings.txt").open("w"),
        freshenv=True,
    )
    app.build()
    warnings = (tmp_path / "warnings.txt").read_text()
    pages = {p.stem: p.read_text() for p in out.glob("*.html")}
    pages["_warnings"] = warnings
    root_icon = out / "favicon.ico"
    pages["_root_favicon"] = root_icon.read_bytes().hex() if root_icon.is_file() else ""
    return pages


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("shown"), hide=False)


@pytest.mark.slow
def test_no_thebe_assets_and_no_duplicate_scripts(shown):
    html = shown["demo"]
    assert "unpkg.com" not in html and "THEBE_JS_URL" not in html and "sphinx-thebe" not in html
    assert "x-thebe-config" not in html
    inline = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(inline) == len(set(inline)), "an inline script appears twice"
    assert 'data-default-mode="auto"' in html  # no "invalid theme mode" console error
    assert "mathjax/tex-chtml.js" in html and "cdn.jsdelivr" not in html


@pytest.mark.slow
def test_solution_is_a_dropdown_by_default(shown):
    html = shown["demo"]
    assert 'class="solution dropdown' in html and SECRET in html


@pytest.mark.slow
def test_short_and_reexported_names_resolve(shown):
    assert "reference target not found" not in shown["_warnings"], shown["_warnings"]
    assert shown["api"].count('href="#diagsink.runtime.Settings"') >= 2


@pytest.mark.slow
def test_hide_solutions_removes_the_solution_code(tmp_path):
    pages = _build(tmp_path, hide=True)
    html = pages["demo"]
    assert SECRET not in html and 'class="solution' not in html
    assert "NotImplementedError" in html and "tag_exercise-check" in html  # stub and check stay


@pytest.mark.slow
def test_favicon_linked_and_copied_to_the_site_root(shown):
    """Every page links the favicon; the extension also puts it at ``/favicon.ico``."""
    assert re.search(r'<link rel="icon" href="_static/favicon.ico"\s*/?>', shown["demo"])
    assert shown["_root_favicon"] == (STATIC / "favicon.ico").read_bytes().hex()
    assert "logo.svg" in shown["demo"]
    assert re.search(r'<link rel="stylesheet"[^>]*href="_static/diagsink.css', shown["demo"])


@pytest.mark.slow
def test_heatmap_class_reaches_the_image(shown):
    """``mystnb.image.classes`` puts ``heatmap-cols-N`` on the ``<img>`` the browser test reads."""
    imgs = re.findall(r"<img [^>]*>", shown["demo"])
    figure = [tag for tag in imgs if FIGURE_ALT in tag]
    assert len(figure) == 1, imgs
    assert re.search(r'class="[^"]*\bheatmap-cols-3\b', figure[0]), figure[0]
