"""Whole-graph rematerialization on real compiled graphs: tags, forecasts, the grid, faults."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lightning_memplan import forecast, measure_peak
from lightning_memplan.forecasting.backend import memplan_backend
from lightning_memplan.forecasting.grid import forecast_grid


class Block(nn.Module):
    def __init__(self, dim: int, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.ln, self.qkv, self.proj = heads, nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(x)))


def _model(layers: int = 3, dim: int = 32) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(*[Block(dim) for _ in range(layers)], nn.Linear(dim, 1)), torch.randn(8, 64, dim)


def _saved_bytes(fc) -> int:  # noqa: ANN001
    return sum(r.decision.saved_bytes for r in fc.regions if r.decision)


def test_remat_forecasts_equal_the_measured_step_and_lower_budgets_save_less() -> None:
    model, x = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = []
    for b in (1.0, 0.5, 0.2):
        torch._dynamo.reset()
        fc = forecast(model, (x,), budget=b, solver="remat", backend="aot_eager", optimizer=opt)
        assert fc.status == "ok", fc.problems
        assert [r.decision.reason for r in fc.regions] == ["remat"]
        fc.step()
        fc.step()
        assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.01)
        saved.append(_saved_bytes(fc))
    assert saved[0] > saved[1] > saved[2]
    # budget 1.0 is the cheapest plan: it saves no less than torch's own runtime-optimal min cut
    torch._dynamo.reset()
    plain = forecast(model, (x,), budget=1.0, backend="aot_eager", optimizer=opt)
    assert saved[0] >= _saved_bytes(plain)


def test_a_remat_plan_beats_the_knapsack_on_both_memory_and_recompute() -> None:
    """The point of deciding every value: a remat plan that dominates torch's budget-0.3 plan, its
    forecast peak no higher and fewer FLOPs recomputed (it recomputes pointwise chains the knapsack
    never considers; below that peak the step's floor is not the saved activations)."""
    from lightning_memplan.planner.search import forecast_flops

    model, x = _model(layers=4, dim=64)
    budgets = (0.6, 0.4, 0.3, 0.25, 0.2)
    grid = forecast_grid(model, (x,), budgets=(1.0, 0.3), checkpoint_sets=[()], remat_budgets=budgets)
    assert list(grid)[-len(budgets):] == [("remat", b) for b in budgets]
    knap = grid[((), 0.3)]
    rem = [grid[("remat", b)] for b in budgets]
    assert all(fc.status == "ok" for fc in rem)
    better = [fc for fc in rem if fc.peak_bytes <= knap.peak_bytes and forecast_flops(fc) < forecast_flops(knap)]
    assert better, [(fc.peak_bytes, forecast_flops(fc)) for fc in rem] + [(knap.peak_bytes, forecast_flops(knap))]


def test_grid_remat_plans_equal_separate_forecasts() -> None:
    model, x = _model()
    grid = forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[()], remat_budgets=(0.5, 0.2))
    for b in (0.5, 0.2):
        torch._dynamo.reset()
        real = forecast(model, (x,), budget=b, solver="remat", backend="aot_eager")
        assert grid[("remat", b)].peak_bytes == real.peak_bytes
        assert grid[("remat", b)].solver == "remat"
        with pytest.raises(RuntimeError, match=r"remat plan at budget .* call `forecast\(\.\.\., budget=.*, solver='remat'\)`"):
            grid[("remat", b)].step()


def test_a_failing_remat_plan_still_compiles_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_memplan.forecasting.remat_graph as rg

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no plan today")

    monkeypatch.setattr(rg, "remat_bounds", boom)
    model, x = _model(layers=1)
    fc = forecast(model, (x,), budget=0.3, solver="remat", backend="aot_eager")
    assert any("remat plan (budget 0.3): RuntimeError: no plan today; partitioned as torch's budget 1.0" in p
               for p in fc.problems), fc.problems
    assert torch.isfinite(fc.step())  # the run is not lost


