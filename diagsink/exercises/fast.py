"""Checks of the exercise of the appendix "Making it fast" (``book/fast.ipynb``).

* ``ex-fast-pack``: ``block_bias(T, G)``, the ``[G T, G T]`` bias that keeps ``G`` sequences
  packed end to end apart (``0`` within a sequence, ``-inf`` between), as the layer's fast
  path builds it (:func:`diagsink._packing.pack_diagonal_bias`).

The check draws fresh random inputs, compares with the package's reference and returns
``None`` or a hint that names the kind of mistake (never the solution).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._packing import pack_diagonal_bias
from . import compare_tensors, fresh_generator, register

__all__ = ["check_block_bias"]


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
