"""``diagsink course grade``: run a submitted notebook, then each exercise's registered check.

Grading executes the student's code. It runs in its own Jupyter kernel (a separate process);
the checks run here, in the grader's process, which the student's code never touches: each
check calls the student's function through :class:`_RemoteFunction`, which sends the check's
fresh inputs to the kernel, calls the function there and reads back only tensors and plain
numbers (``torch.load(weights_only=True)``). A notebook that replaces ``ds.exercises.check``,
prints ``PASS`` or edits its check cells changes nothing: its kernel never grades itself.
Sandbox the whole command anyway (a container or a throwaway user, ``book/instructors.md``):
the student's code can do whatever that user may.

Part of :mod:`diagsink.course` (``book/instructors.md``).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from .. import exercises
from ..errors import DiagsinkError
from .notebooks import (
    CHECK_TAG,
    _defined_names,
    _src,
    _tags,
    exercises_of,
    find_book_root,
    read_notebook,
    toc_notebooks,
)

__all__ = ["GRADE_STATUSES", "Grade", "SubmissionError", "grade"]

# --------------------------------------------------------------------------- grading

GRADE_STATUSES = ("pass", "hint", "not attempted", "missing", "error")


@dataclass
class Grade:
    """The outcome of one exercise in a submitted notebook."""

    label: str
    status: str  # one of GRADE_STATUSES
    message: str = ""


class SubmissionError(DiagsinkError):
    """A submitted notebook cannot be graded at all (unreadable, malformed, unknown chapter)."""


def read_submission(path: Path) -> Any:
    """A submitted notebook, validated against the notebook format; else :class:`SubmissionError`.

    Malformed JSON, a cell without ``source``, a ``source`` that is not text: each is one
    error naming the file, never a traceback from deep inside the notebook libraries.
    """
    fix = "Fix: ask the student for the notebook as saved by Jupyter (File > Save)."
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # noqa: BLE001 - JSON, encoding, format-version errors alike
        raise SubmissionError(
            f"{path}: not a readable notebook ({type(exc).__name__}: {_short(exc)}). {fix}"
        ) from exc
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        where = "/".join(str(p) for p in getattr(exc, "absolute_path", ()))
        at = f" at {where}" if where else ""
        raise SubmissionError(
            f"{path}: not a valid notebook ({_short(exc.message)}{at}). {fix}"
        ) from exc
    return nb


def _short(exc: Any, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _source_chapter(nb: Any, path: Path, root: Path) -> Path:
    """The book chapter a submission belongs to: a chapter of ``_toc.yml``, never another file.

    The ``diagsink.source`` metadata (written by the export) must name one of the chapters
    exactly (e.g. ``book/attention.ipynb``); anything else (``../../etc/passwd``) is refused
    unread. Without the metadata the chapter is the one with the submission's file name.
    """
    chapters = {os.path.relpath(p, root).replace(os.sep, "/"): p for p in toc_notebooks(root)}
    meta = nb.metadata.get("diagsink")
    source = meta.get("source") if isinstance(meta, dict) else None
    if source:
        if isinstance(source, str) and source in chapters:
            return chapters[source]
        raise SubmissionError(
            f"{path}: its metadata diagsink.source = {_short(repr(source), 80)} is not a chapter of the "
            f"book in {root}. Fix: set it to one of {', '.join(sorted(chapters))} (or remove it and name "
            "the file after its chapter)."
        )
    for chapter in chapters.values():
        if chapter.name == path.name:
            return chapter
    raise SubmissionError(
        f"cannot tell which chapter {path} is: it has no diagsink.source metadata (written by "
        "`diagsink course export`) and no chapter in _toc.yml has its file name; rename it to the chapter's name."
    )


# --------------------------------------------------------------------------- the student's kernel

_HELPERS = """
def __diagsink_grader_call(name, inp, out):
    import torch as _torch, numbers as _numbers
    def _pack(obj):
        if isinstance(obj, _torch.Tensor):
            return obj.detach().cpu().clone()
        if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
            return obj
        if isinstance(obj, _numbers.Number) and hasattr(obj, "item"):
            return obj.item()
        if isinstance(obj, list):
            return [_pack(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(_pack(v) for v in obj)
        if isinstance(obj, (set, frozenset)):
            return {_pack(v) for v in obj}
        if isinstance(obj, dict):
            plain = (bool, int, float, str, type(None))
            return {k if isinstance(k, plain) else str(k): _pack(v) for k, v in obj.items()}
        return {"__opaque__": type(obj).__name__}
    args, kwargs, needs_grad = _torch.load(inp, weights_only=True)
    args = [a.requires_grad_() if i in needs_grad else a for i, a in enumerate(args)]
    try:
        result = globals()[name](*args, **kwargs)
    except BaseException as exc:
        _torch.save({"error": [type(exc).__name__, str(exc)]}, out)
        return
    grad = isinstance(result, _torch.Tensor) and result.requires_grad and bool(needs_grad)
    if grad:
        __diagsink_graphs[out] = (result, [args[i] for i in needs_grad])
    _torch.save({"result": _pack(result), "args": [_pack(a) for a in args], "grad": grad}, out)

def __diagsink_grader_backward(key, inp, out):
    import torch as _torch
    result, inputs = __diagsink_graphs[key]
    grads = _torch.autograd.grad(result, inputs, _torch.load(inp, weights_only=True),
                                 allow_unused=True, retain_graph=True)
    _torch.save([None if g is None else g.detach().cpu() for g in grads], out)

__diagsink_graphs = {}
"""


class KernelFailure(BaseException):
    """The student's kernel died or a cell ran past the time limit: the notebook cannot go on.

    A ``BaseException`` so that a check's own ``except Exception`` (which turns the student's
    errors into hints) cannot turn a dead kernel into a hint.
    """


class _Kernel:
    """The student's notebook in its own kernel, and calls into it (files in a private folder)."""

    def __init__(self, client: NotebookClient, folder: Path) -> None:
        self.client, self.folder, self.calls = client, folder, 0

    def run(self, code: str) -> list[Any]:
        """Execute ``code`` as one cell; its outputs. Raises :class:`KernelFailure`."""
        cell = nbformat.v4.new_code_cell(code)
        self.execute(cell, -1)
        return cell.outputs

    def execute(self, cell: Any, index: int) -> None:
        try:
            self.client.execute_cell(cell, index)
        except DeadKernelError as exc:
            where = f"cell {index}" if index >= 0 else "a call of the student's function"
            raise KernelFailure(f"the kernel died while running {where}") from exc
        except (CellTimeoutError, TimeoutError) as exc:
            where = f"cell {index}" if index >= 0 else "a call of the student's function"
            raise KernelFailure(
                f"{where} ran longer than the time limit ({self.client.timeout} s; --timeout)"
            ) from exc

    def exchange(self, payload: Any, command: str, *names: str) -> Any:
        """Save ``payload``, run ``command(names..., in, out)`` in the kernel, load its answer."""
        self.calls += 1
        inp, out = self.folder / f"in{self.calls}.pt", self.folder / f"out{self.calls}.pt"
        torch.save(payload, inp)
        args = ", ".join(repr(str(v)) for v in (*names, inp, out))
        self.run(f"{command}({args})")
        try:
            return out, torch.load(out, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - missing, truncated or foreign: the call failed
            raise RuntimeError(
                "the grader could not read the answer of the student's function"
            ) from exc

    def defines(self, name: str) -> bool:
        outputs = self.run(f"print('DIAGSINK', callable(globals().get({name!r})))")
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        return "DIAGSINK True" in text


def _opaque(obj: Any) -> Any:
    """Rebuild what came back: ``{"__opaque__": name}`` becomes an object of a class of that name."""
    if isinstance(obj, dict):
        if set(obj) == {"__opaque__"}:
            return type(str(obj["__opaque__"]), (), {})()
        return {k: _opaque(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return type(obj)(_opaque(v) for v in obj)
    return obj


class _RemoteGrad(torch.autograd.Function):
    """The student's result as a node of this process's graph; its backward asks the kernel."""

    @staticmethod
    def forward(ctx, kernel: _Kernel, key: str, value: torch.Tensor, *inputs: torch.Tensor):  # type: ignore[override]
        ctx.kernel, ctx.key = kernel, key
        return value.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        _, grads = ctx.kernel.exchange(grad.detach().cpu(), "__diagsink_grader_backward", ctx.key)
        return (None, None, None, *grads)


def _raise_like(name: str, message: str) -> None:
    """Raise the student's exception here: the built-in type of that name, else a RuntimeError."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            raise kind(message)
        except TypeError:  # an exception type whose constructor wants other arguments
            pass
    raise RuntimeError(f"{name}: {message}")


class _RemoteFunction:
    """Stands for the student's function ``name`` in the kernel: calls it there with the check's inputs.

    Arguments and results travel as tensors and plain Python values; a tensor argument that
    the function changed in place is changed here too, a result that needs a gradient gets
    one (:class:`_RemoteGrad`), and the function's exception is raised here with its type
    (``NotImplementedError`` for an unchanged stub).
    """

    def __init__(self, kernel: _Kernel, name: str) -> None:
        self.kernel, self.__name__ = kernel, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        needs_grad = [
            i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad
        ]
        sent = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        kw = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        key, answer = self.kernel.exchange(
            (sent, kw, needs_grad), "__diagsink_grader_call", self.__name__
        )
        if "error" in answer:
            _raise_like(*answer["error"])
        for arg, back in zip(args, answer["args"]):  # in-place changes come back
            if isinstance(arg, torch.Tensor) and isinstance(back, torch.Tensor):
                if back.shape == arg.shape and not torch.equal(back.to(arg.dtype), arg.detach()):
                    with torch.no_grad():
                        arg.copy_(back)
        result = _opaque(answer["result"])
        if answer.get("grad") and isinstance(result, torch.Tensor):
            inputs = [args[i] for i in needs_grad]
            result = _RemoteGrad.apply(self.kernel, str(key), result, *inputs)
        return result


# --------------------------------------------------------------------------- one notebook


def _targets(chapter: Any) -> list[tuple[str, str]]:
    """``(label, function name)`` of every exercise with a stub, from the book's chapter."""
    targets: list[tuple[str, str]] = []
    for label, ex in exercises_of(chapter).items():
        if ex.stubs:
            names = sorted(_defined_names(_src(chapter.cells[ex.stubs[0]])))
            if names:
                targets.append((label, names[0]))
    return targets


def _without_checks(submitted: Any) -> Any:
    """A copy of the submission without its check cells (what the student's kernel runs)."""
    run = nbformat.v4.new_notebook(metadata=copy.deepcopy(submitted.metadata))
    run.cells = [
        copy.deepcopy(c)
        for c in submitted.cells
        if not (c.cell_type == "code" and CHECK_TAG in _tags(c))
    ]
    return run


def _grade_one(kernel: _Kernel, label: str, name: str) -> Grade:
    """Run the registered check of ``label`` here, on the student's ``name`` in the kernel."""
    if not kernel.defines(name):
        return Grade(label, "missing", f"no function {name!r} is defined")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # check() prints PASS/HINT
            result = exercises.check(label, _RemoteFunction(kernel, name))
    except NotImplementedError:
        return Grade(label, "not attempted", "the stub still raises NotImplementedError")
    except Exception as exc:  # noqa: BLE001 - the check could not run: recorded, grading goes on
        return Grade(label, "error", f"{type(exc).__name__}: {exc}")
    return Grade(label, "pass" if result.passed else "hint", result.message)


def grade(
    notebook: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    timeout: int = 600,
) -> list[Grade]:
    """Grade a submitted student notebook with the registered checks.

    The notebook runs top to bottom in a fresh kernel (errors allowed, in its own folder),
    without its check cells. Then, for every exercise of the chapter (taken from the book's
    source, not from the submission), the registered check runs in *this* process on fresh
    random inputs, calling the student's function in the kernel (:class:`_RemoteFunction`):
    nothing the notebook does can change a check or its verdict.

    Returns one :class:`Grade` per exercise: ``pass``, ``hint`` (wrong; the message says
    what), ``not attempted`` (the stub is unchanged), ``missing`` (the function is not
    defined) or ``error`` (the check could not run, the kernel died, a cell ran past
    ``timeout`` seconds: the message says which).

    Raises:
        SubmissionError: the file is not a valid notebook or its chapter is unknown (naming
            the file); :class:`FileNotFoundError` when there is no book (``_toc.yml``).
    """
    path = Path(notebook)
    root = find_book_root(source)
    exercises.labels()  # import every check now, before any student code runs
    submitted = read_submission(path)
    chapter = read_notebook(_source_chapter(submitted, path, root))
    targets = _targets(chapter)
    run = _without_checks(submitted)
    client = NotebookClient(
        run,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    folder = Path(tempfile.mkdtemp(prefix="diagsink-grade-"))
    grades: list[Grade] = []
    try:
        with client.setup_kernel():
            kernel = _Kernel(client, folder)
            for index, cell in enumerate(run.cells):
                kernel.execute(cell, index)
            kernel.run(_HELPERS)
            for label, name in targets:
                grades.append(_grade_one(kernel, label, name))
    except KernelFailure as exc:
        done = {g.label for g in grades}
        grades += [
            Grade(label, "error", f"{path.name}: {exc}")
            for label, _ in targets
            if label not in done
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return grades
