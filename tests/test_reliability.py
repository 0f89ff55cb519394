"""Reliability across the whole package: bad input, interruptions, determinism, nothing lost.

* **Bad input** (tests marked ``bad_input``; the terminal summary prints how many were tried):
  every public entry point, including every command line command, answers bad input with an
  error that names the problem *and* the fix; the command line prints exactly one line that
  starts with ``error:`` (no traceback) and exits with status 2. Cases already covered by the
  per-module tests are not repeated here: see ``test_attention.py`` (layer arguments and input
  tensors), ``test_positional.py``, ``test_model.py`` (graph convolution, unknown variant,
  input layout), ``test_data.py`` (missing files, wrong columns, index gaps, NaN/inf/negative
  speeds, truncated HDF, pickles), ``test_protocol.py``, ``test_metrics.py`` (all-masked
  batches), ``test_train.py`` (misspelt keys, unknown protocol and variant, escaping paths),
  ``test_course.py`` (export folders) and ``test_download.py`` (bad mirrors).
* **Interruptions**: ``kill -9`` during a download, during artifact writes and during
  ``reproduce``; the rerun recovers and never reads a half-written file. (``kill -9`` during
  training and the resume from the checkpoint: ``test_train.py``.)
* **Determinism**: the same seed gives identical metrics in two separate processes.
* **Properties** (hypothesis): window indexing of the splits; masked metrics ignore masked
  entries. (Attention rows and masks: ``test_attention.py``; metrics against NumPy:
  ``test_metrics.py``.)

All data here is SYNTHETIC (5 made-up sensors); nothing is read from the METR-LA folder.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import diagsink as ds
from diagsink.cli import main
from diagsink.data import windows as P
from diagsink.engine.config import load_config, override
from diagsink.errors import ConfigError, DataError, DiagsinkError
from diagsink.variants import VARIANTS

import _fileserver  # tests/_fileserver.py: the local HTTP server over in-memory files
from conftest import ROOT

IDS = ["201", "202", "203", "204", "205"]
TINY = {
    "model.d_model": 8,
    "model.n_heads": 2,
    "model.depth": 1,
    "model.node_embed_dim": 3,
    "train.epochs": 2,
    "train.batch_size": 16,
    "train.eval_batch_size": 64,
    "train.max_train_windows": 32,
    "train.warmup_epochs": 1,
    "train.lr": 5e-3,
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


# ---------------------------------------------------------------- synthetic inputs
def make_data(root: Path, *, steps: int = 300, speed: np.ndarray | None = None) -> Path:
    """A valid, SYNTHETIC data folder with 5 sensors (not METR-LA data)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "graph_sensor_ids.txt").write_text(",".join(IDS))
    pd.DataFrame(
        {
            "index": range(5),
            "sensor_id": IDS,
            "latitude": np.linspace(34.0, 34.2, 5),
            "longitude": np.linspace(-118.4, -118.2, 5),
        }
    ).to_csv(root / "graph_sensor_locations.csv", index=False)
    adj = np.eye(5, dtype=np.float32) + np.diag(np.full(4, 0.5, dtype=np.float32), 1)
    (root / "adj_mx.pkl").write_bytes(
        pickle.dumps((IDS, {s: i for i, s in enumerate(IDS)}, adj), protocol=4)
    )
    if speed is None:
        rng = np.random.default_rng(0)
        t = np.arange(steps)[:, None]
        speed = 60 + 8 * np.sin(2 * np.pi * t / 288 + np.arange(5)) + rng.normal(0, 1.5, (steps, 5))
        speed[rng.random(speed.shape) < 0.02] = 0.0
    index = pd.date_range("2012-03-01", periods=len(speed), freq="5min")
    pd.DataFrame(speed, index=index, columns=IDS).to_hdf(root / "metr-la.h5", key="df")
    return root


