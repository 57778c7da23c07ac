"""Budget sweep: one trace, the joint graph partitioned under every budget, a Forecast per budget
equal to separate ``forecast()`` calls (aot_eager)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lightning_memplan.forecasting.backend import memplan_backend
from lightning_memplan.forecasting.grid import forecast_sweep
from lightning_memplan.forecasting.step_forecast import forecast

BUDGETS = (1.0, 0.5, 0.1)


def _gpt() -> nn.Module:
    from lightning_memplan.demo.model import GPT

    torch.manual_seed(0)
    return GPT.from_size("tiny", vocab_size=32).train()


def _globals() -> tuple[object, object, object]:
    fconfig = torch._functorch.config
    return (fconfig.activation_memory_budget, fconfig.activation_memory_budget_solver,
            torch.compiler.config.force_disable_caches)


def _case(kind: str, make_mlp) -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.optim.Optimizer]:  # noqa: ANN001
    if kind == "mlp":
        model: nn.Module = make_mlp(width=128, depth=3)
        inputs = (torch.randn(32, 128),)
    else:
        model = _gpt()
        inputs = (torch.randint(0, 32, (4, 64)),)
    return model, inputs, torch.optim.AdamW(model.parameters())


@pytest.fixture(scope="module", params=["mlp", "gpt"])
def pair(request, make_mlp):  # noqa: ANN001, ANN201
    model, inputs, opt = _case(request.param, make_mlp)
    before = _globals()
    swept = forecast_sweep(model, inputs, budgets=BUDGETS, optimizer=opt)
    after = _globals()
    separate = {b: forecast(model, inputs, budget=b, backend="aot_eager", optimizer=opt) for b in BUDGETS}
    return swept, separate, before, after


def test_peaks_equal_separate_forecasts(pair) -> None:  # noqa: ANN001
    swept, separate, _, _ = pair
    assert list(swept) == list(BUDGETS)
    for b in BUDGETS:
        s, f = swept[b], separate[b]
        assert s.status == f.status == "ok", (b, s.problems, f.problems)
        assert s.budget == b
        assert s.peak_bytes == f.peak_bytes, b
        assert s.baseline_bytes == f.baseline_bytes
        assert s.breakdown == f.breakdown
        assert s.solver_estimate_bytes == f.solver_estimate_bytes


def test_decisions_equal_separate_forecasts(pair) -> None:  # noqa: ANN001
    swept, separate, _, _ = pair
    for b in BUDGETS:
        ds = [(r.decision.reason, r.decision.solver_called, r.decision.saved_names) for r in swept[b].regions]
        df = [(r.decision.reason, r.decision.solver_called, r.decision.saved_names) for r in separate[b].regions]
        assert ds == df, b
        assert all(r.decision.budget == b for r in swept[b].regions)


def test_cost_equals_separate_forecasts(pair) -> None:  # noqa: ANN001
    from lightning_memplan.planner.search import forecast_flops

    swept, separate, _, _ = pair
    for b in BUDGETS:
        assert forecast_flops(swept[b]) == forecast_flops(separate[b]), b


def test_torch_globals_unchanged(pair) -> None:  # noqa: ANN001
    _, _, before, after = pair
    assert before == after


def test_only_the_first_budget_steps(pair) -> None:  # noqa: ANN001
    swept, _, _, _ = pair
    loss = swept[BUDGETS[0]].step()
    assert torch.isfinite(loss)
    for b in BUDGETS[1:]:
        with pytest.raises(RuntimeError, match=r"only budget .* without checkpointing was compiled to run"):
            swept[b].step()


def test_one_trace_for_all_budgets(make_mlp) -> None:  # noqa: ANN001
    model = make_mlp(width=64, depth=2)
    be = memplan_backend(budget=1.0, inner="aot_eager", sweep=(1.0, 0.5, 0.0))
    compiled = torch.compile(lambda x: model(x).sum(), backend=be)
    compiled(torch.randn(8, 64)).backward()
    assert len(be.regions) == 1
    assert [r.decision.reason for r in be.sweep_regions(0.0)] == ["budget_0"]
    assert be.sweep_regions(1.0) is be.regions
    assert be.sweep_regions(0.5)[0].fw_graph is not None and be.sweep_regions(0.5)[0].bw_graph is not None
    with pytest.raises(KeyError):
        be.sweep_regions(0.3)


def test_sweep_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="aot_eager"):
        memplan_backend(inner="inductor", sweep=(0.5,))
    with pytest.raises(ValueError, match="budget"):
        memplan_backend(inner="aot_eager", sweep=(1.5,))
    with pytest.raises(ValueError, match="budgets"):
        forecast_sweep(nn.Linear(2, 2), (torch.randn(1, 2),), budgets=())
