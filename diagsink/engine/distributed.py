"""Data-parallel training over several processes (``torchrun``), in plain ``torch.distributed``.

Run one of::

    torchrun --standalone --nproc_per_node=4 -m diagsink train --variant penalty --protocol book --device cuda
    diagsink train --variant penalty --protocol book --device cuda --distributed 4   # starts torchrun for you

or, in a script that torchrun starts on every rank::

    with distributed.session("cuda") as ddp:
        artifact = distributed.data_parallel(train_run, ddp, cfg, "penalty", 0, out_dir="results")

Every process (a *rank*) holds the whole series on its own device and a full copy of the
model wrapped in :class:`torch.nn.parallel.DistributedDataParallel` (DDP). What changes
against one process, and nothing else:

* **Process group** (:func:`setup` / :func:`teardown`): NCCL when the device is CUDA (one
  GPU per rank: ``cuda:<LOCAL_RANK>``), gloo on the CPU. Rank and world size come from
  torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).
* **Global batch, fixed** (:func:`shard_batch`): ``train.batch_size`` is the *global* batch
  ``B``. All ranks draw the same shuffled order of windows (seeded by ``(seed, epoch)``) and
  split each global batch into ``W`` contiguous shards of ``ceil(B / W)`` or ``floor(B / W)``
  windows; rank ``r`` gathers only shard ``r``, on its own device. So ``W`` processes take
  exactly the optimiser steps one process takes.
* **Loss** (:meth:`DDPContext.loss`): the masked MAE of the *global* batch,
  ``sum_r S_r / sum_r n_r`` (``S_r`` = sum of absolute errors of the observed targets of
  shard ``r``, ``n_r`` their count; one ``all_reduce`` of ``(S_r, n_r)`` per step). Each rank
  backpropagates ``W S_r / n``; DDP averages the gradients over ranks, which gives
  ``sum_r grad S_r / n``, the gradient of the global loss. Gradient clipping then sees the
  same all-reduced gradient on every rank.
* **Learning rate, unchanged**: as the global batch does not change with ``W``, neither
  does ``train.lr``. (To *grow* the batch with the number of GPUs instead, raise
  ``train.batch_size`` yourself and the learning rate with it: the linear scaling rule with
  a warm-up, Goyal et al., 2017, is the usual starting point; it is a heuristic.)
* **Randomness**: the model is initialised from ``seed`` on every rank (DDP also broadcasts
  rank 0's parameters). Dropout draws come from a stream reseeded at the start of every epoch
  from ``(seed, epoch, rank)`` (:meth:`DDPContext.seed_dropout`), so ranks draw different masks
  and a resumed run replays them exactly. With dropout, a ``W``-process run is therefore a
  different (equally valid) draw than a one-process run; without dropout it is the same
  computation up to floating-point summation order.
* **Files**: rank 0 alone writes checkpoints, state dicts and the result artifact; every
  rank reads the checkpoint when resuming (one machine, or a shared filesystem). A
  checkpoint does not depend on ``W``: a run may resume with another number of processes.
* **Stopping**: early stopping and the time limit are decided on rank 0 and broadcast
  (:meth:`DDPContext.agree`), so no rank waits for a step the others never take.
* Validation and test run in full on every rank (identical weights, identical numbers).

This module wraps the run; the run does not look for it. The training run
(:func:`diagsink.engine.train.train_model`, also :func:`~diagsink.engine.train.train_run` and
:func:`diagsink.engine.runs.reproduce`) takes its processes as an argument, ``processes``: by
default one process (:class:`~diagsink.engine.epoch.SingleProcess`). :func:`session` joins the
process group and gives this rank's :class:`DDPContext`, which replaces the run's module, its
epoch and its stopping decision; :func:`data_parallel` calls the run with it once every rank is
ready. Explained in the appendix "Running it bigger" (``book/scaling.ipynb``). NCCL paths are not
exercised by the tests (CPU-only CI); they differ from the gloo paths only in the backend name
and the device.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ..errors import ConfigError, DataError
from .epoch import SingleProcess

__all__ = [
    "in_torchrun",
    "EnvInfo",
    "env_info",
    "setup",
    "teardown",
    "session",
    "data_parallel",
    "shard_batch",
    "DDPContext",
    "rank_loss",
]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")

T = TypeVar("T")


def in_torchrun() -> bool:
    """True when torchrun (``torch.distributed.run``) started this process (its variables are set)."""
    return all(k in os.environ for k in _ENV)


@dataclass(frozen=True)
class EnvInfo:
    """Rank, world size and local rank (the GPU index on this machine) from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int


def env_info() -> EnvInfo:
    """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.

    Raises:
        ConfigError: a variable is missing or not a whole number (the fix: start with torchrun).
    """
    try:
        info = EnvInfo(*(int(os.environ[k]) for k in _ENV))
    except (KeyError, ValueError):
        raise ConfigError(
            "RANK, WORLD_SIZE and LOCAL_RANK must be set to whole numbers for distributed training; "
            "start the command with `torchrun --standalone --nproc_per_node=N -m diagsink ...` "
            "(or `diagsink train ... --distributed N`)."
        ) from None
    if not (0 <= info.rank < info.world_size and 0 <= info.local_rank):
        raise ConfigError(
            f"inconsistent torchrun environment {info}; start the command with torchrun."
        )
    return info


