from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _oracle import brute_force_arena, random_buffers
from perfect_packing import perfect_packing

from lightning_memplan.placement import (
    Buffer,
    Failure,
    MemorySpace,
    _decide,
    exact_search,
    greedy_by_position,
    greedy_by_size,
    peak_live,
    read_csv,
    validate,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "minimalloc"  # shipped copy of ../shared/data/minimalloc


def test_reaches_the_optimum_where_greedy_does_not() -> None:
    # Greedy by size puts the two 4-byte buffers side by side at [0, 8) for all of [0, 4): the
    # 6-byte buffer then lands on top. The optimum staggers them.
    bufs = [
        Buffer(id="a", lower=0, upper=2, size=4),
        Buffer(id="b", lower=0, upper=4, size=4),
        Buffer(id="c", lower=2, upper=6, size=4),
        Buffer(id="d", lower=4, upper=6, size=4),
    ]
    plan = exact_search(bufs, 64, time_limit=10)
    assert validate(plan)
    assert plan.arena == (8,) == (peak_live(bufs)[0],)
    assert plan.optimal and not plan.timed_out
    assert plan.algorithm == "search"


def test_matches_brute_force_on_small_random_instances() -> None:
    rng = np.random.default_rng(7)
    for trial in range(300):
        bufs = random_buffers(rng, int(rng.integers(1, 7)), align=trial % 4 == 0)
        plan = exact_search(bufs, sum(b.size + b.alignment for b in bufs) + 1, time_limit=30)
        assert validate(plan), (trial, validate(plan))
        assert plan.optimal, trial
        assert plan.arena[0] == brute_force_arena(bufs), (trial, bufs)


def test_property_search_plans_validate_with_tight_capacities() -> None:
    rng = np.random.default_rng(11)
    for trial in range(1500):
        bufs = random_buffers(rng, int(rng.integers(1, 10)), align=trial % 5 == 0)
        live = peak_live(bufs)[0]
        cap = max(max(b.size for b in bufs), live + int(rng.integers(-2, 4)))
        plan = exact_search(bufs, cap, time_limit=30)
        verdict = validate(plan)
        assert verdict or verdict.failure is Failure.UNPLACED, (trial, verdict)
        if live <= cap and greedy_by_size(bufs, cap).feasible:
            assert plan.feasible, trial  # never worse than the greedy it starts from


def test_time_limit_returns_the_best_plan_so_far() -> None:
    bufs = read_csv(DATA / "D.1048576.csv")
    plan = exact_search(bufs, 2**30, time_limit=1.0)
    assert validate(plan)
    assert plan.timed_out and not plan.optimal
    assert plan.arena[0] <= greedy_by_size(bufs, 2**30).arena[0]
    assert plan.seconds < 30  # stopped by the limit (with generous slack for a loaded machine)


def test_capacity_below_live_peak_leaves_buffers_unplaced() -> None:
    bufs = [Buffer(id=i, lower=0, upper=2, size=4) for i in range(3)]
    plan = exact_search(bufs, 8, time_limit=5)
    assert validate(plan).failure is Failure.UNPLACED
    assert len(plan.unplaced) == 1 and not plan.timed_out and not plan.optimal


def test_hierarchy_fills_the_first_space_then_spills() -> None:
    bufs = [Buffer(id=i, lower=i, upper=i + 3, size=4) for i in range(6)]
    spaces = [MemorySpace(name="sram", capacity=8), MemorySpace(name="hbm", capacity=64)]
    plan = exact_search(bufs, spaces, time_limit=10)
    assert validate(plan)
    assert plan.feasible
    assert plan.space.count(0) >= 3 and plan.space.count(1) >= 1
    everything_fits = exact_search(bufs, [MemorySpace(name="sram", capacity=12), spaces[1]], time_limit=10)
    assert set(everything_fits.space) == {0} and everything_fits.optimal


def test_zero_size_buffers_and_alignment() -> None:
    bufs = [
        Buffer(id="z", lower=0, upper=9, size=0),
        Buffer(id="a", lower=0, upper=4, size=3),
        Buffer(id="b", lower=0, upper=4, size=4, alignment=4),
    ]
    plan = exact_search(bufs, 64, time_limit=10)
    assert validate(plan)
    assert plan.offset[0] == 0 and plan.offset[2] % 4 == 0
    assert plan.arena == (7,) and plan.optimal  # b at [0, 4), a at [4, 7)


def test_rejects_bad_arguments() -> None:
    bufs = [Buffer(id=0, lower=0, upper=1, size=4)]
    with pytest.raises(ValueError, match=r"time_limit=0.*positive number of seconds or None"):
        exact_search(bufs, 8, time_limit=0)
    with pytest.raises(ValueError, match=r"size=4 bytes, larger than every memory space"):
        exact_search(bufs, 3)
    original = list(bufs)
    exact_search(bufs, 8, time_limit=None)
    assert bufs == original


@pytest.mark.parametrize(("seed", "pinwheels", "alignment"), [(0, 0.0, 1), (1, 0.3, 512), (2, 0.2, 256)])
def test_issue_25_more_slack_never_gives_a_worse_answer(seed: int, pinwheels: float, alignment: int) -> None:
    optimum = 2**16
    bufs, _ = perfect_packing(seed, 40, steps=200, capacity=optimum, granularity=512, alignment=alignment,
                              pinwheels=pinwheels)
    tight = exact_search(bufs, optimum, time_limit=20)
    assert validate(tight) and tight.optimal and tight.arena == (optimum,)
    for slack in (1.02, 1.05, 1.10):
        plan = exact_search(bufs, int(optimum * slack), time_limit=20)
        assert validate(plan), slack
        assert plan.feasible and plan.arena[0] <= tight.arena[0], slack
        assert plan.optimal, slack


def test_issue_25_search_asks_the_lower_bound_before_the_slack_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    # Greedy cannot pack at 1.05x, so the search must decide; its first (or raced) question is
    # the live peak, which a perfect packing answers (and which answers every looser capacity).
    bufs, _ = perfect_packing(3, 40, steps=200, capacity=2**16, granularity=512)
    asked: list[int] = []
    steps = _decide.Decider.steps

    def spy(self: _decide.Decider, capacity: int):  # type: ignore[no-untyped-def]
        asked.append(capacity)
        return steps(self, capacity)

    monkeypatch.setattr(_decide.Decider, "steps", spy)
    capacity = int(2**16 * 1.05)
    assert not greedy_by_size(bufs, capacity).feasible and not greedy_by_position(bufs, capacity).feasible
    plan = exact_search(bufs, capacity, time_limit=20)
    assert asked[0] == peak_live(bufs)[0] == 2**16
    assert validate(plan) and plan.optimal and plan.arena == (2**16,)
