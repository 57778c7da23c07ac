"""The backend: scoped budget and solver, partitioner decisions, captured graphs, caches, bad input."""
from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from lightning_memplan.forecasting import backend as mp_compile
from lightning_memplan.forecasting.backend import MemplanBackend, memplan_backend
from lightning_memplan.forecasting.estimator import profile_region
from lightning_memplan.forecasting.fx import node_flops

X = torch.randn(1024, 256)  # activations dominate: the solver is called at budgets in (0, 1)


def make_mlp(width: int = 256, depth: int = 4, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])


def run(backend: MemplanBackend, model: nn.Module | None = None, x: torch.Tensor = X) -> MemplanBackend:
    model = model if model is not None else make_mlp()

    def loss(i: torch.Tensor) -> torch.Tensor:
        return model(i).pow(2).mean()

    # a new code object per run: dynamo's per-code recompile limit (8) would fall back to eager
    fresh = types.FunctionType(loss.__code__.replace(), globals(), "loss", None, loss.__closure__)
    torch.compile(fresh, backend=backend)(x).backward()
    return backend


@pytest.fixture(scope="module")
def by_budget() -> dict[float, MemplanBackend]:
    return {b: run(memplan_backend(budget=b, inner="aot_eager")) for b in (1.0, 0.5, 0.2, 0.0)}


def saved_bytes(be: MemplanBackend) -> int:
    r = be.regions[0]
    return profile_region(r.fw_graph.graph, r.bw_graph.graph).saved_bytes


def test_lower_budget_saves_fewer_bytes(by_budget: dict[float, MemplanBackend]) -> None:
    saved = [saved_bytes(by_budget[b]) for b in (1.0, 0.5, 0.2, 0.0)]
    assert saved == sorted(saved, reverse=True)
    assert saved[0] > saved[2]


def test_decisions_say_which_branch_decided(by_budget: dict[float, MemplanBackend]) -> None:
    reasons = {b: be.regions[0].decision.reason for b, be in by_budget.items()}
    assert reasons == {1.0: "budget_1", 0.5: "solved", 0.2: "solved", 0.0: "budget_0"}
    assert by_budget[1.0].regions[0].knapsack is None
    d = by_budget[0.5].regions[0].decision
    assert d.solver_called and d.budget == 0.5 and 0 < d.min_act_bytes < d.max_act_bytes


def test_knapsack_record_is_consistent(by_budget: dict[float, MemplanBackend]) -> None:
    k = by_budget[0.5].regions[0].knapsack
    n = len(k.names)
    assert n > 0 and k.max_memory == 0.5 and k.solver == "dp"
    assert sorted(k.saved_idx + k.recomputed_idx) == list(range(n))
    assert len(k.sizes_bytes) == len(k.memory) == len(k.runtimes) == n
    assert list(k.sizes_bytes) == sorted(k.sizes_bytes, reverse=True)  # the partitioner's order
    d = by_budget[0.5].regions[0].decision
    for size, mem in zip(k.sizes_bytes, k.memory):  # normalized by (max - min) activation bytes
        assert mem == pytest.approx(size / (d.max_act_bytes - d.min_act_bytes), rel=1e-6)
    assert all(r >= 1 for r in k.runtimes)


def test_solver_not_called_when_weights_dominate() -> None:
    be = run(memplan_backend(budget=0.5, inner="aot_eager"), x=torch.randn(4, 256))
    d = be.regions[0].decision
    assert not d.solver_called and be.regions[0].knapsack is None
    assert d.reason in {"min_cut_below_inputs", "more_aggressive_fits", "aggressive_fits", "nothing_recomputable"}


def test_user_callable_solver_is_used(by_budget: dict[float, MemplanBackend]) -> None:
    calls: list[int] = []

    def save_nothing(memory: list[float], runtimes: list[float], max_memory: float) -> tuple[float, list[int], list[int]]:
        calls.append(len(memory))
        return 0.0, [], list(range(len(memory)))

    be = run(memplan_backend(budget=0.5, solver=save_nothing, inner="aot_eager"))
    assert calls and be.regions[0].knapsack.saved_idx == ()
    assert be.regions[0].knapsack.solver.endswith("save_nothing")
    assert saved_bytes(be) <= saved_bytes(by_budget[0.5])


@pytest.mark.parametrize("name", ["greedy", "dp", "hirschberg", "ilp"])
def test_every_named_solver_is_installed(name: str) -> None:
    from lightning_memplan.forecasting.validate import resolve_solver
    from lightning_memplan.solvers import get_solver

    assert resolve_solver(name)[1] is get_solver(name)
    k = run(memplan_backend(budget=0.5, solver=name, inner="aot_eager")).regions[0].knapsack
    assert k.solver == name
    assert sorted(k.saved_idx + k.recomputed_idx) == list(range(len(k.names)))
    assert sum(k.memory[i] for i in k.saved_idx) <= k.max_memory  # never over the budget


def test_node_flops_of_a_matmul() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    g = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(8, 16), torch.randn(16, 4)).graph
    mm = next(n for n in g.nodes if n.op == "call_function")
    assert node_flops(mm) == 2 * 8 * 16 * 4
    relu = make_fx(torch.relu, tracing_mode="fake")(torch.randn(3)).graph
    assert node_flops(next(n for n in relu.nodes if n.op == "call_function")) == 1


