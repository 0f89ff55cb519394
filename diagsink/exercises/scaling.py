"""Checks of the exercises in the appendix ``book/scaling.ipynb`` ("Running it bigger").

* ``ex-scaling-rank-loss``: ``rank_loss(pred, target, count, world_size)``, the loss one rank
  backpropagates so that DDP's average of the gradients is the gradient of the global masked MAE.
* ``ex-scaling-sparse-apply``: ``sparse_apply(index, weight, x)``, ``y = P x`` from an edge list.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import compare_tensors, fresh_generator, register


def _targets(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    target = 30 + 40 * torch.rand(shape, generator=gen, dtype=torch.float64)
    target[torch.rand(shape, generator=gen) < 0.3] = 0.0
    target.view(-1)[0] = 55.0
    return target


@register("ex-scaling-rank-loss")
def check_rank_loss(rank_loss: Callable) -> str | None:
    """Fresh batches split over 2-4 simulated ranks with unequal numbers of missing targets."""
    gen = fresh_generator()
    world = int(torch.randint(2, 5, (1,), generator=gen))
    batch = int(torch.randint(world + 2, 3 * world + 4, (1,), generator=gen))
    shape = (batch, 3, int(torch.randint(3, 8, (1,), generator=gen)))
    target = _targets(gen, shape)
    target[: batch // 2][torch.rand(target[: batch // 2].shape, generator=gen) < 0.5] = (
        0.0  # uneven shards
    )
    # always uneven: the first shard keeps one observed target (equal counts, which random
    # zeros can give, would let the shard's own mean pass for the global one)
    target[torch.tensor_split(torch.arange(batch), world)[0]] = 0.0
    target.view(-1)[0] = 55.0
    pred = (target + torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = target != 0
    global_mae = torch.where(mask, (pred - target).abs(), torch.zeros_like(pred)).sum() / mask.sum()
    (expected,) = torch.autograd.grad(global_mae, pred)
    count = mask.sum()
    grads = []
    for idx in torch.tensor_split(torch.arange(batch), world):
        loss = rank_loss(pred[idx], target[idx], count, world)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return (
                "rank_loss should return one number (a 0-d tensor) that autograd can differentiate."
            )
        if not loss.requires_grad:
            return "rank_loss is not differentiable in pred: compute it from pred with torch operations."
        grads.append(torch.autograd.grad(loss, pred)[0])
    averaged = sum(grads) / world
    if torch.allclose(averaged, expected, rtol=1e-6, atol=1e-12):
        return None
    if torch.allclose(averaged * world, expected, rtol=1e-6, atol=1e-12):
        return (
            "the averaged gradient is W times too small: DDP divides the sum of the ranks' gradients by W, "
            "so each rank's loss must be multiplied by world_size."
        )
    if torch.allclose(averaged / world, expected, rtol=1e-6, atol=1e-12):
        return "the averaged gradient is W times too large: multiply by world_size once, not twice."
    local = [
        torch.where(target[i] != 0, (pred[i] - target[i]).abs(), 0.0).sum() / (target[i] != 0).sum()
        for i in torch.tensor_split(torch.arange(batch), world)
    ]
    naive = sum(torch.autograd.grad(loss, pred)[0] for loss in local) / world
    if torch.allclose(averaged, naive, rtol=1e-6, atol=1e-12) or torch.allclose(
        averaged, naive * world
    ):
        return (
            "you divide by the number of observed targets of the rank's own shard; shards hold different "
            "numbers of missing readings, so divide by `count`, the observed targets of the whole global batch."
        )
    return compare_tensors(
        averaged, expected, name="the averaged gradient", rtol=1e-6, atol=1e-12
    ) or (
        "wrong gradient: sum |pred - target| over this shard's observed (non-zero) targets, times world_size, "
        "divided by count."
    )


@register("ex-scaling-sparse-apply")
def check_sparse_apply(sparse_apply: Callable) -> str | None:
    """A fresh random directed graph as an edge list; compare with the dense product."""
    gen = fresh_generator()
    n = int(torch.randint(5, 30, (1,), generator=gen))
    dense = torch.rand(n, n, generator=gen, dtype=torch.float64)
    dense[torch.rand(n, n, generator=gen) < 0.8] = 0.0
    dense[0, 1], dense[1, 0] = 0.7, 0.0  # surely not symmetric
    index = dense.nonzero().T  # [2, E]: row n (receives), column m (sends)
    weight = dense[index[0], index[1]]
    perm = torch.randperm(index.shape[1], generator=gen)  # edges in no particular order
    index, weight = index[:, perm], weight[perm]
    x = torch.randn(
        n, int(torch.randint(1, 6, (1,), generator=gen)), generator=gen, dtype=torch.float64
    )
    got = sparse_apply(index.clone(), weight.clone(), x.clone())
    expected = dense @ x
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        if torch.allclose(got, dense.T @ x):
            return (
                "you computed P^T x: index[0] is the row n that receives and index[1] the column m that sends, "
                "y[n] = sum over edges (n, m) of P[n, m] x[m]."
            )
        if torch.allclose(got, (dense != 0).to(x.dtype) @ x):
            return "every edge must be weighted by its weight P[n, m], not counted once."
    return compare_tensors(got, expected, name="y = P x", rtol=1e-9, atol=1e-9)
