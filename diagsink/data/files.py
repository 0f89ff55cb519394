"""METR-LA files: find them, read them, check them (sensor ids, locations, adjacency, speeds).

Part of the chapter ``book/metr_la.ipynb`` ("METR-LA"); :mod:`diagsink.data.metr_la` puts the
pieces together. The data folder (``root``) holds the files in the layout DCRNN uses (see
:mod:`diagsink.data`). Missing readings are stored as 0.0 (never NaN).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..runtime import settings
from ._unpickle import RestrictedUnpickler, restricted_pytables

__all__ = [
    "resolve_root",
    "find_speed_file",
    "missing_files",
    "missing_files_message",
    "read_sensor_ids",
    "read_locations",
    "read_adjacency",
    "load_adj_pickle",
    "read_speed",
    "read_speed_arrays",
    "validate_speed_frame",
    "validate_speed",
    "sensor_positions",
    "SPEED_FILES",
    "GRAPH_FILES",
    "FULL_STEPS",
    "FULL_START",
    "FULL_END",
    "N_SENSORS",
    "MAX_SPEED",
    "STEP",
    "DOWNLOAD_HINT",
]

#: Accepted file names of the speed matrix, in the order they are looked for.
SPEED_FILES: tuple[str, ...] = (
    "metr-la.h5",
    "metr-la_first1026steps.h5",
    "metr-la_29sensors_allsteps.h5",
)
#: The DCRNN graph files the loader needs (``adj_mx.npy`` may replace ``adj_mx.pkl``).
GRAPH_FILES: tuple[str, ...] = ("graph_sensor_ids.txt", "graph_sensor_locations.csv", "adj_mx.pkl")
#: Shape and time range of the full data set.
FULL_STEPS = 34272
N_SENSORS = 207
#: Largest plausible speed in mph; a reading above it is a corrupt value, not traffic.
MAX_SPEED = 150.0
FULL_START = pd.Timestamp("2012-03-01 00:00:00")
FULL_END = pd.Timestamp("2012-06-27 23:55:00")
STEP = pd.Timedelta(minutes=5)

DOWNLOAD_HINT = (
    "run `diagsink data download --root {root}` (or call ds.data.load_metr_la(download=True)); "
    "offline, place metr-la.h5 (from DCRNN's Google Drive folder "
    "https://drive.google.com/open?id=10FOTa6HXPqX8Pf5WRoRwcFnW9BrNZEIX or Baidu Yun "
    "https://pan.baidu.com/s/14Yy9isAIZYdU__OYEQGa_g) and the DCRNN graph files "
    "graph_sensor_ids.txt, graph_sensor_locations.csv, adj_mx.pkl (from "
    "https://github.com/liyaguang/DCRNN/tree/master/data/sensor_graph) in {root}, "
    "or point DIAGSINK_DATA at a folder that has them"
)


# --------------------------------------------------------------------------------------------
# Finding files
# --------------------------------------------------------------------------------------------
def resolve_root(root: str | Path | None = None) -> Path:
    """The data folder: ``root`` if given, else ``DIAGSINK_DATA``, else ``~/.cache/diagsink/metr-la``."""
    return Path(root).expanduser() if root is not None else settings().data_root


def find_speed_file(root: Path, name: str | None = None) -> Path | None:
    """The speed file ``name`` in ``root``, or (``name=None``) the first of :data:`SPEED_FILES` there; ``None`` if absent."""
    for candidate in SPEED_FILES if name is None else (name,):
        if (root / candidate).is_file():
            return root / candidate
    return None


def missing_files(root: Path, speed_file: str | None = None) -> list[str]:
    """The files the loader needs that ``root`` lacks (the speed file ``speed_file``, else any of :data:`SPEED_FILES`)."""
    missing = []
    if find_speed_file(root, speed_file) is None:
        missing.append(speed_file or " or ".join(SPEED_FILES))
    for name in GRAPH_FILES:
        if name == "adj_mx.pkl":
            if not (root / "adj_mx.pkl").is_file() and not (root / "adj_mx.npy").is_file():
                missing.append("adj_mx.pkl")
        elif not (root / name).is_file():
            missing.append(name)
    return missing


def missing_files_message(root: Path, missing: list[str]) -> str:
    """The error text for missing files: which files, where, and how to get them."""
    return (
        f"METR-LA files missing in {root}: {', '.join(missing)}. To fix: "
        + DOWNLOAD_HINT.format(root=root)
    )


# --------------------------------------------------------------------------------------------
# Graph files
# --------------------------------------------------------------------------------------------
def read_sensor_ids(path: str | Path) -> list[str]:
    """Sensor ids from ``graph_sensor_ids.txt`` (comma-separated, one line) as strings."""
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii").strip()
    except UnicodeDecodeError:
        text = ""  # binary content: reported below
    ids = [s.strip() for s in text.replace("\n", ",").split(",") if s.strip()]
    if not ids or not all(s.isdigit() for s in ids):
        raise DataError(
            f"{path} is not a list of numeric sensor ids separated by commas. "
            "Fix: replace it with DCRNN's data/sensor_graph/graph_sensor_ids.txt (`diagsink data download`)."
        )
    if len(set(ids)) != len(ids):
        raise DataError(
            f"{path} lists some sensor ids twice. Fix: replace it with DCRNN's graph_sensor_ids.txt."
        )
    return ids


def read_locations(path: str | Path, sensor_ids: list[str]) -> pd.DataFrame:
    """``graph_sensor_locations.csv`` as ``sensor_id, latitude, longitude`` in ``sensor_ids`` order."""
    path = Path(path)
    df = pd.read_csv(path, dtype={"sensor_id": str})
    need = {"sensor_id", "latitude", "longitude"}
    if not need <= set(df.columns):
        raise DataError(
            f"{path} lacks the columns {sorted(need - set(df.columns))}; expected index,sensor_id,latitude,longitude. "
            "Fix: replace it with DCRNN's graph_sensor_locations.csv (`diagsink data download`)."
        )
    df["sensor_id"] = df["sensor_id"].astype(str).str.strip()
    df = df.drop_duplicates("sensor_id").set_index("sensor_id")
    absent = [s for s in sensor_ids if s not in df.index]
    if absent:
        raise DataError(
            f"{path} has no location for {len(absent)} sensors (e.g. {absent[:3]}). "
            "Fix: use the graph_sensor_locations.csv that belongs to graph_sensor_ids.txt (both from DCRNN)."
        )
    out = df.loc[sensor_ids, ["latitude", "longitude"]].reset_index()
    return out.astype({"latitude": float, "longitude": float})


def load_adj_pickle(path: str | Path) -> tuple[list[str], dict[str, int], np.ndarray]:
    """Read DCRNN's ``adj_mx.pkl`` safely: ``(sensor_ids, sensor_id_to_ind, adj_mx)``.

    The file is a Python-2 pickle (protocol 0), so strings are decoded as latin-1.

    Raises:
        DataError: unexpected globals, a truncated file, or an unexpected structure.
    """
    path = Path(path)
    try:
        obj = RestrictedUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except DataError:
        raise
    except Exception as exc:  # truncated or garbled pickle
        raise DataError(
            f"{path} could not be read as DCRNN's adjacency pickle ({type(exc).__name__}: {exc}); it is "
            "probably truncated or corrupt. Fix: delete it and run `diagsink data download`."
        ) from exc
    ok = isinstance(obj, (tuple, list)) and len(obj) == 3 and isinstance(obj[2], np.ndarray)
    if (
        not ok
        or obj[2].ndim != 2
        or obj[2].shape[0] != obj[2].shape[1]
        or len(obj[0]) != obj[2].shape[0]
    ):
        raise DataError(
            f"{path} does not hold (sensor_ids, sensor_id_to_ind, adj_mx) with a square matrix. "
            "Fix: replace it with DCRNN's data/sensor_graph/adj_mx.pkl."
        )
    ids = [str(s) for s in obj[0]]
    return ids, {str(k): int(v) for k, v in dict(obj[1]).items()}, obj[2]


def _read_npy_adjacency(npy: Path) -> np.ndarray:
    """``adj_mx.npy`` as a numeric array; anything else (object, text, .npz, damaged) is one DataError."""
    fix = "Fix: save the [N, N] weights with np.save(path, weights.astype('float32')), or use `diagsink data download`."
    try:
        adj = np.load(npy, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # object arrays, truncated or foreign files
        raise DataError(f"{npy} cannot be read as a numeric array ({exc}). {fix}") from exc
    if not isinstance(adj, np.ndarray) or adj.dtype.kind not in "biuf":
        kind = adj.dtype if isinstance(adj, np.ndarray) else type(adj).__name__
        raise DataError(f"{npy} holds {kind} values, not numbers. {fix}")
    return adj


def read_adjacency(root: Path, sensor_ids: list[str]) -> np.ndarray:
    """DCRNN's adjacency ``[N, N]`` float32 from ``adj_mx.pkl`` (or ``adj_mx.npy``), checked against the ids."""
    pkl, npy = root / "adj_mx.pkl", root / "adj_mx.npy"
    if pkl.is_file():
        ids, _, adj = load_adj_pickle(pkl)
        if ids != sensor_ids:
            raise DataError(
                f"the sensor ids in {pkl} are not those of graph_sensor_ids.txt (in the same order). "
                "Fix: take both files from the same DCRNN checkout (`diagsink data download`)."
            )
    elif npy.is_file():
        adj = _read_npy_adjacency(npy)
    else:
        raise DataError(missing_files_message(root, ["adj_mx.pkl"]))
    n = len(sensor_ids)
    if adj.shape != (n, n):
        raise DataError(
            f"the adjacency in {root} is {adj.shape}, expected ({n}, {n}). Fix: `diagsink data download`."
        )
    if not np.isfinite(adj).all() or (adj < 0).any():
        raise DataError(
            f"the adjacency in {root} has NaN, inf or negative weights. Fix: `diagsink data download`."
        )
    return np.ascontiguousarray(adj, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# Speed matrix
# --------------------------------------------------------------------------------------------
def read_speed(path: str | Path) -> pd.DataFrame:
    """Read the speed frame from an HDF file (key ``df``; a file with one other key is accepted too).

    Read with ``pd.read_hdf`` inside :class:`~diagsink.data._unpickle.restricted_pytables`:
    PyTables unpickles some stored attributes (e.g. the index ``freq``), and the guard lets
    only the harmless globals such attributes need through.

    Raises:
        DataError: the file is truncated, not HDF5, or has no table.
    """
    path = Path(path)
    try:
        with restricted_pytables(path), pd.HDFStore(path, mode="r") as store:
            keys = store.keys()
            if "/df" in keys:
                key = "/df"
            elif len(keys) == 1:
                key = keys[0]
            else:
                raise DataError(
                    f"{path} holds the tables {keys} but not 'df'. Fix: save the speed matrix with "
                    "df.to_hdf(path, key='df') or run `diagsink data download`."
                )
            df = pd.read_hdf(store, key)
    except DataError:
        raise
    except Exception as exc:  # HDF5ExtError, OSError, ... on truncated or foreign files
        raise DataError(
            f"{path} cannot be read as a pandas HDF file ({type(exc).__name__}); it is probably truncated "
            "(an interrupted copy or download) or not an HDF5 file. Fix: delete it and run "
            f"`diagsink data download --root {path.parent}`, or copy it again."
        ) from exc
    if not isinstance(df, pd.DataFrame):
        raise DataError(
            f"{path} holds a {type(df).__name__}, not a DataFrame. Fix: `diagsink data download`."
        )
    return df


def read_speed_arrays(path: str | Path) -> tuple[np.ndarray, pd.DatetimeIndex, list[str]]:
    """``(values float64 [T, N], index, columns)`` of a speed file, read by :func:`read_speed`.

    Raises:
        DataError: the file is truncated, not HDF5, or has no table.
    """
    frame = read_speed(path)
    return frame.to_numpy(dtype=np.float64, copy=True), frame.index, list(frame.columns)


def sensor_positions(
    columns: list[str], sensor_ids: list[str], *, path: Path | str = "speed file"
) -> np.ndarray:
    """Positions of a speed file's columns among the 207 ids of ``graph_sensor_ids.txt``.

    The columns must be distinct known ids in the order of ``graph_sensor_ids.txt`` (all of
    them for ``metr-la.h5``; a subset for a file with fewer sensors, e.g. 29 of 207). Returns
    the increasing positions ``[N]`` (int64); the road graph is restricted to them by id.
    """
    where = {sid: i for i, sid in enumerate(sensor_ids)}
    unknown = [c for c in columns if c not in where]
    if unknown or not columns:
        detail = f"unknown ids e.g. {unknown[:3]}" if unknown else "no columns"
        raise DataError(
            f"the columns of {path} are not sensor ids of graph_sensor_ids.txt: {detail}. Fix: use the "
            "metr-la.h5 that belongs to DCRNN's graph files (`diagsink data download`), or columns named by those ids."
        )
    pos = np.array([where[c] for c in columns], dtype=np.int64)
    if len(set(columns)) != len(columns) or np.any(np.diff(pos) <= 0):
        i = int(np.flatnonzero(np.diff(pos) <= 0)[0]) + 1 if len(pos) > 1 else 0
        raise DataError(
            f"the columns of {path} are not in graph_sensor_ids.txt order (or repeat an id): column {i} is "
            f"{columns[i]}. Fix: reorder with df[[s for s in sensor_ids if s in df.columns]]."
        )
    return pos


def validate_speed_frame(
    df: pd.DataFrame,
    sensor_ids: list[str],
    *,
    path: Path | str = "speed file",
    require_full: bool = False,
) -> tuple[np.ndarray, pd.DatetimeIndex]:
    """Check a speed frame and return ``(speed float64 [T, N], timestamps [T])``.

    Checks: columns are ``sensor_ids`` or a subset in their order (:func:`sensor_positions`),
    a DatetimeIndex that is contiguous at 5 minutes, finite values in ``[0, MAX_SPEED]``. With ``require_full`` also the full shape
    34272 x 207 and the range 2012-03-01 00:00 to 2012-06-27 23:55 (the download check).

    Raises:
        DataError: naming the first problem found and the fix.
    """
    return validate_speed(
        df.to_numpy(dtype=np.float64, copy=True),
        df.index,
        list(df.columns),
        sensor_ids,
        path=path,
        require_full=require_full,
    )


def validate_speed(
    speed: np.ndarray,
    index,
    columns: list,
    sensor_ids: list[str],
    *,
    path: Path | str = "speed file",
    require_full: bool = False,
) -> tuple[np.ndarray, pd.DatetimeIndex]:
    """:func:`validate_speed_frame` on the parts of a frame: values ``[T, N]``, index, columns.

    The columns are all of ``sensor_ids`` or a subset of them, in ``graph_sensor_ids.txt``
    order (:func:`sensor_positions`).
    """
    cols = [str(c).strip() for c in columns]
    sensor_positions(cols, sensor_ids, path=path)
    index = _time_index(index, path)
    if speed.shape != (len(index), len(cols)):
        raise DataError(
            f"{path}: values {speed.shape} do not match {len(index)} timestamps x {len(cols)} columns. "
            "Fix: use an unmodified metr-la.h5 (`diagsink data download`)."
        )
    _check_speed_values(speed, index, cols, path)
    if require_full and (
        speed.shape != (FULL_STEPS, len(sensor_ids))
        or index[0] != FULL_START
        or index[-1] != FULL_END
    ):
        raise DataError(
            f"{path} is {speed.shape[0]} x {speed.shape[1]} from {index[0]} to {index[-1]}; the full METR-LA is "
            f"{FULL_STEPS} x {N_SENSORS} from {FULL_START} to {FULL_END}. Fix: download the complete file "
            "(`diagsink data download`)."
        )
    return speed, pd.DatetimeIndex(index)


def _time_index(index, path: Path | str) -> pd.DatetimeIndex:
    """``index`` as a non-empty :class:`pandas.DatetimeIndex` in contiguous 5-minute steps, or a DataError."""
    if not isinstance(index, pd.DatetimeIndex):
        try:
            if pd.api.types.is_numeric_dtype(np.asarray(index)):
                raise TypeError(
                    "a numeric index is not a time"
                )  # pandas would read it as ns since 1970
            index = pd.DatetimeIndex(index)
        except Exception as exc:
            raise DataError(
                f"the index of {path} is not a timestamp index. Fix: store the speeds with a 5-minute DatetimeIndex "
                "(as DCRNN's metr-la.h5 does)."
            ) from exc
    if len(index) == 0:
        raise DataError(f"{path} holds no rows. Fix: `diagsink data download`.")
    if len(index) > 1:
        steps = np.diff(index.to_numpy().astype("datetime64[ns]").view(np.int64))
        bad = np.flatnonzero(steps != STEP.value)
        if bad.size:
            i = int(bad[0])
            raise DataError(
                f"the time index of {path} is not contiguous at 5 minutes: {bad.size} gaps or jumps, the first "
                f"between {index[i]} and {index[i + 1]}. Fix: reindex to a full 5-minute range and fill missing rows "
                "with 0 (df.reindex(pd.date_range(start, end, freq='5min'), fill_value=0)), or use an unmodified metr-la.h5."
            )
    return index


def _check_speed_values(
    speed: np.ndarray, index: pd.DatetimeIndex, cols: list[str], path: Path | str
) -> None:
    """Speeds ``[T, N]`` must be finite, ``>= 0`` (0: missing) and at most ``MAX_SPEED``; else a DataError."""
    finite = np.isfinite(speed)
    if not finite.all():
        r, c = np.argwhere(~finite)[0]
        raise DataError(
            f"{path} holds {int((~finite).sum())} NaN or infinite values (first at {index[r]}, sensor {cols[c]}). "
            "METR-LA marks a missing reading with 0. Fix: df.fillna(0) for NaN (and check where the inf came from), "
            "or use an unmodified metr-la.h5."
        )
    if (speed < 0).any():
        r, c = np.argwhere(speed < 0)[0]
        raise DataError(
            f"{path} holds {int((speed < 0).sum())} negative speeds (first {speed[r, c]} at {index[r]}, sensor {cols[c]}). "
            "Speeds are >= 0 and 0 means missing. Fix: use an unmodified metr-la.h5 (`diagsink data download`)."
        )
    if (speed > MAX_SPEED).any():
        r, c = np.argwhere(speed > MAX_SPEED)[0]
        raise DataError(
            f"{path} holds {int((speed > MAX_SPEED).sum())} speeds above {MAX_SPEED:g} mph, which no loop "
            f"detector reports (first {speed[r, c]:g} at {index[r]}, sensor {cols[c]}). Fix: set the bad "
            "readings to 0 (missing), e.g. df[df > 150] = 0, or use an unmodified metr-la.h5."
        )
