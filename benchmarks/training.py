"""Benchmark: the training step of the book's T&S model against two other implementations.

Usage::

    python benchmarks/training.py                   # CPU: book size at 29 and 207 sensors
    python benchmarks/training.py --device cuda     # GPU: book and paper size, bf16 autocast
    python benchmarks/training.py --device cuda --compile   # the same, ours under torch.compile

Each row times whole training steps (forward, masked-MAE loss, backward, gradient clipping at
5, AdamW) of

* **ours**: :class:`diagsink.model.TSModel` built by the engine (``build_model``, the ``dropout``
  variant) and fed as the engine feeds it (windows gathered from the series kept on the
  device), under bf16 autocast on a GPU, as :func:`diagsink.engine.train.train_run` trains;
* **straightforward** (same work): what one would write first for the same model -
  ``nn.MultiheadAttention`` over time per sensor with the same diagonal-dropout mask, the
  diffusion graph convolution as dense ``einsum``s over the same supports, the same widths,
  heads, depth and read-out - fed by a per-sample ``Dataset`` and a ``DataLoader``, under the
  same autocast;
* **released** (GPU only): the paper's released model as :mod:`diagsink.released` re-states
  it (``TimeSpaceBlock`` = ``nn.MultiheadAttention`` returning its weights, the ``AdaptiveGCN``
  contraction, time of day through two linears per block), fed by a ``DataLoader`` in float32
  as the released code trains (no autocast).

The models are timed alternately, step by step (median of the timed steps), so that other load
on a shared machine affects them alike. The CPU rows are the book model (``book`` protocol) at
29 sensors (``metr-la_29sensors_allsteps.h5``, the full-length file) and at 207 sensors (the
first available speed file), batch 64; the target is ours / straightforward >= 0.95. The GPU
rows are ``book`` (batch 64) and ``paper`` (batch 128) at 207 sensors; the targets are at least
10,000 samples/s for ``book`` and at least 3 times the released step for ``paper``.
The JSON written to ``benchmarks/results/training_<device>[_compile].json`` records the
machine, the commit, torch, the threads and the data of the run. Appendix "Making it fast"
(``book/fast.ipynb``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from torch import nn

from diagsink.data import load_metr_la
from diagsink.engine.config import load_config
from diagsink.engine.prepare import batch as gather_batch
from diagsink.engine.prepare import prepare
from diagsink.engine.provenance import git_commit, machine
from diagsink.engine.train import build_model
from diagsink.metrics import masked_mae
from diagsink.positional import PositionalEncoding
from diagsink.released import ReleasedBlock, diag_attn_mask

#: CPU rows: (label, protocol, speed file or None for the first available)
CPU_ROWS = [("book@29", "book", "metr-la_29sensors_allsteps.h5"), ("book@207", "book", None)]
#: GPU rows
GPU_ROWS = [("book@207", "book", None), ("paper@207", "paper", None)]
TARGET_CPU_RATIO = 0.95  # ours / straightforward, CPU
TARGET_GPU_BOOK = 10_000.0  # samples/s, book model at 207 sensors
TARGET_GPU_PAPER_RATIO = 3.0  # ours / released, paper model


class WindowDataset(torch.utils.data.Dataset):
    """Per-sample windows: ``(x [T_in, N, 2], y [T_out, N])`` sliced from numpy arrays."""

    def __init__(self, series: np.ndarray, speed: np.ndarray, starts: np.ndarray, t: int = 12):
        self.series, self.speed, self.starts, self.t = series, speed, starts, t

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s, t = int(self.starts[i]), self.t
        x = torch.from_numpy(self.series[s : s + t].copy())
        return x, torch.from_numpy(self.speed[s + t : s + 2 * t].copy())


class EinsumGraphConv(nn.Module):
    """``dropout(mix(cat[x, P x, P^2 x, ..., A x, A^2 x]))``, one dense ``einsum`` per hop."""

    def __init__(self, d: int, supports, order: int, n: int, embed: int, dropout: float):
        super().__init__()
        for i, s in enumerate(supports):
            self.register_buffer(f"p{i}", s.clone())
        self.n_fixed, self.order = len(supports), order
        self.e1 = nn.Parameter(torch.randn(n, embed))
        self.e2 = nn.Parameter(torch.randn(n, embed))
        self.mix = nn.Linear((1 + order * (len(supports) + 1)) * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, N, C] -> [B, T, N, C]
        supports = [getattr(self, f"p{i}") for i in range(self.n_fixed)]
        supports.append(torch.softmax(torch.relu(self.e1 @ self.e2.T), dim=1))
        terms = [x]
        for p in supports:
            h = x
            for _ in range(self.order):
                h = torch.einsum("nm,btmc->btnc", p.to(x.dtype), h)
                terms.append(h)
        return self.dropout(self.mix(torch.cat(terms, dim=-1)))


class StraightforwardModel(nn.Module):
    """The book's T&S model written the obvious way: ``[B, T, N, 2] -> [B, T, N]`` (mph)."""

    def __init__(self, cfg: dict, prepared) -> None:
        super().__init__()
        m, r = cfg["model"], cfg["regularizers"]
        d, n = m["d_model"], prepared.series.shape[1]
        self.diag_p, self.mean, self.std = r["diag_p"], prepared.mean, prepared.std
        self.embed, self.tod = nn.Linear(1, d), nn.Linear(1, d)
        self.pos = PositionalEncoding(m["pos_encoding"], d, 16)
        heads, p = m["n_heads"], m["dropout"]
        self.attn = nn.ModuleList(
            nn.MultiheadAttention(d, heads, dropout=p, batch_first=True) for _ in range(m["depth"])
        )
        sup = [s.cpu() for s in prepared.supports]
        self.gconvs = nn.ModuleList(
            EinsumGraphConv(d, sup, m["graph_order"], n, m["node_embed_dim"], p)
            for _ in range(m["depth"])
        )
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * m["depth"]))
        self.readout, self.time_mix = nn.Linear(d + 1, 1), nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, n, _ = x.shape
        tod = self.tod(x[..., 1:])
        h = self.pos(self.embed(x[..., :1]).transpose(1, 2)).transpose(1, 2)
        drop = torch.rand(t, device=x.device) < self.diag_p  # one diagonal pattern per pass
        mask = torch.zeros(t, t, device=x.device).masked_fill_(torch.diag(drop), float("-inf"))
        for i, (attn, gconv) in enumerate(zip(self.attn, self.gconvs)):
            z = (h + tod).transpose(1, 2).reshape(b * n, t, -1)
            z = self.norms[2 * i](z + attn(z, z, z, attn_mask=mask, need_weights=False)[0])
            h = z.reshape(b, n, t, -1).transpose(1, 2)
            h = self.norms[2 * i + 1](h + gconv(h))
        out = self.readout(torch.cat([h, x[..., 1:]], -1)).squeeze(-1)
        return self.time_mix(out.transpose(1, 2)).transpose(1, 2) * self.std + self.mean


