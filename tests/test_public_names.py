"""The names the docs promise are importable from ``lightning_memplan`` itself, one object each."""
from __future__ import annotations

import warnings

import pytest

import lightning_memplan

pytestmark = pytest.mark.unit


def test_every_public_name_resolves() -> None:
    for name in lightning_memplan.__all__:
        assert getattr(lightning_memplan, name) is not None, name


def test_memplan_warning_is_the_one_class_every_part_warns_with() -> None:
    from lightning_memplan import MemPlanWarning
    from lightning_memplan.callback import MemPlanWarning as from_callback
    from lightning_memplan.planner import messages

    assert MemPlanWarning is from_callback is messages.MemPlanWarning
    assert issubclass(MemPlanWarning, UserWarning)
    assert not hasattr(messages, "PlanWarning")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemPlanWarning)
        with pytest.raises(MemPlanWarning):
            warnings.warn("x", MemPlanWarning, stacklevel=1)
