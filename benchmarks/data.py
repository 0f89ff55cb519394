"""Benchmark: load full-size METR-LA and cut it into windows (target: < 2 s, < 2x the raw matrix's memory).

Usage::

    python benchmarks/data.py [--root DIR]

If the folder (``--root``, else ``DIAGSINK_DATA``) has the full ``metr-la.h5``, that file is
used. Otherwise a SYNTHETIC series of the full shape (34272 x 207, float64, the real time
range and, when available, the real sensor ids and graph files) is written to a temporary
folder and loaded through the same code path; the output says which.

Measured in one run: the wall time of ``load_metr_la`` (read + validate + checksum), of
building DCRNN's splits and the zero-copy window view, and of gathering one epoch of training
batches; the peak of Python-traced memory (``tracemalloc``: numpy and pandas buffers) during
loading and windowing, as a multiple of the raw float64 matrix (34272 x 207 x 8 bytes).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from diagsink import data as D
from diagsink.data import windows as P


def synthetic_folder(dest: Path, source: Path) -> Path:
    """A data folder with a SYNTHETIC full-shape speed file (and real graph files when ``source`` has them)."""
    dest.mkdir(parents=True, exist_ok=True)
    have_graph = all((source / n).is_file() for n in D.GRAPH_FILES)
    if have_graph:
        for name in D.GRAPH_FILES:
            shutil.copy(source / name, dest / name)
        ids = D.read_sensor_ids(dest / "graph_sensor_ids.txt")
    else:
        ids = [str(700000 + i) for i in range(D.N_SENSORS)]
        (dest / "graph_sensor_ids.txt").write_text(",".join(ids))
        pd.DataFrame(
            {"index": range(len(ids)), "sensor_id": ids, "latitude": 34.0, "longitude": -118.3}
        ).to_csv(dest / "graph_sensor_locations.csv", index=False)
        np.save(dest / "adj_mx.npy", np.eye(len(ids), dtype=np.float32))
    rng = np.random.default_rng(0)
    index = pd.date_range(D.FULL_START, periods=D.FULL_STEPS, freq="5min")
    speed = np.round(rng.uniform(20, 70, size=(D.FULL_STEPS, len(ids))) * 8) / 8
    speed[rng.random(speed.shape) < 0.08] = 0.0
    pd.DataFrame(speed, index=index, columns=ids).to_hdf(dest / "metr-la.h5", key="df")
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    root = D.resolve_root(args.root)
    real = (root / "metr-la.h5").is_file()
    tmp = None
    if real:
        folder = root
        print(f"data: the real full file {root / 'metr-la.h5'}")
    else:
        tmp = tempfile.TemporaryDirectory(prefix="diagsink-bench-")
        folder = synthetic_folder(Path(tmp.name), root)
        print(
            f"data: SYNTHETIC series of the full shape {D.FULL_STEPS} x {D.N_SENSORS} "
            f"(no metr-la.h5 in {root}), written to a temporary folder"
        )

    raw_bytes = D.FULL_STEPS * D.N_SENSORS * 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # warm the OS file cache and the imports: time the code, not the disk
        pd.read_hdf(folder / "metr-la.h5", "df")

    tracemalloc.start()
    t0 = time.perf_counter()
    data = D.load_metr_la(folder, download=False)
    t1 = time.perf_counter()
    load_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    splits = P.split_windows(data.n_steps)
    series = torch.from_numpy(data.speed)  # shares memory with data.speed
    windows = P.sliding_windows(series, 24)  # [W, 24, N] view, no copy
    x = P.gather(series, splits.train[: args.batch], 12)
    y = P.gather(series, splits.train[: args.batch], 12, offset=12)
    t2 = time.perf_counter()
    window_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    t3 = time.perf_counter()
    n = 0
    for i in range(0, len(splits.train), args.batch):
        idx = splits.train[i : i + args.batch]
        xb, _yb = P.gather(series, idx, 12), P.gather(series, idx, 12, offset=12)
        n += xb.shape[0]
    t4 = time.perf_counter()

    print(data.describe())
    print(
        f"windows: {splits.counts()} ({splits.order}); view {tuple(windows.shape)} shares memory: "
        f"{windows.data_ptr() == series.data_ptr()}; batch x {tuple(x.shape)}, y {tuple(y.shape)}"
    )
    total = t2 - t0
    peak = max(load_peak, window_peak)
    print(f"load_metr_la:            {t1 - t0:7.3f} s")
    print(f"splits + window view:    {t2 - t1:7.3f} s")
    print(
        f"load + windowing:        {total:7.3f} s   (target < 2 s: {'OK' if total < 2 else 'OVER'})"
    )
    print(
        f"peak traced memory:      {peak / 2**20:7.1f} MiB = {peak / raw_bytes:.2f} x the raw matrix "
        f"({raw_bytes / 2**20:.1f} MiB; target < 2x: {'OK' if peak < 2 * raw_bytes else 'OVER'})"
    )
    print(
        f"one epoch of batches:    {t4 - t3:7.3f} s   ({n} training windows, batch {args.batch}, gathered by indexing)"
    )
    if tmp is not None:
        tmp.cleanup()
    return 0 if total < 2 and peak < 2 * raw_bytes else 1


if __name__ == "__main__":
    sys.exit(main())
