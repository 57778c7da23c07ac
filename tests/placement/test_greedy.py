from __future__ import annotations

import numpy as np
import pytest
from _oracle import random_buffers  # noqa: E402  (tests/placement is on sys.path via conftest)

from lightning_memplan.placement import (
    Buffer,
    Failure,
    MemorySpace,
    greedy_by_position,
    greedy_by_size,
    peak_live,
    validate,
)

ALGOS = [greedy_by_size, greedy_by_position]


def test_greedy_by_size_uses_the_gap_above_every_lower_buffer() -> None:
    # Placed first (largest): tall [0, 10) at 0. Then mid [10, 14) and low... the gap rule must take
    # the highest end of *all* buffers below a gap, not only of the previous one.
    bufs = [
        Buffer(id="tall", lower=0, upper=10, size=10),
        Buffer(id="wide", lower=0, upper=10, size=6),
        Buffer(id="a", lower=0, upper=2, size=2),
        Buffer(id="b", lower=5, upper=9, size=2),
    ]
    plan = greedy_by_size(bufs, 64)
    assert validate(plan)
    assert plan.offset == (0, 10, 16, 16)


def test_greedy_by_size_prefers_the_smallest_gap_that_fits() -> None:
    bufs = [
        Buffer(id="base", lower=0, upper=10, size=8),
        Buffer(id="x", lower=0, upper=3, size=6),  # dies at 3 -> a 6-byte hole above base
        Buffer(id="y", lower=0, upper=10, size=5),
        Buffer(id="z", lower=3, upper=10, size=4),  # after x: hole [8, 14) ... picks the tight one
    ]
    plan = greedy_by_size(bufs, 64)
    assert validate(plan)
    assert plan.offset[3] == 8


def test_greedy_by_position_is_first_fit_in_start_order() -> None:
    bufs = [Buffer(id=0, lower=0, upper=2, size=4), Buffer(id=1, lower=1, upper=3, size=4), Buffer(id=2, lower=2, upper=4, size=4)]
    plan = greedy_by_position(bufs, 64)
    assert plan.offset == (0, 4, 0)
    assert plan.arena == (8,)


@pytest.mark.parametrize("algo", ALGOS)
def test_hierarchy_spills_to_the_next_space_then_leaves_unplaced(algo) -> None:  # type: ignore[no-untyped-def]
    bufs = [Buffer(id=i, lower=0, upper=4, size=4) for i in range(4)]
    spaces = [MemorySpace(name="sram", capacity=8), MemorySpace(name="hbm", capacity=4)]
    plan = algo(bufs, spaces)
    assert sorted(s for s in plan.space if s is not None) == [0, 0, 1]
    assert len(plan.unplaced) == 1
    assert plan.arena == (8, 4)
    assert validate(plan).failure.value == "unplaced"


@pytest.mark.parametrize("algo", ALGOS)
def test_alignment_is_respected(algo) -> None:  # type: ignore[no-untyped-def]
    bufs = [Buffer(id=0, lower=0, upper=4, size=3), Buffer(id=1, lower=0, upper=4, size=8, alignment=8)]
    plan = algo(bufs, 64)
    assert validate(plan)
    assert plan.offset[1] % 8 == 0


@pytest.mark.parametrize("algo", ALGOS)
def test_inputs_are_not_mutated_and_errors_are_clear(algo) -> None:  # type: ignore[no-untyped-def]
    bufs = [Buffer(id=0, lower=0, upper=4, size=3)]
    copy = list(bufs)
    plan = algo(bufs, 8)
    assert bufs == copy and plan.buffers == tuple(copy)
    with pytest.raises(ValueError, match=r"size=3 bytes, larger than every memory space \(the largest holds 2 bytes\)"):
        algo(bufs, 2)
    with pytest.raises(ValueError, match=r"duplicate id 0"):
        algo(bufs + bufs, 8)


def test_empty_input_gives_an_empty_plan() -> None:
    plan = greedy_by_size([], 8)
    assert plan.arena == (0,) and plan.feasible


def test_property_greedy_plans_always_validate() -> None:
    """10,000 seeded random instances (5,000 per greedy): the oracle never finds a fault.

    Odd trials use a two-level hierarchy whose second space holds everything (so all is placed);
    even trials one space of random capacity, where some buffers may stay unplaced.
    """
    rng = np.random.default_rng(20260501)
    for trial in range(5000):
        bufs = random_buffers(rng, int(rng.integers(1, 9)), align=trial % 3 == 0)
        largest = max(b.size for b in bufs)
        total = sum(b.size + b.alignment for b in bufs)
        hierarchy = [MemorySpace(name="fast", capacity=int(rng.integers(0, 16))), MemorySpace(name="slow", capacity=total)]
        for algo in ALGOS:
            plan = algo(bufs, hierarchy if trial % 2 else largest + int(rng.integers(0, 40)))
            verdict = validate(plan)
            if trial % 2:
                assert verdict, (trial, algo.__name__, verdict)
            else:
                assert verdict or verdict.failure is Failure.UNPLACED, (trial, algo.__name__, verdict)
                assert plan.feasible or plan.arena[0] > 0 or largest == 0
            if plan.feasible and len(plan.spaces) == 1:
                assert plan.arena[0] >= peak_live(bufs)[0]