def test_caches_never_reuse_a_plan_of_another_budget() -> None:
    fconfig = importlib.import_module("torch._functorch.config")
    assert torch.compiler.config.force_disable_caches is False  # caches on, as users have them
    assert fconfig.enable_autograd_cache
    model = make_mlp()
    hi = run(memplan_backend(budget=0.5, inner="aot_eager"), model)
    lo = run(memplan_backend(budget=0.2, inner="aot_eager"), model)
    again = run(memplan_backend(budget=0.5, inner="aot_eager"), model)
    assert all(be.regions[0].decision.solver_called for be in (hi, lo, again))
    assert saved_bytes(lo) < saved_bytes(hi) == saved_bytes(again)


def test_a_plan_compiled_again_under_inductor_loads_its_kernels_instead_of_compiling_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second inductor compile of the same plan partitions and generates code again (its
    captures are made anew) but compiles no kernel: inductor's kernel cache, keyed by the kernels'
    source, stays on while the graph caches are off (``force_disable_caches`` compiled every kernel
    again, in a fresh directory per compile)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    kernels = lambda: sorted(p.name for p in tmp_path.rglob("*.so"))  # noqa: E731
    x = torch.randn(32, 64)
    first = run(memplan_backend(budget=0.5, inner="inductor"), make_mlp(width=64, depth=2), x)
    built = kernels()
    again = run(memplan_backend(budget=0.5, inner="inductor"), make_mlp(width=64, depth=2), x)
    assert built and kernels() == built
    assert again.regions[0].bw_schedule is not None and again.regions[0].decision is not None
    assert saved_bytes(again) == saved_bytes(first)


def test_global_state_restored() -> None:
    fconfig = importlib.import_module("torch._functorch.config")
    partitioners = importlib.import_module("torch._functorch.partitioners")
    imem = importlib.import_module("torch._inductor.memory")
    iconfig = importlib.import_module("torch._inductor.config")
    before = (fconfig.activation_memory_budget, fconfig.activation_memory_budget_solver,
              torch.compiler.config.force_disable_caches, partitioners.solve_min_cut,
              partitioners.choose_saved_values_set, imem.reorder_for_peak_memory,
              fconfig.enable_autograd_cache, iconfig.fx_graph_cache)
    run(memplan_backend(budget=0.3, inner="aot_eager"))
    after = (fconfig.activation_memory_budget, fconfig.activation_memory_budget_solver,
             torch.compiler.config.force_disable_caches, partitioners.solve_min_cut,
             partitioners.choose_saved_values_set, imem.reorder_for_peak_memory,
             fconfig.enable_autograd_cache, iconfig.fx_graph_cache)
    assert after == before


def test_graph_breaks_give_one_region_each() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = make_mlp(depth=1), make_mlp(depth=1, seed=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            torch._dynamo.graph_break()
            return self.b(y)

    be = run(memplan_backend(budget=0.5, inner="aot_eager"), Broken())
    # the break splits forward() in two, and the loss after it lands in a region of its own
    assert len(be.regions) >= 2
    assert [r.index for r in be.regions] == list(range(len(be.regions)))
    assert all(r.fw_graph is not None and r.bw_graph is not None for r in be.regions)


def test_capture_failure_keeps_the_compiled_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        raise RuntimeError("snapshot exploded")

    monkeypatch.setattr(mp_compile, "_snapshot", broken)
    model = make_mlp(depth=1)
    be = memplan_backend(budget=0.5, inner="aot_eager")
    loss = torch.compile(lambda i: model(i).sum(), backend=be)(X)
    loss.backward()
    assert model[0].weight.grad is not None
    assert any("snapshot exploded" in e for e in be.errors)
    assert be.regions[0].fw_graph is None


@pytest.mark.parametrize("budget", [1.5, -0.1, float("nan"), "0.5", True, None])
def test_bad_budget(budget: object) -> None:
    with pytest.raises(ValueError, match=r"memplan_backend\(budget=.*\)` is not a valid activation memory budget\. "
                                         r"Expected a float in \[0\.0, 1\.0\]"):
        memplan_backend(budget=budget)  # type: ignore[arg-type]


def test_bad_solver() -> None:
    with pytest.raises(ValueError, match=r"memplan_backend\(solver='knap'\)` is not a known solver\. "
                                         r"Expected one of 'greedy', 'dp', 'hirschberg', 'ilp'"):
        memplan_backend(solver="knap")


def test_bad_inner() -> None:
    with pytest.raises(ValueError, match=r"memplan_backend\(inner='tvm'\)` is not a supported backend\. "
                                         r"Expected one of 'inductor', 'aot_eager'"):
        memplan_backend(inner="tvm")


def test_old_torch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.10.1")
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.11 .*found torch '2\.10\.1'"):
        memplan_backend()


def test_missing_private_symbol_is_named() -> None:
    from lightning_memplan._torch.version import require

    with pytest.raises(RuntimeError, match=r"needs `torch\._inductor\.memory\.no_such_thing`.*Supported: torch >= 2\.11"):
        require("torch._inductor.memory", "no_such_thing")
