"""METR-LA: load and validate the traffic-speed matrix and the DCRNN road graph.

The loader of the package :mod:`diagsink.data`; explained in the chapter ``book/metr_la.ipynb`` ("METR-LA").

The data folder (``root``) holds the files in the layout DCRNN uses::

    <root>/metr-la.h5                   speed matrix: pandas HDF, key "df", DatetimeIndex (5 min),
                                        columns = sensor ids in graph_sensor_ids.txt order
    <root>/graph_sensor_ids.txt         207 sensor ids, comma-separated, one line
    <root>/graph_sensor_locations.csv   index,sensor_id,latitude,longitude
    <root>/adj_mx.pkl                   (sensor_ids, sensor_id_to_ind, adj_mx): DCRNN's adjacency
                                        (or adj_mx.npy: the same matrix without pickle)

Accepted names for the speed file, tried in this order (:data:`~diagsink.data.files.SPEED_FILES`):

* ``metr-la.h5`` -- the full matrix (34272 steps x 207 sensors), as DCRNN distributes it;
* ``metr-la_first1026steps.h5`` -- a contiguous *slice* of it in the same layout (the first
  1026 real steps of all 207 sensors);
* ``metr-la_29sensors_allsteps.h5`` -- all 34,272 steps of 29 of the 207 sensors.

Any of them (or another file in this layout) can be named with ``speed_file``. A file may hold
a contiguous part of the time span and any subset of the sensors, as columns in
``graph_sensor_ids.txt`` order; the road graph is then restricted to those sensors by id. Such
a file loads fine and is reported as PARTIAL by :attr:`MetrLA.is_full` and
:meth:`MetrLA.describe` ("29 of 207 sensors, all 34272 steps").

Missing readings are stored as 0.0 (never NaN). ``adj_mx.pkl`` is a Python-2 pickle; it is
read only through ``RestrictedUnpickler`` (``diagsink.data._unpickle``), which admits exactly the three numpy globals
an array needs and refuses everything else.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .._io import sha256_file
from ..errors import DataError
from .download import download_metr_la
from .files import (
    FULL_START,
    FULL_STEPS,
    N_SENSORS,
    STEP,
    find_speed_file,
    missing_files,
    missing_files_message,
    read_adjacency,
    read_locations,
    read_sensor_ids,
    read_speed_arrays,
    resolve_root,
    sensor_positions,
    validate_speed,
)

__all__ = ["MetrLA", "load_metr_la"]


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
        adjacency: float32 ``[N, N]`` DCRNN ``adj_mx`` (directed, diagonal = 1), restricted
            to the file's sensors.
        locations: columns ``sensor_id, latitude, longitude``; row ``i`` is ``sensor_ids[i]``.
        is_full: ``True`` only for the full 34272-step matrix of all 207 sensors starting
            2012-03-01 00:00.
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
    n_sensors_total: int = N_SENSORS

    @property
    def all_steps(self) -> bool:
        """Whether the file holds the whole time span, all 34272 steps from 1 March 2012 on."""
        return self.n_steps == FULL_STEPS and self.timestamps[0] == FULL_START

    @property
    def coverage(self) -> str:
        """Which part of METR-LA this is, e.g. ``"29 of 207 sensors, all 34272 steps"``."""
        sensors = (
            f"all {self.n_nodes} sensors"
            if self.n_nodes == self.n_sensors_total
            else f"{self.n_nodes} of {self.n_sensors_total} sensors"
        )
        if self.all_steps:
            return f"{sensors}, all {self.n_steps} steps"
        first = int(round((self.timestamps[0] - FULL_START) / STEP))
        where = "first" if first == 0 else f"steps {first}..{first + self.n_steps - 1}, i.e."
        share = 100.0 * self.n_steps / FULL_STEPS
        return f"{sensors}, {where} {self.n_steps} of {FULL_STEPS} steps ({share:.1f} %)"

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

        E.g. ``"METR-LA, PARTIAL: all 207 sensors, first 1026 of 34272 steps (3.0 %), ..."`` or
        ``"METR-LA, PARTIAL: 29 of 207 sensors, all 34272 steps, ..."``.
        """
        start, end = self.timestamps[0], self.timestamps[-1]
        span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}"
        tail = f"{span}, {100 * self.missing_fraction:.2f} % zeros (missing), file {self.path.name}"
        if self.is_full:
            return f"METR-LA, FULL: {self.n_steps} steps, {self.n_nodes} sensors, {tail}"
        return f"METR-LA, PARTIAL: {self.coverage}, {tail}"

    def __repr__(self) -> str:  # the arrays are too big to print
        return f"MetrLA({self.describe()!r})"


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------
def load_metr_la(
    root: str | Path | None = None, *, download: bool | None = None, speed_file: str | None = None
) -> MetrLA:
    """Load METR-LA from ``root`` (argument, else ``DIAGSINK_DATA``, else the per-user cache).

    Args:
        root: the data folder (layout in the module docstring).
        speed_file: the speed file's name in ``root`` (e.g. ``"metr-la_29sensors_allsteps.h5"``);
            ``None``: the first of :data:`~diagsink.data.files.SPEED_FILES` there.
        download: fetch missing files from the public mirrors (:mod:`diagsink.data.download`) with a
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
        download = root is None and not os.environ.get("DIAGSINK_DATA", "").strip()
    missing = missing_files(folder, speed_file)
    if missing and download:
        download_metr_la(folder)
        missing = missing_files(folder, speed_file)
    if missing:
        raise DataError(missing_files_message(folder, missing))

    all_ids = read_sensor_ids(folder / "graph_sensor_ids.txt")
    locations = read_locations(folder / "graph_sensor_locations.csv", all_ids)
    adjacency = read_adjacency(folder, all_ids)
    path = find_speed_file(folder, speed_file)
    assert path is not None
    with warnings.catch_warnings():
        # pytables' NaturalNameWarning etc. are not the user's problem
        warnings.simplefilter("ignore")
        values, index, columns = read_speed_arrays(path)
    speed, timestamps = validate_speed(values, index, columns, all_ids, path=path)
    keep = sensor_positions([str(c).strip() for c in columns], all_ids, path=path)
    is_full = (
        len(keep) == len(all_ids) and speed.shape[0] == FULL_STEPS and timestamps[0] == FULL_START
    )
    return MetrLA(
        speed=speed,
        timestamps=timestamps,
        sensor_ids=[all_ids[i] for i in keep],
        adjacency=np.ascontiguousarray(adjacency[np.ix_(keep, keep)]),
        locations=locations.iloc[keep].reset_index(drop=True),
        is_full=bool(is_full),
        path=path,
        sha256=sha256_file(path),
        n_sensors_total=len(all_ids),
    )
