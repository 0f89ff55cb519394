"""nbval's executions, kept for the book build: the chapters run once per `make test`.

A pytest plugin for the nbval stage (``-p tests._nbval_cache --nbval-cache DIR``). nbval runs
every code cell of a chapter in one kernel and keeps each cell's outputs; when every cell of a
chapter passed, this plugin writes the chapter with those outputs into the jupyter-cache folder
``DIR``, the cache myst-nb reads when the book is built with ``execute_notebooks: cache``
(``tools/run-tests`` builds it so, with the cache at ``_build/.jupyter_cache``). A chapter
nbval failed is not cached, so the build executes it again and fails too; the cache is keyed
by the code cells' sources, so an edited chapter is never matched. nbval stays the check; the
build only reuses its outputs. Without ``--nbval-cache`` the plugin only prints the table.

It also prints how long each chapter's cells took (the sum of nbval's per-cell durations).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path

import nbformat


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--nbval-cache",
        metavar="DIR",
        default=None,
        help="write every notebook whose cells all passed, with nbval's outputs, "
        "into the jupyter-cache folder DIR",
    )


class _Chapters:
    """Per notebook: its nbval items, seconds, and whether a cell failed or was skipped."""

    def __init__(self) -> None:
        self.items: dict[Path, list] = defaultdict(list)
        self.seconds: dict[Path, float] = defaultdict(float)
        self.path_of: dict[str, Path] = {}  # node id -> notebook
        self.passed: dict[str, bool] = {}

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            if hasattr(item, "test_outputs"):  # an nbval cell (nbval.plugin.IPyNbCell)
                self.items[item.parent.path].append(item)
                self.path_of[item.nodeid] = item.parent.path

    def pytest_runtest_logreport(self, report) -> None:
        path = self.path_of.get(report.nodeid)
        if path is None:
            return
        self.seconds[path] += report.duration
        ok = report.passed if report.when == "call" else not report.failed
        self.passed[report.nodeid] = self.passed.get(report.nodeid, True) and ok

    def all_passed(self, path: Path) -> bool:
        items = self.items[path]
        return bool(items) and all(self.passed.get(i.nodeid) for i in items)

    def executed(self, path: Path):
        """The notebook as nbval read it, each code cell with the outputs nbval received."""
        items = self.items[path]
        nb = copy.deepcopy(items[0].parent.nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        for n, (cell, item) in enumerate(zip(code, items, strict=True), start=1):
            cell.outputs = copy.deepcopy(item.test_outputs)
            cell.execution_count = n
            for out in cell.outputs:
                if out.output_type == "execute_result":
                    out.execution_count = n
        nbformat.validate(nb)
        return nb

    def pytest_sessionfinish(self, session) -> None:
        folder = session.config.getoption("nbval_cache")
        if not folder:
            return
        from jupyter_cache import get_cache
        from jupyter_cache.base import CacheBundleIn

        cache = get_cache(folder)
        for path in self.items:
            if self.all_passed(path):
                bundle = CacheBundleIn(
                    self.executed(path), str(path), data={"execution_seconds": self.seconds[path]}
                )
                cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.items:
            return
        terminalreporter.section("seconds per notebook (nbval)")
        for path, secs in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            state = "passed" if self.all_passed(path) else "FAILED"
            terminalreporter.write_line(f"{secs:8.1f}  {state:6}  {path.name}")
        terminalreporter.write_line(f"{sum(self.seconds.values()):8.1f}  total")


def pytest_configure(config) -> None:
    config.pluginmanager.register(_Chapters(), "diagsink-nbval-cache")
