"""diagsink: temporal attention, its diagonal sink, and three ways to regulate it.

The package behind the book *Stochastic Parroting in Temporal Attention*, an executable
companion to Hankemeier & Schilling (ESANN 2026, arXiv 2602.10956). One concept per module:

* :mod:`diagsink.settings`    quick/full mode, data folder, device (``DIAGSINK_QUICK``, ``DIAGSINK_DATA``)
* :mod:`diagsink.attention`   :class:`~diagsink.attention.TemporalAttention` and the diagonal regularizers
* :mod:`diagsink.positional`  sinusoidal, tAPE and learned positional encodings
* :mod:`diagsink.variants`    the paper's five variants: names, letters, labels, layer arguments

Tensor shapes follow ``[batch, time, nodes, channels]`` for traffic data and
``[..., T, C]`` (time second-to-last) inside the attention layer.
"""

from __future__ import annotations

from . import (  # METR-LA: book/metr_la.ipynb  # depth: stacks of layers and LayerNorm; the Jacobian and its bounds: book/jacobian.ipynb, book/bounds.ipynb  # book/parroting.ipynb (plotting: the whole book)
    adjacency,
    baselines,
    data,
    depth,
    exercises,
    jacobian,
    metrics,
    parroting,
    plotting,
    protocol,
    stats,
    variants,  # the one list of the paper's five variants (every chapter)
)
from .attention import DIAG_OPTIONS, TemporalAttention, diagonal_bias
from .errors import ConfigError, DataError, DiagsinkError
from .positional import PositionalEncoding, sinusoidal_table, tape_table
from .settings import Settings, pick, settings

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "exercises",
    "adjacency",
    "baselines",
    "data",
    "metrics",
    "protocol",
    "parroting",
    "plotting",
    "stats",
    "variants",
    "jacobian",
    "depth",
    "settings",
    "Settings",
    "pick",
    "TemporalAttention",
    "diagonal_bias",
    "DIAG_OPTIONS",
    "PositionalEncoding",
    "sinusoidal_table",
    "tape_table",
    "DiagsinkError",
    "DataError",
    "ConfigError",
]
