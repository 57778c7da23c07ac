"""The closed loop's choice (search.replan_candidate): what the forecast did not see is added to
every candidate, not scaled with it."""
from __future__ import annotations

import pytest

from lightning_memplan.plan import Candidate, MemPlan
from lightning_memplan.planner.search import replan_candidate


def _plan(*candidates: Candidate, chosen: int = 0, baseline: int = 1_000) -> MemPlan:
    c = candidates[chosen]
    return MemPlan(budget=c.budget, solver="dp", checkpoint=c.checkpoint, predicted_peak_bytes=c.peak_bytes,
                   baseline_bytes=baseline, reason="test", knee=chosen, chosen=chosen, candidates=candidates)


def test_the_unseen_bytes_are_added_to_every_candidate() -> None:
    # budget 1.0 was forecast at 100 B above the baseline and measured at 160 B: 60 B of eager code
    # (the loss on the outputs) the forecast does not see, the same whatever the plan
    plan = _plan(Candidate(budget=1.0, peak_bytes=100, cost=0.0), Candidate(budget=0.5, peak_bytes=75, cost=1.0),
                 Candidate(budget=0.1, peak_bytes=60, cost=2.0))
    new, unseen, fits = replan_candidate(plan, measured=160, max_memory=1_000 + 130)
    # 0.5: 75 + 60 = 135 > 130 (scaled by 160/100 it would be 120 and chosen, and then measure 135)
    assert (new.budget, unseen, fits) == (0.1, 60, True)
    # with room for 0.5, the cheaper plan is taken
    new, _, _ = replan_candidate(plan, measured=160, max_memory=1_000 + 135)
    assert new.budget == 0.5


def test_nothing_fits_halves_the_budget_and_a_low_measurement_adds_nothing() -> None:
    plan = _plan(Candidate(budget=1.0, peak_bytes=100, cost=0.0), Candidate(budget=0.5, checkpoint=("blocks.0",), peak_bytes=80, cost=1.0),
                 chosen=1)
    new, unseen, fits = replan_candidate(plan, measured=150, max_memory=1_100)
    assert (new.budget, new.checkpoint, unseen, fits) == (0.25, ("blocks.0",), 70, False)
    # measured below the forecast: nothing unseen; the current plan itself is never the answer
    new, unseen, fits = replan_candidate(plan, measured=70, max_memory=1_100)
    assert (new.budget, unseen, fits) == (1.0, 0, True)
    with pytest.raises(ValueError, match="no baseline_bytes"):
        replan_candidate(MemPlan(budget=1.0, solver="dp"), measured=1, max_memory=1)


def test_a_replan_never_takes_a_plan_forecast_above_the_one_in_force() -> None:
    """Nothing fits: a smaller forecast among the candidates is taken before halving; and when the
    halved plan was forecast already at no less than the plan in force, there is no re-plan (it
    would only measure higher: budget 0.1 -> 0.05 with blocks checkpointed went from 16.2 to 20.2 MiB)."""
    plan = _plan(Candidate(budget=1.0, peak_bytes=100, cost=0.0), Candidate(budget=0.5, peak_bytes=80, cost=1.0),
                 Candidate(budget=0.25, peak_bytes=70, cost=2.0), chosen=1)
    new, _, fits = replan_candidate(plan, measured=150, max_memory=1_100)
    assert new is not None and (new.budget, fits) == (0.25, False)
    plan = _plan(Candidate(budget=0.1, checkpoint=("b",), peak_bytes=80, cost=1.0),
                 Candidate(budget=0.05, checkpoint=("b",), peak_bytes=95, cost=2.0))
    new, _, fits = replan_candidate(plan, measured=150, max_memory=1_100)
    assert (new, fits) == (None, False)
