"""METR-LA and everything made from it: files, windows, the road graph, baselines, toy data.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA"). The modules:

* :mod:`~diagsink.data.metr_la`    :func:`~diagsink.data.metr_la.load_metr_la` and the :class:`~diagsink.data.metr_la.MetrLA` it returns
* :mod:`~diagsink.data.files`      finding, reading and checking each file
* :mod:`~diagsink.data.download`   fetching the files from public mirrors, with checksums
* :mod:`~diagsink.data.windows`    the 12-in/12-out windows, the chronological split, the scaler
* :mod:`~diagsink.data.adjacency`  DCRNN's Gaussian-kernel graph and its diffusion supports
* :mod:`~diagsink.data.baselines`  historical averages, last value, linear forecaster
* :mod:`~diagsink.data.synthetic`  a small synthetic stand-in for tests and demonstrations (:func:`toy_data`)

Every public name of these modules is importable from :mod:`diagsink.data` itself.

The data folder's layout, the accepted names of the speed file and the handling of missing
readings are documented once, in :mod:`diagsink.data.metr_la`.
"""

from __future__ import annotations

from . import adjacency, baselines, download, files, metr_la, synthetic, windows
from ._unpickle import RestrictedUnpickler
from .adjacency import *  # noqa: F403
from .baselines import *  # noqa: F403
from .files import *  # noqa: F403
from .metr_la import *  # noqa: F403
from .synthetic import *  # noqa: F403
from .windows import *  # noqa: F403

__all__ = [
    "adjacency",
    "baselines",
    "download",
    "files",
    "metr_la",
    "synthetic",
    "windows",
    "RestrictedUnpickler",
    *adjacency.__all__,
    *baselines.__all__,
    *files.__all__,
    *metr_la.__all__,
    *synthetic.__all__,
    *windows.__all__,
]
