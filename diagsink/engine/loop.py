"""The one training loop: gradient steps over batches, shared by every model the book trains.

The T&S runs (:func:`diagsink.engine.train.train_run`), the parroting task
(:mod:`diagsink.parroting`) and the toy layers of the theory chapters all call
:func:`fit_epoch`; they differ only in what they feed it. Explained in the chapter "The T&S
model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["fit_epoch"]


def fit_epoch(
    forward: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    clip: float | None = None,
    on_step: Callable[[torch.Tensor], None] | None = None,
) -> float:
    """One pass over ``batches``: for each ``(x, y)``, ``loss_fn(forward(x), y)``, backward, step.

    Args:
        forward: the model (or a function calling it, e.g. under autocast); ``x`` is whatever
            the model takes (``[B, T_in, N, 2]`` for T&S, ``[B, T, C]`` for the parroting task).
        optimizer: its parameter groups are the parameters that are updated (and clipped).
        batches: ``(inputs, targets)`` pairs; consumed once.
        loss_fn: ``(prediction, target) -> scalar`` loss.
        clip: clip the gradient's global 2-norm to this value before each step (None: no clip).
        on_step: called with each step's (detached) loss, e.g. to update a progress bar.

    Returns:
        The mean loss over the pass, weighted by batch size (``len(x)``).
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    total, count = None, 0
    for x, y in batches:
        loss = loss_fn(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        weighted = loss.detach() * len(x)
        total = weighted if total is None else total + weighted
        count += len(x)
        if on_step is not None:
            on_step(loss.detach())
    if count == 0:
        raise ValueError("fit_epoch got no batches: the training set is empty.")
    return float(total) / count
