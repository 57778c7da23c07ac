"""Large-neighbourhood search (placement.improve) and the searches it relies on, issue #25."""
from __future__ import annotations

import pytest
from _oracle import one_space_plan
from perfect_packing import perfect_packing

from lightning_memplan.placement import exact_search, greedy_by_size, search, validate
from lightning_memplan.placement._decide import Decider, Timeout
from lightning_memplan.placement.improve import improve


@pytest.mark.parametrize(("seed", "alignment"), [(0, 1), (1, 256), (2, 512)])
def test_improve_takes_a_greedy_plan_to_the_optimum_of_a_perfect_packing(seed: int, alignment: int) -> None:
    optimum = 2**16
    bufs, _ = perfect_packing(seed, 60, steps=200, capacity=optimum, alignment=alignment)
    start = greedy_by_size(bufs, 2**30)
    assert start.arena[0] > 1.1 * optimum  # greedy is far off
    offsets, _ = improve(bufs, list(start.offset), optimum, float("inf"), moves=300)
    plan = one_space_plan(bufs, offsets, 2**30)
    assert validate(plan) and plan.arena[0] <= 1.02 * optimum


def test_improve_never_returns_a_worse_plan_and_stops_at_the_bound() -> None:
    bufs, witness = perfect_packing(5, 30, steps=100, capacity=2**14)
    offsets, _ = improve(bufs, witness, 2**14, float("inf"), moves=50)
    assert offsets == witness  # already at the lower bound: nothing to do
    start = greedy_by_size(bufs, 2**30)
    for moves in (1, 3, 10):
        offsets, _ = improve(bufs, list(start.offset), 2**14, float("inf"), moves=moves)
        plan = one_space_plan(bufs, offsets, 2**30)
        assert validate(plan) and plan.arena[0] <= start.arena[0]


def test_decider_floor_keeps_buffers_above_it() -> None:
    d = Decider([0, 0, 2], [2, 2, 4], [4, 4, 2], [1, 1, 2], floor=[3, 0, 1])
    assert d.solve(7, float("inf")) is None  # buffer 0 above 3, buffer 1 of 4 bytes cannot fit below it
    assert d.solve(8, float("inf")) == [4, 0, 2]  # buffer 2's floor of 1 is rounded up to its alignment


def test_zero_slack_branching_solves_a_perfect_packing_the_plain_orders_do_not() -> None:
    # perfect#2 of the benchmark: 330 buffers, no spare byte at the optimum. The plain orders need
    # millions of nodes; branching on the floor of a full section needs a few hundred.
    bufs, _ = perfect_packing(2, 330, capacity=2**20)
    cols = [b.lower for b in bufs], [b.upper for b in bufs], [b.size for b in bufs], [b.alignment for b in bufs]
    tight = Decider(*cols)
    offsets = tight.solve(2**20, float("inf"))
    assert offsets is not None and tight.nodes < 20_000
    assert validate(one_space_plan(bufs, offsets, 2**20))
    plain = Decider(*cols, tight_heuristics=None)  # the plain orders only
    steps = plain.steps(2**20)
    for _ in range(50):  # 50 slices of 4096 nodes: 10x what the tight orders needed
        try:
            next(steps)
        except StopIteration:  # the plain orders got lucky
            pytest.fail("the plain orders solved it: the test no longer shows the difference")
    assert plain.nodes > 10 * tight.nodes


def test_search_falls_back_to_improvement_when_the_exact_search_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_answer(*args: object, **kwargs: object) -> tuple[int, list[int] | None]:
        raise Timeout  # stands for an exact search that does not close in its share of the time

    monkeypatch.setattr(search._Race, "until", no_answer)
    monkeypatch.setattr(search, "cp_sat_pack", no_answer)
    optimum = 2**16
    bufs, _ = perfect_packing(1, 60, steps=200, capacity=optimum)
    capacity = int(1.05 * optimum)
    assert not greedy_by_size(bufs, capacity).feasible
    plan = exact_search(bufs, capacity, time_limit=10)
    assert validate(plan) and plan.feasible and plan.arena[0] <= capacity
    assert plan.optimal == (plan.arena[0] == optimum) and plan.timed_out == (not plan.optimal)
    assert plan.seconds_to_best <= plan.seconds
