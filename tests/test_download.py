"""Downloads against a local HTTP server on 127.0.0.1: good, interrupted, wrong, corrupt, dead mirrors.

The speed file served here is SYNTHETIC: a made-up series of the full METR-LA shape
(34272 x 207, 2012-03-01 00:00 to 2012-06-27 23:55, the sensor ids as columns), written
compressed so that the tests stay fast. The graph files are copies of the real DCRNN files
from ``DIAGSINK_DATA`` (checked against DCRNN's git blob ids), or synthetic stand-ins when
that folder does not have them.
"""

from __future__ import annotations

import io
import pickle
import socket
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import diagsink as ds
from diagsink import data as D
from diagsink._io import sha256_file
from diagsink.data import download as DL
from diagsink.errors import DataError

import _fileserver  # tests/_fileserver.py: the local HTTP server over in-memory files

SHARED = ds.settings().data_root
REAL_GRAPH = all((SHARED / n).is_file() for n in DL.GRAPH_BLOBS)
_REAL_BLOBS = dict(DL.GRAPH_BLOBS)


def py2_pickle(obj) -> bytes:
    """A protocol-0 pickle whose arrays look like DCRNN's Python-2 file (raw bytes as latin-1 text)."""

    def to_str(x):
        return (
            x.decode("latin1")
            if isinstance(x, bytes)
            else tuple(map(to_str, x))
            if isinstance(x, tuple)
            else x
        )

    class Py2Pickler(pickle.Pickler):
        def reducer_override(self, o):
            if isinstance(o, np.ndarray):
                fn, args, state = o.__reduce__()
                return fn, to_str(args), to_str(state)
            return NotImplemented

    buf = io.BytesIO()
    Py2Pickler(buf, protocol=0).dump(obj)
    return buf.getvalue()


def _graph_files() -> dict[str, bytes]:
    """Copies of the real DCRNN graph files, or synthetic ones (207 made-up ids) when they are absent."""
    if REAL_GRAPH:
        return {name: (SHARED / name).read_bytes() for name in DL.GRAPH_BLOBS}
    ids = [str(700000 + i) for i in range(D.N_SENSORS)]
    locs = pd.DataFrame(
        {"index": range(len(ids)), "sensor_id": ids, "latitude": 34.0, "longitude": -118.3}
    )
    return {
        "graph_sensor_ids.txt": ",".join(ids).encode(),
        "graph_sensor_locations.csv": locs.to_csv(index=False).encode(),
        "adj_mx.pkl": py2_pickle(
            (ids, {s: i for i, s in enumerate(ids)}, np.eye(len(ids), dtype=np.float32))
        ),
    }


