"""Shared pytest set-up: quick mode on, a fixed seed, the repository root, the markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tests always run in quick mode unless the caller chose otherwise.
os.environ.setdefault("DIAGSINK_QUICK", "1")


@pytest.fixture
def root() -> Path:
    """The repository root."""
    return ROOT


@pytest.fixture(autouse=True)
def _kernels_only_where_marked(request, monkeypatch):
    """A test that starts a Jupyter kernel in this process must be marked ``kernel``."""
    if request.node.get_closest_marker("kernel") is None:
        from jupyter_client.manager import KernelManager

        async def refuse(*_args, **_kwargs):
            raise RuntimeError(
                f"{request.node.nodeid} starts a Jupyter kernel: mark it @pytest.mark.kernel "
                "(tools/run-tests runs those tests beside no other kernels)"
            )

        monkeypatch.setattr(KernelManager, "_async_launch_kernel", refuse)
    yield


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
    yield


# -- bad-input cases: tests marked ``bad_input`` (one case each) are counted and the total printed
_BAD_INPUT = {"tried": 0, "failed": 0}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "bad_input: one bad-input case (counted in the terminal summary)"
    )
    # tools/run-tests runs these in the lane that runs nbval, one kernel at a time: two kernels
    # started at once by two processes can race for the same TCP port
    config.addinivalue_line("markers", "kernel: starts a Jupyter kernel")


def pytest_runtest_logreport(report):
    if report.when == "call" and "bad_input" in report.keywords:
        _BAD_INPUT["tried"] += 1
        _BAD_INPUT["failed"] += int(report.failed)


def pytest_terminal_summary(terminalreporter):
    if _BAD_INPUT["tried"]:
        terminalreporter.write_line(
            f"bad-input cases tried: {_BAD_INPUT['tried']} ({_BAD_INPUT['failed']} without a clear error)"
        )
