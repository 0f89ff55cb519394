"""Check the package layout rules of the developers' guide: function sizes, imports.

Prints every function over 60 lines (docstring excluded), every
``import`` inside a function body without a ``# reason:`` comment on its line or the line
above, and import cycles between the package's modules. Exit status 1 if any is found.
Usage: ``python tools/layout_check.py [--baseline FILE] [package_dir]``.

With ``--baseline`` (``make test`` passes ``tools/layout_baseline.txt``), the known problems
listed in that file are reported but tolerated, and any *new* problem fails: the layout can
only get better. Problems are compared by a key without line numbers or sizes
(``path: kind name``), so editing a listed function does not make it new. A baseline entry
that no longer occurs is reported so that it can be deleted.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: No limit on a module's length (a module is split by cohesion, never trimmed to a count).
MAX_FUNCTION = 60


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = fn.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
    ):
        if isinstance(body[0].value.value, str):
            body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def check(root: Path) -> list[str]:
    problems: list[str] = []
    modules = {}
    for path in sorted(root.rglob("*.py")):
        modules[_module_name(path, root)] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        src = path.read_text()
        lines = src.splitlines()
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _body_lines(node)
                if n > MAX_FUNCTION:
                    problems.append(
                        f"{path}:{node.lineno} {node.name}: {n} lines (> {MAX_FUNCTION})"
                    )
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        here = lines[sub.lineno - 1]
                        above = lines[sub.lineno - 2] if sub.lineno > 1 else ""
                        if "reason:" not in here and "reason:" not in above:
                            problems.append(
                                f"{path}:{sub.lineno} import inside {node.name}() without a '# reason:'"
                            )
        for node in tree.body:  # module-level imports only make the import graph
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(node, name, path.name == "__init__.py")
            elif isinstance(node, ast.If):  # TYPE_CHECKING blocks do not count
                continue
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between modules (a package's ``__init__`` importing its own submodules is not one)."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def parent_init(a: str, b: str) -> bool:
        return b.startswith(a + ".")

    for start in graph:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if parent_init(node, nxt) or parent_init(nxt, node):
                    continue
                if nxt == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        found.append(path + [start])
                elif nxt not in path and len(path) < 8:
                    stack.append((nxt, path + [nxt]))
    return found


def key(problem: str) -> str:
    """A problem without line number or size: ``"diagsink/x.py: import inside f()"``."""
    if problem.startswith("import cycle"):
        return problem
    where, _, what = problem.partition(" ")
    path = where.split(":")[0]
    if what.startswith("import inside"):
        return f"{path}: {what.split(' without')[0]}"
    return f"{path}: function {what.split(':')[0]} over {MAX_FUNCTION} lines"


def main(argv: list[str]) -> int:
    """Run the check; return the exit status (1 if a problem is not in the baseline)."""
    repo = Path(__file__).resolve().parents[1]
    baseline: set[str] | None = None
    if argv[:1] == ["--baseline"]:
        lines = Path(argv[1]).read_text().splitlines()
        baseline = {x.strip() for x in lines if x.strip() and not x.startswith("#")}
        argv = argv[2:]
    root = (Path(argv[0]) if argv else repo / "diagsink").resolve()
    found = [p.replace(f"{repo}/", "") for p in check(root)]
    keys = {key(p) for p in found}
    new = sorted(keys - baseline) if baseline is not None else sorted(keys)
    print(f"layout: {len(keys)} problem(s), {len(new)} not in the baseline")
    for k in new:
        print("  NEW   " + k)
    if baseline is not None:
        for k in sorted(keys & baseline):
            print("  known " + k)
        for k in sorted(baseline - keys):
            print("  fixed (delete it from the baseline): " + k)
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
