"""Backward simulator on hand-computed graphs; knee point on frontiers."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_memplan.core.simulate import (
    RecomputeGraph,
    knee_point,
    simulate_backward,
)
from lightning_memplan.solvers import dp_knapsack, pareto_frontier


def chain(sizes: list[float], runtimes: list[float] | None = None) -> RecomputeGraph:
    n = len(sizes)
    return RecomputeGraph(
        names=tuple(f"n{i}" for i in range(n)),
        memory=tuple(sizes),
        runtimes=tuple(runtimes or [1.0] * n),
        edges=tuple((i, i + 1) for i in range(n - 1)),
    )


def test_save_everything_peaks_at_the_start() -> None:
    sim = simulate_backward(chain([10, 20, 30]), [0, 1, 2])
    assert sim.saved_memory == 60 and sim.peak_memory == 60
    assert sim.recompute_runtime == 0 and sim.recomputed == ()
    assert sim.timeline == (60, 30, 10, 0)


def test_recompute_from_the_last_saved_node() -> None:
    # save n0 only: n2's turn recomputes n1 and n2 (10 + 20 + 30 live), then frees in reverse
    sim = simulate_backward(chain([10, 20, 30], [1.0, 2.0, 4.0]), [0])
    assert sim.recomputed == (1, 2)
    assert sim.peak_memory == 60
    assert sim.recompute_runtime == 6.0
    assert sim.timeline == (10, 30, 60, 30, 10, 0)


def test_saved_inputs_are_not_counted_twice() -> None:
    # diamond: 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3; save 0 and 1; 3 needs 2 recomputed (0 is live)
    g = RecomputeGraph(
        names=("a", "b", "c", "d"), memory=(8, 4, 2, 1), runtimes=(1, 1, 1, 1),
        edges=((0, 1), (0, 2), (1, 3), (2, 3)),
    )
    sim = simulate_backward(g, [0, 1])
    assert sim.recomputed == (2, 3)
    # 12 saved, + c (2) + d (1) = 15; torch's evaluator would add a's 8 bytes again
    assert sim.peak_memory == 15


def test_each_node_recomputed_at_most_once() -> None:
    rng = np.random.default_rng(3)
    n = 40
    edges = {(int(a), int(b)) for a, b in rng.integers(0, n, (120, 2)) if a < b}
    g = RecomputeGraph(
        names=tuple(map(str, range(n))), memory=tuple(rng.uniform(1, 10, n)),
        runtimes=tuple(rng.uniform(1, 10, n)), edges=tuple(sorted(edges)),
    )
    saved = [i for i in range(n) if rng.random() < 0.3]
    sim = simulate_backward(g, saved)
    assert len(sim.recomputed) == len(set(sim.recomputed))
    assert set(sim.recomputed).isdisjoint(saved)
    assert sim.peak_memory == pytest.approx(max(sim.timeline))
    assert sim.timeline[-1] == pytest.approx(0.0, abs=1e-9)
    # saving everything never recomputes; saving nothing recomputes everything exactly once
    assert simulate_backward(g, []).recompute_runtime == pytest.approx(sum(g.runtimes))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(memory=(1.0,), runtimes=(1.0, 2.0), edges=()), r"one memory and runtime entry per name"),
        (dict(memory=(1.0, 1.0), runtimes=(1.0, 1.0), edges=((0, 5),)), r"edges` entry \(0, 5\) must join"),
        (dict(memory=(1.0, 1.0), runtimes=(1.0, 1.0), edges=((0, 1), (1, 0))), r"contain a cycle"),
    ],
)
def test_bad_graph(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RecomputeGraph(names=("a", "b"), **kwargs)


def test_bad_saved_index() -> None:
    with pytest.raises(ValueError, match=r"`saved` holds indices outside range\(3\): \[7\]"):
        simulate_backward(chain([1, 2, 3]), [7])


def test_knee_is_closest_to_origin_on_the_full_frontier() -> None:
    rng = np.random.default_rng(1)
    memory = rng.uniform(0.01, 0.2, 30)
    memory /= memory.sum()
    runtimes = rng.uniform(1, 100, 30) ** 2
    knee = knee_point(memory, runtimes)
    fr = knee.frontier
    mem, cost = fr.normalized()
    # brute force over all frontier points
    d = [math.hypot(a, b) for a, b in zip(mem, cost)]
    assert knee.index == int(np.argmin(d)) and knee.distance == pytest.approx(min(d))
    assert 0 < knee.index < len(fr.memory) - 1
    # the knee's budget really achieves its runtime
    assert dp_knapsack(memory, runtimes, knee.budget, complete=False)[0] == pytest.approx(knee.runtime)
    assert knee_point(fr) == knee


def test_knee_degenerate_and_errors() -> None:
    single = knee_point(pareto_frontier([0.0], [5.0]))
    assert single.index == 0 and single.distance == 0.0
    with pytest.raises(ValueError, match=r"needs `runtimes` too"):
        knee_point([0.5, 0.5])
    with pytest.raises(ValueError, match=r"pass runtimes only with memory"):
        knee_point(pareto_frontier([0.5], [1.0]), [1.0])
