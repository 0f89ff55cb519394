"""The training engine: one run = one variant x one protocol x one seed, in plain PyTorch.

What a run does, in order (``train_run``):

1. **Data on the device.** The whole series goes to the device once as ``[T, N, 2]``
   (scaled speed, time of day) plus the raw speeds ``[T, N]`` for the targets; a batch is
   one vectorised :func:`diagsink.protocol.gather` of its window starts (no ``Dataset``,
   no ``DataLoader``, no per-sample Python).
2. **Model.** :class:`diagsink.model.TSModel` with the variant's attention arguments; the
   parameters are initialised from ``torch.manual_seed(seed)``.
3. **Epochs.** AdamW; the learning rate rises linearly for ``warmup_epochs`` and then
   follows a cosine down to ``min_lr`` (:func:`lr_at`); loss = masked MAE on *unscaled*
   speeds; gradients clipped to norm ``clip``; bf16 autocast and TF32 on CUDA only. The
   order of the training windows in epoch ``e`` comes from a generator seeded with
   ``(seed, e)``, so an interrupted run replays exactly.
4. **Early stopping** on the validation masked MAE (patience, ``min_delta``); the
   best-validation weights are **restored before testing**. (The paper's released code
   tests the weights of the last epoch instead.)
5. **Checkpoint every epoch** (``torch.save`` into memory, then an atomic write), holding
   the model, the optimiser, the best weights, the history and the random-number state;
   a rerun of the same command resumes from it after a crash or ``kill -9``.
6. **Test** at horizons 3/6/12 and the 12-step mean, then the last block's attention
   averaged as the paper does (:func:`record_attention`), then the result artifact
   (:mod:`diagsink.artifacts`).

Explained in the chapter "The T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import os
import subprocess
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from . import __version__
from ._io import atomic_write_bytes, remove_stale_temporaries
from .config import config_hash, load_config
from .distributed import context as distributed_context
from .errors import ConfigError, DiagsinkError
from .model import TSModel
from .settings import check_device
from .sparse import sparsify
from .variants import VARIANTS, check_variant

__all__ = [
    "Prepared",
    "prepare",
    "build_model",
    "lr_at",
    "predict",
    "record_attention",
    "train_run",
    "reproduce",
    "run_name",
    "run_paths",
    "STATE_DICT_LIMIT",
    "toy_data",
]

#: State dicts larger than this (bytes) are not written next to the artifact.
STATE_DICT_LIMIT = 1_000_000


@dataclass
class Prepared:
    """Everything a run needs from the data, already on the device.

    Attributes:
        series: ``[T, N, 2]`` float32: scaled speed (missing zeros scaled like any value)
            and time of day in ``[0, 1)``.
        speed: ``[T, N]`` float32 raw speeds (0 = missing): the targets.
        train, val, test: window starts (``LongTensor``) on the device.
        supports: ``[P_fwd, P_bwd]`` ``[N, N]``.
        mean, std: the scaler, fitted on the steps the training windows see.
        info: provenance of the data (path, sha256, steps, full or partial).
    """

    series: torch.Tensor
    speed: torch.Tensor
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    supports: list[torch.Tensor]
    mean: float
    std: float
    info: dict[str, Any]


def prepare(data: Any, cfg: dict[str, Any], device: str | torch.device = "cpu") -> Prepared:
    """Move a :class:`diagsink.data.MetrLA` to ``device`` and split it as ``cfg["data"]`` says."""
    from .adjacency import diffusion_supports
    from .protocol import Scaler, split_windows, time_of_day, train_steps

    m = cfg["model"]
    splits = split_windows(
        data.n_steps,
        m["t_in"],
        m["t_out"],
        ratios=tuple(cfg["data"]["ratios"]),
        order=cfg["data"]["split_order"],
    )
    scaler = Scaler.fit(data.speed[: train_steps(splits, m["t_in"], m["t_out"])])
    speed = torch.as_tensor(data.speed, dtype=torch.float32)
    tod = torch.tensor(time_of_day(data.timestamps), dtype=torch.float32)[:, None].expand_as(speed)
    series = torch.stack([(speed - scaler.mean) / scaler.std, tod], dim=-1)
    info = {
        "file": Path(data.path).name,
        "sha256": data.sha256,
        "n_steps": int(data.n_steps),
        "n_nodes": int(data.n_nodes),
        "full": bool(data.is_full),
        "describe": data.describe(),
        "split_order": splits.order,
        "windows": {
            k: int(len(v))
            for k, v in (("train", splits.train), ("val", splits.val), ("test", splits.test))
        },
        "scaler": {"mean": float(scaler.mean), "std": float(scaler.std)},
    }
    return Prepared(
        series=series.to(device),
        speed=speed.to(device),
        train=splits.train.to(device),
        val=splits.val.to(device),
        test=splits.test.to(device),
        supports=[s.to(device) for s in diffusion_supports(data.adjacency)],
        mean=float(scaler.mean),
        std=float(scaler.std),
        info=info,
    )


def build_model(cfg: dict[str, Any], variant: str, prepared: Prepared) -> TSModel:
    """The :class:`TSModel` of ``cfg["model"]`` for ``variant`` (parameters from the current RNG)."""
    m, r = cfg["model"], cfg["regularizers"]
    model = TSModel(
        prepared.series.shape[1],
        prepared.supports,
        variant=variant,
        d_model=m["d_model"],
        n_heads=m["n_heads"],
        depth=m["depth"],
        dropout=m["dropout"],
        pos_encoding=m["pos_encoding"],
        order=m["graph_order"],
        adaptive=m["adaptive_adjacency"],
        embed_dim=m["node_embed_dim"],
        t_in=m["t_in"],
        t_out=m["t_out"],
        diag_p=r["diag_p"],
        diag_penalty=r["diag_penalty"],
        speed_mean=prepared.mean,
        speed_std=prepared.std,
        block_order=m.get("block_order", "ts"),  # optional key (diagsink.config.OPTIONAL)
    ).to(prepared.series.device)
    # torch.sparse road-graph products when the graph is large (book/scaling.ipynb)
    return sparsify(model)


def lr_at(epoch: int, cfg: dict[str, Any]) -> float:
    """Learning rate of (0-based) ``epoch``: linear warm-up to ``lr``, then cosine to ``min_lr``.

    Warm-up epoch ``e < W`` uses ``lr (e + 1) / W``; afterwards
    ``min_lr + (lr - min_lr) (1 + cos(pi (e - W) / (E - W))) / 2``.
    """
    t = cfg["train"]
    lr, lo, warm, total = t["lr"], t["min_lr"], t["warmup_epochs"], t["epochs"]
    if epoch < warm:
        return lr * (epoch + 1) / warm
    progress = (epoch - warm) / max(1, total - warm)
    return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _batch(
    prepared: Prepared, starts: torch.Tensor, t_in: int, t_out: int
) -> tuple[torch.Tensor, torch.Tensor]:
    from .protocol import gather

    x = gather(prepared.series, starts, t_in)  # [B, T_in, N, 2]
    y = gather(prepared.speed, starts, t_out, offset=t_in)  # [B, T_out, N]
    return x, y


@torch.no_grad()
def predict(
    model: TSModel, prepared: Prepared, starts: torch.Tensor, cfg: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode forecasts and targets for the windows ``starts``: ``[B, T_out, N]`` each (mph)."""
    model.eval()
    m, bs = cfg["model"], cfg["train"]["eval_batch_size"]
    preds, targets = [], []
    for i in range(0, len(starts), bs):
        x, y = _batch(prepared, starts[i : i + bs], m["t_in"], m["t_out"])
        with _autocast(x.device):
            p = model(x)
        preds.append(p.float())
        targets.append(y)
    return torch.cat(preds), torch.cat(targets)