def tiny_protocol(path: Path, **extra) -> Path:
    """A valid custom protocol file (tiny model, 2 epochs)."""
    cfg = override(load_config("quick"), {**TINY, **extra})
    cfg["protocol"] = "custom-tiny"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Folders and files the bad-input table points at (each built once)."""
    base = tmp_path_factory.mktemp("inputs")
    out: dict[str, Path] = {"base": base, "empty": base / "empty", "file": base / "a_file"}
    out["empty"].mkdir()
    out["file"].write_text("not a folder")
    out["good"] = make_data(base / "good")
    # 3 windows of 24 steps: no validation window
    out["short"] = make_data(base / "short", steps=26)
    corrupt = make_data(base / "corrupt")
    rng = np.random.default_rng(1)
    (corrupt / "metr-la.h5").write_bytes(rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    out["corrupt"] = corrupt
    series = make_data(base / "series")  # a Series, not a DataFrame
    pd.Series(np.ones(40), index=pd.date_range("2012-03-01", periods=40, freq="5min")).to_hdf(
        series / "metr-la.h5", key="df"
    )
    out["series"] = series
    twokeys = make_data(base / "twokeys")
    frame = pd.read_hdf(twokeys / "metr-la.h5", "df")
    (twokeys / "metr-la.h5").unlink()
    frame.to_hdf(twokeys / "metr-la.h5", key="speed", format="table")
    frame.to_hdf(twokeys / "metr-la.h5", key="other", format="table")
    out["twokeys"] = twokeys
    out["tiny"] = tiny_protocol(base / "tiny.yaml")
    cfg = yaml.safe_load(out["tiny"].read_text())
    cfg["train"]["epoch"] = cfg["train"].pop("epochs")
    (base / "misspelt.yaml").write_text(yaml.safe_dump(cfg))
    out["misspelt"] = base / "misspelt.yaml"
    (base / "broken.yaml").write_text("protocol: custom-tiny\nmodel: d_model: 8\n")
    out["broken"] = base / "broken.yaml"
    for name, protocol in (("escape", "custom-../../outside"), ("absolute", "/tmp/custom-abs")):
        cfg = yaml.safe_load(out["tiny"].read_text())
        cfg["protocol"] = protocol
        (base / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        out[name] = base / f"{name}.yaml"
    (base / "extends.yaml").write_text("extends: custom-tiny\nprotocol: custom-tinier\n")
    out["extends"] = base / "extends.yaml"
    cfg = yaml.safe_load(out["tiny"].read_text())
    cfg["data"]["ratios"] = ["0.7", 0.1, 0.2]
    (base / "ratios.yaml").write_text(yaml.safe_dump(cfg))
    out["ratios"] = base / "ratios.yaml"
    return out


# ---------------------------------------------------------------- the API table
def _api_cases():
    """(id, call(inputs), exception type, words that must all appear in the message)."""
    from diagsink.data import toy_data
    from diagsink.engine.train import train_run
    from diagsink.graphconv import DiffusionGraphConv
    from diagsink.model import TSModel

    def diverging(_):
        data = toy_data(200, 4)
        # a model fed NaN cannot learn: the run must stop with a clear message
        data.speed[:] = np.nan
        from diagsink.engine.prepare import prepare

        cfg = override(load_config("quick"), TINY)
        prepared = prepare(data, cfg)
        return train_run(
            cfg, "none", 0, prepared=prepared, device="cpu", write=False, progress=False
        )

    eye = [torch.eye(5)]
    return [
        (
            "TSModel depth=0",
            lambda i: TSModel(5, eye, depth=0),
            ConfigError,
            ["depth=0", "positive integer", "model.depth"],
        ),
        (
            "TSModel t_in=0",
            lambda i: TSModel(5, eye, t_in=0),
            ConfigError,
            ["t_in=0", "positive integer"],
        ),
        (
            "TSModel n_nodes=0",
            lambda i: TSModel(0, eye),
            ConfigError,
            ["n_nodes=0", "number of sensors"],
        ),
        (
            "TSModel heads",
            lambda i: TSModel(5, eye, d_model=10, n_heads=4),
            ConfigError,
            ["n_heads=4", "divisors"],
        ),
        (
            "graph conv order=0",
            lambda i: DiffusionGraphConv(4, eye, order=0),
            ValueError,
            ["order=0", "positive integer"],
        ),
        (
            "split: no validation window",
            lambda i: P.split_windows(26),
            DataError,
            ["val part", "0 of the 3", "Fix", "more data"],
        ),
        (
            "split: zero ratio",
            lambda i: P.split_windows(500, ratios=(0.9, 0.0, 0.1)),
            DataError,
            ["val part", "ratio > 0"],
        ),
        (
            "adjacency: not square",
            lambda i: ds.data.adjacency.diffusion_supports(np.ones((3, 4))),
            DataError,
            ["square [N, N]", "(3, 4)", "Fix"],
        ),
        (
            "adjacency: negative weight",
            lambda i: ds.data.adjacency.random_walk(torch.tensor([[1.0, -0.5], [0.0, 1.0]])),
            DataError,
            ["non-negative", "Fix"],
        ),
        (
            "adjacency: NaN weight",
            lambda i: ds.data.adjacency.symmetric_normalize(np.array([[1.0, np.nan], [0.0, 1.0]])),
            DataError,
            ["NaN", "Fix"],
        ),
        (
            "sliding windows longer than the series",
            lambda i: P.sliding_windows(torch.randn(5, 3), 10),
            DataError,
            ["length 10", "5 steps", "Fix"],
        ),
        (
            "historical average: timestamps missing",
            lambda i: ds.data.baselines.historical_average_table(
                np.ones((300, 2)), pd.date_range("2012-03-01", periods=200, freq="5min"), 100
            ),
            DataError,
            ["one timestamp per step", "200 timestamps", "Fix"],
        ),
        (
            "last value: window outside",
            lambda i: ds.data.baselines.last_value(np.ones((30, 2)), torch.tensor([25])),
            DataError,
            ["outside the series of 30 steps", "Fix"],
        ),
        (
            "load: random bytes as HDF",
            lambda i: ds.data.load_metr_la(i["corrupt"]),
            DataError,
            ["cannot be read", "truncated", "diagsink data download"],
        ),
        (
            "load: a Series",
            lambda i: ds.data.load_metr_la(i["series"]),
            DataError,
            ["Series", "not a DataFrame", "Fix"],
        ),
        (
            "load: two tables, no df",
            lambda i: ds.data.load_metr_la(i["twokeys"]),
            DataError,
            ["not 'df'", "Fix", "key='df'"],
        ),
        (
            "load: a file as folder",
            lambda i: ds.data.load_metr_la(i["file"]),
            DataError,
            ["missing", "diagsink data download"],
        ),
        (
            "config: broken YAML",
            lambda i: load_config(i["broken"]),
            ConfigError,
            ["not valid YAML", "line 2", "Fix"],
        ),
        (
            "config: ratios as text",
            lambda i: load_config(i["ratios"]),
            ConfigError,
            ["data.ratios", "three fractions"],
        ),
        (
            "config: protocol with ..",
            lambda i: load_config(i["escape"]),
            ConfigError,
            ["plain name", "no '/' or '..'"],
        ),
        (
            "config: absolute protocol",
            lambda i: load_config(i["absolute"]),
            ConfigError,
            ["plain name"],
        ),
        (
            "config: extends a file",
            lambda i: load_config(i["extends"]),
            ConfigError,
            ["extends = 'custom-tiny' is not a shipped protocol", "choose one of paper"],
        ),
        (
            "config: no such file",
            lambda i: load_config(i["base"] / "nope.yaml"),
            ConfigError,
            ["does not exist", "paper, book, quick"],
        ),
        (
            "config: override typo",
            lambda i: override(load_config("quick"), {"trian.lr": 1.0}),
            ConfigError,
            ["unknown config section", "sections: model"],
        ),
        (
            "train_run: no out_dir",
            lambda i: train_run("quick", "none", 0, data=toy_data(), write=True, out_dir=None),
            ConfigError,
            ["needs out_dir"],
        ),
        (
            "train_run: device",
            lambda i: train_run("quick", "none", 0, data=toy_data(), device="gpu", write=False),
            ValueError,
            ["'gpu' is not a device", "cpu or cuda"],
        ),
        (
            "train_run: seed",
            lambda i: train_run("quick", "none", -1, data=toy_data(), write=False),
            ConfigError,
            ["seed -1", "integer in [0, 2**31)"],
        ),
        ("train_run: diverges", diverging, DiagsinkError, ["diverged", "Fix: lower train.lr"]),
        (
            "exercise: unknown label",
            lambda i: ds.exercises.check("ex-attention-nope", lambda: None),
            KeyError,
            ["no exercise 'ex-attention-nope'", "known exercises", "ex-attention-mask"],
        ),
    ]


API = _api_cases()


@pytest.mark.bad_input
@pytest.mark.parametrize("name, call, kind, words", API, ids=[c[0] for c in API])
def test_api_bad_input_names_problem_and_fix(inputs, name, call, kind, words):
    with pytest.raises(kind) as info:
        call(inputs)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "value, words",
    [
        ("tpu", ["DIAGSINK_DEVICE='tpu'", "cpu or cuda"]),
        ("cuda:7", ["DIAGSINK_DEVICE='cuda:7'", "GPU", "Fix"]),
    ],
)
def test_bad_device_variable(monkeypatch, capsys, value, words):
    if value.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    monkeypatch.setenv("DIAGSINK_DEVICE", value)
    with pytest.raises(ValueError) as info:
        ds.settings()
    assert all(w in str(info.value) for w in words), info.value
    assert main(["info"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DIAGSINK_DEVICE=") and err.count("\n") == 1


# ---------------------------------------------------------------- the command line table
CLI = [
    # (id, argv with {placeholders}, words in the one error line)
    ("no command", [], ["required: COMMAND", "--help"]),
    ("unknown command", ["trian"], ["invalid choice: 'trian'", "train", "reproduce"]),
    ("info: unknown option", ["info", "--verbose"], ["unrecognized arguments: --verbose"]),
    ("data: no action", ["data"], ["required: ACTION", "diagsink data --help"]),
    ("data: unknown action", ["data", "fetch"], ["invalid choice: 'fetch'", "download"]),
    (
        "data info: empty folder",
        ["data", "info", "--root", "{empty}"],
        ["files missing", "diagsink data download --root"],
    ),
    (
        "data verify: a file as root",
        ["data", "verify", "--root", "{file}"],
        ["files missing", "diagsink data download"],
    ),
    (
        "data verify: corrupt HDF",
        ["data", "verify", "--root", "{corrupt}"],
        ["cannot be read", "truncated", "Fix"],
    ),
    (
        "data download: root under a file",
        ["data", "download", "--root", "{file}/x", "--no-progress"],
        ["cannot create the data folder", "Fix: pass --root"],
    ),
    ("train: no variant", ["train"], ["required: --variant"]),
    (
        "train: unknown variant",
        ["train", "--variant", "masked"],
        ["invalid choice: 'masked'", "'mask'", "'penalty'"],
    ),
    (
        "train: unknown protocol",
        ["train", "--variant", "none", "--protocol", "papr", "--out", "{out}"],
        ["protocol 'papr' is not known", "paper, book, quick"],
    ),
    (
        "train: misspelt config key",
        ["train", "--variant", "none", "--protocol", "{misspelt}", "--out", "{out}"],
        ["unknown config key train.epoch", "epochs", "check the spelling"],
    ),
    (
        "train: broken YAML",
        ["train", "--variant", "none", "--protocol", "{broken}", "--out", "{out}"],
        ["not valid YAML", "line 2", "Fix the file"],
    ),
    (
        "train: protocol escapes --out",
        ["train", "--variant", "none", "--protocol", "{escape}", "--out", "{out}"],
        ["plain name", "no '/' or '..'"],
    ),
    (
        "train: negative seed",
        ["train", "--variant", "none", "--seed", "-1"],
        ["--seed", "non-negative"],
    ),
    (
        "train: seed not a number",
        ["train", "--variant", "none", "--seed", "one"],
        ["'one' is not a whole number"],
    ),
    (
        "train: unknown device",
        ["train", "--variant", "none", "--device", "tpu"],
        ["'tpu' is not a device", "cpu or cuda"],
    ),
    (
        "train: --out under a file",
        ["train", "--variant", "none", "--protocol", "{tiny}", "--out", "{file}/results"],
        ["is a file, not a folder", "choose another --out"],
    ),
    (
        "train: --out not writable",
        ["train", "--variant", "none", "--protocol", "{tiny}", "--out", "{readonly}"],
        ["not writable", "Fix: choose a writable folder"],
    ),
    (
        "train: no data",
        [
            "train",
            "--variant",
            "none",
            "--protocol",
            "{tiny}",
            "--data",
            "{empty}",
            "--out",
            "{out}",
        ],
        ["files missing", "diagsink data download --root"],
    ),
    (
        "train: data too short",
        [
            "train",
            "--variant",
            "none",
            "--protocol",
            "{tiny}",
            "--data",
            "{short}",
            "--out",
            "{out}",
            "--no-progress",
        ],
        ["val part", "Fix: load more data"],
    ),
    (
        "reproduce: zero seeds",
        ["reproduce", "--seeds", "0", "--out", "{out}"],
        ["--seeds must be at least 1"],
    ),
    (
        "reproduce: unknown variant",
        ["reproduce", "--variants", "none,masked", "--out", "{out}"],
        ["unknown variant 'masked'", "choose from"],
    ),
    (
        "reproduce: --out is a file",
        ["reproduce", "--protocol", "{tiny}", "--out", "{file}"],
        ["is a file, not a folder"],
    ),
    (
        "reproduce: absolute protocol name",
        ["reproduce", "--protocol", "{absolute}", "--out", "{out}"],
        ["plain name"],
    ),
    ("course: no action", ["course"], ["required"]),
    (
        "course export: --out is a file",
        ["course", "export", "--out", "{file}"],
        ["is a file, not a folder"],
    ),
    (
        "course export: empty --out",
        ["course", "export", "--out", ""],
        ["--out is empty", "Fix"],
    ),
    (
        "probe: empty --out",
        ["probe", "missing.json", "--out", ""],
        ["--out is empty", "Fix"],
    ),
    (
        "course grade: --timeout 0",
        ["course", "grade", "x.ipynb", "--timeout", "0"],
        ["--timeout", "at least 1"],
    ),
    (
        "course check: no book here",
        ["course", "check", "--source", "{empty}"],
        ["no _toc.yml", "pass --source"],
    ),
]


@pytest.mark.bad_input
@pytest.mark.parametrize("name, argv, words", CLI, ids=[c[0] for c in CLI])
def test_cli_bad_input_is_one_error_line(inputs, tmp_path, monkeypatch, capsys, name, argv, words):
    places = {k: str(v) for k, v in inputs.items()}
    places["out"] = str(tmp_path / "results")
    places["readonly"] = str(tmp_path / "readonly")
    if "{readonly}" in argv:
        # root ignores permission bits, so the test makes os.access answer as for a normal user
        Path(places["readonly"]).mkdir()
        real = os.access
        monkeypatch.setattr(
            os,
            "access",
            lambda p, mode, **kw: False if str(p) == places["readonly"] else real(p, mode, **kw),
        )
    argv = [a.format(**places) for a in argv]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse
        status = exc.code
    captured = capsys.readouterr()
    assert status == 2, (status, captured)
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    assert not Path(places["out"]).exists() or not any(Path(places["out"]).rglob("*.json"))


def test_cli_errors_in_a_real_process_have_no_traceback(inputs):
    """The console script itself (not only ``main``): one ``error:`` line, status 2, for each kind of failure."""
    code = textwrap.dedent("""
        import sys
        from diagsink.cli import main
        for argv in {argvs}:
            try:
                status = main(argv)
            except SystemExit as exc:
                status = exc.code
            print(status)
    """).format(
        argvs=repr(
            [
                ["train", "--variant", "masked"],
                [
                    "train",
                    "--variant",
                    "none",
                    "--protocol",
                    str(inputs["tiny"]),
                    "--out",
                    str(inputs["file"]),
                ],
                ["data", "verify", "--root", str(inputs["corrupt"])],
                [],
            ]
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "2", "2", "2"]
    lines = out.stderr.splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "diagsink", "train", "--variant", "penalty", "--device", "tpu"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert (
        out.returncode == 2 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    )


# ---------------------------------------------------------------- interruptions: download
DOWNLOADER = textwrap.dedent("""
    import sys
    from diagsink.data import download as DL
    server, mode, root, size, sha = sys.argv[1:6]
    DL.GRAPH_URL = server + "/ok/{name}"
    DL.OPTIONAL_GRAPH_BLOBS = {}
    DL.GRAPH_BLOBS = dict(eval(sys.argv[6]))
    DL.EXPECTED_SIZE, DL.EXPECTED_SHA256, DL.TIMEOUT = int(size), sha, 60.0
    DL.SPEED_MIRRORS = [DL.Mirror(server + "/" + mode + "/full.h5", kind="h5")]
    DL.download_metr_la(root, progress=False)
    print("done")
