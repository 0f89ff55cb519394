"""Tag the chapters' plumbing cells ``hide-input``: ``python tools/tag_plumbing.py [--write]``.

Quiet plumbing: a cell that only plots, only tabulates or only prints provenance
shows its output with its code collapsed (a toggle opens it); a cell that implements an
equation or checks a claim stays open. The rules (``plumbing_kind``), applied to one code cell
of a chapter ``book/*.ipynb``:

Never plumbing (the cell stays open):
  - it checks something: an ``assert`` statement, or a call whose name starts with
    ``assert`` (``torch.testing.assert_close``, ``np.testing.assert_allclose``), or
    ``exercises.check(...)``; or it is part of an exercise (a tag ``exercise-*``);
  - it defines a function or class (``def``, ``class``): it implements something;
  - it binds a name that a later code cell of the chapter reads before binding it itself
    (an assignment, ``for``, ``with ... as``; see ``free_names``): it
    computes something the text builds on. Names bound by ``import`` do not count (importing
    is plumbing), nor do names a later cell binds afresh (``fig, ax = ...``, loop variables);
  - its code does not parse as Python (an IPython magic line is skipped first).

Plumbing, when none of the above holds:
  - **plot**: the code draws (``DRAWS``, the figure detector of ``tests/test_book_static.py``;
    a test keeps the two patterns identical);
  - **table**: the last statement displays a value (a bare expression or ``display(...)``)
    and the cell builds a table (``DataFrame(``, ``pd.concat(``, ``.pivot``/``.pivot_table``,
    ``.to_frame(``, ``.from_records``/``.from_dict``, ``.style``, or a call ``*_table(...)``);
  - **provenance**: every statement is a ``print``/``display`` call and the cell names where
    its numbers come from (``settings()``, ``.describe()``, ``provenance``, ``git_commit``,
    ``__version__``, ``perf_counter``, ``DIAGSINK_``, ``device``).

A cell already tagged ``hide-input``, ``remove-input``, ``hide-cell`` or ``remove-cell`` is
left alone. Running the tool twice changes nothing the second time (idempotent), and only
the ``tags`` of the cells it reports change (the JSON is written back in the notebooks' own
layout: one-space indent, key order kept, UTF-8).

Without ``--write`` it only lists what it would tag; ``--check`` exits 1 when a cell would be
tagged (the static test ``tests/test_book_static.py::test_plumbing_cells_carry_hide_input``
applies the same rule).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = "hide-input"
HIDDEN = {"hide-input", "remove-input", "hide-cell", "remove-cell"}

# the figure detector: identical to tests/test_book_static.py::_DRAWS (a test compares them)
DRAWS = re.compile(
    r"\bplt\.(show|subplots?|subplot_mosaic|figure|imshow|plot|bar|barh|hist|scatter|matshow|pcolormesh|contourf?|errorbar|fill_between)\s*\("
    r"|\bsns\.\w+\s*\("
    r"|\.(imshow|matshow|pcolormesh|heatmap|plot|scatter|errorbar|bar|barh|hist|fill_between)\s*\("
    r"|\bplotting\.(attention_heatmap|variant_panel|head_grid)\s*\("
    r"|(?:(?<![\w.])|\bprobe\.)report\s*\("
)
TABLE = re.compile(
    r"\bDataFrame\s*\(|\bpd\.concat\s*\(|\.pivot(_table)?\s*\(|\.to_frame\s*\("
    r"|\.from_(records|dict)\s*\(|\.style\b|\b\w+_table\s*\("
)
PROVENANCE = re.compile(
    r"settings\(\)|\.describe\(\)|provenance|git_commit|__version__|perf_counter|DIAGSINK_|device"
)


def source(cell: dict) -> str:
    """A cell's source as one string (notebooks store a list of lines or a string)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _strip_comments(code: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in code.splitlines())


def _parse(code: str) -> ast.Module | None:
    lines = [ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _defines(tree: ast.Module) -> bool:
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree)
    )


