"""Argument types shared by the commands: whole numbers with a minimum, a device name."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..runtime import check_device

__all__ = ["whole_number", "seed", "positive", "device"]


def whole_number(minimum: int, not_a_number: str, too_small: str) -> Callable[[str], int]:
    """An ``argparse`` type: ``int(text)`` if it is at least ``minimum``, else a clear error.

    ``not_a_number`` is appended to ``"<text> is not a whole number"``; ``too_small`` is the
    message for a value below ``minimum``.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number{not_a_number}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(too_small)
        return value

    return parse


#: A seed: 0, 1, 2, ...
seed = whole_number(0, "; seeds are 0, 1, 2, ...", "seeds are non-negative integers")
#: A count of at least 1 (seeds of a sweep, epochs).
positive = whole_number(1, "", "must be at least 1")


def device(text: str) -> str:
    """An ``argparse`` type for ``--device``: ``cpu``, ``cuda`` or ``cuda:<k>``."""
    try:
        return check_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