""")


@pytest.mark.slow
def test_kill_minus_9_during_download_then_rerun(tmp_path):
    """A download killed mid-transfer leaves only a ``.part`` file, which is never read; the rerun completes."""
    import hashlib

    from diagsink import data as D
    from diagsink.data import download as DL

    # the served files: synthetic graph files for 207 made-up sensors and a synthetic full-shape speed matrix
    ids = [str(700000 + i) for i in range(D.N_SENSORS)]
    graph = {
        "graph_sensor_ids.txt": ",".join(ids).encode(),
        "graph_sensor_locations.csv": pd.DataFrame(
            {"index": range(len(ids)), "sensor_id": ids, "latitude": 34.0, "longitude": -118.3}
        )
        .to_csv(index=False)
        .encode(),
        "adj_mx.pkl": pickle.dumps(
            (ids, {s: i for i, s in enumerate(ids)}, np.eye(len(ids), dtype=np.float32)), protocol=4
        ),
    }
    index = pd.date_range(D.FULL_START, periods=D.FULL_STEPS, freq="5min")
    day = np.round(8 * (60 - 10 * np.sin(np.arange(288) / 288 * 2 * np.pi))) / 8
    speed = np.tile(day, D.FULL_STEPS // 288)[:, None] + np.zeros((1, len(ids)))
    pd.DataFrame(speed, index=index, columns=ids).to_hdf(
        tmp_path / "full.h5", key="df", complevel=1, complib="zlib"
    )
    files = {**graph, "full.h5": (tmp_path / "full.h5").read_bytes()}
    httpd, server = _fileserver.start(files)
    blobs = repr({n: DL.git_blob_sha1(b) for n, b in graph.items()})
    size, sha = str(len(files["full.h5"])), hashlib.sha256(files["full.h5"]).hexdigest()
    root = tmp_path / "data"
    script = tmp_path / "dl.py"
    script.write_text(DOWNLOADER)
    try:
        proc = subprocess.Popen(
            [sys.executable, str(script), server, "stall", str(root), size, sha, blobs],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        part = root / "metr-la.h5.part"
        deadline = time.time() + 60
        # opened: the transfer is under way (and stalls)
        while time.time() < deadline and not part.exists():
            assert proc.poll() is None, proc.communicate()[1][-800:]
            time.sleep(0.05)
        assert part.exists(), "the download never started"
        time.sleep(0.5)
        assert proc.poll() is None, "the download should still be waiting for the stalled server"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the half file has no final name; loading reports the missing file instead of reading it
        assert not (root / "metr-la.h5").exists()
        with pytest.raises(DataError, match="missing.*metr-la.h5"):
            D.load_metr_la(root, download=False)
        rerun = subprocess.run(
            [sys.executable, str(script), server, "ok", str(root), size, sha, blobs],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rerun.returncode == 0 and "done" in rerun.stdout, rerun.stderr
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert not part.exists()
    data = D.load_metr_la(root, download=False)
    assert data.is_full and data.sha256 == sha
    assert DL.read_manifest(root)["files"]["metr-la.h5"]["sha256"] == sha


# ---------------------------------------------------------------- interruptions: artifact writes
WRITER = textwrap.dedent("""
    import copy, sys
    from diagsink._io import atomic_write_bytes
    from diagsink.engine.artifacts import write_artifact
    from diagsink.engine.config import load_config, override
    from diagsink.engine.runs import run_paths
    from diagsink.data import toy_data
    from diagsink.engine.train import train_run
    out = sys.argv[1]
    cfg = override(load_config("quick"), {tiny!r})
    art = train_run(cfg, "penalty", 0, data=toy_data(120, 3), device="cpu", write=False, progress=False)
    print("ready", flush=True)
    for seed in range(10_000):
        a = copy.deepcopy(art)
        a["seed"] = a["provenance"]["seed"] = seed
        paths = run_paths(out, "quick", "penalty", seed)
        atomic_write_bytes(paths["state"], bytes([seed % 251]) * 8_000_000)  # big: a kill often lands mid-write
        write_artifact(paths["json"], a)
