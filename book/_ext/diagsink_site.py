"""Sphinx extension for the diagsink book: serve MathJax from a local copy.

The published site and the offline CI build must render math without any CDN.
MathJax 3 comes from the ``django-static-mathjax`` wheel (pinned in the ``book``
extra; it has no dependencies and is not used with Django here). At the end of the
build the ``es5`` component folder (the ``tex-chtml.js`` bundle, the fonts and the
lazily loaded components) is copied to ``_static/mathjax``, and ``mathjax_path``
points there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

MATHJAX_PATH = "mathjax/tex-chtml.js"  # relative to _static


def _mathjax_es5() -> Path:
    try:
        import mathjax  # provided by django-static-mathjax
    except ImportError as exc:  # pragma: no cover - message for a missing extra
        raise ExtensionError(
            "MathJax is not installed: install the book extra, "
            "`pip install -c constraints.txt -e '.[book]'` (it provides django-static-mathjax)."
        ) from exc
    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").is_file():
        raise ExtensionError(f"MathJax files are missing from {es5}; reinstall django-static-mathjax.")
    return es5


def _set_path(app: Sphinx, config) -> None:
    _mathjax_es5()  # fail early, before any notebook executes
    config.mathjax_path = MATHJAX_PATH


def _copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    es5 = _mathjax_es5()
    target = Path(app.outdir) / "_static" / "mathjax"
    # keep the one bundle we load plus every folder it may load components from
    skip = {p.name for p in es5.glob("*.js") if p.name != "tex-chtml.js"}
    shutil.copytree(es5, target, dirs_exist_ok=True, ignore=lambda d, names: [n for n in names if Path(d) == es5 and n in skip])


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _set_path)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
