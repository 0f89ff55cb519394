"""Shared pytest set-up: quick mode on, a fixed seed, and the repository root."""

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
def _seed():
    import torch

    torch.manual_seed(0)
    yield
