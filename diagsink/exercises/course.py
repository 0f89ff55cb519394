"""Check of the worked example on the instructor page (``book/instructors.md``).

``ex-course-softmax``: write ``row_softmax(scores)``, the softmax over the last dimension of
a score tensor ``[..., T, T]`` that stays finite for large scores (subtract the row maximum).
It shows the format every chapter's exercises follow; see the instructor page.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import compare_tensors, fresh_generator, register


@register("ex-course-softmax")
def check_row_softmax(row_softmax: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """Fresh scores of shape ``[B, H, T, T]``; then large scores, which overflow a naive ``exp``."""
    gen = fresh_generator()
    b, h, t = (int(v) for v in torch.randint(2, 6, (3,), generator=gen))
    scores = torch.randn(b, h, t, t, generator=gen)
    got = row_softmax(scores.clone())
    if isinstance(got, torch.Tensor) and got.shape == scores.shape:
        sums = got.sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
            if torch.allclose(got.sum(dim=-2), torch.ones_like(sums), atol=1e-5):
                return "the columns sum to 1, not the rows: normalise over the last dimension (dim=-1)."
            return (
                "the rows of your result do not sum to 1: divide each exp by the sum over its row."
            )
    hint = compare_tensors(got, torch.softmax(scores, dim=-1), name="the attention weights")
    if hint is not None:
        return hint
    large = 200.0 + 50.0 * torch.randn(b, t, t, generator=gen)
    return compare_tensors(
        row_softmax(large.clone()),
        torch.softmax(large, dim=-1),
        name="for scores around 200, the result",
    )
