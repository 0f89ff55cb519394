"""The test stages' Jupyter kernels run over IPC and leave nothing behind (tests/_kernels.py)."""

from __future__ import annotations

import os

import _kernels  # tests/_kernels.py
import jupyter_client
import nbformat
import nbval.kernel
import pytest
from nbclient import NotebookClient

PROBE = (
    "from ipykernel.kernelapp import IPKernelApp\n"
    "app = IPKernelApp.instance()\n"
    "print(app.transport, app.ip)"
)


def _run(**client_kwargs) -> tuple[str, str]:
    """Execute one cell that prints the kernel's transport and socket path prefix."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(PROBE)]
    NotebookClient(nb, timeout=120, kernel_name="python3", **client_kwargs).execute()
    transport, ip = nb.cells[0].outputs[0]["text"].split()
    return transport, ip


@pytest.mark.slow
def test_an_ipc_kernel_binds_files_in_its_own_folder_and_removes_them():
    transport, ip = _run(kernel_manager_class=_kernels.IpcAsyncKernelManager)
    assert transport == "ipc"
    folder = os.path.dirname(ip)
    assert os.path.basename(folder).startswith("diagsink-kernel-")
    assert not os.path.exists(folder), "the kernel's socket folder was left behind"


@pytest.mark.slow
def test_install_makes_ipc_the_default_of_nbclient_and_nbval(monkeypatch):
    # restore whatever install() replaces when the test ends
    monkeypatch.setattr(jupyter_client, "AsyncKernelManager", jupyter_client.AsyncKernelManager)
    monkeypatch.setattr(nbval.kernel, "KernelManager", nbval.kernel.KernelManager)
    default = NotebookClient(nbformat.v4.new_notebook()).kernel_manager_class
    assert default.transport.default_value == "tcp"  # the default this module exists to change
    _kernels.install()
    assert nbval.kernel.KernelManager is _kernels.IpcKernelManager
    assert (
        NotebookClient(nbformat.v4.new_notebook()).kernel_manager_class
        is _kernels.IpcAsyncKernelManager
    )
    assert _run()[0] == "ipc"
