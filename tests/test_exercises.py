"""Every registered exercise check lets an unfinished stub's NotImplementedError through.

The student notebooks rely on this: an exercise that is not done yet must show up as
exactly that error, never as a misleading hint ("return two numbers ...").
Also: the exercise of the appendix "Making it fast" (``ex-fast-mask``) and the two of the chapter "Depth and LayerNorm" (``ex-depth-layernorm``,
``ex-depth-bound``) pass the right answer and name each typical mistake.
"""

from __future__ import annotations

import math

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
        "designs",
        "reproducing",
        "model",
        "results",
        "heatmaps",
        "scaling",
        "fast",
        "depth",
    } <= chapters


@pytest.mark.parametrize("label", LABELS)
def test_stub_error_propagates(label: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(label)

    with pytest.raises(NotImplementedError, match=label):
        ds.exercises.check(label, stub)


def _sdpa_mask(T: int, diag: str, penalty: float) -> torch.Tensor:
    """The right answer of ``ex-fast-mask``, written independently of the package."""
    if diag == "mask":
        return ~torch.eye(T, dtype=torch.bool)  # True: the key takes part
    return torch.diag(torch.full((T,), penalty))


def test_mask_check_passes_the_right_answer_and_the_float_form():
    assert ds.exercises.check("ex-fast-mask", _sdpa_mask, strict=True).passed

    def float_form(T, diag, penalty):
        value = float("-inf") if diag == "mask" else penalty
        return torch.zeros(T, T).fill_diagonal_(value)

    assert ds.exercises.check("ex-fast-mask", float_form, strict=True).passed


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (
            lambda T, d, p: ~_sdpa_mask(T, d, p) if d == "mask" else _sdpa_mask(T, d, p),
            "True means",
        ),
        (
            lambda T, d, p: _sdpa_mask(T, d, p) if d == "mask" else torch.full((T, T), p),
            "diagonal only",
        ),
        (
            lambda T, d, p: _sdpa_mask(T, d, p) if d == "mask" else 2 * _sdpa_mask(T, d, p),
            "after the",
        ),
        (lambda T, d, p: _sdpa_mask(T, d, p)[:-1], "shape"),
        (lambda T, d, p: _sdpa_mask(T, d, p).tolist(), "returned list"),
    ],
    ids=["mha-convention", "everywhere", "scaled", "shape", "list"],
)
def test_mask_check_names_the_mistake(wrong, hint: str):
    result = ds.exercises.check("ex-fast-mask", wrong)
    assert not result.passed and hint in result.message, result.message
    with pytest.raises(ds.exercises.ExerciseFailed):
        ds.exercises.check("ex-fast-mask", wrong, strict=True)


# ------------------------------------------------------------------------- depth and LayerNorm
def _layernorm_block(x, gamma, eps, *, centre=True, outer=True, biased=True):
    """The right answer of ``ex-depth-layernorm`` (and its typical mistakes), by autograd."""
    c = x.numel()

    def f(v):
        mu = v.mean() if centre else v.mean().detach()
        sigma = torch.sqrt(((v - v.mean()) ** 2).sum() / (c if biased else c - 1) + eps)
        if not outer:
            sigma = sigma.detach()
        return gamma * (v - mu) / sigma

    return torch.autograd.functional.jacobian(f, x)


def _stack_off_bound(constants, T):
    """The right answer of ``ex-depth-bound``, written out for two products."""
    alphas = [a - b / T for a, b in constants]
    return (math.prod(al + b for al, (_, b) in zip(alphas, constants)) - math.prod(alphas)) / T


def test_depth_checks_pass_the_right_answers():
    for _ in range(3):
        assert ds.exercises.check("ex-depth-layernorm", _layernorm_block, strict=True).passed
        assert ds.exercises.check("ex-depth-bound", _stack_off_bound, strict=True).passed


def test_depth_bound_attains_the_averaging_stack():
    for L in (1, 2, 5):
        assert math.isclose(_stack_off_bound([(1 + 1 / 9, 1.0)] * L, 9), (2**L - 1) / 9)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda x, g, e: _layernorm_block(x, g, e, outer=False), "x̂ x̂ᵀ / C is missing"),
        (lambda x, g, e: _layernorm_block(x, g, e, centre=False), "1 1ᵀ / C is missing"),
        (lambda x, g, e: _layernorm_block(x, torch.ones_like(g), e), "the gain γ is missing"),
        (lambda x, g, e: _layernorm_block(x, g, 0.0), "ε is missing"),
        (lambda x, g, e: _layernorm_block(x, g, e, biased=False), "biased variance"),
        (lambda x, g, e: _layernorm_block(x, g, e).T, "transposed, or the gain"),
        (lambda x, g, e: _layernorm_block(x, g, e)[:-1], "shape"),
    ],
    ids=["no-outer", "no-centre", "no-gain", "no-eps", "unbiased", "transposed", "shape"],
)
def test_layernorm_check_names_the_mistake(wrong, hint: str):
    result = ds.exercises.check("ex-depth-layernorm", wrong)
    assert not result.passed and hint in result.message, result.message


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda c, T: math.prod(a + b for a, b in c) / T, "T-free ceiling"),
        (lambda c, T: math.prod(a - b / T + b for a, b in c) / T, "subtract Π α_l"),
        (lambda c, T: _stack_off_bound(c, T) * T, "divide by T"),
        (lambda c, T: math.prod(a - b / T for a, b in c) + _stack_off_bound(c, T), "diagonal"),
        (lambda c, T: str(_stack_off_bound(c, T)), "return a float"),
    ],
    ids=["ceiling", "no-subtraction", "no-T", "diagonal", "string"],
)
def test_stack_bound_check_names_the_mistake(wrong, hint: str):
    result = ds.exercises.check("ex-depth-bound", wrong)
    assert not result.passed and hint in result.message, result.message