def setup(device: str | None = None) -> torch.device:
    """Join the process group torchrun prepared; return this rank's device.

    ``device`` ``"cuda"`` (or None with a GPU visible) -> NCCL and ``cuda:<LOCAL_RANK>``;
    ``"cpu"`` -> gloo. Idempotent: a second call returns the device without re-initialising.

    Raises:
        ConfigError: not under torchrun, or more CUDA ranks on this machine than GPUs.
    """
    info = env_info()
    use_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if use_cuda:
        count = torch.cuda.device_count()
        if info.local_rank >= count:
            raise ConfigError(
                f"local rank {info.local_rank} has no GPU: this machine shows {count}. Fix: "
                f"--nproc_per_node={count} (one process per GPU) or --device cpu."
            )
        dev = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return dev


def teardown() -> None:
    """Leave the process group (if one is initialised)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def session(device: str | None = None) -> Iterator[DDPContext]:
    """``with session("cpu") as ddp:``: join the process group (:func:`setup`), give this rank's
    :class:`DDPContext`, and leave the group (:func:`teardown`) on exit."""
    dev = setup(device)
    try:
        yield DDPContext(dev)
    finally:
        teardown()


def data_parallel(run: Callable[..., T], ddp: DDPContext, *args: Any, **options: Any) -> T:
    """``run(*args, processes=ddp, **options)`` on this rank, once every rank has reached this call.

    ``run`` is a training entry point that takes ``processes``:
    :func:`diagsink.engine.train.train_run`, :func:`~diagsink.engine.train.train_model` or
    :func:`diagsink.engine.runs.reproduce`. The ranks first wait for each other (a barrier), so
    that rank 0's last checkpoint is complete before any rank looks for one (a run interrupted
    and started again in the same :func:`session` resumes from it on every rank).
    """
    dist.barrier()
    return run(*args, processes=ddp, **options)


def shard_batch(starts: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Shard ``rank`` of a global batch of window starts ``[B]``: contiguous, sizes differ by at most 1.

    The first ``B mod W`` ranks get ``ceil(B / W)`` windows, the others ``floor(B / W)``
    (possibly 0 for a short last batch); concatenating the shards of ranks ``0..W-1`` gives
    ``starts`` back. This is :func:`torch.tensor_split`.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size}).")
    return torch.tensor_split(starts, world_size)[rank]


def rank_loss(
    pred: torch.Tensor, target: torch.Tensor, count: torch.Tensor | float, world_size: int
) -> torch.Tensor:
    """``W * S_r / n``: the loss one rank backpropagates so that DDP's *average* is the global gradient.

    ``S_r = sum(|pred - target|)`` over this shard's observed targets (``target != 0``),
    ``n`` the number of observed targets in the whole global batch (all ranks). Averaging
    ``grad(W S_r / n)`` over the ``W`` ranks gives ``grad(sum_r S_r / n)``.
    """
    mask = target != 0
    err = torch.where(mask, (pred - target).abs(), torch.zeros_like(pred)).sum()
    return err * world_size / count


class DDPContext(SingleProcess):
    """This rank of a data-parallel run (a process group must be initialised; see the module docstring).

    Against one process it changes: the model is wrapped in DDP, each rank trains on its
    shard of every global batch with the global batch's loss, the dropout draws are reseeded
    per epoch and rank, the stopping decision is rank 0's, and only rank 0 writes.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device  # this rank's device, from setup()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.is_main = self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP around ``model``; buffers (graph supports, scaler, tables) are not synchronised:
        every rank derives the same ones from the same data and config."""

        names = [name for name, _ in model.named_buffers()]
        DDP._set_params_and_buffers_to_ignore_for_model(model, names)
        device = next(model.parameters()).device
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    def shard(self, starts: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous shard of the global batch (:func:`shard_batch`)."""
        return shard_batch(starts, self.rank, self.world_size)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Value: the global batch's masked MAE; gradient (after DDP's average): that of the global MAE."""
        mask = target != 0
        err = torch.where(mask, (pred - target).abs(), torch.zeros_like(pred)).sum()
        stats = torch.stack([err.detach(), mask.sum().to(err.dtype)])
        dist.all_reduce(stats)
        total, count = stats[0], stats[1]
        if float(count) == 0:
            raise DataError(
                "masked_mae: every target of this global batch is missing (0); the loss is undefined. "
                "Fix: a larger train.batch_size."
            )
        local = err * self.world_size / count
        return local + (total / count - local).detach()

    def seed_dropout(self, seed: int, epoch: int) -> None:
        """Reseed the global RNG from ``(seed, epoch, rank)``: different dropout draws per rank,
        exact replays after a resume."""
        torch.manual_seed((seed * 1_000_003 + epoch) * 4_099 + self.rank + 17)

    def agree(self, finished: bool, stopped: str) -> tuple[bool, str]:
        """Rank 0's ``(finished, stopped)``, broadcast: per-rank clocks differ, the decision must not."""
        box = [(bool(finished), str(stopped))]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def describe(self) -> str:
        """``"DistributedDataParallel, <W> processes (<backend>)"``."""
        return f"DistributedDataParallel, {self.world_size} processes ({dist.get_backend()})"