""")


@pytest.mark.slow
def test_kill_minus_9_during_artifact_writes_leaves_only_whole_files(tmp_path):
    from diagsink.engine.artifacts import load_artifact, load_results

    script = tmp_path / "writer.py"
    script.write_text(
        WRITER.replace("{tiny!r}", repr({**TINY, "train.epochs": 1, "train.warmup_epochs": 0}))
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    folder = out / "quick"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(folder.glob("*.json"))) < 3:
        time.sleep(0.01)
    time.sleep(0.137)  # land somewhere inside a later write
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    jsons = sorted(folder.glob("*.json"))
    assert len(jsons) >= 3
    for path in jsons:  # every artifact under its final name is whole and passes its checksum
        art = load_artifact(path)
        assert path.name == f"penalty_seed{art['seed']}.json"
    for path in folder.glob("*.pt"):  # every state file under its final name is whole
        seed = int(path.stem.removeprefix("penalty_seed"))
        raw = path.read_bytes()
        assert len(raw) == 8_000_000 and raw == bytes([seed % 251]) * 8_000_000, path
    leftovers = [p.name for p in folder.iterdir() if p.suffix not in (".json", ".pt")]
    # temp names only
    assert all(n.startswith(".") and n.endswith(".tmp") for n in leftovers), leftovers
    assert len(load_results(folder)) == len(jsons)  # the loader never sees a temp file


# ---------------------------------------------------------------- nothing lost: reproduce
REPRODUCER = textwrap.dedent("""
    import sys
    from diagsink.cli import main
    sys.exit(main(["reproduce", "--protocol", sys.argv[1], "--data", sys.argv[2], "--out", sys.argv[3],
                   "--seeds", "1", "--device", "cpu", "--no-progress"]))