@torch.no_grad()
def record_attention(
    model: TSModel,
    prepared: Prepared,
    cfg: dict[str, Any],
    seed: int,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The last block's attention averaged as the paper's Figure 1: ``([T, T], [H, T, T], how)``.

    One pass over the training batches of one epoch (the same batch size and the shuffled
    order of a training epoch), in *train* mode (attention dropout and diagonal dropout
    active, as during training) but without gradients or updates, in float32 (no autocast);
    each batch's attention
    ``[B, N, H, T, T]`` is averaged over batch and nodes, then over batches (weighted by
    batch size); the per-head maps are kept and the mean over heads gives ``[T, T]``.
    """
    m, t = cfg["model"], cfg["train"]
    if starts is None:
        starts = prepared.train
    g = torch.Generator().manual_seed(seed * 100_003 + 99_991)
    order = starts[torch.randperm(len(starts), generator=g).to(starts.device)]
    model.train()
    total, n = None, 0
    for i in range(0, len(order), t["batch_size"]):
        x, _ = _batch(prepared, order[i : i + t["batch_size"]], m["t_in"], m["t_out"])
        _, attn = model(x, return_attention=True)  # float32 even on CUDA: rows must sum to 1
        s = attn.float().sum(dim=(0, 1))  # [H, T, T]
        total = s if total is None else total + s
        n += attn.shape[0] * attn.shape[1]
    model.eval()
    per_head = (total / n).cpu()
    how = (
        f"last block, train mode (dropout active), no gradient, best-validation weights; one pass over all "
        f"{len(order)} training windows in batches of {t['batch_size']}; averaged over batch, nodes and batches "
        "(per head), then over heads"
    )
    return per_head.mean(0), per_head, how


@dataclass(frozen=True)
class ToyData:
    """A small synthetic stand-in for :class:`diagsink.data.MetrLA` (same attributes used here)."""

    speed: Any
    timestamps: Any
    adjacency: Any
    path: Path
    sha256: str
    is_full: bool = False

    @property
    def n_steps(self) -> int:
        return int(self.speed.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.speed.shape[1])

    def describe(self) -> str:
        return f"toy data: {self.n_steps} steps, {self.n_nodes} sensors on a ring (synthetic)"


def toy_data(n_steps: int = 300, n_nodes: int = 6, seed: int = 0) -> ToyData:
    """Synthetic speeds ``[n_steps, n_nodes]`` on a ring road graph, for fast tests and demos.

    Each sensor carries a daily cycle with its own phase, its neighbour's value one step
    earlier, and noise; about 2 % of the readings are 0 (missing), as in METR-LA.
    """
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    t = np.arange(n_steps)[:, None]
    phase = rng.uniform(0, 2 * np.pi, n_nodes)[None, :]
    speed = 60 + 8 * np.sin(2 * np.pi * t / 288 + phase) + rng.normal(0, 1.5, (n_steps, n_nodes))
    speed[1:] = 0.7 * speed[1:] + 0.3 * np.roll(speed[:-1], 1, axis=1)
    speed[rng.random(speed.shape) < 0.02] = 0.0
    adj = np.eye(n_nodes, dtype=np.float32)
    for i in range(n_nodes):
        adj[i, (i + 1) % n_nodes] = 0.5
    stamps = pd.date_range("2012-03-01", periods=n_steps, freq="5min")
    return ToyData(
        speed=speed, timestamps=stamps, adjacency=adj, path=Path("toy.h5"), sha256="0" * 64
    )


# -- provenance ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The repository's commit (``+dirty`` if tracked files changed), or ``"unknown"``.

    Read once per process (at the start of its first run) and cached: the code that runs is
    the code imported then, even if the repository moves on while a long ``reproduce`` runs.
    A copy of the tree without ``.git`` (e.g. on a remote GPU machine) has no commit to read;
    there the value of ``DIAGSINK_GIT_COMMIT``, recorded by whoever copied the tree, is used and
    marked as such (``"<sha> (DIAGSINK_GIT_COMMIT, no .git)"``).
    """
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        if sha.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=here,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    given = os.environ.get("DIAGSINK_GIT_COMMIT", "").strip()
    return f"{given} (DIAGSINK_GIT_COMMIT, no .git)" if given else "unknown"


def device_name(device: torch.device) -> str:
    """``"cuda: NVIDIA H200"`` or ``"cpu: <processor>, <k> threads"``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    import platform

    proc = platform.processor() or platform.machine()
    return f"cpu: {proc}, {torch.get_num_threads()} threads"


# -- paths --------------------------------------------------------------------------------------------
def run_name(variant: str, seed: int) -> str:
    """``"<variant>_seed<k>"`` for a known variant and a non-negative int seed."""
    check_variant(variant)
    if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**31):
        raise ConfigError(f"seed {seed!r} must be an integer in [0, 2**31).")
    return f"{variant}_seed{seed}"


def run_paths(out_dir: str | Path, protocol: str, variant: str, seed: int) -> dict[str, Path]:
    """Artifact, state-dict and checkpoint paths of a run; all inside ``out_dir/<protocol>``.

    Raises:
        ConfigError: if a path would leave ``out_dir`` (e.g. a protocol name with ``..``).
    """
    base = Path(out_dir).resolve()
    folder = (base / protocol).resolve()
    if folder.parent != base or not protocol.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(
            f"protocol name {protocol!r} would write outside {base}; use a plain name like 'quick'."
        )
    name = run_name(variant, seed)
    paths = {
        "json": folder / f"{name}.json",
        "state": folder / f"{name}.pt",
        "checkpoint": folder / ".checkpoints" / f"{name}.ckpt.pt",
    }
    for p in paths.values():
        if not p.resolve().is_relative_to(base):
            raise ConfigError(f"{p} is outside the output folder {base}.")
    return paths


def release_freed_memory_to_os() -> bool:
    """Ask glibc to hand freed blocks of 128 KiB and more back to the OS at once (Linux only).

    glibc raises its mmap threshold dynamically (up to 32 MiB), after which the many
    activation-sized blocks of a training step are served from the heap and kept after being
    freed, so the resident memory of a CPU run grows far beyond what is alive at any moment
    (for the paper model at batch 32: 4.7 GiB instead of 1.3 GiB with ``low_memory``; see
    ``benchmarks/training.py``). Fixing the threshold (``mallopt(M_MMAP_THRESHOLD)``, the same
    as ``MALLOC_MMAP_THRESHOLD_=131072``) stops that. Returns whether it could be set.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 128 * 1024) == 1
        return bool(ok and libc.mallopt(m_trim_threshold, 128 * 1024) == 1)
    except (OSError, AttributeError):
        return False


