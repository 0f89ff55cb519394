"""The paper's five variants: the one list of names, letters, labels and layer arguments.

Every part of the package and every chapter takes the variants from here. The letters
follow the paper's results table: (a) no residual, (b) no regularization, (c) full
diagonal mask, (d) diagonal dropout, (e) diagonal penalty. The paper's Figure 1 puts its
panels in another order (penalty before dropout, :data:`FIGURE_ORDER`); where the book
reproduces that figure, its caption says so and the letters stay those of the table.

A variant is a set of keyword arguments of :class:`diagsink.attention.TemporalAttention`
(:func:`attention_kwargs`); the strengths default to the values reported in the paper's
text (penalty -0.1, dropout p = 0.2; the released code's defaults are -0.05 and 0).
Introduced in the chapter "The T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

__all__ = [
    "VARIANTS",
    "FIGURE_ORDER",
    "LETTERS",
    "LABELS",
    "SHORT_LABELS",
    "REPORTED_DIAG_P",
    "REPORTED_DIAG_PENALTY",
    "check_variant",
    "attention_kwargs",
    "label",
]

#: The five variants, in the order of the paper's results table.
VARIANTS: tuple[str, ...] = ("no_residual", "none", "mask", "dropout", "penalty")

#: The order of the panels of the paper's Figure 1 (penalty before dropout).
FIGURE_ORDER: tuple[str, ...] = ("no_residual", "none", "mask", "penalty", "dropout")

#: The letter of each variant in the paper's results table.
LETTERS: dict[str, str] = dict(zip(VARIANTS, "abcde", strict=True))

_NAMES = {
    "no_residual": "no residual",
    "none": "no regularization",
    "mask": "full diagonal mask",
    "dropout": "diagonal dropout",
    "penalty": "diagonal penalty",
}

#: Labels as the paper's table prints them, e.g. ``"(d) diagonal dropout"``.
LABELS: dict[str, str] = {v: f"({LETTERS[v]}) {_NAMES[v]}" for v in VARIANTS}

_SHORT_NAMES = {
    "no_residual": "no residual",
    "none": "no regularization",
    "mask": "mask",
    "dropout": "dropout",
    "penalty": "penalty",
}

#: Short labels for panel titles, e.g. ``"(d) dropout"``.
SHORT_LABELS: dict[str, str] = {v: f"({LETTERS[v]}) {_SHORT_NAMES[v]}" for v in VARIANTS}

#: Diagonal-dropout probability reported in the paper's text (the released default is 0).
REPORTED_DIAG_P = 0.2

#: Diagonal penalty reported in the paper's text (the released default is -0.05).
REPORTED_DIAG_PENALTY = -0.1


def check_variant(variant: Any) -> str:
    """Return ``variant`` if it is one of :data:`VARIANTS`, else raise :class:`ConfigError`."""
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ConfigError(f"variant {variant!r} is not known; choose one of {', '.join(VARIANTS)}.")
    return variant


def attention_kwargs(
    variant: str, *, diag_p: float = REPORTED_DIAG_P, diag_penalty: float = REPORTED_DIAG_PENALTY
) -> dict[str, Any]:
    """The :class:`~diagsink.attention.TemporalAttention` arguments of one variant.

    ``no_residual`` -> ``residual=False`` (no regularizer); ``none`` -> no regularizer;
    ``mask`` -> ``diag="mask"``; ``dropout`` -> ``diag="dropout", diag_p``;
    ``penalty`` -> ``diag="penalty", diag_penalty``.
    """
    check_variant(variant)
    kwargs: dict[str, Any] = {"residual": variant != "no_residual", "diag": None}
    if variant == "mask":
        kwargs["diag"] = "mask"
    elif variant == "dropout":
        kwargs.update(diag="dropout", diag_p=diag_p)
    elif variant == "penalty":
        kwargs.update(diag="penalty", diag_penalty=diag_penalty)
    return kwargs


def label(variant: str, short: bool = False) -> str:
    """The label of ``variant``: ``"(c) full diagonal mask"``, or ``"(c) mask"`` with ``short``."""
    return (SHORT_LABELS if short else LABELS)[check_variant(variant)]
