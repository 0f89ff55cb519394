"""Early stopping: the rule that says whether an epoch improved on the best and when to stop.

The training run (:func:`diagsink.engine.train.train_model`) asks it once per epoch, with the
epoch's validation masked MAE; when it says *improved*, the run keeps a copy of the weights,
and those best-validation weights are restored before testing. Explained in the chapter "The
T&S model and its training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["EarlyStopping"]


@dataclass
class EarlyStopping:
    """Stop after ``patience`` epochs in a row without an improvement of more than ``min_delta``.

    An epoch *improves* when its value is below ``best - min_delta`` (strictly: a tie with the
    best, or a gain of exactly ``min_delta``, is no improvement, and the earlier epoch stays the
    best). A NaN never improves (every comparison with it is false) and counts as a bad epoch.
    The fields are the whole state, so a run that resumes from a checkpoint carries on with
    the same decisions.

    Attributes:
        patience: bad epochs in a row that end the run (``>= 1``).
        min_delta: the smallest decrease that counts as an improvement (``>= 0``).
        best: the best value so far (``inf`` before the first epoch).
        best_epoch: the (0-based) epoch of ``best`` (``-1`` before the first epoch).
        bad_epochs: epochs since the last improvement.
    """

    patience: int
    min_delta: float = 0.0
    best: float = math.inf
    best_epoch: int = -1
    bad_epochs: int = 0

    def __post_init__(self) -> None:
        if not self.patience >= 1:
            raise ConfigError(
                f"patience = {self.patience!r}; it counts epochs. Fix: 1 or more, e.g. 5."
            )
        if not self.min_delta >= 0:
            raise ConfigError(
                f"min_delta = {self.min_delta!r} is negative or NaN. Fix: 0 or more, e.g. 1e-4."
            )

    def step(self, value: float, epoch: int) -> bool:
        """Record ``epoch``'s ``value`` (lower is better); return True when it is the new best."""
        if value < self.best - self.min_delta:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        """True once ``patience`` epochs in a row brought no improvement."""
        return self.bad_epochs >= self.patience
