"""Early stopping (diagsink.engine.early_stopping): improvement, patience, ties, NaN, resume."""

from __future__ import annotations

import math

import pytest

from diagsink.engine.early_stopping import EarlyStopping
from diagsink.errors import ConfigError


def run(stopper: EarlyStopping, values: list[float]) -> list[tuple[bool, bool]]:
    """``(improved, should_stop)`` after each value, epochs 0, 1, ..."""
    return [(stopper.step(v, e), stopper.should_stop) for e, v in enumerate(values)]


def test_stops_after_patience_epochs_without_improvement():
    stopper = EarlyStopping(patience=2)
    steps = run(stopper, [5.0, 4.0, 4.5, 3.0, 3.5, 3.2])
    assert [s[0] for s in steps] == [True, True, False, True, False, False]
    assert [s[1] for s in steps] == [False, False, False, False, False, True]
    assert (stopper.best, stopper.best_epoch, stopper.bad_epochs) == (3.0, 3, 2)


def test_an_improvement_resets_the_count_of_bad_epochs():
    stopper = EarlyStopping(patience=3)
    run(stopper, [2.0, 2.1, 2.2])
    assert stopper.bad_epochs == 2 and not stopper.should_stop
    assert stopper.step(1.0, 3) and stopper.bad_epochs == 0
    assert not any(s for _, s in run(stopper, [1.5, 1.5]))


def test_a_tie_or_a_gain_of_min_delta_is_no_improvement_and_the_first_best_stays():
    tie = EarlyStopping(patience=5)
    run(tie, [1.0, 1.0])
    assert (tie.best_epoch, tie.bad_epochs) == (0, 1)
    delta = EarlyStopping(patience=5, min_delta=0.25)
    steps = run(delta, [1.0, 0.75, 0.74])  # 0.75 is exactly min_delta below: not enough
    assert [s[0] for s in steps] == [True, False, True]
    assert (delta.best, delta.best_epoch) == (0.74, 2)


def test_nan_is_a_bad_epoch_and_never_the_best():
    stopper = EarlyStopping(patience=2)
    assert not stopper.step(math.nan, 0)  # not even against inf
    assert stopper.best == math.inf and stopper.best_epoch == -1
    assert stopper.step(3.0, 1)
    assert not stopper.step(math.nan, 2) and stopper.best == 3.0
    assert not stopper.step(math.nan, 3) and stopper.should_stop


def test_a_stopper_rebuilt_from_its_fields_decides_like_the_one_that_ran_on():
    values = [4.0, 3.0, 3.5, 3.6, 2.0, 2.5, 2.6, 2.7]
    whole = EarlyStopping(patience=3, min_delta=0.1)
    expected = run(whole, values)
    first = EarlyStopping(patience=3, min_delta=0.1)
    head = run(first, values[:3])
    resumed = EarlyStopping(3, 0.1, first.best, first.best_epoch, first.bad_epochs)  # a checkpoint
    tail = [(resumed.step(v, e), resumed.should_stop) for e, v in enumerate(values[3:], start=3)]
    assert head + tail == expected
    assert (resumed.best, resumed.best_epoch) == (whole.best, whole.best_epoch) == (2.0, 4)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "kwargs, word",
    [({"patience": 0}, "patience"), ({"patience": 2, "min_delta": -1e-4}, "min_delta")],
)
def test_bad_settings_name_the_setting_and_the_fix(kwargs, word):
    with pytest.raises(ConfigError, match=rf"{word}.*Fix"):
        EarlyStopping(**kwargs)
