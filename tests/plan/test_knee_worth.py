"""The knee takes only plans that buy something: a plan saving less than ``MIN_SAVING`` of the
fastest plan's forecast total is never chosen for its compute (issue: a knee that buys nothing)."""
from __future__ import annotations

from lightning_memplan.plan import Candidate
from lightning_memplan.planner.search import MIN_SAVING, choose

MiB = 2**20


def test_a_plan_saving_almost_nothing_is_not_the_knee() -> None:
    # transformers' own checkpointing already on: budget 0.7 saves 0.01 MiB of 7.23 MiB for +33% compute
    cands = [Candidate(budget=1.0, peak_bytes=int(4.23 * MiB), cost=0.0),
             Candidate(budget=0.7, peak_bytes=int(4.22 * MiB), cost=0.33)]
    plan = choose(cands, baseline_bytes=3 * MiB, max_memory=None, solver="dp")
    assert plan.chosen == 0 and plan.budget == 1.0
    assert f"no plan saves {MIN_SAVING:.0%} of the step's memory" in plan.reason


def test_a_plan_that_saves_enough_can_still_be_the_knee() -> None:
    cands = [Candidate(budget=1.0, peak_bytes=10 * MiB, cost=0.0),
             Candidate(budget=0.7, peak_bytes=int(9.9 * MiB), cost=0.01),   # saves 0.9%: left out
             Candidate(budget=0.3, peak_bytes=5 * MiB, cost=0.05),          # saves 45% for little
             Candidate(budget=0.1, peak_bytes=4 * MiB, cost=1.0)]
    plan = choose(cands, baseline_bytes=1 * MiB, max_memory=None, solver="dp")
    assert plan.budget == 0.3 and plan.reason.startswith("knee of the forecast Pareto front")
    # without the rule the near-free 0.7 would sit on the front; it must never be chosen
    assert plan.knee != 1


def test_max_memory_still_takes_the_fastest_that_fits_even_if_it_saves_little() -> None:
    cands = [Candidate(budget=1.0, peak_bytes=10 * MiB, cost=0.0),
             Candidate(budget=0.7, peak_bytes=int(9.9 * MiB), cost=0.3)]
    plan = choose(cands, baseline_bytes=0, max_memory=int(9.95 * MiB), solver="dp")
    assert plan.budget == 0.7  # an explicit limit wins: the only plan under it
