"""The built website in a real browser (Debian's Chromium driven by Playwright).

Serves ``_build/html`` on 127.0.0.1 and opens every page of the table of contents. A page
fails on: a console error or uncaught JavaScript exception; a failed request or a response
with status >= 400; any request to a host other than the local server (the site must work
offline: MathJax and every script are served from the site itself); an image that did not
load (``naturalWidth == 0``) or a figure without alt text; math that MathJax did not render (every ``.math`` element
must hold an ``mjx-container``, and no raw ``$$`` may remain in the text). A solution
dropdown must open when clicked, and a screenshot of the heatmap page is saved to
``_build/screenshots/`` (the CI artifact).

Two reader checks at 1280 px: no output box overflows horizontally (an output area,
or a ``<pre>``/table inside it, whose ``scrollWidth`` exceeds its ``clientWidth``: a printed line
or a table wider than the page), and on the heatmaps and results pages every heatmap panel is
at least 220 px wide as rendered (``MIN_PANEL_PX``).

How the test knows a figure's panels (the rule for chapter authors):

1. A heatmap figure declares how many panels sit side by side in one row with the class
   ``heatmap-cols-N`` in its cell metadata, next to its alt text:
   ``{"mystnb": {"image": {"alt": "...", "classes": "heatmap-cols-3"}}}`` (a two-row layout of
   five variants is ``heatmap-cols-3``; a 2-head by 5-variant grid with one row per variant is
   ``heatmap-cols-2``). Then ``rendered width / N >= 220``.
2. Without that class, an image whose alt text says "heatmap" or "attention map" is a heatmap
   figure too, and N is the number written before "heatmaps"/"panels"/"maps" in the alt text
   ("Five 12 by 12 attention heatmaps ..." -> 5 in one row). An alt text that names no count
   ("A grid of attention heatmaps ...") fails: add the class. Other figures are not measured.

At 1280 px the page's main column is 688 px wide: at most 3 panels of 220 px fit in a row.

Skipped, with the reason, when the site is not built (``make book``) or Chromium is missing
(``apt-get install chromium``); ``make test`` builds the site before this stage.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.browser

HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]


def toc_pages() -> list[str]:
    """Every page of ``_toc.yml`` (root first), as docnames like ``book/attention``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(str(entry["file"]).removesuffix(".ipynb").removesuffix(".md"))
            walk(entry.get("sections"))

    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return pages


PAGES = toc_pages()
VIEWPORT_WIDTH = 1280  # px: the reader's laptop
MIN_PANEL_PX = 220  # px per heatmap panel: a 12 x 12 map at ~18 px per entry is legible
HEATMAP_PAGES = ("book/heatmaps",)  # the results page links to its maps there


def _skip_reason() -> str | None:
    if not (HTML / "index.html").is_file():
        return f"the site is not built ({HTML / 'index.html'} is missing): run `make book` first"
    if not Path(CHROMIUM).is_file():
        return "Chromium is missing: install it with `apt-get install -y chromium`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: install the test extra"
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass


@pytest.fixture(scope="module")
def server():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class PageVisit:
    """One page opened with every problem recorded."""

    def __init__(self, browser, server: str, docname: str):
        self.url = f"{server}/{docname}.html"
        self.host = urlparse(server).netloc
        self.problems: list[str] = []
        self.pending: set[str] = set()  # requests sent and not yet finished or failed
        self.context = browser.new_context(viewport={"width": VIEWPORT_WIDTH, "height": 900})
        self.context.set_default_timeout(60_000)  # a loaded 2-core CI machine is slow
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.page.on("console", self._console)
        self.page.on(
            "pageerror", lambda exc: self.problems.append(f"uncaught JavaScript error: {exc}")
        )
        self.page.on("requestfailed", self._failed)
        self.page.on("request", lambda request: self.pending.add(request.url))
        self.page.on("requestfinished", lambda request: self.pending.discard(request.url))
        self.page.on("response", self._response)

    def _route(self, route):
        url = route.request.url
        parsed = urlparse(url)
        if parsed.scheme in ("data", "blob", "about") or parsed.netloc == self.host:
            route.continue_()
        else:
            self.problems.append(f"request to an external host (the site must work offline): {url}")
            route.abort()

    def _console(self, msg):
        if msg.type == "error":
            self.problems.append(f"console error: {msg.text} ({msg.location.get('url', '')})")

    def _failed(self, request):
        self.pending.discard(request.url)
        if urlparse(request.url).netloc == self.host:  # external ones are reported by _route
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def _response(self, response):
        if response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")

    def open(self) -> None:
        # imported here: without playwright the module still loads and the tests skip
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self.page.goto(self.url, wait_until="load")
        if self.page.locator(".math").count():
            # MathJax is deferred; wait until its start-up (typesetting included) is done
            self.page.wait_for_function(
                "() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000
            )
            self.page.evaluate("() => MathJax.startup.promise")
        try:
            self.page.wait_for_load_state("networkidle", timeout=20_000)
        except PlaywrightTimeout:
            # Chromium under load sometimes never signals "network idle" although nothing is
            # in flight; a request that really hangs is a problem of the page
            self.page.wait_for_timeout(1_000)
            self.problems += [f"request never finished: {url}" for url in sorted(self.pending)]

    def close(self) -> None:
        self.context.close()


def _image_problems(page) -> list[str]:
    broken = page.evaluate(
        """async () => {
            const imgs = Array.from(document.images);
            await Promise.all(imgs.map(img => {
                img.loading = "eager";
                if (img.complete) return null;
                return new Promise(done => { img.onload = img.onerror = done; setTimeout(done, 10000); });
            }));
            return imgs.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src);
        }"""
    )
    problems = [f"image did not load: {src}" for src in broken]
    no_alt = page.evaluate(
        """() => Array.from(document.querySelectorAll('img[src*="_images/"]'))
            .filter(img => { const alt = (img.getAttribute('alt') || '').trim();
                             return !alt || /\\.(png|svg|jpe?g)$/i.test(alt); })
            .map(img => img.getAttribute('src'))"""
    )
    problems += [
        f"figure without alt text (set mystnb.image.alt on its cell): {src}" for src in no_alt
    ]
    return problems


def _math_problems(page) -> list[str]:
    return page.evaluate(
        """() => {
            const problems = [];
            const maths = Array.from(document.querySelectorAll('.math'));
            const raw = maths.filter(el => !el.querySelector('mjx-container'));
            if (raw.length) problems.push(`${raw.length} of ${maths.length} math elements not rendered by MathJax, e.g. ${raw[0].textContent.slice(0, 60)}`);
            const main = (document.querySelector('main') || document.body).cloneNode(true);
            main.querySelectorAll('pre, code, script, style, .highlight, mjx-container, .math').forEach(el => el.remove());
            if (main.textContent.includes('$$')) problems.push('raw $$ in the page text: a display formula was not parsed as math');
            return problems;
        }"""
    )


@pytest.fixture(scope="module")
def page_problems(browser, server):
    """``docname -> (load problems, overflow problems)``: each page opened once for both tests."""
    seen: dict[str, tuple[list[str], list[str]]] = {}

    def problems(docname: str) -> tuple[list[str], list[str]]:
        if docname not in seen:
            visit = PageVisit(browser, server, docname)
            try:
                visit.open()
                loading = visit.problems + _image_problems(visit.page) + _math_problems(visit.page)
                seen[docname] = (loading, _overflow_problems(visit.page))
            finally:
                visit.close()
        return seen[docname]

    return problems


@pytest.mark.parametrize("docname", PAGES)
def test_page_loads_cleanly(page_problems, docname):
    """No console error, no failed or external request, every image loaded, math rendered."""
    problems = page_problems(docname)[0]
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


def _pages_with(pattern: str) -> list[str]:
    return [
        d
        for d in PAGES
        if (HTML / f"{d}.html").is_file()
        and pattern in (HTML / f"{d}.html").read_text(errors="ignore")
    ]


