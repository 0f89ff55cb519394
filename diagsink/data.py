"""METR-LA: load and validate the traffic-speed matrix and the DCRNN road graph.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA").

The data folder (``root``) holds the files in the layout DCRNN uses::

    <root>/metr-la.h5                   speed matrix: pandas HDF, key "df", DatetimeIndex (5 min),
                                        columns = sensor ids in graph_sensor_ids.txt order
    <root>/graph_sensor_ids.txt         207 sensor ids, comma-separated, one line
    <root>/graph_sensor_locations.csv   index,sensor_id,latitude,longitude
    <root>/adj_mx.pkl                   (sensor_ids, sensor_id_to_ind, adj_mx): DCRNN's adjacency
                                        (or adj_mx.npy: the same matrix without pickle)

Accepted names for the speed file, tried in this order (:data:`SPEED_FILES`):

* ``metr-la.h5`` -- the full matrix (34272 steps x 207 sensors), as DCRNN distributes it;
* ``metr-la_first1026steps.h5`` -- a contiguous *slice* of it in the same layout (the first
  1026 real steps, shipped with this project's CI). A slice loads fine and is reported as
  PARTIAL by :attr:`MetrLA.is_full` and :meth:`MetrLA.describe`.

Missing readings are stored as 0.0 (never NaN). ``adj_mx.pkl`` is a Python-2 pickle; it is
read only through :class:`RestrictedUnpickler`, which admits exactly the three numpy globals
an array needs and refuses everything else.
"""

from __future__ import annotations

import io
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import sha256_file
from .errors import DataError
from .settings import settings

__all__ = [
    "MetrLA",
    "load_metr_la",
    "resolve_root",
    "find_speed_file",
    "read_sensor_ids",
    "read_locations",
    "read_adjacency",
    "read_speed",
    "validate_speed_frame",
    "validate_speed",
    "read_speed_arrays",
    "load_adj_pickle",
    "RestrictedUnpickler",
    "SPEED_FILES",
    "GRAPH_FILES",
    "FULL_STEPS",
    "FULL_START",
    "FULL_END",
    "N_SENSORS",
    "STEP",
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
# The data object
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetrLA:
    """The METR-LA speed matrix with its road graph.

    Attributes:
        speed: float64 ``[T, N]`` speeds in mph; ``0.0`` marks a missing reading (never NaN).
        timestamps: ``[T]`` contiguous 5-minute :class:`pandas.DatetimeIndex` (naive local time).
        sensor_ids: ``[N]`` sensor ids as strings, in ``graph_sensor_ids.txt`` order.
        adjacency: float32 ``[N, N]`` DCRNN ``adj_mx`` (directed, diagonal = 1).
        locations: columns ``sensor_id, latitude, longitude``; row ``i`` is ``sensor_ids[i]``.
        is_full: ``True`` only for the full 34272-step matrix starting 2012-03-01 00:00.
        path: the ``.h5`` file that was read.
        sha256: hex sha256 of that file.
    """

    speed: np.ndarray
    timestamps: pd.DatetimeIndex
    sensor_ids: list[str]
    adjacency: np.ndarray
    locations: pd.DataFrame
    is_full: bool
    path: Path
    sha256: str

    @property
    def n_steps(self) -> int:
        """Number of time steps ``T``."""
        return int(self.speed.shape[0])

    @property
    def n_nodes(self) -> int:
        """Number of sensors ``N``."""
        return int(self.speed.shape[1])

    @property
    def missing_fraction(self) -> float:
        """Fraction of readings equal to 0 (missing)."""
        return float((self.speed == 0).mean())

    def describe(self) -> str:
        """One line saying what was loaded, and plainly whether it is partial.

        E.g. ``"METR-LA, PARTIAL: first 1026 of 34272 steps (3.0 %), 207 sensors, ..."``.
        """
        start, end = self.timestamps[0], self.timestamps[-1]
        span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}"
        tail = f"{self.n_nodes} sensors, {span}, {100 * self.missing_fraction:.2f} % zeros (missing), file {self.path.name}"
        if self.is_full:
            return f"METR-LA, FULL: {self.n_steps} steps, {tail}"
        first = int(round((start - FULL_START) / STEP))
        share = 100.0 * self.n_steps / FULL_STEPS
        where = "first" if first == 0 else f"steps {first}..{first + self.n_steps - 1}, i.e."
        return f"METR-LA, PARTIAL: {where} {self.n_steps} of {FULL_STEPS} steps ({share:.1f} %), {tail}"

    def __repr__(self) -> str:  # the arrays are too big to print
        return f"MetrLA({self.describe()!r})"


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


