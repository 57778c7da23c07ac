"""torch's knapsack failures, each as a named regression test (torch 2.10-2.14 behaviour)."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_memplan.solvers import (
    dp_knapsack,
    get_solver,
    greedy_knapsack,
    hirschberg_knapsack,
    ilp_knapsack,
)
from lightning_memplan.solvers._problem import fits


def test_greedy_zero_size_item_no_zero_division() -> None:
    # torch: runtimes[i] / memory[i] -> ZeroDivisionError
    value, saved, recomputed = greedy_knapsack([0.0, 0.5, 0.6], [3.0, 2.0, 1.0], 0.5)
    assert saved == [0, 1] and recomputed == [2] and value == 5.0


def test_pytorch_197871_hirschberg_over_budget() -> None:
    # torch's right half gets one quantum too many and saves both items (2e-4 > 1e-4)
    value, saved, _ = hirschberg_knapsack([1e-4, 1e-4], [1.0, 2.0], 1e-4)
    assert saved == [1] and value == 2.0
    value, saved, _ = hirschberg_knapsack([1e-4, 1e-4, 1e-4], [1.0, 1.0, 1.0], 1e-4)
    assert len(saved) == 1


def test_hirschberg_never_over_budget_on_large_instances() -> None:
    rng = np.random.default_rng(197871)
    for n in (200, 1000):
        memory = np.exp(rng.uniform(0, np.log(1e4), n))
        memory /= memory.sum()
        runtimes = np.exp(rng.uniform(0, np.log(1e6), n))
        _, saved, _ = hirschberg_knapsack(memory, runtimes, 0.5)
        assert fits(memory, saved, 0.5)


def test_dp_items_that_round_to_zero_are_not_free() -> None:
    # torch: round(0.4) == 0 quanta, so all ten items "fit" in one quantum: 4x over budget
    memory = [4e-5] * 10
    _, saved, _ = dp_knapsack(memory, [1.0] * 10, 1e-4)
    assert sum(memory[i] for i in saved) <= 1e-4
    assert len(saved) == 2  # one by the quantized optimum, one more by the completion step


def test_dp_float64_keeps_small_values_next_to_huge_ones() -> None:
    # torch accumulates in float32: 1e12 + 1 == 1e12, so the second item looks worthless
    value, saved, _ = dp_knapsack([0.3, 0.3, 0.3], [1e12, 1.0, 1.0], 0.6, complete=False)
    assert saved == [0, 1] and value == 1e12 + 1.0
    value, saved, _ = hirschberg_knapsack([0.3, 0.3, 0.3], [1e12, 1.0, 1.0], 0.6, complete=False)
    assert saved == [0, 1] and value == 1e12 + 1.0


def test_float_noise_falls_back_to_strict_rounding() -> None:
    # snapped quantization says three 1e-4 items fit in 3e-4; their exact sum does not
    value, saved, _ = dp_knapsack([1e-4] * 3, [1.0] * 3, 3e-4)
    assert len(saved) == 2 and fits(np.array([1e-4] * 3), saved, 3e-4)


@pytest.mark.parametrize("name", ["greedy", "dp", "hirschberg", "ilp"])
@pytest.mark.parametrize(
    ("memory", "runtimes", "budget", "saved"),
    [
        ([1e15, 3e14, 7e14], [1.0, 2.0, 3.0], 1e15, [1, 2]),  # OverflowError in dp and hirschberg
        ([1e15, 0.3], [10.0, 1.0], 0.5, [1]),  # 1e19 quanta wrapped to one quantum, then overflowed
        ([4e9, 3e9, 2e9, 1e9], [4.0, 3.5, 2.0, 1.1], 6e9, [1, 2, 3]),  # bytes: a 6e13-quanta table
        ([1e30, 1e-30, 0.5, 3e29, 6e29], [5.0, 1.0, 2.0, 3.0, 4.0], 1e30, [1, 2, 3, 4]),
        ([1e-300, 1e-300, 2e-300], [1.0, 1.0, 3.0], 2e-300, [2]),
        ([1e308, 1e308, 5e307], [1.0, 2.0, 3.0], 1.5e308, [1, 2]),  # sums beyond the float range
    ],
)
def test_issue_24_huge_and_tiny_sizes(name: str, memory, runtimes, budget, saved) -> None:
    value, got, _ = get_solver(name)(memory, runtimes, budget)
    assert got == saved == ilp_knapsack(memory, runtimes, budget)[1]
    assert value == sum(runtimes[i] for i in saved)
    assert fits(np.asarray(memory), got, budget)
