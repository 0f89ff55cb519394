"""Every registered exercise check lets an unfinished stub's NotImplementedError through.

The student notebooks rely on this: an exercise that is not done yet must show up as
exactly that error, never as a misleading hint ("return two numbers ...").
Also: the two exercises of the appendix "Making it fast" (``ex-fast-pack``,
``ex-fast-groups``) and the two of the chapter "Depth and LayerNorm" (``ex-depth-layernorm``,
``ex-depth-bound``) pass the right answer and name each typical mistake.
"""

from __future__ import annotations

import math

import pytest
import torch

import diagsink as ds
from diagsink.exercises.fast import reference_groups

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
        "depth",
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


def _choose_groups(n_seq: int, T: int, pack_length: int) -> int:
    """The right answer of ``ex-fast-groups``, written independently of the package."""
    fits = [g for g in range(1, pack_length // T + 1) if n_seq % g == 0]
    return max(fits) if 2 * T <= pack_length else 1


def test_groups_rule_is_the_packages():
    cpu = torch.device("cpu")
    for n_seq in range(1, 120):
        for T in range(1, 30):
            expected = ds._packing.pack_groups(n_seq, T, cpu)
            assert reference_groups(n_seq, T, ds._packing.PACK_LENGTH) == expected
            assert _choose_groups(n_seq, T, ds._packing.PACK_LENGTH) == expected


def test_groups_check_passes_the_right_answer():
    assert ds.exercises.check("ex-fast-groups", _choose_groups, strict=True).passed


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda n, T, L: max(L // T, 1), "does not divide"),
        (lambda n, T, L: 1, "take the largest"),
        (lambda n, T, L: float(_choose_groups(n, T, L)), "return an int"),
        (lambda n, T, L: _choose_groups(n, T, L) if T <= L else 0, "at least 1"),
        (lambda n, T, L: 2 if 2 * T > L else _choose_groups(n, T, L), "G T ="),
    ],
    ids=["no-divisor", "always-one", "float", "zero", "too-long"],
)
def test_groups_check_names_the_mistake(wrong, hint: str):
    for _ in range(5):  # fresh cases on every call: the mistake shows in at least one of them
        result = ds.exercises.check("ex-fast-groups", wrong)
        assert not result.passed and hint in result.message, result.message


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