def _checks(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            return True
        name = _call_name(node)
        if name.startswith("assert") or (name == "check" and "exercises" in ast.unparse(node.func)):
            return True
    return False


def _scoped(node: ast.AST) -> bool:
    """A node with its own scope: names bound inside it do not leak into the cell."""
    return isinstance(
        node,
        (
            ast.FunctionDef,
            ast.AsyncFunctionDef,
            ast.ClassDef,
            ast.Lambda,
            ast.ListComp,
            ast.SetComp,
            ast.DictComp,
            ast.GeneratorExp,
        ),
    )


def _all_stores(node: ast.AST) -> set[str]:
    """Every name bound anywhere inside ``node``, local scopes included (and arguments)."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
    return names


def _walk_outer(node: ast.AST):
    """Like ``ast.walk``, but not into function, class, lambda or comprehension bodies."""
    yield node
    for child in ast.iter_child_nodes(node):
        if _scoped(child):
            yield child  # the def/class itself binds its name; its body is its own scope
        else:
            yield from _walk_outer(child)


def bound_names(tree: ast.Module) -> set[str]:
    """Names a cell binds at module level (not by ``import``): assignments, loops, defs."""
    names: set[str] = set()
    for node in _walk_outer(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def free_names(tree: ast.Module) -> set[str]:
    """Names a cell reads before binding them itself: what it takes from earlier cells.

    Statement by statement: a name read in a statement counts unless an earlier statement of
    the cell, or the statement itself (a loop variable, a comprehension variable, the target
    of an assignment), binds it; ``x += 1`` reads ``x``. (So ``x = f(x)`` is not seen as
    reading an earlier ``x``: a rare pattern after a plotting cell.)
    """
    bound: set[str] = set()
    free: set[str] = set()
    for stmt in tree.body:
        loads = {
            n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        stores = _all_stores(stmt)  # loop, comprehension and local variables included
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            loads.add(stmt.target.id)
            stores.discard(stmt.target.id)
        free |= loads - bound - stores
        bound |= bound_names(ast.Module(body=[stmt], type_ignores=[]))
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return free


def _displays(stmt: ast.stmt) -> bool:
    """The statement shows a value: a bare expression (Jupyter displays it) or ``display(...)``."""
    return isinstance(stmt, ast.Expr) and _call_name(stmt.value) not in {"print", "show"}


def plumbing_kind(cells: list[dict], index: int) -> str | None:
    """``"plot"``, ``"table"`` or ``"provenance"`` when cell ``index`` is plumbing, else None."""
    cell = cells[index]
    if cell.get("cell_type") != "code":
        return None
    tags = set(cell.get("metadata", {}).get("tags", []))
    if any(t.startswith("exercise") for t in tags):
        return None
    code = source(cell)
    tree = _parse(code)
    if tree is None or not tree.body or _checks(tree) or _defines(tree):
        return None
    later: set[str] = set()
    for other in cells[index + 1 :]:
        if other.get("cell_type") == "code":
            other_tree = _parse(source(other))
            later |= free_names(other_tree) if other_tree else set()
    if bound_names(tree) & later:
        return None
    code = _strip_comments(code)
    if DRAWS.search(code):
        return "plot"
    if TABLE.search(code) and _displays(tree.body[-1]):
        return "table"
    prints = all(
        isinstance(s, ast.Expr) and _call_name(s.value) in {"print", "display"} for s in tree.body
    )
    if prints and PROVENANCE.search(code):
        return "provenance"
    return None


def untagged(cells: list[dict]) -> list[tuple[int, str, str]]:
    """Plumbing cells without a hiding tag: ``(index, kind, first line)``."""
    found = []
    for i, cell in enumerate(cells):
        if HIDDEN & set(cell.get("metadata", {}).get("tags", [])):
            continue
        kind = plumbing_kind(cells, i)
        if kind:
            first = (source(cell).strip().splitlines() or [""])[0][:70]
            found.append((i, kind, first))
    return found


def tag_notebook(path: Path, write: bool) -> list[tuple[int, str, str]]:
    """Find (and with ``write``, tag) the untagged plumbing cells of one notebook."""
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    found = untagged(nb["cells"])
    if write and found:
        for i, _, _ in found:
            meta = nb["cells"][i].setdefault("metadata", {})
            meta["tags"] = [*meta.get("tags", []), TAG]
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return found


def main(argv: list[str] | None = None) -> int:
    """List (``--write``: tag) plumbing cells of the given chapters; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: book/*.ipynb")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"add the tag {TAG!r}")
    group.add_argument("--check", action="store_true", help="exit 1 when a cell needs the tag")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    total = 0
    for path in paths:
        for i, kind, first in tag_notebook(path, args.write):
            total += 1
            verb = "tagged" if args.write else "would tag"
            print(f"{path.name}: cell {i} ({kind}) {verb} {TAG}: {first!r}")
    print(f"{total} cell(s) {'tagged' if args.write else 'to tag'} in {len(paths)} notebook(s)")
    return 1 if args.check and total else 0


if __name__ == "__main__":
    sys.exit(main())
