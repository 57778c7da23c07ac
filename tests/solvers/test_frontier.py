"""pareto_frontier against brute force and against per-budget dp solves."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from lightning_memplan.solvers import dp_knapsack, pareto_frontier
from lightning_memplan.solvers._problem import MAX_QUANTA, effective_scale, quantize_sizes

from .oracle import random_instance, subsets


def test_frontier_matches_brute_force_staircase() -> None:
    rng = np.random.default_rng(11)
    for k in range(400):
        n = int(rng.integers(1, 10))
        memory, runtimes, _ = random_instance(rng, n, ("loguniform", "grid", "wide")[k % 3])
        fr = pareto_frontier(memory, runtimes)
        b = subsets(n)
        qsum = b.astype(np.int64) @ quantize_sizes(memory, 10_000)
        value = b @ runtimes
        # best value for every capacity, by brute force, then its strict increases
        caps = np.unique(qsum)
        best = np.array([value[qsum <= c].max() for c in caps])
        keep = np.concatenate(([True], np.diff(best) > 0))
        assert np.allclose(fr.memory * 10_000, caps[keep] if caps[0] == 0 else np.concatenate(([0], caps[keep])))
        assert fr.runtime[-1] == pytest.approx(runtimes[runtimes > 0].sum() + 0.0, rel=1e-12)
        assert np.all(np.diff(fr.memory) > 0) and np.all(np.diff(fr.runtime) > 0)
        assert fr.total_runtime == pytest.approx(runtimes.sum())


def test_issue_24_frontier_of_any_finite_sizes() -> None:
    # sizes up to 1e300: the frontier coarsens its step by a power of two and stays exact for it
    rng = np.random.default_rng(2424)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        memory, runtimes, _ = random_instance(rng, n, "extreme")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fr = pareto_frontier(memory, runtimes)
        assert fr.scale == effective_scale(math.fsum(memory), 10_000)
        q = quantize_sizes(memory, fr.scale)
        assert q.sum() <= MAX_QUANTA + n
        b = subsets(n)
        qsum, value = b.astype(np.int64) @ q, b @ runtimes
        caps = np.unique(np.concatenate(([0], qsum)))
        best = np.array([value[qsum <= c].max(initial=0.0) for c in caps])
        keep = np.concatenate(([True], np.diff(best) > 0))
        assert np.array_equal(fr.memory, caps[keep] / float(fr.scale))
        assert np.allclose(fr.runtime, best[keep], rtol=1e-12, atol=0)


def test_frontier_agrees_with_dp_at_every_budget() -> None:
    rng = np.random.default_rng(12)
    memory = np.exp(rng.uniform(0, np.log(1e3), 300))
    memory /= memory.sum()
    runtimes = np.exp(rng.uniform(0, np.log(1e6), 300))
    fr = pareto_frontier(memory, runtimes)
    for budget in np.linspace(0, 1, 23):
        assert fr.best_runtime(budget) == pytest.approx(
            dp_knapsack(memory, runtimes, budget, complete=False)[0], rel=1e-12
        )


def test_frontier_normalized_and_empty() -> None:
    fr = pareto_frontier([0.5, 0.5], [1.0, 3.0])
    mem, cost = fr.normalized()
    assert mem.tolist() == [0.0, 0.5, 1.0] and cost.tolist() == [1.0, 0.25, 0.0]
    empty = pareto_frontier([], [])
    assert empty.memory.tolist() == [0.0] and empty.runtime.tolist() == [0.0]