""")


@pytest.mark.slow
def test_kill_minus_9_during_reproduce_keeps_finished_runs(inputs, tmp_path, capsys):
    out = tmp_path / "results"
    folder = out / "custom-tiny"
    proc = subprocess.Popen(
        [sys.executable, "-c", REPRODUCER, str(inputs["tiny"]), str(inputs["good"]), str(out)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 90
    while time.time() < deadline and len(list(folder.glob("*.json"))) < 2 and proc.poll() is None:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    assert len(finished) >= 2, "the first runs did not finish in time"
    # rerun: finished runs are skipped (not rewritten), the rest is trained
    assert (
        main(
            [
                "reproduce",
                "--protocol",
                str(inputs["tiny"]),
                "--data",
                str(inputs["good"]),
                "--out",
                str(out),
                "--seeds",
                "1",
                "--device",
                "cpu",
                "--no-progress",
            ]
        )
        == 0
    )
    assert {
        p.name: p.stat().st_mtime_ns for p in folder.glob("*.json") if p.name in finished
    } == finished
    assert sorted(p.name for p in folder.glob("*.json")) == sorted(
        f"{v}_seed0.json" for v in VARIANTS
    )
    assert not (folder / ".checkpoints").exists() or not any((folder / ".checkpoints").iterdir())


@pytest.mark.slow
def test_ctrl_c_during_training_says_how_to_continue_and_the_rerun_resumes(inputs, tmp_path):
    """Ctrl-C (SIGINT): one line saying that finished work is kept, status 130; the same command resumes."""
    # 100 epochs of ~0.1 s: the signal lands mid-training even on a loaded machine (with 25, the
    # run could finish between the checkpoint's first write and the signal)
    protocol = tiny_protocol(
        tmp_path / "long.yaml", **{"train.epochs": 100, "train.patience": 1000}
    )
    out = tmp_path / "results"
    argv = [
        sys.executable,
        "-m",
        "diagsink",
        "train",
        "--variant",
        "mask",
        "--protocol",
        str(protocol),
        "--data",
        str(inputs["good"]),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--no-progress",
    ]
    # A shell starts background jobs with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler (tools/run-tests runs the unit tests in the background): give
    # the child the default disposition, as a terminal's Ctrl-C finds it.
    proc = subprocess.Popen(
        argv,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    ckpt = out / "custom-tiny" / ".checkpoints" / "mask_seed0.ckpt.pt"
    deadline = time.time() + 60
    while time.time() < deadline and not ckpt.exists() and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert (
        err.strip().splitlines()[-1]
        == "interrupted: finished work is kept; rerun the same command to continue."
    )
    assert "Traceback" not in err
    assert ckpt.exists()
    done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    art = json.loads((out / "custom-tiny" / "mask_seed0.json").read_text())
    assert art["resumed_from_epoch"] is not None and art["resumed_from_epoch"] >= 1


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_damaged_artifact_is_redone_and_damaged_checkpoint_is_ignored(inputs, tmp_path, capsys):
    """An artifact edited by hand fails its checksum and is trained again; an unreadable checkpoint starts over."""
    from diagsink.engine.artifacts import load_artifact
    from diagsink.engine.runs import run_paths

    out = tmp_path / "results"
    argv = [
        "reproduce",
        "--protocol",
        str(inputs["tiny"]),
        "--data",
        str(inputs["good"]),
        "--out",
        str(out),
        "--seeds",
        "1",
        "--variants",
        "mask",
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert main(argv) == 0
    paths = run_paths(out, "custom-tiny", "mask", 0)
    good = json.loads(paths["json"].read_text())
    edited = {**good, "metrics": {**good["metrics"], "MAE@12": 0.5}}
    paths["json"].write_text(json.dumps(edited))
    paths["checkpoint"].parent.mkdir(parents=True, exist_ok=True)
    paths["checkpoint"].write_bytes(b"\x80\x04 not a checkpoint")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        assert main(argv) == 0
    assert "redo" in capsys.readouterr().out
    again = load_artifact(paths["json"])
    assert again["metrics"] == good["metrics"]  # the same seed gives the same numbers
    assert not paths["checkpoint"].exists()


# ---------------------------------------------------------------- determinism
@pytest.mark.slow
def test_same_seed_same_metrics_in_two_processes(inputs, tmp_path):
    """Two separate ``diagsink train`` processes with the same seed write identical metrics and attention."""
    arts = []
    for k in range(2):
        out = tmp_path / f"run{k}"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "diagsink",
                "train",
                "--variant",
                "dropout",
                "--seed",
                "5",
                "--protocol",
                str(inputs["tiny"]),
                "--data",
                str(inputs["good"]),
                "--out",
                str(out),
                "--device",
                "cpu",
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        arts.append(json.loads((out / "custom-tiny" / "dropout_seed5.json").read_text()))
    a, b = arts
    assert a["metrics"] == b["metrics"]
    assert a["history"] == b["history"]
    assert a["attention"] == b["attention"]
    assert a["provenance"]["config_hash"] == b["provenance"]["config_hash"]


CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "book").glob("*.ipynb"))
_DRAW = re.compile(
    r"torch\.(randn|rand|randint|randperm|normal|bernoulli)\(|np\.random\.(?!default_rng)|\.random\("
)
_SEED = re.compile(r"manual_seed\(|default_rng\(\s*\d|seed=")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapters_seed_before_their_first_random_draw(chapter):
    """Two executions of a chapter agree only if its random numbers are seeded before the first draw."""
    cells = [
        ("".join(c["source"]), c.get("metadata", {}).get("tags", []))
        for c in json.loads(chapter.read_text(encoding="utf-8"))["cells"]
        if c["cell_type"] == "code"
    ]
    first_draw = next((i for i, (src, _) in enumerate(cells) if _DRAW.search(src)), None)
    if first_draw is None:
        return
    first_seed = next((i for i, (src, _) in enumerate(cells) if _SEED.search(src)), None)
    assert first_seed is not None and first_seed <= first_draw, (
        f"{chapter.name}: code cell {first_draw} draws random numbers before any seed is set"
    )


# ---------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(
    n_steps=st.integers(30, 400),
    t_in=st.integers(1, 12),
    t_out=st.integers(1, 12),
    order=st.sampled_from(["dcrnn", "split-first"]),
    ratios=st.sampled_from([(0.7, 0.1, 0.2), (0.6, 0.2, 0.2), (0.5, 0.25, 0.25), (0.8, 0.1, 0.1)]),
)
def test_property_windows_stay_inside_their_part(n_steps, t_in, t_out, order, ratios):
    """Every window fits in the series; the parts are ordered and disjoint; split-first never crosses a boundary;
    ``gather`` returns exactly the slices; a series too short raises a DataError that says how to fix it."""
    try:
        s = P.split_windows(n_steps, t_in, t_out, ratios=ratios, order=order)
    except DataError as exc:
        assert "Fix" in str(exc)
        width = t_in + t_out
        if order == "dcrnn":
            n_windows = n_steps - width + 1
            assert n_windows < 3 or min(P.split_sizes(n_windows, ratios)) < 1
        else:
            assert min(P.split_sizes(n_steps, ratios)) < width
        return
    width = t_in + t_out
    parts = [s.train, s.val, s.test]
    assert all(len(p) >= 1 for p in parts)
    for p in parts:
        assert bool((p[1:] > p[:-1]).all()), "window starts increase"
        assert int(p[0]) >= 0 and int(p[-1]) + width <= n_steps
    assert int(s.train[-1]) < int(s.val[0]) and int(s.val[-1]) < int(s.test[0])
    if order == "dcrnn":
        assert torch.equal(torch.cat(parts), torch.arange(n_steps - width + 1))
    else:
        n_train, n_val, _ = P.split_sizes(n_steps, ratios)
        assert int(s.train[-1]) + width <= n_train
        assert int(s.val[0]) >= n_train and int(s.val[-1]) + width <= n_train + n_val
        assert int(s.test[0]) >= n_train + n_val
    assert P.train_steps(s) == int(s.train[-1]) + width
    series = torch.arange(n_steps * 2, dtype=torch.float32).reshape(n_steps, 2)
    starts = s.test[:: max(1, len(s.test) // 5)]
    x, y = P.gather(series, starts, t_in), P.gather(series, starts, t_out, offset=t_in)
    for b, start in enumerate(starts.tolist()):
        assert torch.equal(x[b], series[start : start + t_in])
        assert torch.equal(y[b], series[start + t_in : start + width])


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    T=st.integers(2, 9),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    fast=st.booleans(),
)
def test_property_shared_dropped_pattern_zeroes_exactly_those_entries(lead, T, heads, seed, fast):
    """A shared ``[T]`` pattern (the paper's diagonal dropout) removes exactly the dropped diagonal entries of every
    sequence and head; the rows still sum to 1 and the fast path's output equals the explicit one.
    (Per-sequence patterns and the other options: ``test_attention.py``.)"""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = ds.TemporalAttention(2 * heads, heads, diag="dropout", diag_p=0.5).double().train()
    x = torch.randn(*lead, T, 2 * heads, generator=g, dtype=torch.float64)
    dropped = torch.rand(T, generator=g) < 0.5
    y, attn = layer(x, return_attention=True, dropped=dropped)
    torch.testing.assert_close(attn.sum(-1), torch.ones(*lead, heads, T, dtype=torch.float64))
    diagonal = torch.diagonal(attn, dim1=-2, dim2=-1)  # [..., H, T]
    assert bool((diagonal[..., dropped] == 0).all()) and bool((diagonal[..., ~dropped] > 0).all())
    if fast:
        torch.testing.assert_close(layer(x, dropped=dropped), y)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([(6,), (3, 4), (2, 3, 4)]),
    junk=st.floats(-1e6, 1e6),
)
def test_property_masked_entries_never_matter(seed, shape, junk):
    """Whatever is predicted where the target is 0 (missing): every masked metric and the MAE gradient ignore it."""
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(shape, generator=g, dtype=torch.float64) * 70 + 1
    mask = torch.rand(shape, generator=g) < 0.4
    mask.view(-1)[0] = False  # at least one observed entry
    target[mask] = 0.0
    pred = target + torch.randn(shape, generator=g, dtype=torch.float64)
    other = pred.clone()
    other[mask] = junk
    for fn in (ds.metrics.masked_mae, ds.metrics.masked_rmse, ds.metrics.masked_mape):
        assert float(fn(pred, target)) == float(fn(other, target))
    p = other.clone().requires_grad_(True)
    ds.metrics.masked_mae(p, target).backward()
    assert bool((p.grad[mask] == 0).all())


# ---------------------------------------------------------------- the README quotes real messages
def test_readme_troubleshooting_quotes_the_real_messages(inputs, tmp_path, monkeypatch, capsys):
    """The path-free ``error:`` lines of the book's Troubleshooting page are what the code prints today."""
    page = (ROOT / "book" / "troubleshooting.md").read_text(encoding="utf-8")
    quoted = {line for line in page.splitlines() if line.startswith("error: ")}
    assert len(quoted) >= 7, "book/troubleshooting.md lost its quoted error lines"

    def first_error(argv):
        try:
            main(argv)
        except SystemExit:
            pass
        return capsys.readouterr().err.strip()

    typo = tmp_path / "typo.yaml"
    cfg = yaml.safe_load(inputs["tiny"].read_text())
    cfg["train"]["epoch"] = cfg["train"].pop("epochs")
    typo.write_text(yaml.safe_dump(cfg))
    (tmp_path / "broken.yaml").write_text(inputs["broken"].read_text())
    monkeypatch.chdir(tmp_path)
    produced = [
        first_error(["train", "--variant", "masked"]),
        first_error(["train", "--variant", "mask", "--protocol", "papr"]),
        first_error(["train", "--variant", "mask", "--protocol", str(typo)]),
        first_error(["train", "--variant", "mask", "--protocol", "broken.yaml"]),
        first_error(
            [
                "train",
                "--variant",
                "none",
                "--protocol",
                str(inputs["tiny"]),
                "--data",
                str(inputs["short"]),
                "--out",
                str(tmp_path / "r"),
                "--no-progress",
            ]
        ),
    ]
    bad_pickle = make_data(tmp_path / "pkl")

    class _System:
        def __reduce__(self):
            return (os.system, ("true",))

    (bad_pickle / "adj_mx.pkl").write_bytes(pickle.dumps((["1"], {}, _System()), protocol=0))
    produced.append(first_error(["data", "verify", "--root", str(bad_pickle)]))
    monkeypatch.setenv("DIAGSINK_QUICK", "yes-please")
    produced.append(first_error(["info"]))
    for message in produced:
        assert message in quoted, (
            f"book/troubleshooting.md is out of date; the code now prints:\n{message}"
        )


# ---------------------------------------------------------------- config values: every key, every class
def _range_cases():
    """(dotted key, bad value) for every numeric key of RANGES: non-finite, below, above."""
    from diagsink.engine.config import RANGES, SCHEMA

    cases = []
    for key, (low, high, low_in, high_in, _) in RANGES.items():
        parents, leaf = key.split(".")[:-1], key.split(".")[-1]
        kinds = SCHEMA[parents[0]][leaf] if parents else SCHEMA[leaf]
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if float in kinds:
            cases += [(key, float("nan")), (key, float("inf")), (key, float("-inf"))]
        step = 1 if float not in kinds else 1e-9
        cases.append((key, low if not low_in else low - step))
        if math.isfinite(high):
            cases.append((key, high if not high_in else high + max(step, 1e-9 * abs(high))))
    return cases


RANGE_CASES = _range_cases()


@pytest.mark.bad_input
@pytest.mark.parametrize("key, value", RANGE_CASES, ids=[f"{k}={v!r}" for k, v in RANGE_CASES])
def test_every_numeric_config_key_refuses_non_finite_and_out_of_range_values(key, value):
    """One line naming the key, the value, the allowed range and the fix, before anything runs."""
    base = load_config("quick")
    if key == "train.min_lr":  # its range reaches up to train.lr: test it below lr's ceiling
        base = override(base, {"train.lr": 1.0})
    with pytest.raises(ConfigError) as info:
        override(base, {key: value})
    message = str(info.value)
    assert "\n" not in message and f"config key {key} = " in message, message
    assert "out of range" in message and "Fix: set " + key in message, message


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "key, value",
    [
        ("train.min_lr", 1e-2),  # above train.lr = 5e-3
        ("train.warmup_epochs", 5),  # = train.epochs
        ("data.ratios", [0.7, float("nan"), 0.3]),
    ],
)
def test_related_config_values_are_checked_together(key, value):
    with pytest.raises(ConfigError) as info:
        override(load_config("quick"), {key: value})
    assert key in str(info.value) and "\n" not in str(info.value)


