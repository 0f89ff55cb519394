"""One training epoch of a T&S run: which windows, in which order, and the gradient steps.

An epoch visits the training windows in an order drawn from ``(seed, epoch)``
(:func:`epoch_windows`), cuts it into global batches of ``train.batch_size`` window starts
(:func:`global_batches`), gathers each batch on the device and takes one AdamW step on its
masked MAE (:func:`fit_windows`, through the shared loop :func:`diagsink.engine.loop.fit_epoch`),
under bf16 autocast on CUDA.

:class:`SingleProcess` is what the run (:func:`diagsink.engine.train.train_model`) asks about
the processes that train it: the module that trains, one epoch of gradient steps, the stopping
decision, who writes files. Its default is one process, which trains on every window of every
global batch. Data-parallel training (:mod:`diagsink.engine.distributed`) passes the run a
subclass instead, which runs the same epoch with a shard of every global batch and the global
batch's loss. Explained in the chapter "The T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..metrics import masked_mae
from .loop import fit_epoch
from .prepare import Prepared, batch

__all__ = [
    "epoch_windows",
    "windows_per_epoch",
    "global_batches",
    "autocast",
    "fit_windows",
    "SingleProcess",
]


def epoch_windows(prepared: Prepared, cfg: dict[str, Any], seed: int, epoch: int) -> torch.Tensor:
    """The training window starts of (0-based) ``epoch``, in the order they are visited.

    With ``train.epoch_parts = k`` pass ``p = epoch // k`` draws one permutation of the training
    windows (seeded by ``seed`` and ``p``) and epoch ``epoch`` takes its part ``epoch % k`` (of
    ``k`` near-equal consecutive parts): every window is used once every ``k`` epochs. With
    ``k = 1`` (the default) each epoch is a whole pass. ``train.max_train_windows`` caps the
    epoch's windows (the first ones of its part).
    """
    parts = cfg["train"].get("epoch_parts", 1)
    cycle, part = divmod(epoch, parts)
    g = torch.Generator().manual_seed(seed * 100_003 + cycle)
    perm = torch.randperm(len(prepared.train), generator=g).tensor_split(parts)[part]
    cap = cfg["train"]["max_train_windows"]
    perm = perm if cap is None else perm[:cap]
    return prepared.train[perm.to(prepared.train.device)]


def windows_per_epoch(prepared: Prepared, cfg: dict[str, Any]) -> int:
    """Windows per epoch (the largest part when ``train.epoch_parts`` does not divide evenly)."""
    per_epoch = -(-len(prepared.train) // cfg["train"].get("epoch_parts", 1))
    cap = cfg["train"]["max_train_windows"]
    return per_epoch if cap is None else min(cap, per_epoch)


def global_batches(
    prepared: Prepared, cfg: dict[str, Any], seed: int, epoch: int
) -> Iterator[torch.Tensor]:
    """The window starts ``[B]`` of each global batch of ``epoch`` (the last one may be shorter)."""
    order = epoch_windows(prepared, cfg, seed, epoch)
    size = cfg["train"]["batch_size"]
    return (order[i : i + size] for i in range(0, len(order), size))


def autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing (float32) on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def fit_windows(
    net: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    prepared: Prepared,
    cfg: dict[str, Any],
    starts: Iterator[torch.Tensor],
    *,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = masked_mae,
    on_step: Callable[[torch.Tensor], None] | None = None,
) -> float:
    """Gradient steps over the batches of window ``starts``; returns the mean training loss.

    Each batch of starts ``[B]`` is gathered into inputs ``[B, T_in, N, 2]`` and targets
    ``[B, T_out, N]``; ``loss`` sees the float32 forecast and the targets (by default the
    batch's masked MAE, in mph). ``net`` is in train mode (dropout active) afterwards.
    """
    m, t = cfg["model"], cfg["train"]
    batches = (batch(prepared, s, m["t_in"], m["t_out"]) for s in starts)
    device = prepared.series.device

    def forward(x: torch.Tensor) -> torch.Tensor:
        with autocast(device):
            return net(x)

    net.train()
    return fit_epoch(
        forward,
        optimizer,
        batches,
        lambda p, y: loss(p.float(), y),
        clip=t["clip"],
        on_step=on_step,
    )


class SingleProcess:
    """One process: the plain run, and the base of
    :class:`~diagsink.engine.distributed.DDPContext` (what ``W`` processes change).

    :func:`diagsink.engine.train.train_model` is given this object (argument ``processes``; one
    process when it is None) and uses it in four places: :meth:`wrap` (the module that trains),
    :meth:`train_epoch` (one epoch of gradient steps), :meth:`agree` (the stopping decision every
    rank follows) and ``is_main`` (only the main process writes files and shows progress);
    :meth:`describe` goes into the artifact's provenance. One process trains the model itself on
    every window of every global batch, with the batch's masked MAE.
    """

    rank = 0
    world_size = 1
    is_main = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module that trains: ``model`` itself."""
        return model

    def shard(self, starts: torch.Tensor) -> torch.Tensor:
        """This process's window starts of a global batch ``[B]``: all of them."""
        return starts

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The masked MAE of the batch (:func:`diagsink.metrics.masked_mae`)."""
        return masked_mae(pred, target)

    def train_epoch(
        self,
        net: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        prepared: Prepared,
        cfg: dict[str, Any],
        seed: int,
        epoch: int,
        on_step: Callable[[torch.Tensor], None] | None = None,
    ) -> float:
        """One epoch (:func:`fit_windows`) on this process's :meth:`shard` of every global batch,
        with :meth:`loss`; returns the epoch's training loss."""
        self.seed_dropout(seed, epoch)
        starts = (self.shard(s) for s in global_batches(prepared, cfg, seed, epoch))
        return fit_windows(net, optimizer, prepared, cfg, starts, loss=self.loss, on_step=on_step)

    def seed_dropout(self, seed: int, epoch: int) -> None:
        """The dropout draws of ``epoch``: one process goes on with the stream seeded by the run."""
        return None

    def agree(self, finished: bool, stopped: str) -> tuple[bool, str]:
        """The stopping decision every rank follows: this process's own."""
        return finished, stopped

    def describe(self) -> str:
        """``"one process"``."""
        return "one process"
