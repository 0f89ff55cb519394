"""Exercise checks: run a student's answer against the reference on fresh random inputs.

Every exercise in the book has a label ``ex-<chapter>-<name>`` and one check function,
registered here with :func:`register` in the module ``diagsink/exercises/<chapter>.py``.
In a notebook the student calls::

    ds.exercises.check("ex-attention-scores", my_scores)

which prints ``PASS ...`` or a hint (``HINT ...``: the shape is wrong, a path of the
Jacobian is missing, the mask is not applied, ...). A check never prints the reference
solution. If the student's function still raises ``NotImplementedError`` (the stub), the
error propagates unchanged, so an unfinished exercise is visible as exactly that.

The course tooling (``diagsink course export``) and the tests rely on this convention;
see the instructor page of the book.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["register", "check", "Result", "labels", "ExerciseFailed"]

CheckFn = Callable[[Callable], "Result"]
_REGISTRY: dict[str, CheckFn] = {}


@dataclass(frozen=True)
class Result:
    """Outcome of a check: ``passed`` and a message (``PASS``/``HINT`` text, never the solution)."""

    label: str
    passed: bool
    message: str

    def __str__(self) -> str:
        return f"{'PASS' if self.passed else 'HINT'} [{self.label}] {self.message}"


class ExerciseFailed(AssertionError):
    """Raised by :func:`check` with ``strict=True`` when an answer is wrong."""


def register(label: str) -> Callable[[CheckFn], CheckFn]:
    """Decorator: register ``fn(answer) -> Result | str | None`` as the check of ``label``.

    The check function returns ``None`` (or a :class:`Result` that passed) when the answer is
    right and a hint string (or a failing :class:`Result`) when it is wrong.
    """
    if not label.startswith("ex-"):
        raise ValueError(f"exercise labels start with 'ex-': got {label!r}")

    def deco(fn: CheckFn) -> CheckFn:
        if label in _REGISTRY and _REGISTRY[label] is not fn:
            raise ValueError(f"exercise {label!r} is registered twice")
        _REGISTRY[label] = fn
        return fn

    return deco


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def labels() -> list[str]:
    """All registered exercise labels, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def check(label: str, answer: Callable, *, strict: bool = False) -> Result:
    """Check ``answer`` for exercise ``label``; print and return the :class:`Result`.

    Args:
        label: the exercise label, e.g. ``"ex-attention-scores"``.
        answer: the student's function (or object) the exercise asks for.
        strict: raise :class:`ExerciseFailed` on a wrong answer (used by the instructor
            notebooks and the tests), instead of only printing the hint.

    Raises:
        KeyError: unknown label (the message lists the known ones).
        NotImplementedError: propagated from an unfinished stub.
    """
    _load_all()
    if label not in _REGISTRY:
        raise KeyError(f"no exercise {label!r}; known exercises: {', '.join(sorted(_REGISTRY))}")
    try:
        outcome = _REGISTRY[label](answer)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's code crashed: report it as a hint, not a traceback
        outcome = f"your function raised {type(exc).__name__}: {exc}"
    if isinstance(outcome, Result):
        result = outcome
    elif outcome is None:
        result = Result(label, True, "matches the reference on fresh random inputs.")
    else:
        result = Result(label, False, str(outcome))
    print(result)
    if strict and not result.passed:
        raise ExerciseFailed(str(result))
    return result
