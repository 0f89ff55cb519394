"""The training engine: one run = one variant x one protocol x one seed, in plain PyTorch.

What a run does, in order (``train_run``):

1. **Data on the device.** The whole series goes to the device once as ``[T, N, 2]``
   (scaled speed, time of day) plus the raw speeds ``[T, N]`` for the targets; a batch is
   one vectorised :func:`diagsink.data.windows.gather` of its window starts (no ``Dataset``,
   no ``DataLoader``, no per-sample Python).
2. **Model.** :class:`diagsink.model.TSModel` with the variant's attention arguments; the
   parameters are initialised from ``torch.manual_seed(seed)``.
3. **Epochs.** AdamW; the learning rate rises linearly for ``warmup_epochs`` and then
   follows a cosine down to ``min_lr`` (:func:`lr_at`); loss = masked MAE on *unscaled*
   speeds; gradients clipped to norm ``clip``; bf16 autocast and TF32 on CUDA only, for the
   training steps (validation and test forecasts are float32: :func:`predict`). The
   order of the training windows in epoch ``e`` comes from a generator seeded with
   ``(seed, e)``, so an interrupted run replays exactly (:mod:`diagsink.engine.epoch`).
4. **Early stopping** on the validation masked MAE
   (:class:`~diagsink.engine.early_stopping.EarlyStopping`: patience, ``min_delta``); the
   best-validation weights are **restored before testing**. (The paper's released code
   tests the weights of the last epoch instead.)
5. **Checkpoint every epoch** (``torch.save`` into memory, then an atomic write), holding
   the model, the optimiser, the best weights, the history and the random-number state;
   a rerun of the same command resumes from it after a crash or ``kill -9``.
6. **Test** at horizons 3/6/12 and the 12-step mean, then the last block's attention
   averaged as the paper does (:func:`record_attention`), then the result artifact
   (:mod:`diagsink.engine.artifacts`).

The run trains with the processes it is given (argument ``processes``): by default one process,
:class:`~diagsink.engine.epoch.SingleProcess`. Under ``torchrun``, :mod:`diagsink.engine.distributed`
calls the same run with this rank's :class:`~diagsink.engine.distributed.DDPContext`, which supplies
the module that trains, the epoch on this rank's shard of every batch and the stopping decision.
Explained in the chapter "The T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import __version__
from .._io import atomic_write_bytes, atomic_write_text
from ..data import load_metr_la
from ..errors import ConfigError, DiagsinkError
from ..metrics import horizon_metrics, masked_mae
from ..model import TSModel
from ..runtime import resolve_device
from ..sparse import SPARSE_MIN_NODES, sparsify
from .artifacts import SCHEMA_VERSION, artifact_json
from .config import config_hash, load_config, validate_config
from .early_stopping import EarlyStopping
from .epoch import SingleProcess, windows_per_epoch
from .prepare import Prepared, batch, prepare
from .provenance import device_name, git_commit
from .runs import (
    RunState,
    keep_finished,
    resume_checkpoint,
    run_name,
    run_paths,
    tidy_finished_run,
    write_checkpoint,
)

__all__ = [
    "build_model",
    "lr_at",
    "predict",
    "record_attention",
    "train_model",
    "train_run",
    "STATE_DICT_LIMIT",
]

#: State dicts larger than this (bytes) are not written next to the artifact.
STATE_DICT_LIMIT = 1_000_000


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
        block_order=m.get("block_order", "ts"),  # optional keys (diagsink.engine.config.OPTIONAL)
        graph_layer=m.get("graph_layer", "diffusion"),
    ).to(prepared.series.device)
    if model.n_nodes > SPARSE_MIN_NODES:  # torch.sparse products for a large road graph (scaling)
        sparsify(model)
    return model


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


@contextlib.contextmanager
def _full_precision(device: torch.device):
    """float32 inside: any autocast off, TF32 off; the previous settings restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@torch.no_grad()