class ReleasedModel(nn.Module):
    """The released T&S model from :class:`diagsink.released.ReleasedBlock`: ``[B, T, N, 2] -> [B, T, N]``."""

    def __init__(self, cfg: dict, prepared) -> None:
        super().__init__()
        m, d, n = cfg["model"], cfg["model"]["d_model"], prepared.series.shape[1]
        self.diag_p, self.mean, self.std = (
            cfg["regularizers"]["diag_p"],
            prepared.mean,
            prepared.std,
        )
        self.embed, self.pos = nn.Linear(1, d), PositionalEncoding("tape", d, 16)
        self.blocks = nn.ModuleList(
            ReleasedBlock(d, m["n_heads"], n, attn_dropout=m["dropout"]) for _ in range(m["depth"])
        )
        self.readout, self.time_mix = nn.Linear(d + 1, 1), nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.pos(self.embed(x[..., :1]).transpose(1, 2)).transpose(1, 2)
        mask = diag_attn_mask(t, diag_p=self.diag_p, training=self.training)
        mask = None if mask is None else mask.to(x.device)
        for block in self.blocks:
            h, _ = block(h, x[..., 1:], attn_mask=mask)
        out = self.readout(torch.cat([h, x[..., 1:]], -1)).squeeze(-1)
        return self.time_mix(out.transpose(1, 2)).transpose(1, 2) * self.std + self.mean


def _update(model, opt, x: torch.Tensor, y: torch.Tensor, autocast: bool) -> None:
    """One optimiser step: (bf16 autocast), masked MAE in float32, backward, clip 5, AdamW."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast and x.is_cuda):
        pred = model(x)
    loss = masked_mae(pred.float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    if x.is_cuda:
        torch.cuda.synchronize()


def ours_step(cfg: dict, prepared, batch: int, compile_: bool):
    """A step of the engine's code path: windows gathered on the device, TSModel."""
    torch.manual_seed(0)
    model = build_model(cfg, "dropout", prepared).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if compile_ else model
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        pick = torch.randint(len(prepared.train), (batch,), generator=g)
        x, y = gather_batch(prepared, prepared.train[pick.to(prepared.train.device)], 12, 12)
        _update(run, opt, x, y, autocast=True)

    return step