def test_config_ranges_cover_every_numeric_key_and_admit_every_shipped_value():
    """No numeric key escapes the range table, and every shipped protocol file is inside it."""
    from diagsink.engine.config import PROTOCOLS, RANGES, SCHEMA

    numeric = {
        f"{section}.{k}" if isinstance(v, dict) else section
        for section, v in SCHEMA.items()
        for k, kind in (v.items() if isinstance(v, dict) else [(section, v)])
        if (kind if isinstance(kind, tuple) else (kind,))[0] in (int, float)
    }
    assert numeric - set(RANGES) == set()
    shipped = sorted((ROOT / "diagsink" / "configs").glob("*.yaml"))
    assert {p.stem for p in shipped} >= set(PROTOCOLS)
    for path in shipped:
        assert load_config(path) == (
            load_config(path.stem) if path.stem in PROTOCOLS else load_config(path)
        )


@pytest.mark.parametrize("penalty", [-100.0, 100.0])
def test_the_largest_allowed_diagonal_penalty_trains_without_overflow(penalty):
    """The ends of regularizers.diag_penalty's range: finite outputs and gradients, float32 and bf16."""
    from diagsink.engine.config import PENALTY_BOUND
    from diagsink.model import TSModel

    assert abs(penalty) == PENALTY_BOUND
    model = TSModel(
        5, [torch.eye(5)], variant="penalty", diag_penalty=penalty, d_model=8, n_heads=2, depth=1
    )
    x = torch.randn(3, 12, 5, 2)
    out = model(x)
    out.square().mean().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(x).float()).all()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "text, words",
    [
        ("protocol: custom-a\nprotocol: custom-b\n", ["'protocol'", "lines 1 and 2"]),
        ("train:\n  clip: 5.0\n  lr: 1.0\n  clip: -1.0\n", ["'clip'", "lines 2 and 4"]),
    ],
)
def test_a_key_given_twice_in_a_protocol_file_is_refused(tmp_path, text, words):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert all(w in message for w in words) and "given twice" in message and "Fix" in message