def _missing_files(root: Path) -> list[str]:
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


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that admits only what a pickled numpy array needs.

    Allowed globals (``ALLOWED``): ``numpy.core.multiarray._reconstruct`` (or its numpy-2
    name ``numpy._core.multiarray._reconstruct``), ``numpy.ndarray`` and ``numpy.dtype``.
    Any other global (``os.system``, ``builtins.eval``, ...) raises :class:`DataError`, so a
    tampered ``adj_mx.pkl`` cannot run code.
    """

    ALLOWED: frozenset[tuple[str, str]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module: str, name: str):  # noqa: D102 - see class docstring
        if (module, name) not in self.ALLOWED:
            raise DataError(
                f"adj_mx.pkl asks for the global {module}.{name}, which a plain adjacency pickle never needs; "
                "refusing to load it (it may be tampered with). Fix: replace adj_mx.pkl with DCRNN's original "
                "(`diagsink data download`) or use adj_mx.npy."
            )
        if name == "_reconstruct":
            core = getattr(np, "_core", None)
            multiarray = core.multiarray if core is not None else np.core.multiarray  # numpy < 2
            return multiarray._reconstruct
        return getattr(np, name)


class _HDFAttributeUnpickler(pickle.Unpickler):
    """What PyTables may unpickle from an HDF speed file: pandas' date offsets (the index ``freq``), nothing else."""

    refused: list[str]

    def find_class(self, module: str, name: str):  # noqa: D102
        if module == "pandas._libs.tslibs.offsets" and name.isidentifier() and name[:1].isupper():
            cls = getattr(__import__(module, fromlist=[name]), name, None)
            from pandas.tseries.offsets import BaseOffset

            if isinstance(cls, type) and issubclass(cls, BaseOffset):
                return cls
        self.refused.append(f"{module}.{name}")
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


class _SafePickle:
    """Stands in for the ``pickle`` module inside PyTables while a speed file is read.

    PyTables unpickles every attribute that looks pickled as soon as a node's attributes are
    opened, and object arrays with ``pickle.loads``; a crafted ``.h5`` could run code that way.
    Here only pandas' date offsets are admitted; anything else is refused (PyTables then keeps the
    raw bytes) and recorded in ``refused``.
    """

    def __init__(self) -> None:
        self.refused: list[str] = []

    def __getattr__(self, name: str):  # constants such as HIGHEST_PROTOCOL, dumps for writing
        return getattr(pickle, name)

    def loads(self, data, *, encoding: str = "ASCII", errors: str = "strict", **_ignored):
        unpickler = _HDFAttributeUnpickler(
            io.BytesIO(bytes(data)), encoding=encoding, errors=errors
        )
        unpickler.refused = self.refused
        return unpickler.load()


