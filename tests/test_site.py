"""The built website in a real browser (Debian's Chromium driven by Playwright).

Serves ``_build/html`` on 127.0.0.1 and opens every page of the table of contents. A page
fails on: a console error or uncaught JavaScript exception; a failed request or a response
with status >= 400; any request to a host other than the local server (the site must work
offline: MathJax and every script are served from the site itself); an image that did not
load (``naturalWidth == 0``) or a figure without alt text; math that MathJax did not render (every ``.math`` element
must hold an ``mjx-container``, and no raw ``$$`` may remain in the text). A solution
dropdown must open when clicked, and a screenshot of the heatmap page is saved to
``_build/screenshots/`` (the CI artifact).

Skipped, with the reason, when the site is not built (``make book``) or Chromium is missing
(``apt-get install chromium``); ``make test`` builds the site before this stage.
"""

from __future__ import annotations

import functools
import http.server
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
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.page.on("console", self._console)
        self.page.on(
            "pageerror", lambda exc: self.problems.append(f"uncaught JavaScript error: {exc}")
        )
        self.page.on("requestfailed", self._failed)
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
        if urlparse(request.url).netloc == self.host:  # external ones are reported by _route
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def _response(self, response):
        if response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")

    def open(self) -> None:
        self.page.goto(self.url, wait_until="load")
        if self.page.locator(".math").count():
            # MathJax is deferred; wait until its start-up (typesetting included) is done
            self.page.wait_for_function(
                "() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000
            )
            self.page.evaluate("() => MathJax.startup.promise")
        self.page.wait_for_load_state("networkidle")

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


@pytest.mark.parametrize("docname", PAGES)
def test_page_loads_cleanly(browser, server, docname):
    """No console error, no failed or external request, every image loaded, math rendered."""
    visit = PageVisit(browser, server, docname)
    try:
        visit.open()
        problems = visit.problems + _image_problems(visit.page) + _math_problems(visit.page)
    finally:
        visit.close()
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
