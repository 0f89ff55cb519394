"""diagsink: temporal attention, its diagonal sink, and three ways to regulate it.

The package behind the book *Stochastic Parroting in Temporal Attention*, an executable
companion to Hankemeier & Schilling (ESANN 2026, arXiv 2602.10956). The modules a chapter
teaches carry its name and sit at the top; the machinery sits one level down.

Chapter modules (``ds.<name>``):

* :mod:`diagsink.attention`   :class:`TemporalAttention` and the diagonal regularizers (attention chapter)
* :mod:`diagsink.positional`  sinusoidal, tAPE and learned positional encodings (attention chapter)
* :mod:`diagsink.jacobian`    the layer's Jacobian, its four paths and their bounds (Jacobian, bounds)
* :mod:`diagsink.coupling`    the query path is bounded by the logit spread (bounds chapter)
* :mod:`diagsink.depth`       Jacobians of stacks of layers and LayerNorm (depth chapter)
* :mod:`diagsink.toy`         toy layers, their inputs and sweeps over T (Jacobian, bounds, scaling)
* :mod:`diagsink.parroting`   the parroting task and its measurements (parroting chapter;
  the tasks themselves in :mod:`diagsink.parrot_tasks`)
* :mod:`diagsink.graphconv`, :mod:`diagsink.sparse`, :mod:`diagsink.model`  the T&S model (model chapter)
* :mod:`diagsink.metrics`, :mod:`diagsink.stats`, :mod:`diagsink.plotting`  metrics, attention-map
  statistics, the book's figures (results, heatmaps)
* :mod:`diagsink.sensitivity` where the sink lives in a trained model: input-step profile, maps
* :mod:`diagsink.probe`, :mod:`diagsink.regularize`  diagnose and regularize the sink in any
  PyTorch model (the chapter "Your own model")
* :mod:`diagsink.scaling`     costs and memory as the graph and T grow (scaling chapter)
* :mod:`diagsink.variants`    the paper's five variants: names, letters, labels, layer arguments
* :mod:`diagsink.released`    what the paper's released code does, re-stated and tested (METR-LA, model, results)
* :mod:`diagsink.runtime`     quick/full mode, data folder, device (:func:`settings`, :func:`pick`)

Machinery (subpackages): :mod:`diagsink.data` (METR-LA, windows, graph, baselines, toy data),
:mod:`diagsink.engine` (training, runs, artifacts, configs, sweeps, statistics over seeds),
:mod:`diagsink.course` (student and instructor editions), :mod:`diagsink.cli` (the command line).

Tensor shapes follow ``[batch, time, nodes, channels]`` for traffic data and
``[..., T, C]`` (time second-to-last) inside the attention layer.
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import (  # noqa: E402  (the submodules read __version__)
    attention,
    coupling,
    data,
    depth,
    engine,
    exercises,
    graphconv,
    jacobian,
    metrics,
    model,
    parrot_tasks,
    parroting,
    plotting,
    positional,
    probe,
    released,
    scaling,
    sensitivity,
    sparse,
    stats,
    toy,
    variants,
)
from .attention import DIAG_OPTIONS, TemporalAttention, diagonal_bias  # noqa: E402
from .errors import ConfigError, DataError, DiagsinkError  # noqa: E402
from .model import TSModel  # noqa: E402
from .positional import PositionalEncoding, sinusoidal_table, tape_table  # noqa: E402
from .regularize import regularize  # noqa: E402  (the function; its module: diagsink.regularize)
from .runtime import Settings, pick, settings  # noqa: E402

__all__ = [
    "__version__",
    "attention",
    "coupling",
    "data",
    "depth",
    "engine",
    "exercises",
    "graphconv",
    "jacobian",
    "metrics",
    "model",
    "parroting",
    "parrot_tasks",
    "plotting",
    "positional",
    "probe",
    "released",
    "scaling",
    "sensitivity",
    "sparse",
    "stats",
    "toy",
    "variants",
    "settings",
    "Settings",
    "pick",
    "regularize",
    "TemporalAttention",
    "TSModel",
    "diagonal_bias",
    "DIAG_OPTIONS",
    "PositionalEncoding",
    "sinusoidal_table",
    "tape_table",
    "DiagsinkError",
    "DataError",
    "ConfigError",
]