def loader_step(model: nn.Module, prepared, batch: int, autocast: bool):
    """A step of ``model`` fed by a per-sample ``Dataset`` and a shuffling ``DataLoader``."""
    device = prepared.series.device
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = WindowDataset(
        prepared.series.cpu().numpy(), prepared.speed.cpu().numpy(), prepared.train.cpu().numpy()
    )
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        _update(model, opt, x.to(device), y.to(device), autocast)

    return step


def interleaved(steps: dict, n_steps: int) -> dict[str, float]:
    """Median seconds per step of each step function, timed alternately after 2 warm-ups each."""
    for step in steps.values():
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(n_steps):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(ts)) for name, ts in times.items()}


def measure_row(label: str, protocol: str, speed_file, device, args) -> dict:
    """Samples/s of every model of one row, and the ratios the targets are about."""
    cfg = load_config(protocol)
    data = load_metr_la(speed_file=speed_file)
    prepared = prepare(data, cfg, device)
    batch = cfg["train"]["batch_size"]
    torch.manual_seed(0)
    steps = {
        "ours": ours_step(cfg, prepared, batch, args.compile),
        "straightforward": loader_step(StraightforwardModel(cfg, prepared), prepared, batch, True),
    }
    if device.type == "cuda":
        torch.manual_seed(0)
        steps["released"] = loader_step(ReleasedModel(cfg, prepared), prepared, batch, False)
    seconds = interleaved(steps, args.steps)
    row = {"row": label, "protocol": protocol, "sensors": int(prepared.series.shape[1])}
    row.update(batch=batch, data=data.describe())
    row.update({name: batch / s for name, s in seconds.items()})
    row["ours_over_straightforward"] = seconds["straightforward"] / seconds["ours"]
    if "released" in seconds:
        row["ours_over_released"] = seconds["released"] / seconds["ours"]
    return row


def targets_met(rows: list[dict], device: torch.device) -> dict[str, bool]:
    """Each target of the module docstring, on this run's rows."""
    by = {r["row"]: r for r in rows}
    if device.type == "cpu":
        return {
            f"{k}: ours/straightforward >= {TARGET_CPU_RATIO}": v["ours_over_straightforward"]
            >= TARGET_CPU_RATIO
            for k, v in by.items()
        }
    out = {}
    if "book@207" in by:
        out[f"book@207: ours >= {TARGET_GPU_BOOK:.0f} samples/s"] = (
            by["book@207"]["ours"] >= TARGET_GPU_BOOK
        )
    if "paper@207" in by:
        out[f"paper@207: ours/released >= {TARGET_GPU_PAPER_RATIO}"] = (
            by["paper@207"]["ours_over_released"] >= TARGET_GPU_PAPER_RATIO
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=9, help="timed steps of each (median)")
    parser.add_argument("--rows", default=None, help="comma-separated row labels (default: all)")
    parser.add_argument("--compile", action="store_true", help="torch.compile our model")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    parser.add_argument("--note", default=None, help="what else ran on the machine (recorded)")
    args = parser.parse_args()
    from diagsink._io import atomic_write_text

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    rows_spec = CPU_ROWS if device.type == "cpu" else GPU_ROWS
    if args.rows:
        rows_spec = [r for r in rows_spec if r[0] in args.rows.split(",")]
    table: dict = {
        "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "git_commit": git_commit(),
        "machine": machine(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "compile": args.compile,
        "autocast": "bf16 (ours, straightforward)" if device.type == "cuda" else None,
        "note": args.note,
        "rows": [],
    }
    print(f"UTC {table['utc']}, commit {table['git_commit']}, {table['machine']}")
    print(
        f"device {table['device']}, torch {table['torch']}, {table['threads']} threads, "
        f"{args.steps} timed steps each (median, interleaved), compile={args.compile}"
    )
    for label, protocol, speed_file in rows_spec:
        row = measure_row(label, protocol, speed_file, device, args)
        table["rows"].append(row)
        rates = ", ".join(
            f"{k} {row[k]:.1f}" for k in ("ours", "straightforward", "released") if k in row
        )
        ratios = ", ".join(f"{k} {row[k]:.3f}" for k in row if k.startswith("ours_over"))
        print(f"{label:10s} batch {row['batch']:3d}: samples/s {rates}; {ratios}", flush=True)
    table["targets"] = targets_met(table["rows"], device)
    for what, met in table["targets"].items():
        print(f"target {what}: {'met' if met else 'NOT met'}")
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        "results",
        f"training_{device.type}{'_compile' if args.compile else ''}.json",
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    atomic_write_text(out, json.dumps(table, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
