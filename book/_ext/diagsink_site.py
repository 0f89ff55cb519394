"""Sphinx extension for the diagsink book: an offline site without JavaScript errors, and
solutions that really hide.

1. **MathJax served locally.** The published site and the offline CI build must render math
   without any CDN. MathJax 3 comes from the ``django-static-mathjax`` wheel (pinned in the
   ``book`` extra; it has no dependencies and is not used with Django here). At the end of
   the build the ``es5`` component folder (the ``tex-chtml.js`` bundle, the fonts and the
   lazily loaded components) is copied to ``_static/mathjax``, and ``mathjax_path`` points
   there.

2. **No thebe scripts when thebe is off.** Jupyter Book always loads ``sphinx_thebe``, and
   sphinx-thebe adds its assets in ``env-before-read-docs`` whatever the configuration:
   an inline script ``const THEBE_JS_URL = "https://unpkg.com/..."``, ``sphinx-thebe.js``,
   ``sphinx-thebe.css``, and a ``text/x-thebe-config`` block on every page. Sphinx 7.4
   then lists the inline script twice (``app.add_js_file(None, body=...)`` reaches the
   builder once as ``None`` and once, via the registry, as ``""``; the two do not compare
   equal), and the second ``const`` declaration is a JavaScript error on every page
   ("Identifier 'THEBE_JS_URL' has already been declared"). With
   ``launch_buttons: thebe: false`` in ``_config.yml`` this extension drops all thebe assets
   (so no page names a CDN), and on any configuration it removes duplicate inline scripts.

3. **An explicit theme mode.** pydata-sphinx-theme logs a console error on a reader's first
   visit when no ``default_mode`` is set; it is set to ``"auto"`` (follow the system).

4. **Short names in docstrings resolve.** ``:class:`TemporalAttention``` written in any
   module of the package, or a re-export such as ``diagsink.TemporalAttention``, links to
   the one documented object it can mean (``book/api.md``); ambiguous names still warn.

5. **``hide_solutions`` hides the code too.** sphinx-exercise's ``hide_solutions`` switch
   drops the ``{solution-start}`` directive but keeps everything up to ``{solution-end}``,
   so in a notebook the solution's code cell stayed on the page. Here ``solution-start``
   leaves an invisible marker when the switch is on, and a transform removes the marker,
   everything after it up to the matching ``{solution-end}``, and that end node.

6. **A favicon at the site root too.** ``html.favicon`` (``book/_static/favicon.ico``, drawn
   by ``tools/draw_logo.py``) gives every page a ``<link rel="icon">``; a browser that still
   asks for ``/favicon.ico`` (some do, for pages opened from a bookmark) finds the same file
   there, so no request for an icon fails. ``book/_static/diagsink.css`` (the logo's size)
   is added to every page, with ``book/_static`` as a static folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.transforms import SphinxTransform

MATHJAX_PATH = "mathjax/tex-chtml.js"  # relative to _static
STATIC = Path(__file__).resolve().parents[1] / "_static"  # book/_static
SITE_CSS = "diagsink.css"


# --------------------------------------------------------------------------- MathJax


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


def _set_default_mode(app: Sphinx, config) -> None:
    """Give the theme an explicit light/dark mode ("auto": follow the reader's system).

    Without one, pydata-sphinx-theme starts from ``data-mode=""`` and logs the console error
    "Got invalid theme mode: . Resetting to auto." on the first visit of every reader.
    """
    context = config.html_context
    if isinstance(context, dict) and not context.get("default_mode"):
        context["default_mode"] = "auto"  # pydata-sphinx-theme reads it from html_context


def _copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    es5 = _mathjax_es5()
    target = Path(app.outdir) / "_static" / "mathjax"
    # keep the one bundle we load plus every folder it may load components from
    skip = {p.name for p in es5.glob("*.js") if p.name != "tex-chtml.js"}
    shutil.copytree(es5, target, dirs_exist_ok=True, ignore=lambda d, names: [n for n in names if Path(d) == es5 and n in skip])


def _add_site_css(app: Sphinx, config) -> None:
    """Serve ``book/_static`` (the logo, the favicon, the site CSS) and load the CSS."""
    if not (STATIC / SITE_CSS).is_file():
        raise ExtensionError(f"{STATIC / SITE_CSS} is missing (the site's CSS)")
    paths = list(config.html_static_path or [])
    if str(STATIC) not in paths:
        config.html_static_path = [*paths, str(STATIC)]
    app.add_css_file(SITE_CSS)


def _copy_favicon_to_root(app: Sphinx, exception: Exception | None) -> None:
    """Copy ``html_favicon`` to ``<outdir>/favicon.ico`` (where browsers look by default)."""
    favicon = str(getattr(app.config, "html_favicon", "") or "")
    if exception is not None or app.builder.format != "html" or not favicon:
        return
    if "://" in favicon or not favicon.endswith(".ico"):
        return  # a URL, or an icon format browsers do not look for at /favicon.ico
    source = Path(favicon) if Path(favicon).is_absolute() else Path(app.confdir) / favicon
    if not source.is_file():
        raise ExtensionError(f"html_favicon {favicon!r} does not exist: run tools/draw_logo.py")
    shutil.copyfile(source, Path(app.outdir) / "favicon.ico")


# --------------------------------------------------------------------------- thebe


def _thebe_enabled(app: Sphinx) -> bool:
    options = getattr(app.config, "html_theme_options", None) or {}
    return bool((options.get("launch_buttons") or {}).get("thebe"))


def _is_thebe_asset(asset) -> bool:
    filename = str(getattr(asset, "filename", "") or "")
    body = str((getattr(asset, "attributes", None) or {}).get("body", ""))
    return filename.endswith(("sphinx-thebe.js", "sphinx-thebe.css")) or "THEBE_JS_URL" in body


def _asset_key(asset) -> tuple:
    attributes = getattr(asset, "attributes", None) or {}
    return (str(getattr(asset, "filename", "") or ""), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def _clean_page_assets(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Per page: drop thebe assets when thebe is off, and every duplicate script or style."""
    drop_thebe = not _thebe_enabled(app)
    for key in ("script_files", "css_files"):
        assets = context.get(key)
        if not isinstance(assets, list):
            continue
        seen: set[tuple] = set()
        kept = []
        for asset in assets:
            if drop_thebe and _is_thebe_asset(asset):
                continue
            ident = _asset_key(asset)
            if ident in seen:
                continue
            seen.add(ident)
            kept.append(asset)
        context[key] = kept


def _drop_thebe_config(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Remove sphinx-thebe's per-page ``<script>`` blocks when thebe is off."""
    if _thebe_enabled(app):
        return
    for raw in list(doctree.findall(nodes.raw)):
        text = raw.astext()
        if "text/x-thebe-config" in text or text.strip().startswith("<script>kernelName ="):
            raw.parent.remove(raw)


# --------------------------------------------------------------------------- hide_solutions


class hidden_solution(nodes.Invisible, nodes.Element):
    """Marks where a solution hidden by ``hide_solutions`` starts (removed before writing)."""


def _skip(self, node) -> None:
    raise nodes.SkipNode


def _hiding_solution_start():
    from sphinx_exercise.directive import SolutionStartDirective

    class HidingSolutionStart(SolutionStartDirective):
        def run(self):
            result = super().run()
            if self.env.app.config.hide_solutions:
                return [hidden_solution()]
            return result

    return HidingSolutionStart


class RemoveHiddenSolutions(SphinxTransform):
    """With ``hide_solutions``: remove each hidden solution from its marker to its end node."""

    default_priority = 5  # after sphinx-exercise's structure check (1), before its merges (10)

    def apply(self, **kwargs) -> None:
        from sphinx_exercise.nodes import solution_end_node

        for marker in list(self.document.findall(hidden_solution)):
            parent = marker.parent
            start = parent.index(marker)
            end = next(
                (i for i in range(start + 1, len(parent.children)) if isinstance(parent.children[i], solution_end_node)),
                None,
            )
            if end is None:  # unbalanced markers: sphinx-exercise reports them
                parent.remove(marker)
                continue
            for child in parent.children[start : end + 1]:
                parent.remove(child)


# --------------------------------------------------------------------------- API cross-references


_MISSING = object()


def _lookup(target: str):
    """The object named by a dotted ``diagsink.`` path, or ``_MISSING``."""
    if not target.startswith("diagsink."):
        return _MISSING
    import importlib

    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _canonical_name(target: str) -> str | None:
    """``diagsink.TemporalAttention`` -> ``diagsink.attention.TemporalAttention`` (re-exports)."""
    obj = _lookup(target)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if obj is not _MISSING and module and qualname else None


def _resolve_python_ref(app: Sphinx, env, node, contnode):
    """Resolve a Python cross-reference the domain missed, when exactly one object fits.

    Docstrings say ``:class:`TemporalAttention``` from any module, or name a re-export
    (``diagsink.TemporalAttention``). The Python domain resolves neither by default; this
    looks the name up like a ``.``-prefixed reference (a unique suffix match) or through the
    object's defining module. Ambiguous or unknown names still warn (and fail the build).
    """
    if node.get("refdomain") != "py":
        return None
    from sphinx.util.nodes import make_refnode

    domain = env.get_domain("py")
    target, typ = node["reftarget"], node["reftype"]
    matches = []
    canonical = _canonical_name(target)
    if canonical and canonical != target:
        matches = domain.find_obj(env, None, None, canonical, typ, 1)
    if not matches:
        matches = domain.find_obj(env, node.get("py:module"), node.get("py:class"), target, typ, 1)
    if len(matches) == 1:
        name, entry = matches[0]
        return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)
    if matches:
        return None  # ambiguous: let Sphinx warn
    # an object that exists but has no entry of its own (a constant without a docstring, a
    # helper class outside __all__): link to the nearest documented class or module
    module, cls = node.get("py:module"), node.get("py:class")
    for path in (target, f"{module}.{cls}.{target}" if module and cls else "", f"{module}.{target}" if module else ""):
        if _lookup(path) is _MISSING:
            continue
        parts = path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in domain.objects and domain.objects[prefix].objtype in ("class", "exception"):
                entry = domain.objects[prefix]
                return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, target)
            if prefix in domain.modules:
                entry = domain.modules[prefix]
                return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, target)
    return None


def _skip_namedtuple_fields(app: Sphinx, what: str, name: str, obj, skip: bool, options) -> bool | None:
    """NamedTuple fields are described in the class's ``Attributes:`` section (napoleon);
    documenting them again as members would be a duplicate object description."""
    if what == "class" and type(obj).__name__ == "_tuplegetter":
        return True
    return None


# --------------------------------------------------------------------------- setup


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _set_path)
    app.connect("config-inited", _set_default_mode)
    app.connect("config-inited", _add_site_css)
    app.connect("build-finished", _copy_mathjax)
    app.connect("build-finished", _copy_favicon_to_root)

    app.connect("html-page-context", _clean_page_assets, priority=900)
    app.connect("doctree-resolved", _drop_thebe_config, priority=900)
    app.connect("missing-reference", _resolve_python_ref)
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)

    app.setup_extension("sphinx_exercise")
    app.add_node(
        hidden_solution,
        html=(_skip, None),
        latex=(_skip, None),
        text=(_skip, None),
        man=(_skip, None),
        texinfo=(_skip, None),
    )
    app.add_directive("solution-start", _hiding_solution_start(), override=True)
    app.add_transform(RemoveHiddenSolutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
