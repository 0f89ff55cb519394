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
see the instructor page of the book (``book/instructors.md``).

Writing a check: draw inputs from :func:`fresh_generator` (a new seed on every call, so a
hard-coded answer cannot pass, and the notebook's own random state is left alone), compute
the reference, and compare with :func:`compare_tensors`, which turns a mismatch into a hint
(wrong type, wrong shape, transposed, off by a constant factor, NaN/inf, wrong values)
without printing the expected values. Combine several hints with :func:`first_hint`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "register",
    "check",
    "Result",
    "labels",
    "ExerciseFailed",
    "fresh_generator",
    "compare_tensors",
    "first_hint",
]

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

    def __repr__(self) -> str:  # a notebook shows a check cell's value: keep it one short line
        return f"Result({'PASS' if self.passed else 'HINT'} [{self.label}])"


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


# ---------------------------------------------------------------------------------------
# Helpers for writing checks (used by the modules ``diagsink/exercises/<chapter>.py``)
# ---------------------------------------------------------------------------------------


def fresh_generator() -> Any:
    """A ``torch.Generator`` with a fresh seed from the operating system.

    Checks draw their inputs from it, so every call sees new random inputs (a hard-coded
    answer cannot pass) and the global RNG of the student's notebook is not touched.
    The seed is available as ``generator.initial_seed()`` for a reproducible hint.
    """
    gen = torch.Generator()
    gen.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))
    return gen


def first_hint(*hints: str | None) -> str | None:
    """The first hint that is not ``None`` (``None`` when every part passed)."""
    for hint in hints:
        if hint is not None:
            return hint
    return None


def compare_tensors(
    got: Any,
    expected: Any,
    *,
    name: str = "the result",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> str | None:
    """Compare a student's tensor with the reference; ``None`` if they match, else a hint.

    The hint names the kind of mistake without printing the reference values: not a
    tensor, wrong shape (the expected *shape* is stated), NaN or inf, the transpose of the
    right answer, off by a constant factor (a missing scale such as ``1/sqrt(d)``), or
    wrong values (the largest absolute difference and the share of entries that differ).

    Args:
        got: what the student's function returned.
        expected: the reference tensor.
        name: how the hint calls this value, e.g. ``"the attention weights"``.
        atol, rtol: tolerances as in :func:`torch.testing.assert_close`.
    """
    if not isinstance(got, torch.Tensor):
        return f"{name} should be a torch.Tensor, but your function returned {type(got).__name__}."
    if got.is_complex() != expected.is_complex() or (
        got.is_floating_point() != expected.is_floating_point()
    ):
        return f"{name} has dtype {got.dtype}; a {expected.dtype} tensor is expected."
    if tuple(got.shape) != tuple(expected.shape):
        return (
            f"{name} has shape {list(got.shape)}, expected {list(expected.shape)}: "
            "check which dimension you reduce, transpose or index."
        )
    got = got.detach().to(device=expected.device, dtype=expected.dtype)
    expected = expected.detach()
    if not torch.isfinite(got).all() and torch.isfinite(expected).all():
        return (
            f"{name} contains NaN or inf where the reference is finite: look for an overflow "
            "(e.g. exp of a large number) or a division by zero."
        )
    if torch.allclose(got, expected, atol=atol, rtol=rtol, equal_nan=True):
        return None
    if got.dim() >= 2 and got.shape[-1] == got.shape[-2]:
        if torch.allclose(got.transpose(-1, -2), expected, atol=atol, rtol=rtol):
            return f"{name} is the transpose of the expected one: swap the last two dimensions (rows vs columns)."
    denom = float((expected * expected).sum())
    if denom > 0:
        factor = float((got * expected).sum()) / denom
        if abs(factor - 1.0) > 1e-3 and abs(factor) > 1e-6:
            if torch.allclose(got, factor * expected, atol=atol * max(1.0, abs(factor)), rtol=rtol):
                return (
                    f"{name} is off by a constant factor of about {factor:.4g}: "
                    "a scale (such as 1/sqrt(d) or a normalisation) is missing or applied twice."
                )
    diff = (got - expected).abs()
    bad = ~torch.isclose(got, expected, atol=atol, rtol=rtol, equal_nan=True)
    share = float(bad.float().mean())
    return (
        f"{name} has the right shape but wrong values: the largest difference is "
        f"{float(diff[torch.isfinite(diff)].max()) if torch.isfinite(diff).any() else float('nan'):.3g}, "
        f"and {100 * share:.0f}% of the entries differ."
    )