class _restricted_pytables:
    """Context manager: PyTables (attributes and object atoms) unpickles through :class:`_SafePickle`.

    Raises :class:`DataError` on exit if the file asked for any other global.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.safe = _SafePickle()

    def __enter__(self) -> None:
        import tables.atom
        import tables.attributeset

        self.modules = (tables.atom, tables.attributeset)
        self.saved = [m.pickle for m in self.modules]
        for m in self.modules:
            m.pickle = self.safe

    def __exit__(self, *exc) -> None:
        for m, saved in zip(self.modules, self.saved):
            m.pickle = saved
        if self.safe.refused:
            raise DataError(
                f"{self.path} holds pickled Python objects (asking for {self.safe.refused[0]}); a METR-LA speed file "
                "holds only numbers, so it is refused (it may be tampered with, or saved from an object-dtype frame). "
                "Fix: save the speeds as float64 (df.astype('float64').to_hdf(path, key='df')), or delete it and run "
                f"`diagsink data download --force --root {self.path.parent}`."
            )


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
        with _restricted_pytables(path), pd.HDFStore(path, mode="r") as store:
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
        with _restricted_pytables(path):
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


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------
def load_metr_la(root: str | Path | None = None, *, download: bool | None = None) -> MetrLA:
    """Load METR-LA from ``root`` (argument, else ``DIAGSINK_DATA``, else the per-user cache).

    Args:
        root: the data folder (layout in the module docstring).
        download: fetch missing files from the public mirrors (:mod:`diagsink.download`) with a
            progress bar. ``None`` (default) downloads only into the per-user cache, i.e. when
            neither ``root`` nor ``DIAGSINK_DATA`` chose a folder; ``True``/``False`` force it.

    Returns:
        :class:`MetrLA`; a slice is loaded too and reported as PARTIAL (``is_full=False``).

    Raises:
        DataError: missing files (the message lists which and where to put them), wrong
            columns, index gaps, NaN/inf/negative speeds, truncated HDF, a tampered pickle.
    """
    folder = resolve_root(root)
    if download is None:
        import os

        download = root is None and not os.environ.get("DIAGSINK_DATA", "").strip()
    missing = _missing_files(folder)
    if missing and download:
        from .download import download_metr_la

        download_metr_la(folder)
        missing = _missing_files(folder)
    if missing:
        raise DataError(missing_files_message(folder, missing))

    sensor_ids = read_sensor_ids(folder / "graph_sensor_ids.txt")
    locations = read_locations(folder / "graph_sensor_locations.csv", sensor_ids)
    adjacency = read_adjacency(folder, sensor_ids)
    path = find_speed_file(folder)
    assert path is not None
    with warnings.catch_warnings():
        # pytables' NaturalNameWarning etc. are not the user's problem
        warnings.simplefilter("ignore")
        values, index, columns = read_speed_arrays(path)
    speed, timestamps = validate_speed(values, index, columns, sensor_ids, path=path)
    is_full = speed.shape[0] == FULL_STEPS and timestamps[0] == FULL_START
    return MetrLA(
        speed=speed,
        timestamps=timestamps,
        sensor_ids=sensor_ids,
        adjacency=adjacency,
        locations=locations,
        is_full=bool(is_full),
        path=path,
        sha256=sha256_file(path),
    )


# --------------------------------------------------------------------------------------------
# Command line: diagsink data download | info | verify
# --------------------------------------------------------------------------------------------
def _cmd_download(args) -> int:
    from .download import download_metr_la

    folder = download_metr_la(args.root, progress=not args.no_progress, force=args.force)
    print(load_metr_la(folder, download=False).describe())
    print(f"stored in {folder} (checksums in {folder / 'manifest.json'})")
    return 0


def _cmd_info(args) -> int:
    from .download import read_manifest

    folder = resolve_root(args.root)
    print(f"data folder: {folder}")
    manifest = read_manifest(folder).get("files", {})
    for name in (*SPEED_FILES, *GRAPH_FILES, "adj_mx.npy", "distances_la_2012.csv"):
        path = folder / name
        if path.is_file():
            sha = manifest.get(name, {}).get("sha256")
            print(
                f"  {name:32s} {path.stat().st_size:>12,d} bytes"
                + (f"  sha256 {sha[:16]}... (manifest)" if sha else "")
            )
    missing = _missing_files(folder)
    if missing:
        raise DataError(missing_files_message(folder, missing))
    print(load_metr_la(folder, download=False).describe())
    return 0


def _cmd_verify(args) -> int:
    from .download import EXPECTED_SHA256, read_manifest

    folder = resolve_root(args.root)
    data = load_metr_la(folder, download=False)  # raises on any structural problem
    print(data.describe())
    recorded = read_manifest(folder).get("files", {}).get(data.path.name, {}).get("sha256")
    print(f"sha256 {data.sha256}")
    if recorded:
        if recorded != data.sha256:
            raise DataError(
                f"{data.path} changed since it was downloaded (manifest sha256 {recorded}). "
                "Fix: run `diagsink data download --force`."
            )
        print("matches manifest.json")
    if data.is_full:
        note = "matches" if data.sha256 == EXPECTED_SHA256 else "differs from"
        print(
            f"{note} the third-party reference sha256 (unverified; the structural check above is what counts)"
        )
    else:
        print(
            "PARTIAL data: results computed on it are not comparable with published METR-LA numbers"
        )
    return 0


def add_commands(subparsers) -> None:
    """Register ``diagsink data download|info|verify`` (see :mod:`diagsink.cli`)."""
    parser = subparsers.add_parser("data", help="download, inspect and verify METR-LA")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    dl = sub.add_parser("download", help="fetch METR-LA from public mirrors into the data folder")
    info = sub.add_parser("info", help="show which METR-LA files are present and what they hold")
    verify = sub.add_parser("verify", help="check the METR-LA files (structure, checksums)")
    for p in (dl, info, verify):
        p.add_argument(
            "--root",
            default=None,
            help="data folder (default: DIAGSINK_DATA, else ~/.cache/diagsink/metr-la)",
        )
    dl.add_argument("--force", action="store_true", help="download again even if the files exist")
    dl.add_argument("--no-progress", action="store_true", help="no progress bar")
    dl.set_defaults(func=_cmd_download)
    info.set_defaults(func=_cmd_info)
    verify.set_defaults(func=_cmd_verify)
