"""Type checks shared by every module that validates its arguments: integers and reals, never bools."""

from __future__ import annotations

import numbers

__all__ = ["is_int", "is_real"]


def is_int(value: object) -> bool:
    """An integer (Python or NumPy), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A real number (Python or NumPy, int or float), but not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
