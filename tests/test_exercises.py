"""Every registered exercise check lets an unfinished stub's NotImplementedError through.

The student notebooks rely on this: an exercise that is not done yet must show up as
exactly that error, never as a misleading hint ("return two numbers ...").
Also: the packing exercise of the appendix "Making it fast" (``ex-fast-pack``) passes the
right answer and names each typical mistake.
"""

from __future__ import annotations

import pytest
import torch

import diagsink as ds

LABELS = ds.exercises.labels()


def test_there_are_checks_for_every_chapter():
    chapters = {label.split("-")[1] for label in LABELS}
    assert {
        "attention",
        "jacobian",
        "bounds",
        "metr",
        "parroting",
        "model",
        "results",
        "heatmaps",
        "scaling",
        "fast",
    } <= chapters


@pytest.mark.parametrize("label", LABELS)
def test_stub_error_propagates(label: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(label)

    with pytest.raises(NotImplementedError, match=label):
        ds.exercises.check(label, stub)


def _block_bias(T: int, G: int) -> torch.Tensor:
    """The right answer of ``ex-fast-pack``, written independently of the package."""
    same = torch.block_diag(*[torch.ones(T, T)] * G).bool()
    return torch.zeros(G * T, G * T).masked_fill(~same, float("-inf"))


def test_pack_check_passes_the_right_answer():
    assert ds.exercises.check("ex-fast-pack", _block_bias, strict=True).passed


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda T, G: torch.where(_block_bias(T, G) == 0, float("-inf"), 0.0), "swapped"),
        (lambda T, G: (_block_bias(T, G) == 0).double(), "not 1 and 0"),
        (lambda T, G: _block_bias(T, G).clamp(min=-1e9), "large negative number"),
        (lambda T, G: _block_bias(T, G)[:-1], "shape"),
        (lambda T, G: _block_bias(T, G).tolist(), "returned list"),
        (
            lambda T, G: torch.zeros(G * T, G * T).masked_fill(
                ~torch.kron(torch.ones(G, G), torch.eye(T)).bool(), float("-inf")
            ),
            "one after another",
        ),
    ],
    ids=["swapped", "ones", "finite", "shape", "list", "interleaved"],
)
def test_pack_check_names_the_mistake(wrong, hint: str):
    result = ds.exercises.check("ex-fast-pack", wrong)
    assert not result.passed and hint in result.message, result.message
    with pytest.raises(ds.exercises.ExerciseFailed):
        ds.exercises.check("ex-fast-pack", wrong, strict=True)


def test_the_pack_exercise_moved_to_the_appendix():
    labels = set(LABELS)
    assert "ex-fast-pack" in labels and "ex-attention-pack" not in labels
