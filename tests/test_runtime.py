"""``diagsink.runtime.glue``: hands a page's computed numbers to its text, with or without myst-nb."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from diagsink.runtime import glue


def test_glue_returns_python_numbers_for_numpy_and_torch_scalars():
    for value, expected in ((np.float64(0.25), 0.25), (np.int64(7), 7), (torch.tensor(1.5), 1.5)):
        out = glue("runtime-test", value)
        assert out == expected and type(out) is type(expected)


def test_glue_stores_the_value_for_the_page(monkeypatch):
    calls = []
    import myst_nb

    monkeypatch.setattr(
        myst_nb, "glue", lambda name, value, display: calls.append((name, value, display))
    )
    assert glue("runtime-key", np.float32(2.0)) == 2.0
    assert calls == [("runtime-key", 2.0, False)]


def test_glue_without_myst_nb_only_returns_the_value(monkeypatch):
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # import myst_nb now raises ImportError
    with pytest.raises(ImportError):
        import myst_nb  # noqa: F401
    assert glue("runtime-key", np.float64(3.0)) == 3.0