def test_solution_dropdown_opens(browser, server):
    pages = _pages_with('class="solution dropdown')
    if not pages:
        assert "hide_solutions: true" in (ROOT / "_config.yml").read_text(), (
            "no page has a solution dropdown"
        )
        pytest.skip("hide_solutions is on: the site has no solutions")
    visit = PageVisit(browser, server, pages[0])
    try:
        visit.open()
        solution = visit.page.locator(".solution.dropdown").first
        content = solution.locator("section").first
        solution.scroll_into_view_if_needed()
        assert not content.is_visible(), f"{pages[0]}: the solution is open before it is clicked"
        solution.locator("button.toggle-button").first.click()
        content.wait_for(state="visible", timeout=5_000)
        assert content.is_visible()
        assert not visit.problems, visit.problems
    finally:
        visit.close()


def test_screenshot_of_the_heatmap_page(browser, server):
    """Saved to _build/screenshots/ for CI (the heatmap page, else the attention chapter)."""
    docname = next((d for d in ("book/heatmaps", "book/attention") if d in PAGES), PAGES[0])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = SCREENSHOTS / f"{docname.replace('/', '_')}.png"
    visit = PageVisit(browser, server, docname)
    try:
        visit.open()
        visit.page.screenshot(path=str(target), full_page=True)
    finally:
        visit.close()
    assert target.stat().st_size > 10_000, f"{target} is suspiciously small"


def _overflow_problems(page) -> list[str]:
    """Output boxes (and the ``<pre>``/tables inside them) wider inside than on the page."""
    boxes = page.evaluate(
        """() => {
            const out = [];
            const boxes = document.querySelectorAll(
                '.cell_output, .cell_output .output, .cell_output pre, .cell_output table');
            let index = 0;
            for (const box of boxes) {
                index += 1;
                if (!box.offsetParent && box.tagName !== 'BODY') continue;  // hidden
                const extra = box.scrollWidth - box.clientWidth;
                if (extra <= 1) continue;  // sub-pixel rounding
                const cell = box.closest('.cell');
                const cells = Array.from(document.querySelectorAll('.cell'));
                const input = cell && cell.querySelector('.cell_input pre');
                const code = input ? input.innerText.trim().split('\\n')[0].slice(0, 50) : '';
                const line = (box.innerText || '').split('\\n')
                    .reduce((a, b) => (b.length > a.length ? b : a), '');
                out.push({cell: cells.indexOf(cell), code: code, tag: box.tagName.toLowerCase(),
                          cls: box.className, width: box.clientWidth, extra: extra,
                          line: line.slice(0, 70)});
            }
            return out;
        }"""
    )
    # one line per code cell: its widest overflow and how many boxes overflow
    by_cell: dict[int, list[dict]] = {}
    for b in boxes:
        by_cell.setdefault(b["cell"], []).append(b)
    problems = []
    for cell, found in by_cell.items():
        worst = max(found, key=lambda b: b["extra"])
        problems.append(
            f"code cell {cell + 1} of the page ({worst['code']!r}...): {len(found)} output "
            f"box(es) overflow, by up to {worst['extra']} px (<{worst['tag']} "
            f"class={worst['cls']!r}>, {worst['width']} px wide); longest line {worst['line']!r}"
        )
    return problems


_WORDS = "one two three four five six seven eight nine ten eleven twelve"
_COUNT = {w: i + 1 for i, w in enumerate(_WORDS.split())}
_ALT_COUNT = re.compile(
    r"\b(\d+|" + "|".join(_COUNT) + r")\b(?:[^.,;:]{0,40}?)\b(heatmaps|panels|maps)\b", re.I
)


def panels_across(alt: str, classes: str) -> int | None:
    """Heatmap panels side by side in one row: ``heatmap-cols-N``, else the alt text's count."""
    m = re.search(r"\bheatmap-cols-(\d+)\b", classes)
    if m:
        return int(m.group(1))
    m = _ALT_COUNT.search(alt)
    if not m:
        return None
    word = m.group(1).lower()
    return int(word) if word.isdigit() else _COUNT[word]