@pytest.mark.bad_input
@pytest.mark.parametrize("name", ["paper", "book", "quick", "slice", "full29", "full29-released"])
def test_a_file_claiming_a_shipped_protocol_name_must_hold_that_protocol(tmp_path, name):
    shipped = load_config(name)
    same = tmp_path / f"{name}-copy.yaml"
    same.write_text(yaml.safe_dump(shipped))
    assert load_config(same) == shipped  # an exact copy is that protocol
    other = override(shipped, {"train.clip": 1.0})
    changed = tmp_path / f"{name}-changed.yaml"
    changed.write_text(yaml.safe_dump(other))
    with pytest.raises(ConfigError) as info:
        load_config(changed)
    message = str(info.value)
    assert (
        f"'{name}'" in message and "train.clip = 1.0" in message and f"'custom-{name}'" in message
    )


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--out", ""], ["--out is empty", "Fix"]),
        (["--protocol", "{clip}"], ["train.clip = -1.0", "out of range", "Fix"]),
        (["--protocol", "{twice}"], ["given twice", "Fix"]),
        (["--protocol", "{claims}"], ["'quick'", "custom-quick"]),
    ],
    ids=["empty --out", "negative clip", "key twice", "claims quick"],
)
def test_train_refuses_bad_configs_and_outputs_before_anything_runs(
    inputs, tmp_path, monkeypatch, capsys, argv, words
):
    base = yaml.safe_load(inputs["tiny"].read_text())
    files = {}
    for name, change in (("clip", {"clip": -1.0}), ("claims", {"clip": 1.0})):
        cfg = json.loads(json.dumps(base))
        cfg["train"].update(change)
        cfg["protocol"] = "quick" if name == "claims" else cfg["protocol"]
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(cfg))
    files["twice"] = tmp_path / "twice.yaml"
    files["twice"].write_text(inputs["tiny"].read_text() + "seeds: 2\n")
    monkeypatch.chdir(tmp_path)
    full = ["train", "--variant", "none", "--protocol", str(inputs["tiny"]), "--out", "results"]
    full += ["--data", str(inputs["good"]), "--no-progress", "--device", "cpu"]
    for i in range(0, len(argv), 2):
        full[full.index(argv[i]) + 1] = argv[i + 1].format(**{k: str(v) for k, v in files.items()})
    assert main(full) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert all(w in lines[0] for w in words), lines[0]
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.json"))


