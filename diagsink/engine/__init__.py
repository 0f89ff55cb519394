"""The training engine: configs, one run, runs on disk, artifacts, sweeps, statistics over seeds.

* :mod:`~diagsink.engine.config`        protocols (``paper``, ``book``, ``quick``, ``slice``) and their checks
* :mod:`~diagsink.engine.prepare`       data on the device, batches of windows
* :mod:`~diagsink.engine.loop`          the one training loop (:func:`~diagsink.engine.loop.fit_epoch`)
* :mod:`~diagsink.engine.epoch`         one epoch of a T&S run: window order, batches, gradient steps; the one-process run
* :mod:`~diagsink.engine.early_stopping` improved? stop? on the validation error
* :mod:`~diagsink.engine.train`         one run: data on the device, model, epochs, test, artifact
* :mod:`~diagsink.engine.runs`          paths, checkpoints, skip or redo, ``reproduce``
* :mod:`~diagsink.engine.provenance`    commit, device and memory setting of a run
* :mod:`~diagsink.engine.artifacts`     the result files and their checks
* :mod:`~diagsink.engine.reload`        a committed run rebuilt from its weights; its metrics recomputed
* :mod:`~diagsink.engine.significance`  metric tables, t quantiles, paired comparisons
* :mod:`~diagsink.engine.sweeps`        one setting trained at several values
* :mod:`~diagsink.engine.distributed`   data-parallel training under ``torchrun``: calls a run on every rank with that rank's processes

Explained in the chapters ``book/model.ipynb`` (the loop) and ``book/results.ipynb`` (the runs).
"""

from __future__ import annotations

from . import (
    artifacts,
    config,
    distributed,
    early_stopping,
    epoch,
    loop,
    prepare,
    provenance,
    reload,
    runs,
    significance,
    sweeps,
    train,
)

__all__ = [
    "artifacts",
    "config",
    "distributed",
    "early_stopping",
    "epoch",
    "loop",
    "prepare",
    "provenance",
    "reload",
    "runs",
    "significance",
    "sweeps",
    "train",
]