def tidy_finished_run(paths: dict[str, Path]) -> None:
    """Once a run's artifact is final: delete its checkpoint, the temporary files that a process
    killed mid-write left next to its files, and the ``.checkpoints`` folder if that leaves it empty.

    Called when a run finishes and when :func:`reproduce` skips a finished run (a process killed
    between writing the artifact and deleting the checkpoint leaves the checkpoint behind).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths["checkpoint"])
    for key in ("json", "state", "checkpoint"):
        remove_stale_temporaries(paths[key])
    with contextlib.suppress(OSError):
        paths["checkpoint"].parent.rmdir()


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


# -- one run -------------------------------------------------------------------------------------------
def train_run(
    cfg: dict[str, Any] | str,
    variant: str,
    seed: int,
    *,
    data: Any = None,
    prepared: Prepared | None = None,
    device: str | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    write: bool = True,
    stop_after_epochs: int | None = None,
    low_memory: bool = False,
) -> dict[str, Any]:
    """Train, test and (when ``write``) save one run; return its artifact ``dict``.

    Args:
        cfg: a config dict or a protocol name (:func:`diagsink.config.load_config`).
        variant: one of :data:`diagsink.variants.VARIANTS`.
        seed: initialisation, window order and dropout draws.
        data: a :class:`diagsink.data.MetrLA` (loaded from ``ds.settings().data_root`` if None).
        prepared: an already prepared data set (skips ``data``), e.g. shared by several runs.
        device: ``"cpu"``/``"cuda"``; default ``ds.settings().device``.
        out_dir: the results folder (artifacts go to ``out_dir/<protocol>/``); needed when ``write``.
        progress: show a tqdm bar (loss, validation MAE, ETA).
        write: write the artifact, state dict and per-epoch checkpoints.
        stop_after_epochs: end the process-level loop after this many epochs *without*
            testing (for demonstrations of resuming); returns ``{}``.
        low_memory: activation checkpointing of the blocks (same results, less memory,
            roughly a fifth more compute) and, on a Linux CPU, freed memory returned to the
            OS at once (:func:`release_freed_memory_to_os`); recorded in the provenance.

    Returns:
        The artifact (see :mod:`diagsink.artifacts`), with ``"model"`` holding the trained
        module under the key ``"_model"`` (not saved).
    """
    from .artifacts import SCHEMA_VERSION, write_artifact
    from .metrics import horizon_metrics, masked_mae
    from .settings import settings

    if isinstance(cfg, str):
        cfg = load_config(cfg)
    name = run_name(variant, seed)
    device_t = torch.device(check_device(str(device)) if device else settings().device)
    if device_t.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if prepared is None:
        if data is None:
            from .data import load_metr_la

            data = load_metr_la()
        prepared = prepare(data, cfg, device_t)
    if write and out_dir is None:
        raise ConfigError("train_run(write=True) needs out_dir (the results folder).")
    paths = run_paths(out_dir, cfg["protocol"], variant, seed) if write else None

    m, t = cfg["model"], cfg["train"]
    commit = git_commit()  # before training: the code version that runs
    torch.manual_seed(seed)
    model = build_model(cfg, variant, prepared)
    model.checkpoint_blocks = low_memory
    if low_memory and device_t.type == "cpu":
        release_freed_memory_to_os()
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
    chash = config_hash(cfg)
    start_epoch, best_val, best_epoch, bad, history, train_time = 0, math.inf, -1, 0, [], 0.0
    best_state = _cpu_state(model)
    stopped = "max_epochs"
    resumed_from = None
    # DDP hooks under torchrun, no-ops otherwise (diagsink.distributed)
    dist = distributed_context()
    dist.barrier()  # rank 0's last checkpoint is complete before any rank looks for one
    if write and paths["checkpoint"].exists():
        try:
            ck = torch.load(paths["checkpoint"], map_location="cpu", weights_only=True)
        except Exception as exc:  # damaged or foreign file (our own writes are atomic): start over
            warnings.warn(
                f"ignoring the unreadable checkpoint {paths['checkpoint']} ({type(exc).__name__}); "
                "the run starts from epoch 0.",
                stacklevel=2,
            )
            ck = {}
        if (
            ck.get("config_hash") == chash
            and ck.get("variant") == variant
            and ck.get("seed") == seed
        ):
            model.load_state_dict(ck["model"])
            optimizer.load_state_dict(ck["optimizer"])
            start_epoch, best_val, best_epoch, bad = (
                ck["epoch"],
                ck["best_val"],
                ck["best_epoch"],
                ck["bad_epochs"],
            )
            history, train_time, best_state = ck["history"], ck["train_time"], ck["best_state"]
            stopped = ck["stopped"]
            torch.set_rng_state(ck["rng_cpu"])
            if device_t.type == "cuda" and "rng_cuda" in ck:
                torch.cuda.set_rng_state(ck["rng_cuda"], device_t)
            resumed_from = start_epoch
    net = dist.wrap(model)  # the module that trains; ``model`` stays the plain TSModel
    write = write and dist.is_main  # rank 0 alone writes checkpoints and artifacts

    n_train = (
        len(prepared.train)
        if t["max_train_windows"] is None
        else min(t["max_train_windows"], len(prepared.train))
    )
    steps_per_epoch = math.ceil(n_train / t["batch_size"])
    bar = tqdm(
        total=t["epochs"] * steps_per_epoch,
        initial=start_epoch * steps_per_epoch,
        desc=f"{cfg['protocol']}/{name}",
        disable=not (progress and dist.is_main),
        unit="batch",
        dynamic_ncols=True,
    )
    epoch = start_epoch
    finished = stopped != "max_epochs" or start_epoch >= t["epochs"]
    while not finished:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(epoch, cfg)
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)
        dist.begin_epoch(seed, epoch)
        order = prepared.train[
            torch.randperm(len(prepared.train), generator=g)[:n_train].to(prepared.train.device)
        ]
        model.train()
        loss_sum, loss_n = torch.zeros((), device=device_t), 0
        for i in range(0, n_train, t["batch_size"]):
            x, y = _batch(
                prepared, dist.shard(order[i : i + t["batch_size"]]), m["t_in"], m["t_out"]
            )
            with _autocast(device_t):
                pred = net(x)
            loss = dist.loss(pred.float(), y)  # masked MAE of the (global) batch
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["clip"])
            optimizer.step()
            loss_sum += loss.detach() * len(x)
            loss_n += len(x)
            bar.update(1)
            if bar.n % 10 == 0:
                bar.set_postfix(
                    loss=f"{float(loss.detach()):.3f}", best_val=f"{best_val:.3f}", refresh=False
                )
        val_mae = float(masked_mae(*predict(model, prepared, prepared.val, cfg)))
        train_time += time.perf_counter() - t0
        history.append(
            {
                "epoch": epoch,
                "lr": lr_at(epoch, cfg),
                "train_mae": float(loss_sum) / loss_n,
                "val_mae": val_mae,
            }
        )
        if not (math.isfinite(history[-1]["train_mae"]) and math.isfinite(val_mae)):
            raise DiagsinkError(
                f"{cfg['protocol']}/{name}: training diverged in epoch {epoch} (train MAE {history[-1]['train_mae']}, "
                f"validation MAE {val_mae}). Fix: lower train.lr (now {t['lr']}) or train.clip (now {t['clip']}) "
                "in the protocol; the last finite epoch's checkpoint is kept."
            )
        if val_mae < best_val - t["min_delta"]:
            best_val, best_epoch, bad = val_mae, epoch, 0
            best_state = _cpu_state(model)
        else:
            bad += 1
        bar.set_postfix(
            loss=f"{history[-1]['train_mae']:.3f}", val=f"{val_mae:.3f}", best=f"{best_val:.3f}"
        )
        epoch += 1
        if bad >= t["patience"]:
            stopped, finished = "early_stopping", True
        elif (
            t["time_limit_s"] is not None
            and train_time + train_time / len(history) > t["time_limit_s"]
        ):
            # another epoch (of average length) would overrun the per-run time budget
            stopped, finished = "time_limit", True
        elif epoch >= t["epochs"]:
            finished = True
        # rank 0 decides (time limits differ per rank)
        finished, stopped = dist.agree(finished, stopped)
        if write:
            state = {
                "variant": variant,
                "seed": seed,
                "config_hash": chash,
                "epoch": epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "best_state": best_state,
                "best_val": best_val,
                "best_epoch": best_epoch,
                "bad_epochs": bad,
                "history": history,
                "train_time": train_time,
                "stopped": stopped if finished else "max_epochs",
                "rng_cpu": torch.get_rng_state(),
            }
            if device_t.type == "cuda":
                state["rng_cuda"] = torch.cuda.get_rng_state(device_t)
            _save_checkpoint(paths["checkpoint"], state)
        if (
            stop_after_epochs is not None
            and epoch - start_epoch >= stop_after_epochs
            and not finished
        ):
            bar.close()
            return {}
    bar.close()

    # -- test with the best-validation weights ---------------------------------------------------
    model.load_state_dict(best_state)
    pred, target = predict(model, prepared, prepared.test, cfg)
    metrics = horizon_metrics(pred, target)
    mean_attn, per_head, how = record_attention(model, prepared, cfg, seed)
    state_bytes = io.BytesIO()
    torch.save(_cpu_state(model), state_bytes)
    small = state_bytes.tell() <= STATE_DICT_LIMIT
    artifact: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "protocol": cfg["protocol"],
        "variant": variant,
        "seed": seed,
        "metrics": metrics,
        "best_epoch": best_epoch,
        "epochs_run": len(history),
        "stopped": stopped,
        "weights_tested": "best validation epoch (restored before testing)",
        "history": history,
        "wall_time_s": train_time,
        "resumed_from_epoch": resumed_from,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "attention": {"mean": mean_attn.tolist(), "per_head": per_head.tolist(), "how": how},
        "state_dict": (
            {"file": paths["state"].name if write else None, "bytes": state_bytes.tell()}
            if small
            else {
                "file": None,
                "bytes": state_bytes.tell(),
                "note": f"omitted: larger than {STATE_DICT_LIMIT} bytes",
            }
        ),
        "provenance": {
            "git_commit": commit,
            "diagsink_version": __version__,
            "config": cfg,
            "config_hash": chash,
            "data": prepared.info,
            "device": device_name(device_t),
            "processes": dist.describe(),
            "autocast": "bf16 + TF32" if device_t.type == "cuda" else "none (float32)",
            "activation_checkpointing": bool(low_memory),
            "torch": torch.__version__,
            "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seed": seed,
        },
    }
    if write:
        if small:
            atomic_write_bytes(paths["state"], state_bytes.getvalue())
            from ._io import sha256_file

            artifact["state_dict"]["sha256"] = sha256_file(paths["state"])
        write_artifact(paths["json"], artifact)
        tidy_finished_run(paths)
    artifact["_model"] = model
    return artifact


def _supersede(paths: dict[str, Path], old_hash: str) -> Path:
    """Move a finished run made with another configuration to ``<protocol>/superseded/``.

    A finished result is never deleted: the artifact and its state dict keep their names plus
    the old configuration hash, outside the folder that the chapters load.
    """
    folder = paths["json"].parent / "superseded"
    folder.mkdir(parents=True, exist_ok=True)
    tag = str(old_hash)[:12]
    for key in ("json", "state"):
        src = paths[key]
        if src.exists():
            os.replace(src, folder / f"{src.stem}.{tag}{src.suffix}")
    return folder / f"{paths['json'].stem}.{tag}.json"


def reproduce(
    cfg: dict[str, Any] | str,
    seeds: int,
    *,
    variants: tuple[str, ...] = VARIANTS,
    device: str | None = None,
    out_dir: str | Path = "book/results",
    data: Any = None,
    progress: bool = True,
    low_memory: bool = False,
) -> list[Path]:
    """Train every variant x seed ``0..seeds-1``; skip runs whose valid artifact exists. Returns the JSON paths."""
    from .artifacts import ArtifactError, load_artifact
    from .settings import settings

    if isinstance(cfg, str):
        cfg = load_config(cfg)
    device_t = torch.device(check_device(str(device)) if device else settings().device)
    prepared = None
    done: list[Path] = []
    for seed in range(seeds):
        for variant in variants:
            paths = run_paths(out_dir, cfg["protocol"], variant, seed)
            if paths["json"].exists():
                try:
                    art = load_artifact(paths["json"])
                    if art["provenance"]["config_hash"] == config_hash(cfg):
                        if progress:
                            print(f"skip {paths['json']} (finished)")
                        tidy_finished_run(paths)
                        done.append(paths["json"])
                        continue
                    kept = _supersede(paths, art["provenance"]["config_hash"])
                    print(
                        f"redo {paths['json']}: it was made with another configuration of {cfg['protocol']!r} "
                        f"(the old result is kept as {kept})"
                    )
                except ArtifactError as exc:
                    print(f"redo {paths['json']}: {exc}")
            if prepared is None:
                if data is None:
                    from .data import load_metr_la

                    data = load_metr_la()
                prepared = prepare(data, cfg, device_t)
            train_run(
                copy.deepcopy(cfg),
                variant,
                seed,
                prepared=prepared,
                device=str(device_t),
                out_dir=out_dir,
                progress=progress,
                low_memory=low_memory,
            )
            done.append(paths["json"])
    return done
