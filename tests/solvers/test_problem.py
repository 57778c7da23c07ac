"""Input validation: every error names the argument, shows the value and says what is allowed."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from lightning_memplan.solvers import SOLVER_NAMES, get_solver, pareto_frontier
from lightning_memplan.solvers._problem import (
    MAX_QUANTA,
    effective_scale,
    fits,
    quantize_budget,
    quantize_sizes,
)


@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize(
    ("memory", "runtimes", "budget", "match"),
    [
        ([0.1, math.nan], [1.0, 1.0], 0.5, r"`memory\[1\]` must be a finite non-negative number, got nan"),
        ([0.1, -0.2], [1.0, 1.0], 0.5, r"`memory\[1\]` must be a finite non-negative number, got -0.2"),
        ([math.inf, 0.2], [1.0, 1.0], 0.5, r"`memory\[0\]` must be a finite non-negative number, got inf"),
        ([0.1, -math.inf], [1.0, 1.0], 0.5, r"`memory\[1\]` must be a finite non-negative number, got -inf"),
        ([0.1, 0.2], [math.inf, 1.0], 0.5, r"`runtimes\[0\]` must be a finite non-negative number, got inf"),
        ([0.1, 0.2], [1.0, -3.0], 0.5, r"`runtimes\[1\]` must be .* got -3.0"),
        ([0.1, 0.2], [1.0], 0.5, r"one entry per item, got 2 and 1 entries"),
        ([0.1], [1.0], -0.5, r"`max_memory` must be a finite number >= 0, got -0.5"),
        ([0.1], [1.0], math.nan, r"`max_memory` must be a finite number >= 0, got nan"),
        ([0.1], [1.0], math.inf, r"`max_memory` must be a finite number >= 0, got inf"),
        ([0.1], [1.0], "half", r"`max_memory` must be a finite number >= 0, got 'half'"),
        ([[0.1]], [[1.0]], 0.5, r"`memory` must be one-dimensional .* shape \(1, 1\)"),
        (["a"], [1.0], 0.5, r"`memory` must be a sequence of finite non-negative numbers, got \['a'\]"),
    ],
)
def test_bad_input_raises_named_error(name: str, memory, runtimes, budget, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_solver(name)(memory, runtimes, budget)


@pytest.mark.parametrize("bad", ["cplex", "", None, 3])
def test_unknown_solver_lists_the_choices(bad: object) -> None:
    with pytest.raises(ValueError, match=r"unknown solver\. Expected one of 'greedy', 'dp', 'hirschberg', 'ilp'"):
        get_solver(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("scale", [0, -5, 2.5, True])
def test_bad_scale(scale: object) -> None:
    with pytest.raises(ValueError, match=r"`scale` must be a positive integer \(steps per unit\), got"):
        get_solver("dp")([0.1], [1.0], 0.5, scale=scale)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"`scale` must be a positive integer"):
        pareto_frontier([0.1], [1.0], scale=scale)  # type: ignore[arg-type]


def test_bad_time_limit() -> None:
    with pytest.raises(ValueError, match=r"`time_limit` must be a positive number of seconds, got 0"):
        get_solver("ilp")([0.1], [1.0], 0.5, time_limit=0)  # type: ignore[call-arg]


@pytest.mark.parametrize("budget", [0.0, 1.0, 104.0, 105.0, 6e9, 1e15, 1e30, 1.7e308])
def test_effective_scale_keeps_the_budget_within_max_quanta(budget: float) -> None:
    step = effective_scale(budget, 10_000)
    quanta = quantize_budget(budget, step, strict=True)
    if budget * 10_000 <= MAX_QUANTA:
        assert step == 10_000  # the documented scale, untouched
    else:  # the least power-of-two coarsening that fits: halving less would not
        assert MAX_QUANTA // 2 < quanta <= MAX_QUANTA
        ratio = 10_000 / step
        assert ratio.denominator == 1 and ratio.numerator & (ratio.numerator - 1) == 0  # 2**k
        assert math.floor(Fraction(budget) * step * 2) > MAX_QUANTA


def test_quantize_sizes_refuses_to_wrap() -> None:
    with pytest.raises(OverflowError, match="do not fit in int64"):
        quantize_sizes(np.array([1e15]), 10_000)


def test_quantization_rounds_sizes_up_and_budget_down() -> None:
    q = quantize_sizes(np.array([0.0, 1e-4, 1.5e-4, 1e-9, 0.30000000000000004]), 10_000)
    # 1e-4 snaps to one quantum, 1.5e-4 rounds up to two, a positive size is never free
    assert q.tolist() == [0, 1, 2, 1, 3000]
    assert quantize_budget(1.99e-4, 10_000) == 1
    assert quantize_budget(3e-4, 10_000) == 3


def test_strict_quantization_is_exact_rational() -> None:
    # float 1e-4 is slightly above 1/10000: strictly it needs two quanta
    assert quantize_sizes(np.array([1e-4]), 10_000, strict=True).tolist() == [2]
    assert quantize_budget(3e-4, 10_000, strict=True) == 2


def test_fits_is_exact_at_the_boundary() -> None:
    mem = np.array([1e-4, 1e-4, 1e-4])
    assert fits(mem, [0, 1], 2e-4)
    # the exact sum of three float 1e-4 is above float 3e-4
    assert not fits(mem, [0, 1, 2], 3e-4)
    assert fits(mem, [], 0.0)
