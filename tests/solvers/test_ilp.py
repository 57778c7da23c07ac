"""ILP specifics: time limit, optimality flag."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_memplan.solvers import SolverTimeLimitWarning, ilp_solve
from lightning_memplan.solvers._problem import fits


def test_ilp_reports_proven_optimum() -> None:
    res = ilp_solve([0.3, 0.3, 0.3, 0.2], [3.0, 2.0, 2.0, 2.5], 0.6)
    assert res.optimal and res.saved == [0, 3] and res.value == 5.5


def test_ilp_time_limit_returns_feasible_plan_and_warns() -> None:
    rng = np.random.default_rng(5)
    n = 3000
    # strongly correlated instance: hard for branch and bound, little to reduce
    memory = rng.integers(1, 10**6, n) / 2.0**30
    runtimes = memory * 2.0**30 + 1e5
    budget = float(memory.sum() / 2)
    with pytest.warns(SolverTimeLimitWarning, match=r"time_limit=1e-06 s before proving optimality"):
        res = ilp_solve(memory, runtimes, budget, time_limit=1e-6)
    assert not res.optimal
    assert fits(memory, res.saved, budget)
    assert sorted(res.saved + res.recomputed) == list(range(n))