# ---------------------------------------------------------------- nothing finished is overwritten
def test_train_keeps_a_finished_result_of_another_configuration(inputs, tmp_path, capsys):
    """``diagsink train`` into a folder with a finished run of the same protocol name: the old
    artifact and state dict move to ``superseded/``, byte for byte (like ``reproduce``); the same
    configuration trained again is kept too, under another name."""
    out = tmp_path / "results"
    other = tmp_path / "other.yaml"
    cfg = yaml.safe_load(inputs["tiny"].read_text())
    cfg["train"]["epochs"] = 3
    other.write_text(yaml.safe_dump(cfg))
    argv = ["train", "--variant", "none", "--data", str(inputs["good"]), "--out", str(out)]
    argv += ["--no-progress", "--device", "cpu", "--protocol"]
    folder = out / "custom-tiny"
    assert main([*argv, str(inputs["tiny"])]) == 0
    first = {p.name: p.read_bytes() for p in folder.glob("none_seed0.*")}
    assert set(first) == {"none_seed0.json", "none_seed0.pt"}
    assert main([*argv, str(other)]) == 0
    kept = {p.name.split(".")[-1]: p.read_bytes() for p in (folder / "superseded").iterdir()}
    assert kept == {"json": first["none_seed0.json"], "pt": first["none_seed0.pt"]}
    assert json.loads((folder / "none_seed0.json").read_text())["epochs_run"] == 3
    assert main([*argv, str(other)]) == 0
    assert len(list((folder / "superseded").glob("*.json"))) == 2
    assert "kept the earlier result" in capsys.readouterr().out


def test_a_non_finite_number_leaves_no_state_dict_without_its_artifact(tmp_path, monkeypatch):
    """A NaN in the artifact (here: a metric) stops the write before any file of the run exists."""
    from diagsink.data import toy_data
    from diagsink.engine import train as engine
    from diagsink.engine.artifacts import ArtifactError
    from diagsink.engine.train import train_run

    real = engine.horizon_metrics
    monkeypatch.setattr(
        engine, "horizon_metrics", lambda p, t: {**real(p, t), "MAE@6": float("nan")}
    )
    cfg = override(load_config("quick"), TINY)
    cfg["protocol"] = "custom-tiny"
    with pytest.raises(ArtifactError, match=r"metrics\.MAE@6 is not a finite number.*Fix"):
        train_run(cfg, "none", 0, data=toy_data(), device="cpu", out_dir=tmp_path, progress=False)
    # only the checkpoint is left (a rerun resumes from it), no state dict, no artifact
    assert [p.name for p in (tmp_path / "custom-tiny").iterdir()] == [".checkpoints"]


@pytest.mark.bad_input
@pytest.mark.parametrize("code", ["ENOSPC", "EIO"])
def test_a_failed_write_names_the_file_and_the_fix_and_keeps_the_old_file(
    tmp_path, monkeypatch, code
):
    import errno as errno_module

    from diagsink import _io

    target = tmp_path / "result.json"
    target.write_text("old")

    def full_disk(fd):
        raise OSError(getattr(errno_module, code), os.strerror(getattr(errno_module, code)))

    monkeypatch.setattr(_io.os, "fsync", full_disk)
    with pytest.raises(OSError) as info:
        _io.atomic_write_text(target, "new")
    message = str(info.value)
    assert str(target) in message and "Fix:" in message and "\n" not in message
    assert info.value.errno == getattr(errno_module, code)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["result.json"]