def predict(
    model: TSModel, prepared: Prepared, starts: torch.Tensor, cfg: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode forecasts and targets for the windows ``starts``: ``[B, T_out, N]`` each (mph).

    Always float32 without TF32, also where training uses bf16 autocast: on an H200 run of the
    ``book`` protocol, bf16 evaluation gave a test MAE@3 3 % above the same weights' float32
    value, so metrics (and the best-validation choice) would depend on the device.
    """
    model.eval()
    m, bs = cfg["model"], cfg["train"]["eval_batch_size"]
    preds, targets = [], []
    with _full_precision(prepared.series.device):
        for i in range(0, len(starts), bs):
            x, y = batch(prepared, starts[i : i + bs], m["t_in"], m["t_out"])
            preds.append(model(x).float())
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
        x, _ = batch(prepared, order[i : i + t["batch_size"]], m["t_in"], m["t_out"])
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


# -- provenance ---------------------------------------------------------------------------------------
def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


# -- one run -------------------------------------------------------------------------------------------
def _check_finite(state: RunState, val_mae: float, cfg: dict[str, Any], name: str) -> None:
    """Stop a diverged run with a message: the last epoch's train or validation MAE is not finite."""
    t, last = cfg["train"], state.history[-1]
    if not (math.isfinite(last["train_mae"]) and math.isfinite(val_mae)):
        raise DiagsinkError(
            f"{cfg['protocol']}/{name}: training diverged in epoch {state.epoch} (train MAE {last['train_mae']}, "
            f"validation MAE {val_mae}). Fix: lower train.lr (now {t['lr']}) or train.clip (now {t['clip']}) "
            "in the protocol; the last finite epoch's checkpoint is kept."
        )


def _stop_reason(state: RunState, stopper: EarlyStopping, cfg: dict[str, Any]) -> str:
    """Why the run ends after the epoch just recorded, or ``"max_epochs"`` (it goes on, if epochs are left)."""
    limit = cfg["train"]["time_limit_s"]
    if stopper.should_stop:
        return "early_stopping"
    # another epoch of average length would overrun the time budget
    if limit is not None and state.train_time + state.train_time / len(state.history) > limit:
        return "time_limit"
    return "max_epochs"


def _end_epoch(
    state: RunState,
    stopper: EarlyStopping,
    model: TSModel,
    entry: dict[str, float],
    cfg: dict[str, Any],
    name: str,
) -> bool:
    """Record the epoch ``entry`` in ``state``; keep the weights if they are the best; True when the run ends."""
    state.history.append(entry)
    _check_finite(state, entry["val_mae"], cfg, name)
    if stopper.step(entry["val_mae"], state.epoch):
        state.best_state = _cpu_state(model)
    state.best_val, state.best_epoch, state.bad_epochs = (  # the rule's state, for the checkpoint
        stopper.best,
        stopper.best_epoch,
        stopper.bad_epochs,
    )
    state.epoch += 1
    state.stopped = _stop_reason(state, stopper, cfg)
    return state.stopped != "max_epochs" or state.epoch >= cfg["train"]["epochs"]


def _progress_bar(
    cfg: dict[str, Any], name: str, prepared: Prepared, state: RunState, show: bool
) -> tqdm:
    """A tqdm bar over the run's batches (all epochs), starting at the resumed epoch."""
    t = cfg["train"]
    steps = math.ceil(windows_per_epoch(prepared, cfg) / t["batch_size"])
    return tqdm(
        total=t["epochs"] * steps,
        initial=state.epoch * steps,
        desc=f"{cfg['protocol']}/{name}",
        disable=not show,
        unit="batch",
        ncols=80,  # fixed width: in a notebook the bar must fit the page's output box
    )


def _train_epochs(
    model: TSModel,
    optimizer: torch.optim.Optimizer,
    prepared: Prepared,
    cfg: dict[str, Any],
    name: str,
    seed: int,
    state: RunState,
    processes: SingleProcess,
    *,
    progress: bool,
    checkpoint: Callable[[], None] | None,
    on_epoch: Callable[[dict[str, float]], None] | None,
) -> None:
    """Train from ``state.epoch`` until early stopping, the time limit or the last epoch ends the run.

    Each epoch: the learning rate of :func:`lr_at`, one epoch of gradient steps, the validation
    masked MAE (float32), early stopping (:class:`~diagsink.engine.early_stopping.EarlyStopping`,
    which says when to keep the weights as the best), then ``checkpoint()`` and ``on_epoch(entry)``.
    """
    t = cfg["train"]
    stopper = EarlyStopping(
        t["patience"], t["min_delta"], state.best_val, state.best_epoch, state.bad_epochs
    )
    net = processes.wrap(model)  # the module that trains; ``model`` stays the plain TSModel
    if t.get("compile", False):  # opt-in (config key train.compile): the same function, compiled
        net = torch.compile(net)
    bar = _progress_bar(cfg, name, prepared, state, progress and processes.is_main)

    def on_step(loss: torch.Tensor) -> None:
        bar.update(1)
        if bar.n % 10 == 0:
            bar.set_postfix(loss=f"{float(loss):.3f}", refresh=False)

    finished = state.stopped != "max_epochs" or state.epoch >= t["epochs"]
    while not finished:
        t0 = time.perf_counter()
        lr = lr_at(state.epoch, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        train_mae = processes.train_epoch(net, optimizer, prepared, cfg, seed, state.epoch, on_step)
        val_mae = float(masked_mae(*predict(model, prepared, prepared.val, cfg)))
        state.train_time += time.perf_counter() - t0
        entry = {"epoch": state.epoch, "lr": lr, "train_mae": train_mae, "val_mae": val_mae}
        finished = _end_epoch(state, stopper, model, entry, cfg, name)
        bar.set_postfix(loss=f"{train_mae:.3f}", val=f"{val_mae:.3f}", best=f"{state.best_val:.3f}")
        # rank 0 decides (time limits differ per rank)
        finished, state.stopped = processes.agree(finished, state.stopped)
        if checkpoint is not None:
            checkpoint()
        if on_epoch is not None:
            on_epoch(entry)
    bar.close()


def train_model(
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
    low_memory: bool = False,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    processes: SingleProcess | None = None,
) -> tuple[TSModel, dict[str, Any]]:
    """Train, test and (when ``write``) save one run; return the trained model and its artifact.

    Args:
        cfg: a config dict or a protocol name (:func:`diagsink.engine.config.load_config`).
        variant: one of :data:`diagsink.variants.VARIANTS`.
        seed: initialisation, window order and dropout draws.
        data: a :class:`diagsink.data.metr_la.MetrLA` (loaded from ``ds.settings().data_root`` if None).
        prepared: an already prepared data set (skips ``data``), e.g. shared by several runs.
        device: ``"cpu"``/``"cuda"``; default ``ds.settings().device``.
        out_dir: the results folder (artifacts go to ``out_dir/<protocol>/``); needed when ``write``.
        progress: show a tqdm bar (loss, validation MAE, ETA).
        write: write the artifact, state dict and per-epoch checkpoints.
        low_memory: activation checkpointing of the blocks (same results, less memory,
            roughly a fifth more compute).
        on_epoch: called with each epoch's history entry after its checkpoint is written
            (logging, live plots; an exception raised there interrupts the run like a kill).
        processes: the processes that train the run: None for one process
            (:class:`~diagsink.engine.epoch.SingleProcess`), or this rank of a data-parallel run
            (:class:`~diagsink.engine.distributed.DDPContext`, given by
            :func:`diagsink.engine.distributed.data_parallel`).

    Returns:
        ``(model, artifact)``: the trained :class:`TSModel` with the best-validation weights,
        and the artifact (see :mod:`diagsink.engine.artifacts`).
    """
    cfg = load_config(cfg) if isinstance(cfg, str) else validate_config(cfg)
    name = run_name(variant, seed)  # checks both before the data are loaded
    device_t = resolve_device(device)
    if device_t.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if prepared is None:
        prepared = prepare(
            load_metr_la(speed_file=cfg["data"].get("speed_file")) if data is None else data,
            cfg,
            device_t,
        )
    if write and out_dir is None:
        raise ConfigError("train_run(write=True) needs out_dir (the results folder).")
    paths = run_paths(out_dir, cfg["protocol"], variant, seed) if write else None
    commit = git_commit()  # before training: the code version that runs
    torch.manual_seed(seed)
    model = build_model(cfg, variant, prepared)
    model.checkpoint_blocks = low_memory
    t = cfg["train"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
    key = {"variant": variant, "seed": seed, "config_hash": config_hash(cfg)}
    processes = SingleProcess() if processes is None else processes
    state = (
        write and resume_checkpoint(paths["checkpoint"], key, model, optimizer, device_t)
    ) or RunState(best_state=_cpu_state(model))
    write = write and processes.is_main  # the main process alone writes checkpoints and artifacts

    def checkpoint() -> None:
        write_checkpoint(paths["checkpoint"], key, state, model, optimizer, device_t)

    _train_epochs(
        model,
        optimizer,
        prepared,
        cfg,
        name,
        seed,
        state,
        processes,
        progress=progress,
        checkpoint=checkpoint if write else None,
        on_epoch=on_epoch,
    )
    model.load_state_dict(state.best_state)  # test the best-validation weights
    artifact = _artifact(model, prepared, cfg, variant, seed, state, commit, low_memory, processes)
    if not write:
        artifact["state_dict"]["file"] = None  # nothing written next to it
    else:
        _write_run(paths, artifact, model)
    return model, artifact


def train_run(
    cfg: dict[str, Any] | str,
    variant: str,
    seed: int,
    *,
    processes: SingleProcess | None = None,
    **options: Any,
) -> dict[str, Any]:
    """:func:`train_model` without the model: train, test, save one run; return its artifact.

    ``processes`` (None: one process) and the ``options`` are those of :func:`train_model`.
    """
    return train_model(cfg, variant, seed, processes=processes, **options)[1]


def _artifact(model, prepared, cfg, variant, seed, state: RunState, commit, low_memory, processes):
    """Test the (restored) model, record its attention, and assemble the artifact ``dict``."""
    pred, target = predict(model, prepared, prepared.test, cfg)
    mean_attn, per_head, how = record_attention(model, prepared, cfg, seed)
    n_bytes = len(_state_bytes(model))
    device_t = prepared.series.device
    return {
        "schema_version": SCHEMA_VERSION,
        "protocol": cfg["protocol"],
        "variant": variant,
        "seed": seed,
        "metrics": horizon_metrics(pred, target),
        "best_epoch": state.best_epoch,
        "epochs_run": len(state.history),
        "stopped": state.stopped,
        "weights_tested": "best validation epoch (restored before testing)",
        "history": state.history,
        "wall_time_s": state.train_time,
        "resumed_from_epoch": state.resumed_from,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "attention": {"mean": mean_attn.tolist(), "per_head": per_head.tolist(), "how": how},
        "state_dict": (
            {"file": run_name(variant, seed) + ".pt", "bytes": n_bytes}
            if n_bytes <= STATE_DICT_LIMIT
            else {
                "file": None,
                "bytes": n_bytes,
                "note": f"omitted: larger than {STATE_DICT_LIMIT} bytes",
            }
        ),
        "provenance": {
            "git_commit": commit,
            "diagsink_version": __version__,
            "config": cfg,
            "config_hash": config_hash(cfg),
            "data": prepared.info,
            "device": device_name(device_t),
            "processes": processes.describe(),
            "autocast": "bf16 + TF32" if device_t.type == "cuda" else "none (float32)",
            "evaluation": "float32, no autocast, no TF32",
            "activation_checkpointing": bool(low_memory),
            "torch": torch.__version__,
            "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seed": seed,
        },
    }


def _state_bytes(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(_cpu_state(model), buffer)
    return buffer.getvalue()


def _write_run(paths: dict[str, Path], artifact: dict[str, Any], model: TSModel) -> None:
    """Write the state dict (if small), then the artifact naming its sha256; tidy the checkpoint.

    The artifact is checked whole first (a NaN anywhere stops it before any file is written), and
    a finished artifact already at its path is kept under ``superseded/``, never overwritten.
    """
    state = _state_bytes(model) if artifact["state_dict"]["file"] is not None else None
    if state is not None:
        artifact["state_dict"]["sha256"] = hashlib.sha256(state).hexdigest()
    text = artifact_json(artifact)
    kept = keep_finished(paths)
    if kept is not None:
        print(f"kept the earlier result at {paths['json']} as {kept}")
    if state is not None:
        atomic_write_bytes(paths["state"], state)
    atomic_write_text(paths["json"], text)
    tidy_finished_run(paths)