def is_heatmap(alt: str, classes: str) -> bool:
    """A heatmap figure: the ``heatmap-cols-N`` class, or "heatmap"/"attention map" in the alt."""
    return "heatmap-cols-" in classes or bool(re.search(r"heatmap|attention map", alt, re.I))


def _heatmap_problems(page) -> list[str]:
    images = page.evaluate(
        """() => Array.from(document.querySelectorAll('img[src*="_images/"]')).map(img => ({
            src: img.getAttribute('src'), alt: img.getAttribute('alt') || '',
            cls: img.className || '', width: img.getBoundingClientRect().width}))"""
    )
    problems = []
    for img in images:
        if not is_heatmap(img["alt"], img["cls"]):
            continue
        n = panels_across(img["alt"], img["cls"])
        what = f"{img['src']} ({img['alt'][:60]!r})"
        if n is None:
            problems.append(
                f"heatmap figure {what}: the test cannot tell how many panels sit in a row; "
                'add {"classes": "heatmap-cols-N"} to the cell\'s mystnb.image metadata'
            )
        elif img["width"] / n < MIN_PANEL_PX:
            problems.append(
                f"heatmap figure {what}: {img['width']:.0f} px for {n} panels across = "
                f"{img['width'] / n:.0f} px per panel < {MIN_PANEL_PX} px (use fewer panels "
                "per row, e.g. two rows, or a full-width figure)"
            )
    return problems


@pytest.mark.parametrize("docname", PAGES)
def test_no_output_box_overflows(page_problems, docname):
    """At 1280 px no output area scrolls sideways: printed lines and tables fit their box."""
    problems = page_problems(docname)[1]
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("docname", HEATMAP_PAGES)
def test_heatmap_panels_are_legible(browser, server, docname):
    """Every heatmap panel on the page renders at least ``MIN_PANEL_PX`` wide at 1280 px."""
    if docname not in PAGES:
        pytest.fail(f"{docname} is not in _toc.yml: update HEATMAP_PAGES in tests/test_site.py")
    visit = PageVisit(browser, server, docname)
    try:
        visit.open()
        n_heatmaps = visit.page.evaluate(
            "() => Array.from(document.images).filter(i => /heatmap|attention map/i"
            ".test(i.alt || '') || /heatmap-cols-/.test(i.className)).length"
        )
        problems = _heatmap_problems(visit.page)
    finally:
        visit.close()
    assert n_heatmaps, f"{docname}: no heatmap figure found (alt text or heatmap-cols-N class)"
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


def test_favicon_and_logo_are_served(browser, server):
    """Every page links the favicon; it, ``/favicon.ico`` and the logo load as images."""
    visit = PageVisit(browser, server, PAGES[0])
    try:
        visit.open()
        icon, logo = visit.page.evaluate(
            "() => { const l = document.querySelector('link[rel~=\"icon\"]');"
            " const i = document.querySelector('img.logo__image');"
            " return [l ? l.href : null, i ? i.naturalWidth : 0]; }"
        )
        assert icon, "no <link rel='icon'>: set html.favicon in _config.yml"
        for url in (icon, f"{server}/favicon.ico"):
            response = visit.page.request.get(url)
            assert response.status == 200, f"{url}: HTTP {response.status}"
            assert response.body()[:4] == b"\x00\x00\x01\x00", f"{url} is not an ICO file"
        assert logo > 0, "the navigation bar shows no logo image: set logo in _config.yml"
        assert not visit.problems, visit.problems
    finally:
        visit.close()


def test_panel_rule():
    """The panel-count rule of the module docstring (no browser needed, runs with the others)."""
    five = "Five 12 by 12 attention heatmaps, one per variant, seed 0."
    assert is_heatmap(five, "") and panels_across(five, "") == 5
    assert panels_across(five, "heatmap-cols-3 other") == 3  # the class wins over the alt text
    assert panels_across("Two panels: attention maps of block 1 and 2", "") == 2
    assert panels_across("A grid of attention heatmaps: one row per variant", "") is None
    assert not is_heatmap("Line plot of the MAE", "") and is_heatmap("Bars", "heatmap-cols-2")
