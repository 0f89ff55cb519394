"""Packaging: pyproject, constraints and environment.yml agree; the quick-mode switch works."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tomllib
import yaml

import diagsink as ds

from conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# conda-forge names that differ from the PyPI names
CONDA_TO_PYPI = {
    "pytorch-cpu": "torch",
    "pytorch-gpu": "torch",
    "pytorch": "torch",
    "pytables": "tables",
    "matplotlib-base": "matplotlib",
}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_names_every_core_dependency():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda-forge" in env["channels"]
    conda, pip_lines = set(), []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip_lines += dep["pip"]
        else:
            name = re.split(r"[=<> ]", dep, maxsplit=1)[0]
            conda.add(CONDA_TO_PYPI.get(name, name))
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert core <= conda, f"environment.yml lacks {sorted(core - conda)}"
    # the extras come through pip from the project itself
    assert any(
        line.replace(" ", "").startswith("-e.[") and "book" in line and "test" in line
        for line in pip_lines
    )


def test_environment_yml_cpu_default_with_cuda_comment():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*pytorch-cpu", text, re.M)
    assert re.search(r"^\s*#.*pytorch-gpu", text, re.M)


def test_constraints_pin_every_dependency():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt line {line!r} is not an exact pin"
            pins[_name(name)] = version
    wanted = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra}
    assert wanted <= set(pins), f"constraints.txt lacks {sorted(wanted - set(pins))}"
    assert pins["jupyter-book"] == "1.0.4.post1"


def test_quick_switch(monkeypatch):
    monkeypatch.setenv("DIAGSINK_QUICK", "1")
    assert ds.settings().quick and ds.settings().mode == "quick" and ds.pick("q", "f") == "q"
    monkeypatch.setenv("DIAGSINK_QUICK", "0")
    assert not ds.settings().quick and ds.pick("q", "f") == "f"
    monkeypatch.delenv("DIAGSINK_QUICK")
    assert not ds.settings().quick
    monkeypatch.setenv("DIAGSINK_QUICK", "perhaps")
    with pytest.raises(ValueError, match="DIAGSINK_QUICK"):
        ds.settings()


def test_data_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DIAGSINK_DATA", str(tmp_path))
    assert ds.settings().data_root == tmp_path
    monkeypatch.delenv("DIAGSINK_DATA")
    assert ds.settings().data_root.name == "metr-la"


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "diagsink", "info"], capture_output=True, text=True, check=True
    )
    assert "mode:" in out.stdout and "data root:" in out.stdout


def test_cli_error_is_one_line_without_traceback(monkeypatch):
    env = {"DIAGSINK_QUICK": "perhaps", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "diagsink", "info"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: DIAGSINK_QUICK") and "Traceback" not in out.stderr


def test_atomic_write_gives_the_mode_a_plain_open_would(tmp_path):
    """mkstemp's private 0600 must not leak into results that others (a web server, a course) read."""
    from diagsink._io import atomic_write_text

    old = os.umask(0o022)
    try:
        assert (atomic_write_text(tmp_path / "a.json", "{}").stat().st_mode & 0o777) == 0o644
        os.umask(0o077)
        assert (atomic_write_text(tmp_path / "b.json", "{}").stat().st_mode & 0o777) == 0o600
    finally:
        os.umask(old)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    from diagsink._io import atomic_write_text

    target = tmp_path / "a.json"
    atomic_write_text(target, "first")

    class Boom(Exception):
        pass

    import diagsink._io as io

    real = io.os.replace

    def failing_replace(src, dst):
        raise Boom

    io.os.replace = failing_replace
    try:
        with pytest.raises(Boom):
            atomic_write_text(target, "second")
    finally:
        io.os.replace = real
    assert target.read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
