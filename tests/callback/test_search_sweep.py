"""search() on aot_eager traces once, whatever the number of budgets and checkpoint sets."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import lightning_memplan.forecasting.backend as compile_mod
from lightning_memplan.planner.search import DEFAULT_REMAT_BUDGETS, search


def _count_traces(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The budget of every dynamo backend call (one per graph traced) from now on, in order."""
    calls: list[float] = []
    orig = compile_mod.MemplanBackend.__call__

    def counting(self, gm, example_inputs):  # noqa: ANN001, ANN202
        calls.append(self.budget)
        return orig(self, gm, example_inputs)

    monkeypatch.setattr(compile_mod.MemplanBackend, "__call__", counting)
    return calls


def test_one_trace_for_every_plan(monkeypatch) -> None:  # noqa: ANN001
    calls = _count_traces(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
    seen = []
    result = search(model, (torch.randn(16, 64),), budgets=(1.0, 0.5, 0.1), checkpoint_sets=((), ("0",)),
                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1), on_candidate=seen.append)
    assert calls == [1.0]  # one dynamo backend call (one region): checkpoint sets are emulated on its graph
    assert [(c.budget, c.checkpoint, c.solver) for c in seen] == [
        (b, ck, "") for ck in ((), ("0",)) for b in (1.0, 0.5, 0.1)] + [
        (b, (), "remat") for b in DEFAULT_REMAT_BUDGETS]  # remat plans from the same trace
    assert all(c.peak_bytes is not None and c.cost is not None for c in seen), [c.note for c in seen]
    assert result.plan.candidates == tuple(seen)


def test_the_emulated_candidates_equal_a_search_with_one_trace_per_set(monkeypatch) -> None:  # noqa: ANN001
    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 1))

    kw = dict(budgets=(1.0, 0.3), checkpoint_sets=((), ("0",), ("0", "2")))
    x = torch.randn(256, 64)
    one = search(make(), (x,), **kw).plan.candidates

    refused: list[int] = []

    def no_grid(*a, **k):  # noqa: ANN002, ANN003, ANN202
        refused.append(1)
        raise RuntimeError("grid disabled")

    monkeypatch.setattr("lightning_memplan.forecasting.grid.forecast_grid", no_grid)
    # the fallback path: one trace per set, with the blocks really wrapped
    per_set = search(make(), (x,), **kw).plan.candidates
    assert refused == [1]
    assert [(c.budget, c.checkpoint, c.solver, c.peak_bytes) for c in one] == [
        (c.budget, c.checkpoint, c.solver, c.peak_bytes) for c in per_set]
    assert {c.solver for c in one} == {"", "remat"}


def test_a_remat_only_search_and_its_plan_round_trip_through_json(tmp_path) -> None:  # noqa: ANN001
    from lightning_memplan.plan import MemPlan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 1))
    plan = search(model, (torch.randn(256, 64),), budgets=(0.6, 0.2), checkpoint_sets=((), ("0",)),
                  solver="remat").plan
    assert [(c.label, c.solver) for c in plan.candidates] == [("remat 0.6", "remat"), ("remat 0.2", "remat")]
    assert plan.solver == "remat" and all(c.peak_bytes for c in plan.candidates)
    back = MemPlan.load(plan.save(tmp_path / "plan.json"))
    assert back == plan


def test_kept_forecasts_rejudge_the_candidates_without_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_memplan.planner.search import PlanDoesNotFit, rejudge

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.GELU(), nn.Linear(64, 1))
    result = search(model, (torch.randn(256, 64),), budgets=(1.0, 0.3), checkpoint_sets=((), ("0",)),
                    remat_budgets=(), keep_forecasts=True)
    plan, kept = result.plan, result.forecasts
    assert len(kept) == len(plan.candidates) == 4 and all(fc is not None for fc in kept)
    assert all(fc._backend is None and fc.regions[0]._graphs == (None, None) for fc in kept)  # plain data
    monkeypatch.setattr("torch.compile", lambda *a, **k: pytest.fail("rejudge compiled"))
    # judged on two calls: every candidate's peak is its forecast laid out for two calls
    two = rejudge(plan, kept, lambda fc: (fc.baseline_bytes, fc.repeated(2).peak_bytes), max_memory=None,
                  solver="dp")
    assert [c.peak_bytes for c in two.candidates] == [fc.repeated(2).peak_bytes for fc in kept]
    assert all(c2.peak_bytes > c1.peak_bytes for c1, c2 in zip(plan.candidates, two.candidates))
    assert [c.cost for c in two.candidates] == [c.cost for c in plan.candidates]
    # with a limit only the smallest two-call plan meets, that one is chosen
    smallest = min(two.candidates, key=lambda c: c.peak_bytes)
    limit = two.baseline_bytes + smallest.peak_bytes
    fit = rejudge(plan, kept, lambda fc: (fc.baseline_bytes, fc.repeated(2).peak_bytes), max_memory=limit,
                  solver="dp")
    assert fit.candidates[fit.chosen].peak_bytes == smallest.peak_bytes
    with pytest.raises(PlanDoesNotFit, match="no plan fits max_memory"):
        rejudge(plan, kept, lambda fc: (fc.baseline_bytes, fc.repeated(2).peak_bytes), max_memory=limit - 1,
                solver="dp")
    with pytest.raises(ValueError, match=r"rejudge: 0 forecasts for 4 candidates; search with keep_forecasts=True"):
        rejudge(plan, (), lambda fc: (0, 0), max_memory=None, solver="dp")


def test_a_search_past_its_time_limit_chooses_among_the_candidates_forecast_by_then(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the grid every checkpoint set takes a trace of its own. Past the limit (here at once),
    # the first set's trace still runs (a search always plans); no other trace starts.
    from lightning_memplan.planner.search import OUT_OF_TIME

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 1))

    def no_grid(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("grid disabled")

    monkeypatch.setattr("lightning_memplan.forecasting.grid.forecast_grid", no_grid)
    traces = _count_traces(monkeypatch)
    kw = dict(budgets=(1.0, 0.3), checkpoint_sets=((), ("0",), ("0", "2")), remat_budgets=(0.4,))
    x = torch.randn(256, 64)
    cut = search(make(), (x,), time_limit=1e-6, **kw).plan
    assert len(traces) == 1
    assert [(c.budget, c.checkpoint, c.solver) for c in cut.candidates] == [
        (b, ck, "") for ck in ((), ("0",), ("0", "2")) for b in (1.0, 0.3)] + [(0.4, (), "remat")]
    forecast = [c for c in cut.candidates if c.peak_bytes is not None]
    assert [c.checkpoint for c in forecast] == [(), ()]  # the first set's trace: both its budgets
    assert all(c.note == OUT_OF_TIME for c in cut.candidates[2:])
    assert cut.candidates[cut.chosen] in forecast
    full = search(make(), (x,), time_limit=600, **kw).plan  # time enough: every candidate is forecast
    assert all(c.peak_bytes is not None for c in full.candidates), [c.note for c in full.candidates]
    assert [c.peak_bytes for c in full.candidates[:2]] == [c.peak_bytes for c in forecast]
