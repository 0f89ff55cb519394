"""Loading METR-LA: the real slice, the graph, and every kind of bad input."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import diagsink as ds
from diagsink import data as D
from diagsink.data import adjacency as A
from diagsink.errors import DataError

SHARED = ds.settings().data_root


def _has_real_data(root: Path) -> bool:
    return D.find_speed_file(root) is not None and (root / "graph_sensor_ids.txt").is_file()


needs_real = pytest.mark.skipif(
    not _has_real_data(SHARED), reason=f"METR-LA not found in {SHARED} (set DIAGSINK_DATA)"
)


# ---------------------------------------------------------------- a small synthetic data folder
def _to_str(x):
    if isinstance(x, bytes):
        return x.decode("latin1")
    if isinstance(x, tuple):
        return tuple(_to_str(v) for v in x)
    return x


class Py2Pickler(pickle.Pickler):
    """Writes arrays as DCRNN's Python-2 pickle does: raw bytes as latin-1 text, no ``_codecs`` global."""

    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            fn, args, state = obj.__reduce__()
            return fn, _to_str(args), _to_str(state)
        return NotImplemented


def py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=0).dump(obj)
    return buf.getvalue()


IDS = ["101", "102", "103", "104", "105"]


def make_folder(
    root: Path, *, steps: int = 40, ids=IDS, speed=None, index=None, columns=None
) -> Path:
    """A synthetic, valid data folder with 5 sensors (not real METR-LA data)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "graph_sensor_ids.txt").write_text(",".join(ids))
    pd.DataFrame(
        {
            "index": range(len(ids)),
            "sensor_id": ids,
            "latitude": np.linspace(34.0, 34.2, len(ids)),
            "longitude": np.linspace(-118.4, -118.2, len(ids)),
        }
    ).to_csv(root / "graph_sensor_locations.csv", index=False)
    adj = np.eye(len(ids), dtype=np.float32)
    adj[0, 1] = 0.5
    (root / "adj_mx.pkl").write_bytes(
        py2_pickle((list(ids), {s: i for i, s in enumerate(ids)}, adj))
    )
    rng = np.random.default_rng(0)
    if speed is None:
        speed = rng.uniform(20, 70, size=(steps, len(ids)))
        speed[3] = 0.0
    if index is None:
        index = pd.date_range("2012-03-01", periods=len(speed), freq="5min")
    df = pd.DataFrame(speed, index=index, columns=columns if columns is not None else list(ids))
    df.to_hdf(root / "metr-la.h5", key="df")
    return root


def test_synthetic_folder_loads(tmp_path):
    m = D.load_metr_la(make_folder(tmp_path / "d"))
    assert m.speed.shape == (40, 5) and m.speed.dtype == np.float64
    assert m.sensor_ids == IDS and m.n_nodes == 5 and m.n_steps == 40
    assert m.adjacency.dtype == np.float32 and m.adjacency[0, 1] == 0.5
    assert list(m.locations.columns) == ["sensor_id", "latitude", "longitude"]
    assert not m.is_full and "PARTIAL" in m.describe() and "first 40 of 34272" in m.describe()
    assert len(m.sha256) == 64


@needs_real
def test_real_slice_or_full_file():
    m = D.load_metr_la(SHARED)
    assert m.n_nodes == 207 and len(m.sensor_ids) == 207
    assert m.timestamps[0] == D.FULL_START
    assert (np.diff(m.timestamps) == D.STEP).all()
    assert m.is_full == (m.n_steps == D.FULL_STEPS)
    assert ("FULL" if m.is_full else "PARTIAL") in m.describe()
    # spot values from the README of the shared data folder (true for the full file and the slice)
    np.testing.assert_array_equal(m.speed[0, :5], [64.375, 67.625, 67.125, 61.5, 66.875])
    assert m.speed[5, 0] == 57.333333333333336
    # the adjacency: 1722 non-zeros, diagonal 1, directed
    assert int((m.adjacency != 0).sum()) == 1722 and (np.diag(m.adjacency) == 1).all()
    assert not np.array_equal(m.adjacency, m.adjacency.T)
    assert m.adjacency[m.adjacency > 0].min() >= 0.1
    assert m.locations["sensor_id"].tolist() == m.sensor_ids


@needs_real
def test_env_variable_is_the_default_root(monkeypatch):
    monkeypatch.setenv("DIAGSINK_DATA", str(SHARED))
    assert D.load_metr_la().path.parent == SHARED


# ---------------------------------------------------------------- bad input
def test_missing_files_name_the_files_the_place_and_the_command(tmp_path):
    with pytest.raises(DataError) as err:
        D.load_metr_la(tmp_path / "empty", download=False)
    msg = str(err.value)
    for needed in (
        "metr-la.h5",
        "graph_sensor_ids.txt",
        "graph_sensor_locations.csv",
        "adj_mx.pkl",
        str(tmp_path / "empty"),
        "diagsink data download",
        "drive.google.com",
    ):
        assert needed in msg


def test_only_the_speed_file_missing(tmp_path):
    root = make_folder(tmp_path / "d")
    (root / "metr-la.h5").unlink()
    with pytest.raises(
        DataError,
        match=r"missing in .*: metr-la.h5 or metr-la_first1026steps.h5 or metr-la_29sensors_allsteps.h5\.",
    ):
        D.load_metr_la(root, download=False)


def test_slice_name_is_accepted(tmp_path):
    root = make_folder(tmp_path / "d")
    (root / "metr-la.h5").rename(root / "metr-la_first1026steps.h5")
    assert D.load_metr_la(root).path.name == "metr-la_first1026steps.h5"


def test_wrong_columns(tmp_path):
    with pytest.raises(DataError, match="not in graph_sensor_ids.txt order.*Fix: reorder"):
        D.load_metr_la(make_folder(tmp_path / "a", columns=IDS[::-1]))
    with pytest.raises(DataError, match="repeat an id.*Fix"):
        D.sensor_positions(["101", "101"], IDS)
    with pytest.raises(DataError, match="unknown ids.*Fix"):
        D.load_metr_la(make_folder(tmp_path / "b", columns=IDS[:4] + ["999"]))


def test_index_gap(tmp_path):
    index = pd.date_range("2012-03-01", periods=41, freq="5min").delete(7)
    with pytest.raises(DataError, match="not contiguous at 5 minutes.*00:30:00.*00:40:00.*reindex"):
        D.load_metr_la(make_folder(tmp_path / "d", index=index))


def test_a_sensor_subset_loads_with_its_part_of_the_graph(tmp_path):
    """Columns that are a subset of the ids (in their order) load; the graph is cut by id."""
    keep = ["101", "102", "104"]
    speed = np.random.default_rng(1).uniform(20, 70, size=(40, 3))
    m = D.load_metr_la(make_folder(tmp_path / "s", speed=speed, columns=keep))
    assert m.sensor_ids == keep and m.n_nodes == 3 and m.n_sensors_total == 5
    assert m.adjacency.shape == (3, 3) and m.adjacency[0, 1] == 0.5  # 101 -> 102 kept
    assert list(m.locations["sensor_id"].astype(str)) == keep
    assert not m.is_full and "3 of 5 sensors, first 40 of 34272 steps" in m.describe()


def test_the_29_sensor_file_keeps_its_edges():
    root = Path(os.environ.get("DIAGSINK_DATA", ""))
    if not (root / "metr-la_29sensors_allsteps.h5").is_file():
        pytest.fail(
            f"metr-la_29sensors_allsteps.h5 is not in {root}: point DIAGSINK_DATA at the shared data"
        )
    m = D.load_metr_la(root, speed_file="metr-la_29sensors_allsteps.h5")
    assert m.speed.shape == (34272, 29) and m.all_steps and not m.is_full
    assert int((m.adjacency > 0).sum()) - 29 == 152  # the folder's README: 152 directed edges
    assert "29 of 207 sensors, all 34272 steps" in m.describe()


def test_a_numeric_index_is_refused(tmp_path):
    with pytest.raises(DataError, match="not a timestamp index.*Fix"):
        D.load_metr_la(make_folder(tmp_path / "d", index=np.arange(40)))


@pytest.mark.parametrize(
    "bad, pattern",
    [
        (np.nan, "NaN or infinite.*fillna"),
        (np.inf, "NaN or infinite"),
        (-3.0, "negative speeds.*Fix"),
        (1e30, "above 150 mph.*sensor 103.*Fix"),
        (150.5, "above 150 mph"),
    ],
)
def test_nan_inf_and_negative_speeds(tmp_path, bad, pattern):
    speed = np.full((30, 5), 50.0)
    speed[10, 2] = bad
    with pytest.raises(DataError, match=pattern):
        D.load_metr_la(make_folder(tmp_path / "d", speed=speed))


def test_truncated_hdf(tmp_path):
    root = make_folder(tmp_path / "d", steps=400)
    raw = (root / "metr-la.h5").read_bytes()
    (root / "metr-la.h5").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="truncated.*diagsink data download"):
        D.load_metr_la(root)


class _Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_unexpected_pickle_global_is_refused(tmp_path):
    root = make_folder(tmp_path / "d")
    (root / "adj_mx.pkl").write_bytes(pickle.dumps((IDS, {}, _Evil()), protocol=0))
    with pytest.raises(DataError, match=r"global posix\.getcwd|global os\.getcwd"):
        D.load_metr_la(root)
    # a Python-3 pickle of an array needs _codecs.encode: refused as well (DCRNN's file never needs it)
    (root / "adj_mx.pkl").write_bytes(pickle.dumps((IDS, {}, np.eye(5)), protocol=0))
    with pytest.raises(DataError, match="_codecs.encode"):
        D.load_metr_la(root)
    # the class itself is refused by name, too
    with pytest.raises(DataError, match="refusing"):
        D.RestrictedUnpickler.find_class(
            D.RestrictedUnpickler.__new__(D.RestrictedUnpickler), "builtins", "eval"
        )


def test_truncated_pickle_and_mismatched_ids(tmp_path):
    root = make_folder(tmp_path / "d")
    raw = (root / "adj_mx.pkl").read_bytes()
    (root / "adj_mx.pkl").write_bytes(raw[:-40])
    with pytest.raises(DataError, match="truncated or corrupt"):
        D.load_metr_la(root)
    root2 = make_folder(tmp_path / "e")
    (root2 / "adj_mx.pkl").write_bytes(py2_pickle((IDS[::-1], {}, np.eye(5, dtype=np.float32))))
    with pytest.raises(DataError, match="same DCRNN checkout"):
        D.load_metr_la(root2)


@needs_real
def test_real_pickle_through_the_restricted_unpickler():
    pkl = SHARED / "adj_mx.pkl"
    if not pkl.is_file():
        pytest.skip("adj_mx.pkl not in the data folder")
    ids, to_ind, adj = D.load_adj_pickle(pkl)
    assert ids == D.read_sensor_ids(SHARED / "graph_sensor_ids.txt")
    assert all(to_ind[s] == i for i, s in enumerate(ids))
    assert adj.shape == (207, 207) and adj.dtype == np.float32


def test_full_structure_check(tmp_path):
    speed = np.ones((10, 5))
    index = pd.date_range("2012-03-01", periods=10, freq="5min")
    D.validate_speed_frame(pd.DataFrame(speed, index=index, columns=IDS), IDS)  # fine as a slice
    with pytest.raises(DataError, match="full METR-LA is 34272 x 207"):
        D.validate_speed_frame(
            pd.DataFrame(speed, index=index, columns=IDS), IDS, require_full=True
        )


# ---------------------------------------------------------------- adjacency
def test_gaussian_kernel_on_a_hand_made_table():
    ids = ["a", "b", "c"]
    table = pd.DataFrame(
        {
            "from": ["a", "a", "b", "b", "c", "a", "x"],
            "to": ["a", "b", "a", "c", "c", "c", "a"],
            "cost": [0.0, 100.0, 300.0, 200.0, 0.0, 900.0, 5.0],
        }
    )
    adj = A.gaussian_kernel_adjacency(table, ids)
    # "x" is not a chosen sensor
    d = np.array([0.0, 100.0, 300.0, 200.0, 0.0, 900.0], dtype=np.float32)
    sigma = d.std()
    expect = np.zeros((3, 3), dtype=np.float32)
    for (i, j), dist in zip([(0, 0), (0, 1), (1, 0), (1, 2), (2, 2), (0, 2)], d):
        w = np.exp(-((dist / sigma) ** 2))
        expect[i, j] = w if w >= 0.1 else 0.0
    assert adj.dtype == np.float32
    np.testing.assert_allclose(adj, expect, rtol=1e-6)
    assert adj[0, 2] == 0.0  # 900 m is far: below kappa
    assert adj[1, 1] == 0.0  # no listed distance -> no edge
    assert adj[0, 1] != adj[1, 0]  # directed


def test_rebuilt_adjacency_equals_the_pickle():
    dist = SHARED / "distances_la_2012.csv"
    if not dist.is_file() or not (SHARED / "adj_mx.pkl").is_file():
        pytest.skip(
            f"distances_la_2012.csv is not in {SHARED} (it is not shipped with the shared data; "
            "get it from DCRNN's data/sensor_graph/ to run this check)"
        )
    ids, _, adj = D.load_adj_pickle(SHARED / "adj_mx.pkl")
    table = pd.read_csv(dist, dtype={"from": "str", "to": "str"})
    rebuilt = A.gaussian_kernel_adjacency(table, ids)
    np.testing.assert_array_equal(rebuilt != 0, adj != 0)
    np.testing.assert_allclose(rebuilt, adj, rtol=0, atol=1e-7)


def test_normalisations_numpy_and_torch_agree():
    rng = np.random.default_rng(0)
    adj = (rng.random((6, 6)) * (rng.random((6, 6)) < 0.5)).astype(np.float32)
    np.fill_diagonal(adj, 1.0)
    adj[4] = 0.0  # a node without out-edges stays a zero row
    fwd = A.random_walk(adj)
    rows = fwd.sum(1)
    np.testing.assert_allclose(rows[[0, 1, 2, 3, 5]], 1.0, rtol=1e-6)
    assert rows[4] == 0.0 and np.isfinite(fwd).all()
    t = torch.tensor(adj)
    torch.testing.assert_close(A.random_walk(t), torch.tensor(fwd))
    sym = A.symmetric_normalize(adj)
    d = adj.sum(1)
    inv = np.where(d > 0, 1 / np.sqrt(np.where(d > 0, d, 1)), 0)
    np.testing.assert_allclose(sym, inv[:, None] * adj * inv[None, :], rtol=1e-6)
    torch.testing.assert_close(A.symmetric_normalize(t), torch.tensor(sym))
    p_fwd, p_bwd = A.diffusion_supports(adj)
    assert p_fwd.dtype == torch.float32
    torch.testing.assert_close(p_bwd, A.random_walk(t.T))
    s = adj + adj.T
    eig = np.linalg.eigvalsh(A.symmetric_normalize(s).astype(np.float64))
    assert eig.max() <= 1 + 1e-6 and eig.min() >= -1 - 1e-6


def test_package_exports():
    assert ds.data.load_metr_la is D.load_metr_la is D.metr_la.load_metr_la
    assert ds.data.adjacency is A and ds.data.split_windows is D.windows.split_windows
    assert ds.data.toy_data is D.synthetic.toy_data and ds.metrics.masked_mae
    # every public name of the data modules is reachable from diagsink.data itself
    for module in (D.metr_la, D.files, D.windows, D.adjacency, D.baselines, D.synthetic):
        assert all(getattr(D, name) is getattr(module, name) for name in module.__all__)


def test_table_format_reads_the_same_as_the_fixed_format(tmp_path):
    root = make_folder(tmp_path / "d")
    fixed = D.load_metr_la(root)
    frame = pd.read_hdf(root / "metr-la.h5", "df")
    (root / "metr-la.h5").unlink()
    frame.to_hdf(root / "metr-la.h5", key="df", format="table")
    table = D.load_metr_la(root)
    np.testing.assert_array_equal(table.speed, fixed.speed)
    assert (table.timestamps == fixed.timestamps).all() and table.speed.flags.writeable


def test_cli_info_and_verify_on_a_slice(tmp_path, capsys):
    from diagsink.cli import main

    root = make_folder(tmp_path / "d")
    assert main(["data", "info", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "metr-la.h5" in out and "PARTIAL: all 5 sensors, first 40 of 34272" in out
    assert main(["data", "verify", "--root", str(root)]) == 0
    assert "not comparable with published" in capsys.readouterr().out
    assert main(["data", "info", "--root", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: METR-LA files missing") and "diagsink data download" in err
