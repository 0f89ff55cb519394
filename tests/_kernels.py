"""Jupyter kernels over Unix sockets, for the test stages that run side by side.

Why: a TCP kernel manager picks five ports that are free when it looks, writes them into the
connection file and starts the kernel, which binds them a second or more later. `make test`
(tools/run-tests) runs five stages at once, all starting kernels and opening connections, so
another process can take one of those ports in between; the kernel then dies with "ZMQ:
Address already in use" and the test fails for a reason that has nothing to do with the book
(it happened in CI at e492b80). Over IPC a kernel's sockets are files in a fresh private
folder, so no two kernels can collide.

Two ways in, both calling :func:`install`, which makes nbval's and nbclient's default kernel
managers the IPC ones below (nothing else about the kernels changes):
- the pytest stages that start kernels (tests/test_course.py, whose chapter editions and grader
  run notebooks, and nbval) load this module as a plugin: ``-p tests._kernels``;
- the book build runs as ``python -m tests._kernels jupyter-book build ...``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from jupyter_client.manager import AsyncKernelManager, KernelManager
from traitlets import default


class IpcKernelManager(KernelManager):
    """A blocking kernel manager over IPC (what nbval uses): sockets ``<fresh folder>/kernel-<n>``."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        # one folder per manager (jupyter_client also calls this for defaults it then ignores);
        # a Unix socket path must stay under ~107 bytes, so it lives in the system temp folder
        if getattr(self, "_ipc_folder", None) is None:
            self._ipc_folder = tempfile.mkdtemp(prefix="diagsink-kernel-")
        return os.path.join(self._ipc_folder, "kernel")

    def cleanup_ipc_files(self) -> None:
        super().cleanup_ipc_files()  # the socket files; then the folder made for them
        if getattr(self, "_ipc_folder", None) is not None:
            shutil.rmtree(self._ipc_folder, ignore_errors=True)
            self._ipc_folder = None


class IpcAsyncKernelManager(IpcKernelManager, AsyncKernelManager):
    """An asyncio kernel manager over IPC (what nbclient, and so myst-nb, uses)."""


def install() -> None:
    """Make nbval's and nbclient's default kernel managers the IPC ones, in this process."""
    import jupyter_client

    jupyter_client.AsyncKernelManager = IpcAsyncKernelManager  # nbclient imports it per call
    try:
        import nbval.kernel
    except ImportError:  # the book build has no nbval to patch
        return
    nbval.kernel.KernelManager = IpcKernelManager


def pytest_configure(config) -> None:  # noqa: ARG001 - the pytest hook's signature
    """As a pytest plugin (``-p tests._kernels``): install before any notebook runs."""
    install()


def main(argv: list[str]) -> int:
    """``python -m tests._kernels jupyter-book build ...``: the book build over IPC kernels."""
    if not argv or os.path.basename(argv[0]) != "jupyter-book":
        raise SystemExit("usage: python -m tests._kernels jupyter-book <arguments>")
    install()
    from jupyter_book.cli.main import main as jupyter_book

    sys.argv = ["jupyter-book", *argv[1:]]
    return jupyter_book()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
