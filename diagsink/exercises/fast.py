"""Checks of the exercise of the appendix "Making it fast" (``book/fast.ipynb``).

* ``ex-fast-pack``: ``block_bias(T, G)``, the ``[G T, G T]`` bias that keeps ``G`` sequences
  packed end to end apart (``0`` within a sequence, ``-inf`` between), as the layer's fast
  path builds it (:func:`diagsink._packing.pack_diagonal_bias`).
* ``ex-fast-groups``: ``choose_groups(n_seq, T, pack_length)``, how many sequences to pack into
  one: the largest ``G`` with ``G T <= pack_length`` that divides ``n_seq``, 1 when
  ``2 T > pack_length`` (the rule of :func:`diagsink._packing.pack_groups` on the CPU).

The check draws fresh random inputs, compares with the package's reference and returns
``None`` or a hint that names the kind of mistake (never the solution).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from .._packing import pack_diagonal_bias
from . import compare_tensors, fresh_generator, register

__all__ = ["check_block_bias", "check_choose_groups", "reference_groups"]


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """A random integer in ``[low, high]``."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


# ---------------------------------------------------------------------------------------------
@register("ex-fast-pack")
def check_block_bias(block_bias: Callable[[int, int], torch.Tensor]) -> str | None:
    """Fresh ``T >= 2`` and ``G >= 2``; packed attention must equal attention one at a time.

    ``block_bias(T, G)`` returns ``[G T, G T]``; the check adds it to the logits of ``G``
    packed random sequences (``[G, T, 4]`` each of q, k, v) and compares the result with
    attention computed one sequence at a time.
    """
    gen = fresh_generator()
    t, g = _randint(gen, 2, 7), _randint(gen, 2, 4)
    got = block_bias(t, g)
    expected = pack_diagonal_bias(torch.zeros(t, dtype=torch.float64), g)
    if not isinstance(got, torch.Tensor):
        return (
            f"block_bias({t}, {g}) returned {type(got).__name__}; "
            "return a tensor of shape [G T, G T]."
        )
    if tuple(got.shape) != (g * t, g * t):
        return (
            f"block_bias({t}, {g}) has shape {list(got.shape)}; "
            f"it must be [G T, G T] = {[g * t, g * t]}."
        )
    got = got.detach().to(torch.float64)
    if torch.equal(got, expected):
        q, k, v = torch.randn(3, g, t, 4, generator=gen, dtype=torch.float64)
        alone = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v  # [G, T, 4]
        logits = q.reshape(g * t, 4) @ k.reshape(g * t, 4).T / 2.0 + got  # [G T, G T]
        packed = torch.softmax(logits, dim=-1) @ v.reshape(g * t, 4)
        return compare_tensors(
            packed.reshape(g, t, 4), alone, name="packed attention with your bias"
        )
    return _hint(got, expected, t, g)


def _hint(got: torch.Tensor, expected: torch.Tensor, t: int, g: int) -> str | None:
    """The hint for a wrong ``[G T, G T]`` bias: the mistakes students make, else the diff."""
    inf = float("-inf")
    same = expected == 0
    interleaved = torch.kron(torch.ones(g, g), torch.eye(t)).bool()  # step i of every sequence
    wrong = [
        (
            torch.zeros(g * t, g * t).masked_fill(same, inf),
            "0 and -inf are swapped: a step must see its own sequence (bias 0) and not the "
            "others (-inf).",
        ),
        (
            torch.zeros(g * t, g * t).masked_fill(~interleaved, inf),
            "the sequences lie one after another: sequence g holds steps g*T ... g*T + T - 1, "
            "not every G-th step.",
        ),
        (
            same.double(),
            "use 0 within a sequence and -inf between sequences (not 1 and 0): the bias is "
            "added to the logits.",
        ),
    ]
    for candidate, hint in wrong:
        if torch.equal(got, candidate.to(torch.float64)):
            return hint
    if (
        bool((got[~same] < -1e3).all())
        and bool(torch.isfinite(got[~same]).all())
        and bool((got[same] == 0).all())
    ):
        return (
            "almost: a large negative number still gives a tiny weight across sequences; "
            "use -inf, which gives exactly 0."
        )
    return compare_tensors(got, expected, name=f"block_bias({t}, {g})")


# ---------------------------------------------------------------------------------------------
def reference_groups(n_seq: int, length: int, pack_length: int) -> int:
    """The rule of :func:`diagsink._packing.pack_groups` (CPU, no dropout), any ``pack_length``."""
    if 2 * length > pack_length:
        return 1
    groups = pack_length // length
    while n_seq % groups:
        groups -= 1
    return groups


def _cases(gen: torch.Generator) -> list[tuple[int, int, int]]:
    """Fresh ``(n_seq, T, pack_length)``: packable, not divisible, too long, a prime count."""
    t = _randint(gen, 2, 12)
    pack_length = t * _randint(gen, 2, 6) + _randint(gen, 0, t - 1)  # not always a multiple
    groups = pack_length // t
    return [
        (groups * _randint(gen, 1, 50), t, pack_length),  # the largest G divides
        (groups * _randint(gen, 1, 50) + 1, t, pack_length),  # it does not: a smaller G
        (_randint(gen, 1, 500), pack_length // 2 + 1, pack_length),  # too long to pack
        (_randint(gen, 1, 500), pack_length + _randint(gen, 1, 9), pack_length),  # longer still
        (_randint(gen, 1, 500), t, pack_length),
        (101, 2, 48),  # a prime number of sequences: nothing larger than 1 divides it
        (828, 12, 24),  # METR-LA-like: 4 samples x 207 sensors, T = 12, the package's length
    ]


@register("ex-fast-groups")
def check_choose_groups(choose_groups: Callable[[int, int, int], int]) -> str | None:
    """Fresh ``(n_seq, T, pack_length)`` cases; the answer must be the rule's ``G`` in each."""
    for n_seq, t, pack_length in _cases(fresh_generator()):
        got = choose_groups(n_seq, t, pack_length)
        want = reference_groups(n_seq, t, pack_length)
        call = f"choose_groups({n_seq}, {t}, {pack_length})"
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            return f"{call} returned {type(got).__name__}; return an int (the number G)."
        got = int(got)
        if got == want:
            continue
        if got < 1:
            return f"{call} returned {got}: G is at least 1 (1 means: no packing)."
        if got * t > pack_length:
            too_long = (
                " (2 T > pack_length: not even two fit, so G = 1)" if 2 * t > pack_length else ""
            )
            return (
                f"{call} returned {got}: G T = {got * t} > pack_length = {pack_length}{too_long}."
            )
        if n_seq % got:
            return (
                f"{call} returned {got}, which does not divide the {n_seq} sequences: the packed "
                "batch must hold whole packs (try smaller G until it divides)."
            )
        return f"{call} returned {got}: a larger G also divides {n_seq} and fits; take the largest."
    return None
