"""The plan front's knee: one rule for the plan search and the backward simulator."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_memplan.core.front import knee
from lightning_memplan.core.simulate import knee_point
from lightning_memplan.solvers import pareto_frontier


def test_the_knee_is_the_point_nearest_the_origin_after_normalizing() -> None:
    # normalized: (0, 1), (0.1, 0.2), (1, 0) -> the middle point, at hypot(0.1, 0.2)
    index, distance = knee([0.0, 10.0, 100.0], [50.0, 10.0, 0.0])
    assert index == 1 and distance == pytest.approx(np.hypot(0.1, 0.2))


def test_ties_go_to_the_smaller_peak_and_a_flat_axis_counts_zero() -> None:
    assert knee([5.0, 1.0], [0.0, 1.0]) == (1, 1.0)  # both at distance 1: the smaller peak
    assert knee([3.0, 1.0, 2.0], [7.0, 7.0, 7.0]) == (1, 0.0)  # no cost spread: the smallest peak
    assert knee([4.0], [1.0]) == (0, 0.0)


def test_bad_fronts_are_named() -> None:
    with pytest.raises(ValueError, match=r"as many costs as peaks"):
        knee([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match=r"at least one"):
        knee([], [])


def test_the_simulator_takes_its_knee_from_the_same_rule() -> None:
    rng = np.random.default_rng(0)
    memory, runtimes = rng.uniform(0.01, 1.0, 40), rng.uniform(1.0, 100.0, 40)
    front = pareto_frontier(memory, runtimes)
    point = knee_point(front)
    assert (point.index, point.distance) == knee(front.memory.tolist(), (front.total_runtime - front.runtime).tolist())
    # brute force over the frontier's own normalization
    mem, cost = front.normalized()
    assert point.index == int(np.argmin(np.hypot(mem, cost)))
