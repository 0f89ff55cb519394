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
   ``(seed, e)``, so an interrupted run replays exactly.
4. **Early stopping** on the validation masked MAE (patience, ``min_delta``); the
   best-validation weights are **restored before testing**. (The paper's released code
   tests the weights of the last epoch instead.)
5. **Checkpoint every epoch** (``torch.save`` into memory, then an atomic write), holding
   the model, the optimiser, the best weights, the history and the random-number state;
   a rerun of the same command resumes from it after a crash or ``kill -9``.
6. **Test** at horizons 3/6/12 and the 12-step mean, then the last block's attention
   averaged as the paper does (:func:`record_attention`), then the result artifact
   (:mod:`diagsink.engine.artifacts`).

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
from .distributed import context as distributed_context
from .loop import fit_epoch
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


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


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
def _train_epoch(
    net, optimizer, prepared: Prepared, cfg, seed: int, epoch: int, dist, bar
) -> float:
    """One epoch of gradient steps over the shuffled training windows; returns the train MAE."""
    m, t = cfg["model"], cfg["train"]
    order = epoch_windows(prepared, cfg, seed, epoch)
    n_train = len(order)
    for group in optimizer.param_groups:
        group["lr"] = lr_at(epoch, cfg)
    dist.begin_epoch(seed, epoch)
    batches = (
        batch(prepared, dist.shard(order[i : i + t["batch_size"]]), m["t_in"], m["t_out"])
        for i in range(0, n_train, t["batch_size"])
    )
    device = prepared.series.device

    def forward(x: torch.Tensor) -> torch.Tensor:
        with _autocast(device):
            return net(x)

    def on_step(loss: torch.Tensor) -> None:
        bar.update(1)
        if bar.n % 10 == 0:
            bar.set_postfix(loss=f"{float(loss):.3f}", refresh=False)

    net.train()
    # masked MAE of the (global) batch, float32
    return fit_epoch(
        forward,
        optimizer,
        batches,
        lambda p, y: dist.loss(p.float(), y),
        clip=t["clip"],
        on_step=on_step,
    )


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


def _n_train(prepared: Prepared, cfg: dict[str, Any]) -> int:
    """Windows per epoch (the largest part when ``train.epoch_parts`` does not divide evenly)."""
    per_epoch = -(-len(prepared.train) // cfg["train"].get("epoch_parts", 1))
    cap = cfg["train"]["max_train_windows"]
    return per_epoch if cap is None else min(cap, per_epoch)


def _finished(state: RunState, val_mae: float, model: TSModel, cfg, name: str) -> bool:
    """Record the epoch's validation MAE; early stopping, time limit or the last epoch end the run."""
    t = cfg["train"]
    last = state.history[-1]
    if not (math.isfinite(last["train_mae"]) and math.isfinite(val_mae)):
        raise DiagsinkError(
            f"{cfg['protocol']}/{name}: training diverged in epoch {state.epoch} (train MAE {last['train_mae']}, "
            f"validation MAE {val_mae}). Fix: lower train.lr (now {t['lr']}) or train.clip (now {t['clip']}) "
            "in the protocol; the last finite epoch's checkpoint is kept."
        )
    if val_mae < state.best_val - t["min_delta"]:
        state.best_val, state.best_epoch, state.bad_epochs = val_mae, state.epoch, 0
        state.best_state = _cpu_state(model)
    else:
        state.bad_epochs += 1
    state.epoch += 1
    epochs_done = len(state.history)
    if state.bad_epochs >= t["patience"]:
        state.stopped = "early_stopping"
    elif (
        t["time_limit_s"] is not None
        and state.train_time + state.train_time / epochs_done > t["time_limit_s"]
    ):
        state.stopped = "time_limit"  # another epoch of average length would overrun the budget
    return state.stopped != "max_epochs" or state.epoch >= t["epochs"]


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

    Returns:
        ``(model, artifact)``: the trained :class:`TSModel` with the best-validation weights,
        and the artifact (see :mod:`diagsink.engine.artifacts`).
    """
    cfg = load_config(cfg) if isinstance(cfg, str) else validate_config(cfg)
    name = run_name(variant, seed)
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
    dist = distributed_context()  # DDP hooks under torchrun, no-ops otherwise
    dist.barrier()  # rank 0's last checkpoint is complete before any rank looks for one
    state = (
        write and resume_checkpoint(paths["checkpoint"], key, model, optimizer, device_t)
    ) or RunState(best_state=_cpu_state(model))
    net = dist.wrap(model)  # the module that trains; ``model`` stays the plain TSModel
    if t.get("compile", False):  # opt-in (config key train.compile): the same function, compiled
        net = torch.compile(net)
    write = write and dist.is_main  # rank 0 alone writes checkpoints and artifacts
    steps = math.ceil(_n_train(prepared, cfg) / t["batch_size"])
    bar = tqdm(
        total=t["epochs"] * steps,
        initial=state.epoch * steps,
        desc=f"{cfg['protocol']}/{name}",
        disable=not (progress and dist.is_main),
        unit="batch",
        ncols=80,  # fixed width: in a notebook the bar must fit the page's output box
    )
    finished = state.stopped != "max_epochs" or state.epoch >= t["epochs"]
    while not finished:
        t0 = time.perf_counter()
        train_mae = _train_epoch(net, optimizer, prepared, cfg, seed, state.epoch, dist, bar)
        val_mae = float(masked_mae(*predict(model, prepared, prepared.val, cfg)))
        state.train_time += time.perf_counter() - t0
        entry = {
            "epoch": state.epoch,
            "lr": lr_at(state.epoch, cfg),
            "train_mae": train_mae,
            "val_mae": val_mae,
        }
        state.history.append(entry)
        finished = _finished(state, val_mae, model, cfg, name)
        bar.set_postfix(loss=f"{train_mae:.3f}", val=f"{val_mae:.3f}", best=f"{state.best_val:.3f}")
        # rank 0 decides (time limits differ per rank)
        finished, state.stopped = dist.agree(finished, state.stopped)
        if write:
            write_checkpoint(paths["checkpoint"], key, state, model, optimizer, device_t)
        if on_epoch is not None:
            on_epoch(entry)
    bar.close()
    model.load_state_dict(state.best_state)  # test the best-validation weights
    artifact = _artifact(model, prepared, cfg, variant, seed, state, commit, low_memory, dist)
    if not write:
        artifact["state_dict"]["file"] = None  # nothing written next to it
    else:
        _write_run(paths, artifact, model)
    return model, artifact


def train_run(cfg: dict[str, Any] | str, variant: str, seed: int, **options: Any) -> dict[str, Any]:
    """:func:`train_model` without the model: train, test, save one run; return its artifact."""
    return train_model(cfg, variant, seed, **options)[1]


def _artifact(model, prepared, cfg, variant, seed, state: RunState, commit, low_memory, dist):
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
            "processes": dist.describe(),
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