# ---------------------------------------------------------------- the files served
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("served")
    graph = _graph_files()
    ids = graph["graph_sensor_ids.txt"].decode().split(",")
    index = pd.date_range(D.FULL_START, periods=D.FULL_STEPS, freq="5min")
    # synthetic, k/8 values
    day = np.round(8 * (60 - 10 * np.sin(np.arange(288) / 288 * 2 * np.pi))) / 8
    speed = np.tile(day, D.FULL_STEPS // 288)[:, None] + np.zeros((1, len(ids)))
    speed[::97, ::5] = 0.0
    pd.DataFrame(speed, index=index, columns=ids).to_hdf(
        folder / "full.h5", key="df", complevel=1, complib="zlib"
    )
    short = pd.DataFrame(speed[:500], index=index[:500], columns=ids)
    short.to_hdf(folder / "short.h5", key="df", complevel=1, complib="zlib")
    good = (folder / "full.h5").read_bytes()
    corrupt = bytearray(good)
    corrupt[: len(corrupt) // 2] = b"\0" * (len(corrupt) // 2)  # same size, garbage header and data
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("metr_la/metr_la.h5", good)
        zf.writestr("metr_la/sensor_ids_la.txt", ",".join(ids))
    out = {
        "full.h5": good,
        "short.h5": (folder / "short.h5").read_bytes(),
        "corrupt.h5": bytes(corrupt),
        "metr_la.zip": buf.getvalue(),
    }
    out.update(graph)
    return out


@pytest.fixture(scope="module")
def server(files):
    httpd, url = _fileserver.start(files)
    yield url
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def point_at(monkeypatch, server, files):
    """Point the module constants at the local server; expected size/sha = the synthetic file's."""
    monkeypatch.setattr(DL, "GRAPH_URL", server + "/ok/{name}")
    monkeypatch.setattr(DL, "OPTIONAL_GRAPH_BLOBS", {})
    # the real files have DCRNN's blob ids already; synthetic stand-ins get their own
    monkeypatch.setattr(DL, "GRAPH_BLOBS", {n: DL.git_blob_sha1(files[n]) for n in DL.GRAPH_BLOBS})
    if REAL_GRAPH:
        assert DL.GRAPH_BLOBS == dict(_REAL_BLOBS)
    monkeypatch.setattr(DL, "TIMEOUT", 10.0)
    import hashlib

    monkeypatch.setattr(DL, "EXPECTED_SIZE", len(files["full.h5"]))
    monkeypatch.setattr(DL, "EXPECTED_SHA256", hashlib.sha256(files["full.h5"]).hexdigest())

    def mirrors(*paths):
        ms = [
            DL.Mirror(
                f"{server}/{p}", kind="zip" if p.endswith(".zip") else "h5", member="metr_la.h5"
            )
            for p in paths
        ]
        monkeypatch.setattr(DL, "SPEED_MIRRORS", ms)

    return mirrors


def _no_leftovers(root: Path) -> None:
    left = [
        p.name
        for p in root.iterdir()
        if p.name.endswith((".part", ".tmp")) or p.name.startswith(".")
    ]
    assert not left, f"half-written files left behind: {left}"


# ---------------------------------------------------------------- the cases
def test_good_transfer_stores_verifies_and_records(tmp_path, point_at, files):
    point_at("ok/full.h5")
    root = tmp_path / "data"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # size and sha match the patched reference: no warning
        DL.download_metr_la(root, progress=False)
    assert (root / "metr-la.h5").read_bytes() == files["full.h5"]
    for name in DL.GRAPH_BLOBS:
        assert (root / name).read_bytes() == files[name]
    manifest = DL.read_manifest(root)["files"]
    assert manifest["metr-la.h5"]["sha256"] == sha256_file(root / "metr-la.h5")
    assert manifest["adj_mx.pkl"]["checks"] == "git blob id"
    _no_leftovers(root)
    m = D.load_metr_la(root)
    assert m.is_full and m.speed.shape == (34272, 207) and "FULL" in m.describe()


def test_zip_mirror_is_extracted(tmp_path, point_at, files):
    point_at("ok/metr_la.zip")
    root = tmp_path / "data"
    DL.download_metr_la(root, progress=False)
    assert (root / "metr-la.h5").read_bytes() == files["full.h5"]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [*DL.GRAPH_BLOBS, "metr-la.h5", "manifest.json"]
    )


def test_interrupted_transfer_leaves_nothing(tmp_path, point_at):
    point_at("cut/full.h5")
    root = tmp_path / "data"
    with pytest.raises(DataError) as err:
        DL.download_metr_la(root, progress=False)
    assert "could not download metr-la.h5" in str(err.value)
    assert "Place these files in" in str(err.value) and "drive.google.com" in str(err.value)
    assert not (root / "metr-la.h5").exists()
    _no_leftovers(root)


def test_wrong_size_and_shape_is_rejected(tmp_path, point_at):
    point_at("ok/short.h5")
    root = tmp_path / "data"
    with pytest.raises(DataError, match="500 x 207.*full METR-LA is 34272 x 207"):
        DL.download_metr_la(root, progress=False)
    assert not (root / "metr-la.h5").exists()
    _no_leftovers(root)


def test_size_and_sha_mismatch_only_warn_when_the_structure_is_right(
    tmp_path, point_at, monkeypatch
):
    point_at("ok/full.h5")
    monkeypatch.setattr(DL, "EXPECTED_SIZE", 57_038_056)
    monkeypatch.setattr(DL, "EXPECTED_SHA256", "0" * 64)
    root = tmp_path / "data"
    with pytest.warns(UserWarning, match="structure is right"):
        DL.download_metr_la(root, progress=False)
    assert (root / "metr-la.h5").is_file()
    assert len(DL.read_manifest(root)["files"]["metr-la.h5"]["warnings"]) == 2


def test_corrupt_file_is_rejected(tmp_path, point_at):
    point_at("ok/corrupt.h5")
    root = tmp_path / "data"
    with pytest.raises(DataError, match="cannot be read as a pandas HDF file"):
        DL.download_metr_la(root, progress=False)
    assert not (root / "metr-la.h5").exists()
    _no_leftovers(root)


def test_dead_mirrors_then_a_good_one(tmp_path, point_at, files):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    point_at("ok/missing.h5", "cut/full.h5", "ok/corrupt.h5", "ok/full.h5")
    DL.SPEED_MIRRORS.insert(0, DL.Mirror(f"http://127.0.0.1:{dead}/metr-la.h5"))
    root = tmp_path / "data"
    DL.download_metr_la(root, progress=False)
    assert (root / "metr-la.h5").read_bytes() == files["full.h5"]
    assert DL.read_manifest(root)["files"]["metr-la.h5"]["source"].endswith("/ok/full.h5")
    _no_leftovers(root)


def test_graph_file_with_wrong_content_is_not_stored(tmp_path, point_at, monkeypatch, server):
    point_at("ok/full.h5")
    # serves an h5 for every graph file
    monkeypatch.setattr(DL, "GRAPH_URL", server + "/ok/short.h5?{name}")
    root = tmp_path / "data"
    with pytest.raises(DataError, match="could not download graph_sensor_ids.txt"):
        DL.download_metr_la(root, progress=False)
    assert not (root / "graph_sensor_ids.txt").exists()
    _no_leftovers(root)


def test_first_use_of_the_loader_downloads(tmp_path, point_at, monkeypatch):
    point_at("ok/full.h5")
    monkeypatch.delenv("DIAGSINK_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    m = D.load_metr_la()  # no root, no DIAGSINK_DATA: the per-user cache, downloaded on first use
    assert m.path == tmp_path / "cache" / "diagsink" / "metr-la" / "metr-la.h5" and m.is_full


def test_cli_download_and_verify(tmp_path, point_at, capsys):
    from diagsink.cli import main

    point_at("ok/full.h5")
    root = tmp_path / "data"
    assert main(["data", "download", "--root", str(root), "--no-progress"]) == 0
    assert main(["data", "verify", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "METR-LA, FULL: 34272 steps" in out and "matches manifest.json" in out
    (root / "metr-la.h5").write_bytes((root / "metr-la.h5").read_bytes()[:1000])  # truncate it
    assert main(["data", "verify", "--root", str(root)]) == 2
    assert "truncated" in capsys.readouterr().err
