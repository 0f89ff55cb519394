"""tools/layout_check.py: it finds what the layout rules forbid, and the tree has no new case."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("layout_check", ROOT / "tools" / "layout_check.py")
layout_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout_check)


def _package(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from . import a\n")
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (pkg / "long.py").write_text(f'def f():\n    """Doc."""\n{body}\n' + "\n" * 400)
    short = "\n".join(f"    y{i} = {i}" for i in range(60))
    (pkg / "big.py").write_text(f'def g():\n    """Doc."""\n{short}\n' + "\n" * 2000)
    (pkg / "imp.py").write_text(
        "def g():\n    import os\n    return os\n\n\ndef h():\n"
        "    # reason: start-up time\n    import json\n    return json\n"
    )
    return pkg


def test_finds_long_functions_hidden_imports_and_cycles_not_long_modules(tmp_path):
    problems = layout_check.check(_package(tmp_path))
    keys = {layout_check.key(p.replace(f"{tmp_path}/", "")) for p in problems}
    assert "pkg/long.py: function f over 60 lines" in keys  # 61 lines of body
    assert not any(
        "big.py" in k for k in keys
    )  # 60 lines, in a module of 2,000: no limit on modules
    assert "pkg/imp.py: import inside g()" in keys
    assert not any("inside h()" in k for k in keys)  # the import with a reason is allowed
    assert any(k.startswith("import cycle") and "pkg.a" in k and "pkg.b" in k for k in keys)


def test_the_package_has_no_problem_outside_the_baseline():
    run = subprocess.run(
        [sys.executable, "tools/layout_check.py", "--baseline", "tools/layout_baseline.txt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_test_turns_a_missing_package_module_into_a_skip():
    """``importorskip`` of the package's own modules, or ``except Exception: skip``, would hide a
    regression as a skip; the tests import the package plainly."""
    hazards = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        text = path.read_text()
        if path.name == "test_layout.py":
            text = text.split("def test_no_test_turns", 1)[0]
        hazards += [
            f"{path.name}: importorskip"
            for _ in re.findall(r"importorskip\(\s*['\"]diagsink", text)
        ]
        for m in re.finditer(r"except Exception[^\n]*:\n(\s+)([^\n]*)", text):
            if "skip" in m.group(2):
                hazards.append(f"{path.name}: except Exception -> {m.group(2).strip()}")
    assert not hazards, hazards


def test_tests_take_the_repository_root_from_conftest():
    redefined = [
        p.name
        for p in sorted((ROOT / "tests").glob("*.py"))
        if p.name != "conftest.py" and re.search(r"(?m)^ROOT\s*=", p.read_text())
    ]
    assert not redefined, f"define ROOT only in tests/conftest.py: {redefined}"


def test_no_file_of_the_package_is_ignored_by_git():
    """A package file that .gitignore matches (e.g. a data/ pattern) would be missing from every clone."""
    files = [str(p.relative_to(ROOT)) for p in (ROOT / "diagsink").rglob("*.py")]
    run = subprocess.run(
        ["git", "check-ignore", "--no-index", *files], cwd=ROOT, capture_output=True, text=True
    )
    assert run.stdout.strip() == "", f"ignored by .gitignore: {run.stdout.split()}"
