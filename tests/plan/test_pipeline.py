"""plan_step without a Trainer: a small module on aot_eager, its predictions checked against
``lightning_memplan.forecast`` (the ground truth for the compiled part; with the loss plan_step
forecasts with, ``sum_outputs``) laid out by hand."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_memplan import forecast
from lightning_memplan.forecasting.optim_memory import optimizer_memory
from lightning_memplan.planner import pipeline
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.pipeline import StepObservation, plan_step
from lightning_memplan.planner.plan_forecast import sum_outputs
from lightning_memplan.planner.settings import PlanSettings
from lightning_memplan.planner.step_model import lightning_step_memory


class _Net(nn.Module):
    """Two layers the forward runs, and a head it never reads (it gets no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.unused = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _setup() -> tuple[_Net, torch.Tensor, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _Net()
    return model, torch.randn(16, 32), torch.optim.Adam(model.parameters())


def _bytes(params: Any) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _forecast(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer, **kw: Any) -> Any:
    return forecast(model, (x,), backend="aot_eager", optimizer=opt, loss_fn=sum_outputs, **kw)


def _settings(**kw: Any) -> PlanSettings:
    return PlanSettings.from_args("plan_step", backend="aot_eager", checkpoint=None, **kw)


def test_a_fixed_budget_is_forecast_as_forecast_does() -> None:
    model, x, opt = _setup()
    planned = plan_step(model, settings=_settings(budget=0.5), args=(x,), optimizer=opt)
    fc = _forecast(model, x, opt, budget=0.5)
    grads = _bytes(model.parameters())
    assert planned.decided.reason == "budget given" and planned.candidate_forecasts == ()
    assert planned.forecast is not None and planned.forecast.peak_bytes == fc.peak_bytes
    # Lightning keeps the previous step's gradients through the forward: in the baseline, not the peak
    assert (planned.plan.baseline_bytes, planned.plan.predicted_peak_bytes) == lightning_step_memory(fc, grads)
    assert planned.plan.baseline_bytes == fc.baseline_bytes + grads
    assert planned.warnings == () and planned.loop.gradless_bytes == 0


def test_a_search_is_judged_again_for_the_step_and_laid_out_for_it() -> None:
    model, x, opt = _setup()
    agreed: list[str] = []

    def agree(decide: Any) -> Any:
        agreed.append(decide.__name__)
        return decide()

    settings = _settings(budget="auto", candidate_budgets=(1.0, 0.2), remat_budgets=())
    planned = plan_step(model, settings=settings, args=(x,), optimizer=opt, step=StepObservation(calls=2),
                        agree=agree)
    assert agreed == ["decision", "rejudged"]  # every process takes part in both decisions
    plan, grads = planned.plan, _bytes(model.parameters())
    assert len(planned.candidate_forecasts) == len(plan.candidates) == 2
    assert "judged on 2 forward calls per step" in plan.reason
    for cand, kept in zip(plan.candidates, planned.candidate_forecasts):  # each judged for two calls
        assert kept is not None and cand.peak_bytes == lightning_step_memory(kept.repeated(2), grads)[1]
    fc = _forecast(model, x, opt, budget=plan.budget, solver=plan.solver)
    assert planned.forecast is not None and planned.forecast.calls == 2
    assert (plan.baseline_bytes, plan.predicted_peak_bytes) == lightning_step_memory(fc.repeated(2), grads)


def test_in_two_parts_as_the_callback_plans_it_the_plan_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, opt = _setup()
    settings = _settings(budget="auto", candidate_budgets=(1.0, 0.2), remat_budgets=())
    at_once = plan_step(model, settings=settings, args=(x,), optimizer=opt, step=StepObservation(calls=2))
    first = plan_step(model, settings=settings, args=(x,), optimizer=opt)  # before the step is known
    assert first.forecast is not None and first.forecast.calls == 1
    forecasts: list[Any] = []
    real = pipeline.forecast_plan
    monkeypatch.setattr(pipeline, "forecast_plan", lambda *a, **k: forecasts.append(a) or real(*a, **k))
    then = plan_step(model, settings=settings, args=(x,), optimizer=opt, step=StepObservation(calls=2), earlier=first)
    kept = (then.plan.budget, then.plan.checkpoint) == (first.plan.budget, first.plan.checkpoint)
    assert len(forecasts) == (0 if kept else 1)  # the first part's forecast stands while its plan does
    assert then.plan == at_once.plan and then.decided == first.plan


def test_parameters_the_step_gives_no_gradient_hold_none() -> None:
    model, x, opt = _setup()
    body = frozenset(id(p) for p in model.body.parameters())
    settings = _settings(budget=0.5)
    # from a real backward (the callback), and from the forecast plus the eager code (plan_memory)
    measured = plan_step(model, settings=settings, args=(x,), optimizer=opt, step=StepObservation(reached=body))
    probed = plan_step(model, settings=settings, args=(x,), optimizer=opt,
                       step=StepObservation(eager_reached=frozenset()))
    unused = {id(p) for p in model.unused.parameters()}
    fc = _forecast(model, x, opt, budget=0.5)
    fc = fc.with_optimizer_memory(optimizer_memory(opt, gradless=unused))
    expected = lightning_step_memory(fc, _bytes(model.body.parameters()))
    for planned in (measured, probed):
        assert planned.loop.gradless_bytes == _bytes(model.unused.parameters())
        assert planned.plan.breakdown["gradients"] == _bytes(model.body.parameters())
        assert (planned.plan.baseline_bytes, planned.plan.predicted_peak_bytes) == expected


def test_when_nothing_fits_it_warns_at_the_caller_and_plans_the_smallest() -> None:
    model, x, opt = _setup()
    settings = _settings(budget="auto", candidate_budgets=(1.0, 0.2), remat_budgets=(), max_memory=1)
    with pytest.warns(MemPlanWarning, match=r"^plan_step: .* Training with the smallest plan\.$") as record:
        planned = plan_step(model, settings=settings, args=(x,), optimizer=opt)
    assert [str(w.message) for w in record if w.category is MemPlanWarning] == list(planned.warnings)
    assert record[0].filename == __file__
    peaks = [c.peak_bytes for c in planned.plan.candidates if c.peak_bytes is not None]
    assert planned.plan.candidates[planned.plan.chosen].peak_bytes == min(peaks)


def test_a_failed_stage_goes_to_on_failure_or_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, _ = _setup()

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no forecast")

    monkeypatch.setattr(pipeline, "forecast_plan", fail)
    failed: list[tuple[str, Exception]] = []
    planned = plan_step(model, settings=_settings(budget=0.5), args=(x,), step=StepObservation(calls=2),
                        on_failure=lambda stage, exc: failed.append((stage, exc)))
    assert [stage for stage, _ in failed] == ["forecast"]
    assert planned.forecast is None and planned.plan == planned.decided
    assert all("forward" not in m.__dict__ for m in model.modules())
    with pytest.raises(RuntimeError, match="no forecast"):
        plan_step(model, settings=_settings(budget=0.5), args=(x,))


def test_arguments_are_checked() -> None:
    model, x, _ = _setup()
    with pytest.raises(ValueError, match=r"`StepObservation\(calls=0\)` must be an int >= 1"):
        StepObservation(calls=0)
    with pytest.raises(ValueError, match=r"give one of them"):
        StepObservation(reached=frozenset(), eager_reached=frozenset())
    with pytest.raises(ValueError, match=r"needs `signatures`"):
        StepObservation(calls=2, others={((1,), torch.float32, "cpu"): ((x,), {})})
    settings = _settings(budget=0.5)
    earlier = plan_step(model, settings=settings, args=(x,))
    with pytest.raises(ValueError, match=r"`plan` \(decided already\) or `earlier`"):
        plan_step(model, settings=settings, args=(x,), plan=earlier.plan, earlier=earlier)


def test_a_forecast_without_a_peak_is_not_laid_out_nor_other_calls_forecast(monkeypatch: pytest.MonkeyPatch) -> None:
    """The callback's second part after a forecast whose compile failed (``peak_bytes=None``):
    the plan and forecast stand as they are; no call of other shapes is forecast for them."""
    import dataclasses

    from lightning_memplan.planner.step_model import call_signature

    model, x, opt = _setup()
    settings = _settings(budget=0.5)
    first = plan_step(model, settings=settings, args=(x,), optimizer=opt)
    assert first.forecast is not None
    earlier = dataclasses.replace(first, forecast=dataclasses.replace(first.forecast, peak_bytes=None))

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("other calls forecast for a forecast without a peak")

    monkeypatch.setattr(pipeline, "other_call_forecasts", never)
    monkeypatch.setattr(pipeline, "lay_out_step", never)
    x2 = torch.randn(8, 32)
    sigs = (call_signature((x,), {}), call_signature((x2,), {}))
    failed: list[str] = []
    then = plan_step(model, settings=settings, args=(x,), optimizer=opt, earlier=earlier,
                     step=StepObservation(calls=2, signatures=sigs, others={sigs[1]: ((x2,), {})}),
                     on_failure=lambda stage, exc: failed.append(stage))
    assert failed == [] and then.plan == first.plan and then.forecast is earlier.forecast


def test_candidates_that_could_not_be_forecast_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """One candidate's forecast fails (here: the forecast of budget 0.05 raises): the plan is chosen
    among the others, and a warning says how many were left out and why."""
    from lightning_memplan.forecasting import grid, step_forecast

    real = step_forecast.forecast

    def failing(*args: Any, budget: float = 1.0, **kw: Any) -> Any:
        if budget == 0.05:
            raise RuntimeError("this budget cannot be forecast")
        return real(*args, budget=budget, **kw)

    def no_grid(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("no grid")

    monkeypatch.setattr(step_forecast, "forecast", failing)
    monkeypatch.setattr(grid, "forecast_grid", no_grid)
    monkeypatch.setattr(grid, "forecast_sweep", no_grid)
    model, x, opt = _setup()
    settings = _settings(budget="auto", candidate_budgets=(1.0, 0.5, 0.05), remat_budgets=())
    with pytest.warns(MemPlanWarning, match=r"^plan_step: 1 of 3 candidate plans could not be forecast .*budget 0\.05.*"
                      r"cannot be forecast"):
        planned = plan_step(model, settings=settings, args=(x,), optimizer=opt)
    assert planned.plan.candidates[planned.plan.chosen].budget != 0.05


def test_auto_backend_resolves_by_device_and_plan_step_refuses_it_unresolved() -> None:
    auto = PlanSettings.from_args("plan_step")
    assert auto.backend == "auto"
    assert auto.on_device("cuda").backend == "inductor"
    assert auto.on_device(torch.device("cpu")).backend == "aot_eager"
    assert _settings().on_device("cuda").backend == "aot_eager"  # an explicit backend is kept
    with pytest.raises(ValueError, match=r"backend='nope'.*Expected 'auto' \(inductor on CUDA"):
        PlanSettings.from_args("plan_step", backend="nope")
    with pytest.raises(ValueError, match=r"resolved backend"):
        plan_step(nn.Linear(2, 2), settings=auto, args=(torch.randn(1, 2),))
