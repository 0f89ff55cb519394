"""The notebook lane of `make test`: nbval's outputs reach the book build through jupyter-cache
(tests/_nbval_cache.py), and only tests marked ``kernel`` start kernels (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_cache import get_cache
from nbclient import NotebookClient

from conftest import ROOT


def _notebook(*sources: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_markdown_cell("# A page")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


@pytest.mark.slow
@pytest.mark.kernel
def test_only_notebooks_that_pass_are_cached_with_their_outputs(tmp_path: Path):
    good = _notebook(
        "x = 6 * 7\nprint('printed', x)",
        "from myst_nb import glue\nglue('answer', x, display=False)",
        "x + 1",
    )
    bad = _notebook("y = 1", "raise ValueError('broken')")
    nbformat.write(good, str(tmp_path / "good.ipynb"))
    nbformat.write(bad, str(tmp_path / "bad.ipynb"))
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
        + ["--nbval-lax", "--nbval-current-env", "-p", "_nbval_cache"]
        + ["--nbval-cache", str(cache_dir), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # bad.ipynb fails
    assert "FAILED  bad.ipynb" in done.stdout and "passed  good.ipynb" in done.stdout
    cache = get_cache(str(cache_dir))
    with pytest.raises(KeyError):
        cache.match_cache_notebook(bad)
    # what myst-nb does in `execute_notebooks: cache` mode
    _, merged = cache.merge_match_into_notebook(nbformat.read(tmp_path / "good.ipynb", 4))
    printed, glued, result = (c.outputs for c in merged.cells[1:])
    assert printed[0].text == "printed 42\n"
    assert any(k.startswith("application/papermill.record") for k in glued[0].data)
    assert result[0].output_type == "execute_result" and result[0].data["text/plain"] == "43"
    edited = _notebook("x = 6 * 8\nprint('printed', x)", *(c.source for c in good.cells[2:]))
    with pytest.raises(KeyError):  # an edited notebook never matches
        cache.match_cache_notebook(edited)


def test_a_test_not_marked_kernel_cannot_start_one():
    """tools/run-tests runs the unit tests beside nbval: a kernel started there could race
    nbval's kernels for a TCP port, so conftest refuses it with the fix."""
    with pytest.raises(RuntimeError, match=r"mark it @pytest.mark.kernel"):
        NotebookClient(_notebook("1 + 1"), kernel_name="python3").execute()
