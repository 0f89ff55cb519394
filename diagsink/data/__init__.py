"""METR-LA and everything made from it: files, windows, the road graph, baselines, toy data.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA"). The modules:

* :mod:`~diagsink.data.metr_la`    :func:`~diagsink.data.metr_la.load_metr_la` and the :class:`~diagsink.data.metr_la.MetrLA` it returns
* :mod:`~diagsink.data.files`      finding, reading and checking each file
* :mod:`~diagsink.data.download`   fetching the files from public mirrors, with checksums
* :mod:`~diagsink.data.windows`    the 12-in/12-out windows, the chronological split, the scaler
* :mod:`~diagsink.data.adjacency`  DCRNN's Gaussian-kernel graph and its diffusion supports
* :mod:`~diagsink.data.baselines`  historical average and last value
* :mod:`~diagsink.data.toy`        a small synthetic stand-in for tests and demonstrations

Every public name of these modules is importable from :mod:`diagsink.data` itself.

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
  1026 real steps, shipped with this project's CI). A slice loads fine and is reported as
  PARTIAL by :attr:`~diagsink.data.metr_la.MetrLA.is_full` and :meth:`~diagsink.data.metr_la.MetrLA.describe`.

Missing readings are stored as 0.0 (never NaN). ``adj_mx.pkl`` is a Python-2 pickle; it is
read only through ``RestrictedUnpickler`` (``diagsink.data._unpickle``), which admits exactly the three numpy globals
an array needs and refuses everything else.
"""

from __future__ import annotations

from . import adjacency, baselines, download, files, metr_la, toy, windows
from ._unpickle import RestrictedUnpickler
from .adjacency import *  # noqa: F403
from .baselines import *  # noqa: F403
from .files import *  # noqa: F403
from .metr_la import *  # noqa: F403
from .toy import *  # noqa: F403
from .windows import *  # noqa: F403

__all__ = [
    "adjacency",
    "baselines",
    "download",
    "files",
    "metr_la",
    "toy",
    "windows",
    "RestrictedUnpickler",
    *adjacency.__all__,
    *baselines.__all__,
    *files.__all__,
    *metr_la.__all__,
    *toy.__all__,
    *windows.__all__,
]