def test_remat_arguments_are_checked() -> None:
    model, _ = _model(layers=1)
    with pytest.raises(ValueError, match=r"`memplan_backend\(solver='remat', sweep=\.\.\.\)`: sweep plans use a knapsack"):
        memplan_backend(solver="remat", inner="aot_eager", sweep=(0.5,))
    with pytest.raises(ValueError, match=r"`memplan_backend\(sweep_remat=\(0\.5,\)\)` needs inner='aot_eager'"):
        memplan_backend(inner="inductor", sweep_remat=(0.5,))
    with pytest.raises(ValueError, match=r"`memplan_backend\(sweep_remat=\(1\.5,\)\)`: 1\.5 is not a valid"):
        memplan_backend(solver="remat", inner="aot_eager", sweep_remat=(1.5,))
    with pytest.raises(ValueError, match=r"`forecast_grid\(solver='remat'\)`: .* `remat_budgets=\.\.\.`"):
        forecast_grid(model, (torch.randn(2, 4, 32),), budgets=(1.0,), checkpoint_sets=[()], solver="remat")
    with pytest.raises(ValueError, match=r"`forecast_grid\(remat_budgets=0\.5\)` is not valid\. Expected a sequence"):
        forecast_grid(model, (torch.randn(2, 4, 32),), budgets=(1.0,), checkpoint_sets=[()], remat_budgets=0.5)  # type: ignore[arg-type]


def test_remat_under_inductor_is_forecast_exactly() -> None:
    model, x = _model(layers=2)
    torch._dynamo.reset()
    fc = forecast(model, (x,), budget=0.3, solver="remat", backend="inductor")
    assert fc.status == "ok", fc.problems
    assert [r.decision.reason for r in fc.regions] == ["remat"]
    fc.step()
    fc.step()
    assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.02)


def _spy_remat(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """Record each ``tag_remat`` call's copies solved as one and the variables of every MILP."""
    import lightning_memplan.core.remat as remat
    import lightning_memplan.forecasting.remat_graph as remat_graph

    parts: list[int] = []
    sizes: list[int] = []
    tag, milp = remat_graph.tag_remat, remat._milp

    def spy_tag(gm, budget, cache=None):  # noqa: ANN001, ANN202
        memo = {} if cache is None else cache
        out = tag(gm, budget, memo)
        parts.append(len(memo["split"].groups) if memo["split"] is not None else 1)
        return out

    def spy_milp(c, *args):  # noqa: ANN001, ANN002, ANN202
        sizes.append(int(c.size))
        return milp(c, *args)

    monkeypatch.setattr(remat_graph, "tag_remat", spy_tag)
    monkeypatch.setattr(remat, "_milp", spy_milp)
    return parts, sizes


def test_repeated_blocks_are_solved_one_for_all_and_the_milps_do_not_grow_with_depth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parts, sizes = _spy_remat(monkeypatch)
    largest = {}
    for layers in (3, 5):
        model, x = _model(layers=layers)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch._dynamo.reset()
        parts.clear(), sizes.clear()
        fc = forecast(model, (x,), budget=0.3, solver="remat", backend="aot_eager", optimizer=opt)
        assert fc.status == "ok", fc.problems
        # Sequential(*blocks, head): the blocks are the copies but the first, which computes no gradient
        # for its input (the batch), and the head
        assert parts == [layers - 1]
        largest[layers] = max(sizes)
        fc.step()
        fc.step()
        assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.01)
    assert largest[5] == largest[3]


class _Widen(nn.Module):
    def __init__(self, a: int, b: int) -> None:
        super().__init__()
        self.proj = nn.Linear(a, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def test_blocks_of_another_width_are_not_taken_for_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    parts, _ = _spy_remat(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(Block(32), _Widen(32, 64), Block(64), _Widen(64, 32), Block(32), nn.Linear(32, 1))
    x = torch.randn(8, 64, 32)
    fc = forecast(model, (x,), budget=0.3, solver="remat", backend="aot_eager")
    assert fc.status == "ok", fc.problems
    assert parts == [1]  # solved whole
    fc.step()
    assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.01)


def test_a_remat_plan_stopped_at_the_time_limit_is_used_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_memplan.core.remat as remat

    milp = remat._milp

    def at_time_limit(*args):  # noqa: ANN002, ANN202 - HiGHS's answer at its time limit: a plan, not proved optimal
        got = milp(*args)
        return None if got is None else (got[0], False)

    monkeypatch.setattr(remat, "_milp", at_time_limit)
    model, x = _model()
    fc = forecast(model, (x,), budget=0.4, solver="remat", backend="aot_eager")
    assert fc.status == "ok" and fc.peak_bytes is not None
    assert any("time limit" in p and "best plan it found" in p for p in fc.problems), fc.problems
