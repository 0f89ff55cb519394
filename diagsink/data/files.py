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
    "SPEED_FILES",
    "GRAPH_FILES",
    "FULL_STEPS",
    "FULL_START",
    "FULL_END",
    "N_SENSORS",
    "STEP",
    "DOWNLOAD_HINT",
]

#: Accepted file names of the speed matrix, in the order they are looked for.
SPEED_FILES: tuple[str, ...] = ("metr-la.h5", "metr-la_first1026steps.h5")
#: The DCRNN graph files the loader needs (``adj_mx.npy`` may replace ``adj_mx.pkl``).
GRAPH_FILES: tuple[str, ...] = ("graph_sensor_ids.txt", "graph_sensor_locations.csv", "adj_mx.pkl")
#: Shape and time range of the full data set.
FULL_STEPS = 34272
N_SENSORS = 207
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


def find_speed_file(root: Path) -> Path | None:
    """The first of :data:`SPEED_FILES` present in ``root``, or ``None``."""
    for name in SPEED_FILES:
        if (root / name).is_file():
            return root / name
    return None


def missing_files(root: Path) -> list[str]:
    missing = []
    if find_speed_file(root) is None:
        missing.append(" or ".join(SPEED_FILES))
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
        adj = np.load(npy, allow_pickle=False)
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

    This goes through pandas, which lets PyTables unpickle some stored attributes (e.g. the
    index ``freq``); :func:`read_speed_arrays` avoids that for the standard fixed layout and
    uses this function only for other layouts.

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
            df = store[key]
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


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _read_fixed_arrays(path: Path) -> tuple[np.ndarray, pd.DatetimeIndex, list[str]] | None:
    """Read a pandas *fixed*-format frame (key ``df``, one float64 block) with PyTables directly.

    This reads the matrix once into a C-ordered ``[T, N]`` array (pandas would need twice the
    memory) and never touches pickled attributes (pandas unpickles the stored ``freq``).
    Returns ``None`` for any other layout; the caller then falls back to pandas.
    """
    # reason: PyTables is imported only when an HDF file is read (start-up time)
    import tables

    with tables.open_file(path, mode="r") as h5:
        if "/df" not in h5:
            return None
        group = h5.get_node("/df")
        if not isinstance(group, tables.Group):
            return None
        names = set(group._v_children)
        if (
            not {"axis0", "axis1", "block0_items", "block0_values"} <= names
            or "block1_values" in names
        ):
            return None
        attrs = group._v_attrs
        if (
            _text(getattr(attrs, "pandas_type", "")) != "frame"
            or int(getattr(attrs, "nblocks", 0)) != 1
        ):
            return None
        values_node = group.block0_values
        index_node = group.axis1
        index_attrs = index_node._v_attrs
        kind = _text(getattr(index_attrs, "kind", ""))
        if (
            values_node.dtype != np.float64
            or values_node.ndim != 2
            or not kind.startswith("datetime64")
            or "tz" in index_attrs._v_attrnames
            or not bool(getattr(values_node._v_attrs, "transposed", False))
        ):
            return None
        unit = kind[len("datetime64[") : -1] if "[" in kind else "ns"
        columns = [_text(c) for c in group.axis0.read()]
        if [_text(c) for c in group.block0_items.read()] != columns:
            return None
        index = pd.DatetimeIndex(index_node.read().astype(f"datetime64[{unit}]"))
        values = values_node.read()  # [T, N], C order
    if values.shape != (len(index), len(columns)):
        return None
    return np.ascontiguousarray(values), index, columns


def read_speed_arrays(path: str | Path) -> tuple[np.ndarray, pd.DatetimeIndex, list[str]]:
    """``(values float64 [T, N], index, columns)`` of a speed file: PyTables fast path, else pandas.

    Raises:
        DataError: the file is truncated, not HDF5, or has no table.
    """
    path = Path(path)
    try:
        with restricted_pytables(path):
            fast = _read_fixed_arrays(path)
    except DataError:
        raise
    except Exception:  # truncated or foreign file: let read_speed produce the message
        fast = None
    if fast is not None:
        return fast
    frame = read_speed(path)
    return frame.to_numpy(dtype=np.float64, copy=True), frame.index, list(frame.columns)


def validate_speed_frame(
    df: pd.DataFrame,
    sensor_ids: list[str],
    *,
    path: Path | str = "speed file",
    require_full: bool = False,
) -> tuple[np.ndarray, pd.DatetimeIndex]:
    """Check a speed frame and return ``(speed float64 [T, N], timestamps [T])``.

    Checks: columns equal ``sensor_ids`` in order, a DatetimeIndex that is contiguous at 5
    minutes, finite and non-negative values. With ``require_full`` also the full shape
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
    """:func:`validate_speed_frame` on the parts of a frame: values ``[T, N]``, index, columns."""
    cols = [str(c).strip() for c in columns]
    if cols != list(sensor_ids):
        extra = [c for c in cols if c not in set(sensor_ids)]
        if len(cols) != len(sensor_ids) or extra:
            detail = f"{len(cols)} columns, expected {len(sensor_ids)}" + (
                f"; unknown ids e.g. {extra[:3]}" if extra else ""
            )
        else:
            i = next(k for k, (a, b) in enumerate(zip(cols, sensor_ids)) if a != b)
            detail = f"same ids in another order (first difference at column {i}: {cols[i]} vs {sensor_ids[i]})"
        raise DataError(
            f"the columns of {path} are not the sensor ids of graph_sensor_ids.txt in order: {detail}. "
            "Fix: reorder with df[sensor_ids] if only the order differs, or use the metr-la.h5 that belongs "
            "to DCRNN's graph files (`diagsink data download`)."
        )
    if not isinstance(index, pd.DatetimeIndex):
        try:
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
    if speed.shape != (len(index), len(cols)):
        raise DataError(
            f"{path}: values {speed.shape} do not match {len(index)} timestamps x {len(cols)} columns. "
            "Fix: use an unmodified metr-la.h5 (`diagsink data download`)."
        )
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
    if require_full:
        if (
            speed.shape != (FULL_STEPS, N_SENSORS)
            or index[0] != FULL_START
            or index[-1] != FULL_END
        ):
            raise DataError(
                f"{path} is {speed.shape[0]} x {speed.shape[1]} from {index[0]} to {index[-1]}; the full METR-LA is "
                f"{FULL_STEPS} x {N_SENSORS} from {FULL_START} to {FULL_END}. Fix: download the complete file "
                "(`diagsink data download`)."
            )
    return speed, pd.DatetimeIndex(index)
