"""Every registered exercise check lets an unfinished stub's NotImplementedError through.

The student notebooks rely on this: an exercise that is not done yet must show up as
exactly that error, never as a misleading hint ("return two numbers ...").
"""

from __future__ import annotations

import pytest

import diagsink as ds

LABELS = ds.exercises.labels()


def test_there_are_checks_for_every_chapter():
    chapters = {label.split("-")[1] for label in LABELS}
    assert {
        "attention",
        "jacobian",
        "bounds",
        "metr",
        "parroting",
        "model",
        "results",
        "heatmaps",
        "scaling",
    } <= chapters


@pytest.mark.parametrize("label", LABELS)
def test_stub_error_propagates(label: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(label)

    with pytest.raises(NotImplementedError, match=label):
        ds.exercises.check(label, stub)
