"""The one list of the paper's variants (diagsink.variants): letters, labels, layer arguments."""

from __future__ import annotations

import re

import pytest

from diagsink import variants
from diagsink.errors import ConfigError

from conftest import ROOT


def test_letters_follow_the_papers_results_table():
    assert variants.VARIANTS == ("no_residual", "none", "mask", "dropout", "penalty")
    assert variants.LABELS == {
        "no_residual": "(a) no residual",
        "none": "(b) no regularization",
        "mask": "(c) full diagonal mask",
        "dropout": "(d) diagonal dropout",
        "penalty": "(e) diagonal penalty",
    }
    assert variants.label("penalty", short=True) == "(e) penalty"
    assert variants.label("dropout", short=True) == "(d) dropout"


def test_figure_order_puts_penalty_before_dropout_with_the_same_names():
    assert variants.FIGURE_ORDER == ("no_residual", "none", "mask", "penalty", "dropout")
    assert sorted(variants.FIGURE_ORDER) == sorted(variants.VARIANTS)


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("no_residual", {"residual": False, "diag": None}),
        ("none", {"residual": True, "diag": None}),
        ("mask", {"residual": True, "diag": "mask"}),
        ("dropout", {"residual": True, "diag": "dropout", "diag_p": 0.3}),
        ("penalty", {"residual": True, "diag": "penalty", "diag_penalty": -0.7}),
    ],
)
def test_attention_kwargs_known_answers(variant, expected):
    assert variants.attention_kwargs(variant, diag_p=0.3, diag_penalty=-0.7) == expected


def test_reported_strengths_are_the_defaults():
    assert variants.attention_kwargs("dropout")["diag_p"] == 0.2
    assert variants.attention_kwargs("penalty")["diag_penalty"] == -0.1


@pytest.mark.parametrize("bad", ["diag-mask", "", None, 3, "Mask"])
def test_unknown_variant_names_the_allowed_ones(bad):
    with pytest.raises(ConfigError, match="no_residual, none, mask, dropout, penalty"):
        variants.check_variant(bad)


def test_no_second_list_of_the_five_variants():
    """No module or chapter other than variants.py spells out the five names as one collection."""
    five = r"""["']no_residual["'][^\]\)\}]{0,20}["']none["'][^\]\)\}]{0,20}["']mask["']"""
    offenders = []
    for path in [*(ROOT / "diagsink").rglob("*.py"), *(ROOT / "book").glob("*.ipynb")]:
        if path.name == "variants.py":
            continue
        text = path.read_text()
        if re.search(five, text) or "VARIANT_LABELS" in text or "VARIANT_ORDER" in text:
            offenders.append(path.relative_to(ROOT).as_posix())
    assert offenders == [], f"a second list of the variants in {offenders}; use diagsink.variants"
