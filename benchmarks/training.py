"""Benchmark: training throughput of the T&S engine vs. a straightforward baseline, and peak memory.

Usage::

    python benchmarks/training.py [--device cpu|cuda] [--steps 3] [--protocols quick,book,paper]

For each protocol (``quick``, ``book``, ``paper``) it measures, in one run, a few timed
training steps (forward, masked-MAE loss, backward, clipping, AdamW) of

* **ours**: :class:`diagsink.model.TSModel` fed by the engine's vectorised
  ``protocol.gather`` from the series kept on the device (the code path of
  :func:`diagsink.train.train_run`), including the graph convolution that mixes sensors;
* **baseline**: what one would write first: a per-sample ``torch.utils.data.Dataset``
  (numpy slicing in ``__getitem__``) and a ``DataLoader`` (shuffle, default collate) feeding
  blocks of ``nn.MultiheadAttention`` over time per sensor (+ residual, LayerNorm) of the
  same width, heads and depth, with the same embedding and head -- and *no* graph
  convolution (it does less work than ours).

It prints samples/s, the implied seconds per epoch on the full METR-LA training split
(23,974 windows; an extrapolation from the measured steps) and the ratio ours/baseline.
Then it measures the peak resident memory of one ``paper`` training step at batch 32 in a
fresh subprocess (``ru_maxrss``; ``/usr/bin/time -v`` reports the same number).
Data: the real graph and the available speeds (``DIAGSINK_DATA``); throughput does not
depend on how many steps the file holds.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import numpy as np
import torch
from torch import nn

from diagsink.config import load_config
from diagsink.metrics import masked_mae
from diagsink.train import _batch, build_model, prepare

FULL_TRAIN_WINDOWS = 23974  # DCRNN split of the full 34,272-step METR-LA


class WindowDataset(torch.utils.data.Dataset):
    """Per-sample windows: ``(x [T_in, N, 2], y [T_out, N])`` sliced from numpy arrays."""

    def __init__(self, series: np.ndarray, speed: np.ndarray, starts: np.ndarray, t_in: int = 12, t_out: int = 12):
        self.series, self.speed, self.starts, self.t_in, self.t_out = series, speed, starts, t_in, t_out

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int):
        s = int(self.starts[i])
        x = torch.from_numpy(self.series[s : s + self.t_in].copy())
        y = torch.from_numpy(self.speed[s + self.t_in : s + self.t_in + self.t_out].copy())
        return x, y


class BaselineModel(nn.Module):
    """Embedding -> depth x [nn.MultiheadAttention over time per sensor + residual + LayerNorm] -> head."""

    def __init__(self, d: int, heads: int, depth: int, dropout: float, mean: float, std: float):
        super().__init__()
        self.embed = nn.Linear(1, d)
        self.tod = nn.Linear(1, d)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
        self.readout = nn.Linear(d + 1, 1)
        self.time_mix = nn.Linear(12, 12)
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, N, 2] -> [B, T, N]
        b, t, n, _ = x.shape
        tod = self.tod(x[..., 1:])
        h = self.embed(x[..., :1])
        for attn, norm in zip(self.attn, self.norms):
            z = (h + tod).permute(0, 2, 1, 3).reshape(b * n, t, -1)
            z = norm(z + attn(z, z, z, need_weights=False)[0])
            h = z.reshape(b, n, t, -1).permute(0, 2, 1, 3)
        out = self.readout(torch.cat([h, x[..., 1:]], -1)).squeeze(-1)
        return self.time_mix(out.transpose(1, 2)).transpose(1, 2) * self.std + self.mean


def _steps_per_second(step, n_steps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(n_steps):
        step()
    return n_steps / (time.perf_counter() - t0)


def bench_ours(cfg, prepared, batch: int, n_steps: int) -> float:
    torch.manual_seed(0)
    model = build_model(cfg, "dropout", prepared)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    g = torch.Generator().manual_seed(0)

    def step():
        starts = prepared.train[torch.randint(len(prepared.train), (batch,), generator=g).to(prepared.train.device)]
        x, y = _batch(prepared, starts, 12, 12)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            pred = model(x)
        loss = masked_mae(pred.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()

    return batch * _steps_per_second(step, n_steps)


def bench_baseline(cfg, prepared, batch: int, n_steps: int, device: torch.device) -> float:
    m = cfg["model"]
    torch.manual_seed(0)
    model = BaselineModel(m["d_model"], m["n_heads"], m["depth"], m["dropout"], prepared.mean, prepared.std).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ds = WindowDataset(prepared.series.cpu().numpy(), prepared.speed.cpu().numpy(), prepared.train.cpu().numpy())
    loader = iter(torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True))
    model.train()

    def step():
        x, y = next(loader)
        x, y = x.to(device), y.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            pred = model(x)
        loss = masked_mae(pred.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()

    return batch * _steps_per_second(step, n_steps)


PEAK_SNIPPET = """
import resource, torch
from diagsink.config import load_config
from diagsink.data import load_metr_la
from diagsink.train import prepare
import benchmarks_training as bt
cfg = load_config("paper")
prepared = prepare(load_metr_la(), cfg, "cpu")
bt.bench_ours(cfg, prepared, 32, 1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory_paper_batch32() -> float:
    """Peak RSS (GiB) of a fresh process running one warm-up + one timed ``paper`` step at batch 32."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = PEAK_SNIPPET.replace("import benchmarks_training as bt", f"import sys; sys.path.insert(0, {here!r}); import training as bt")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 2**20  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per measurement (after 1 warm-up)")
    parser.add_argument("--protocols", default="quick,book,paper")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    from diagsink.data import load_metr_la

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    data = load_metr_la()
    print(f"data: {data.describe()}")
    print(f"device: {device} (torch {torch.__version__}, {torch.get_num_threads()} CPU threads)")
    print(f"{'protocol':8s} {'batch':>5s} {'ours samp/s':>12s} {'base samp/s':>12s} {'ratio':>6s} "
          f"{'ours s/epoch*':>14s} {'base s/epoch*':>14s}")
    for name in args.protocols.split(","):
        cfg = load_config(name)
        batch = cfg["train"]["batch_size"]
        if device.type == "cpu" and name == "paper":
            batch = 32  # the paper's batch of 128 takes minutes per step on 2 CPU cores
        prepared = prepare(data, cfg, device)
        ours = bench_ours(cfg, prepared, batch, args.steps)
        base = bench_baseline(cfg, prepared, batch, args.steps, device)
        print(f"{name:8s} {batch:5d} {ours:12.1f} {base:12.1f} {ours / base:6.2f} "
              f"{FULL_TRAIN_WINDOWS / ours:14.0f} {FULL_TRAIN_WINDOWS / base:14.0f}", flush=True)
    print("* seconds per epoch extrapolated to the full METR-LA training split (23,974 windows).")
    if not args.no_memory and device.type == "cpu":
        print(f"peak resident memory, paper protocol, batch 32, one training step on the CPU: "
              f"{peak_memory_paper_batch32():.2f} GiB (target: within 4 GB)")


if __name__ == "__main__":
    main()
