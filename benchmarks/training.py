"""Benchmark: training throughput of the T&S engine vs. a straightforward baseline, and peak memory.

Usage::

    python benchmarks/training.py [--device cpu|cuda] [--steps 3] [--protocols quick,book,paper]

For each protocol (``quick``, ``book``, ``paper``) it measures, in one run, a few timed
training steps (forward, masked-MAE loss, backward, clipping, AdamW) of

* **ours**: :class:`diagsink.model.TSModel` fed by the engine's vectorised
  ``protocol.gather`` from the series kept on the device (the code path of
  :func:`diagsink.engine.train.train_run`), including the graph convolution that mixes sensors;
* **reference** (same work): what one would write first: a per-sample
  ``torch.utils.data.Dataset`` and a ``DataLoader`` feeding blocks of ``nn.MultiheadAttention``
  over time per sensor and a Graph-WaveNet-style graph convolution written as dense ``einsum``s
  over the same supports and diffusion order, of the same width, heads and depth;
* **no graph** (today's baseline): the reference without its graph convolutions, i.e. the
  straightforward model (``DataLoader`` + ``nn.MultiheadAttention`` blocks, :class:`BaselineModel`)
  that does not mix sensors at all: less work than either of the two above. It is not ours
  minus the graph convolution, so it is no ceiling for ours: ours may pass it.

The three are timed alternately, step by step (median of the timed steps), so that other load on
a shared machine affects them alike. It prints samples/s and the ratios ours/reference and
ours/no-graph, and inference samples/s (eval, batch 256).
On the CPU all of it runs as the engine runs every CPU training: with glibc's mmap threshold
fixed, so that freed activation blocks go back to the OS instead of staying in the heap, and
PyTorch's transparent huge pages on, so that their fresh pages fault in 2 MiB at a time
(:func:`diagsink.engine.provenance.release_freed_memory_to_os`). It then measures the peak
resident memory of ``paper`` training steps, each in a fresh subprocess (``VmHWM`` from
``/proc/self/status``, the peak resident set size; ``ru_maxrss`` is not used because Linux
carries the parent's peak over into a child): at batch 32 for ours as the engine runs it, for
ours with glibc's and PyTorch's defaults (dynamic threshold, no huge pages), for ours with ``--low-memory`` (activation
checkpointing) and for the reference (glibc's default, as one would run it); and at the
``paper`` protocol's own batch of 128 for ours with and without ``--low-memory``.
Data: the real graph and the available speeds (``DIAGSINK_DATA``); throughput does not
depend on how many steps the file holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
from torch import nn

from diagsink.engine.config import load_config
from diagsink.engine.prepare import batch as gather_batch
from diagsink.engine.prepare import prepare
from diagsink.engine.provenance import git_commit, machine, release_freed_memory_to_os
from diagsink.engine.train import build_model
from diagsink.metrics import masked_mae

FULL_TRAIN_WINDOWS = 23974  # DCRNN split of the full 34,272-step METR-LA


class WindowDataset(torch.utils.data.Dataset):
    """Per-sample windows: ``(x [T_in, N, 2], y [T_out, N])`` sliced from numpy arrays."""

    def __init__(
        self,
        series: np.ndarray,
        speed: np.ndarray,
        starts: np.ndarray,
        t_in: int = 12,
        t_out: int = 12,
    ):
        self.series, self.speed, self.starts, self.t_in, self.t_out = (
            series,
            speed,
            starts,
            t_in,
            t_out,
        )

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
        self.attn = nn.ModuleList(
            nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True) for _ in range(depth)
        )
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


class EinsumGraphConv(nn.Module):
    """Graph WaveNet's layer written the obvious way: ``mix(cat([x, P x, P^2 x, ..., A x, A^2 x]))``.

    One dense ``einsum`` per support and hop over ``[B, T, N, C]``, the same fixed supports,
    the same learned adjacency ``softmax(relu(E_1 E_2^T))`` and diffusion order as ours.
    """

    def __init__(
        self, d: int, supports, order: int, adaptive: bool, n: int, embed: int, dropout: float
    ):
        super().__init__()
        self.supports = [s.clone() for s in supports]
        self.order = order
        self.e1 = nn.Parameter(torch.randn(n, embed)) if adaptive else None
        self.e2 = nn.Parameter(torch.randn(n, embed)) if adaptive else None
        n_terms = 1 + order * (len(supports) + int(adaptive))
        self.mix = nn.Linear(n_terms * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, N, C] -> [B, T, N, C]
        supports = [s.to(x.device) for s in self.supports]
        if self.e1 is not None:
            supports.append(torch.softmax(torch.relu(self.e1 @ self.e2.T), dim=1))
        terms = [x]
        for p in supports:
            h = x
            for _ in range(self.order):
                h = torch.einsum("nm,btmc->btnc", p.to(x.dtype), h)
                terms.append(h)
        return self.dropout(self.mix(torch.cat(terms, dim=-1)))


class ReferenceModel(BaselineModel):
    """The baseline plus, after each attention sublayer, the einsum graph conv (+ residual, LayerNorm)."""

    def __init__(
        self,
        d: int,
        heads: int,
        depth: int,
        dropout: float,
        mean: float,
        std: float,
        *,
        supports,
        order: int,
        adaptive: bool,
        embed: int,
    ):
        super().__init__(d, heads, depth, dropout, mean, std)
        n = supports[0].shape[0]
        self.gconvs = nn.ModuleList(
            EinsumGraphConv(d, supports, order, adaptive, n, embed, dropout) for _ in range(depth)
        )
        self.gnorms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, N, 2] -> [B, T, N]
        b, t, n, _ = x.shape
        tod = self.tod(x[..., 1:])
        h = self.embed(x[..., :1])
        for attn, norm, gconv, gnorm in zip(self.attn, self.norms, self.gconvs, self.gnorms):
            z = (h + tod).permute(0, 2, 1, 3).reshape(b * n, t, -1)
            z = norm(z + attn(z, z, z, need_weights=False)[0])
            h = z.reshape(b, n, t, -1).permute(0, 2, 1, 3)
            h = gnorm(h + gconv(h))
        out = self.readout(torch.cat([h, x[..., 1:]], -1)).squeeze(-1)
        return self.time_mix(out.transpose(1, 2)).transpose(1, 2) * self.std + self.mean


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def _update(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """The optimiser step both sides share: bf16 autocast on CUDA, masked MAE, clip 5, AdamW."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
        pred = model(x)
    loss = masked_mae(pred.float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    if x.is_cuda:
        torch.cuda.synchronize()


COMPILE = False  # set by --compile: torch.compile every model (measured as an option)


def _maybe_compile(model: nn.Module) -> nn.Module:
    return torch.compile(model) if COMPILE else model


def ours_step(cfg, prepared, batch: int, low_memory: bool = False):
    """One training step of the engine's code path (gather on the device, TSModel, masked MAE, clip, AdamW)."""
    torch.manual_seed(0)
    model = build_model(cfg, "dropout", prepared)
    model.checkpoint_blocks = low_memory
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    run = _maybe_compile(model)
    g = torch.Generator().manual_seed(0)

    def step():
        starts = prepared.train[
            torch.randint(len(prepared.train), (batch,), generator=g).to(prepared.train.device)
        ]
        x, y = gather_batch(prepared, starts, 12, 12)
        _update(run, opt, x, y)

    return step


def _straightforward_model(cfg, prepared, device: torch.device, graph: bool) -> nn.Module:
    m = cfg["model"]
    torch.manual_seed(0)
    if not graph:
        return BaselineModel(
            m["d_model"], m["n_heads"], m["depth"], m["dropout"], prepared.mean, prepared.std
        ).to(device)
    return ReferenceModel(
        m["d_model"],
        m["n_heads"],
        m["depth"],
        m["dropout"],
        prepared.mean,
        prepared.std,
        supports=[s.cpu() for s in prepared.supports],
        order=m["graph_order"],
        adaptive=m["adaptive_adjacency"],
        embed=m["node_embed_dim"],
    ).to(device)


def baseline_step(cfg, prepared, batch: int, device: torch.device, graph: bool = False):
    """One training step of the straightforward model (per-sample Dataset + DataLoader +
    nn.MultiheadAttention blocks; with ``graph`` the einsum graph conv too: the same-work reference)."""
    model = _maybe_compile(_straightforward_model(cfg, prepared, device, graph))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ds = WindowDataset(
        prepared.series.cpu().numpy(), prepared.speed.cpu().numpy(), prepared.train.cpu().numpy()
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True)
    batches = iter(loader)
    model.train()

    def step():
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        _update(model, opt, x.to(device), y.to(device))

    return step


def interleaved(*steps, n_steps: int) -> tuple[float, ...]:
    """Median seconds per step of each step function, timed alternately (a, b, a, b, ...) after one warm-up
    each, so that load from other processes on a shared machine affects all alike."""
    for step in steps:
        step()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(n_steps):
        for step, ts in zip(steps, times):
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
    return tuple(_median(ts) for ts in times)


PEAK_SNIPPET = """
import sys, torch
from diagsink.engine.config import load_config
from diagsink.data import load_metr_la
from diagsink.engine.prepare import prepare
sys.path.insert(0, HERE)
import training as bt
if FIXED:  # before the first large allocation, as train_run does
    from diagsink.engine.provenance import release_freed_memory_to_os
    assert release_freed_memory_to_os(), "could not fix glibc's mmap threshold"
cfg = load_config("paper")
prepared = prepare(load_metr_la(), cfg, "cpu")
step = (bt.baseline_step(cfg, prepared, BATCH, torch.device("cpu"), graph=True) if REF
        else bt.ours_step(cfg, prepared, BATCH, low_memory=LOW))
step(); step()
# VmHWM: this process's peak resident set (ru_maxrss would include the parent's peak: Linux keeps it across exec)
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0])
"""


def peak_memory_paper(
    low_memory: bool, fixed_mmap_threshold: bool = True, reference: bool = False, batch: int = 32
) -> float:
    """Peak RSS (GiB) of a fresh process running two ``paper`` training steps at ``batch`` on the CPU.

    ``fixed_mmap_threshold``: call :func:`~diagsink.engine.provenance.release_freed_memory_to_os`
    first, as the engine does for every CPU run (False: glibc's and PyTorch's defaults).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        PEAK_SNIPPET.replace("HERE", repr(here))
        .replace("FIXED", repr(fixed_mmap_threshold))
        .replace("LOW", repr(low_memory))
        .replace("REF", repr(reference))
        .replace("BATCH", repr(batch))
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout.strip().splitlines()[-1]) / 2**20  # VmHWM is in KiB


#: the peak-memory probes: JSON key -> (batch, low_memory, fixed mmap threshold, reference)
PEAK_PROBES = {
    "peak_gib_paper_batch32": {
        "ours": (32, False, True, False),
        "ours_glibc_default": (32, False, False, False),
        "ours_low_memory": (32, True, True, False),
        "reference": (32, False, False, True),
    },
    "peak_gib_paper_batch128": {
        "ours": (128, False, True, False),
        "ours_low_memory": (128, True, True, False),
    },
}


def inference_rate(
    cfg, prepared, device: torch.device, batch: int = 256, reps: int = 2
) -> tuple[float, float]:
    """Samples/s of eval forward passes (no gradient, batch ``batch``): ours, the same-work reference."""
    torch.manual_seed(0)
    ours = build_model(cfg, "dropout", prepared).eval()
    ref = _straightforward_model(cfg, prepared, device, graph=True).eval()
    starts = prepared.train[torch.randint(len(prepared.train), (batch,))]
    x, _ = gather_batch(prepared, starts, 12, 12)
    times: list[list[float]] = [[], []]
    with (
        torch.no_grad(),
        torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"),
    ):
        for r in range(reps + 1):
            for model, ts in zip((ours, ref), times):
                t0 = time.perf_counter()
                model(x)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if r:  # the first round is a warm-up
                    ts.append(time.perf_counter() - t0)
    return batch / _median(times[0]), batch / _median(times[1])


def main() -> None:
    global COMPILE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--steps",
        type=int,
        default=3,
        help="timed steps of each (after 1 warm-up), interleaved; medians",
    )
    parser.add_argument("--protocols", default="quick,book,paper")
    parser.add_argument(
        "--quick", action="store_true", help="quick,book only, 2 steps, no memory probe (< 2 min)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile every model (an option measured)"
    )
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--out", default=None, help="JSON table (default benchmarks/results/training_<device>.json)"
    )
    args = parser.parse_args()
    from diagsink._io import atomic_write_text
    from diagsink.data import load_metr_la

    if args.quick:
        args.protocols, args.steps, args.no_memory = "quick,book", 2, True
    COMPILE = args.compile
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    fixed = device.type == "cpu" and release_freed_memory_to_os()  # as train_run on the CPU
    data = load_metr_la()
    table: dict = {
        "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "git_commit": git_commit(),
        "machine": machine(),
        "data": data.describe(),
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "compile": COMPILE,
        "autocast": "bf16" if device.type == "cuda" else None,
        "malloc": (
            "glibc mmap threshold fixed, PyTorch THP on (the engine's CPU default)"
            if fixed
            else None
        ),
        "rows": [],
    }
    print(f"UTC {table['utc']}, git commit {table['git_commit']}, {table['machine']}")
    print(f"data: {table['data']}")
    print(
        f"device: {device} (torch {torch.__version__}, {torch.get_num_threads()} CPU threads), "
        f"{args.steps} timed steps each after 1 warm-up, interleaved, median; compile={COMPILE}"
    )
    print(
        f"{'protocol':8s} {'batch':>5s} {'ours':>8s} {'ref':>8s} {'no-graph':>8s} {'ours/ref':>8s} "
        f"{'ours/no-graph':>13s} {'infer ours':>10s} {'infer ref':>9s}   (samples/s)"
    )
    for name in [p for p in args.protocols.split(",") if p]:
        cfg = load_config(name)
        batch = cfg["train"]["batch_size"]
        if device.type == "cpu" and name == "paper":
            batch = 32  # the paper's batch of 128 takes minutes per step on 2 CPU cores
        prepared = prepare(data, cfg, device)
        t_ours, t_ref, t_bare = interleaved(
            ours_step(cfg, prepared, batch),
            baseline_step(cfg, prepared, batch, device, graph=True),
            baseline_step(cfg, prepared, batch, device),
            n_steps=args.steps,
        )
        inf_ours, inf_ref = inference_rate(cfg, prepared, device)
        row = {
            "protocol": name,
            "batch": batch,
            "ours": batch / t_ours,
            "reference": batch / t_ref,
            "no_graph": batch / t_bare,
            "ours_over_reference": t_ref / t_ours,
            "ours_over_no_graph": t_bare / t_ours,
            "inference_batch": 256,
            "inference_ours": inf_ours,
            "inference_reference": inf_ref,
        }
        table["rows"].append(row)
        print(
            f"{name:8s} {batch:5d} {row['ours']:8.1f} {row['reference']:8.1f} {row['no_graph']:8.1f} "
            f"{row['ours_over_reference']:8.2f} {row['ours_over_no_graph']:13.2f} {inf_ours:10.1f} "
            f"{inf_ref:9.1f}",
            flush=True,
        )
    print(
        "ref: nn.MultiheadAttention + einsum graph conv (same spatial work), fed by a Dataset + DataLoader;"
    )
    print(
        "no-graph: today's baseline, that straightforward model without graph convolutions "
        "(no sensor mixing; less work than ours and ref)."
    )
    if not args.no_memory and device.type == "cpu":
        print(
            "peak resident memory (VmHWM), paper protocol, two training steps (target: 4 GB at batch 32):"
        )
        for key, probes in PEAK_PROBES.items():
            table[key] = {}
            for name, (batch, low, fixed_threshold, ref) in probes.items():
                gib = peak_memory_paper(low, fixed_threshold, reference=ref, batch=batch)
                table[key][name] = gib
                print(f"  batch {batch:3d} {name:20s} {gib:6.2f} GiB", flush=True)
        print(
            "ours: as the engine trains on the CPU (glibc mmap threshold fixed, THP); glibc_default: "
            "without that; low_memory: + activation checkpointing; reference: the defaults."
        )
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        "results",
        f"training_{device.type}{'_compile' if COMPILE else ''}.json",
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    atomic_write_text(out, json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
