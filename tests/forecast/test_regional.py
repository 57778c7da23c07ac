"""Regional compilation in the forecast (``regional=``): each block compiled on its own, blocks alike
sharing one graph whose partitions do not grow with depth; forecasts equal the measured step."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lightning_memplan import forecast, measure_peak
from lightning_memplan.forecasting.grid import forecast_grid, forecast_sweep
from lightning_memplan.planner.checkpointing import checkpointed

from .test_remat_graph import Block, _Widen


class Stack(nn.Module):
    """A token embedding, blocks called in a loop of a module of their own (``nn.Sequential``), a
    head. (A loop over the blocks in the compiled frame itself makes dynamo run that frame eagerly
    once a block's call breaks the graph: its stem and head are then neither planned nor forecast.)"""

    def __init__(self, blocks: list[nn.Module], dim: int = 32) -> None:
        super().__init__()
        self.stem, self.blocks, self.head = nn.Embedding(128, dim), nn.Sequential(*blocks), nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _model(layers: int, dim: int = 32) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Stack([Block(dim) for _ in range(layers)], dim), torch.randint(0, 128, (8, 64))


def _names(layers: int) -> tuple[str, ...]:
    return tuple(f"blocks.{i}" for i in range(layers))


def _graph_sizes(fc) -> list[int]:  # noqa: ANN001
    return sorted(len(gm.graph.nodes) for r in fc._backend.regions for gm in (r.fw_graph, r.bw_graph)
                  if gm is not None)


@pytest.mark.parametrize(("budget", "solver"), [(1.0, "dp"), (0.3, "dp"), (0.4, "remat")])
def test_blocks_alike_run_one_graph_forecast_as_measured(budget: float, solver: str) -> None:
    model, x = _model(3)
    fc = forecast(model, (x,), budget=budget, solver=solver, backend="aot_eager", regional=_names(3))
    assert fc.status == "ok", fc.problems
    assert sorted(r.calls for r in fc.regions)[-1] == 3, [(r.index, r.calls) for r in fc.regions]
    fc.step()
    assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.01)


def test_the_partitioned_graphs_do_not_grow_with_depth() -> None:
    sizes = {}
    for layers in (2, 5):
        model, x = _model(layers)
        sweep = forecast_sweep(model, (x,), budgets=(1.0, 0.3), regional=_names(layers))
        sizes[layers] = {b: _graph_sizes(fc) for b, fc in sweep.items()}
    assert sizes[2] == sizes[5]
    whole = forecast(*_model(5), backend="aot_eager")  # the peer: one graph grows with the blocks
    assert max(_graph_sizes(whole)) > max(sizes[5][1.0])


def test_checkpointed_regional_blocks_compile_checkpointed() -> None:
    model, x = _model(4)
    every_other = ("blocks.1", "blocks.3")
    with checkpointed(model, every_other):
        fc = forecast(model, (x,), budget=1.0, backend="aot_eager", regional=_names(4))
        fc.step()
        measured = measure_peak(fc.step)
    plain = forecast(*_model(4), budget=1.0, backend="aot_eager", regional=_names(4))
    assert sorted(r.calls for r in fc.regions)[-2:] == [2, 2]  # the checkpointed and the plain blocks' graphs
    assert fc.peak_bytes < plain.peak_bytes
    assert measured == pytest.approx(fc.peak_bytes, rel=0.01)


def test_checkpoint_sets_of_regional_blocks_are_emulated_on_one_trace_as_the_wrapped_blocks_forecast(
        emulated_as_wrapped: Callable[..., Any]) -> None:
    """Every second block, and every block, checkpointed: the grid partitions the shared block graph
    once more with its forward checkpointed and runs it for those blocks' calls; each plan's peak
    and FLOPs equal those of a trace with the blocks really wrapped (which compiles the block graph
    twice, checkpointed and plain)."""
    model, x = _model(4)
    names = _names(4)
    grid = emulated_as_wrapped(model, (x,), [names[1::2], names], (1.0, 0.3), names)
    assert grid[(names, 0.3)].peak_bytes < grid[((), 0.3)].peak_bytes


class _Broken(nn.Module):
    """A block whose graph breaks in the middle: dynamo compiles its two halves."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.a, self.b = Block(dim), Block(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        torch._dynamo.graph_break()
        return self.b(x)


def test_a_regional_block_whose_graph_breaks_is_not_emulated_and_says_why() -> None:
    torch.manual_seed(0)
    model, x = Stack([_Broken(), _Broken()]), torch.randint(0, 128, (8, 64))
    with pytest.warns(RuntimeWarning, match="blocks.1' made 2 compiled calls in the step, not one"):
        grid = forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[(), ("blocks.1",)], regional=_names(2))
    assert grid[((), 1.0)].status == "ok"
    assert grid[(("blocks.1",), 1.0)].status == "failed"


class _Memo:
    """A Python object a block writes to, as a KV cache is."""

    last: torch.Tensor | None = None


class _Remembering(Block):
    def __init__(self, memo: _Memo, dim: int = 32) -> None:
        super().__init__(dim)
        self.memo = memo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.memo.last = x.detach()
        return super().forward(x)


def test_a_regional_block_that_mutates_an_object_is_not_emulated_and_says_why() -> None:
    """Under torch.utils.checkpoint dynamo traces the write apart from the checkpointed graph, and
    the emulation is not exact for such blocks: it is not used, and says why (the search traces the
    set with the blocks wrapped)."""
    torch.manual_seed(0)
    memo = _Memo()
    model, x = Stack([_Remembering(memo), _Remembering(memo)]), torch.randint(0, 128, (8, 64))
    with pytest.warns(RuntimeWarning, match=r"the graph of block 'blocks.0' mutates Python objects "
                                            r"\(UserDefinedObjectVariable"):
        grid = forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[(), _names(2)], regional=_names(2))
    assert grid[((), 1.0)].status == "ok"
    assert grid[(_names(2), 1.0)].status == "failed"


def test_on_a_torch_that_runs_a_mutating_block_eagerly_under_checkpointing_no_set_with_it_is_a_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``skip_fwd_side_effects_in_bwd_under_checkpoint`` (a torch that lacks it), dynamo
    runs a checkpointed block that writes to an object eagerly: the search traces ("blocks.1",)
    with the block wrapped, finds it eager, and gives every larger set with it no plan without a
    trace of its own (a block's graph is its own, whatever else is wrapped). With the setting, as
    our compiled calls run, the same sets are plans."""
    from lightning_memplan._torch import dynamo
    from lightning_memplan.forecasting import grid as grid_mod
    from lightning_memplan.planner.search import NOT_A_PLAN, search

    sweeps: list[int] = []
    orig = grid_mod.forecast_sweep

    def counting(*a: Any, **k: Any) -> Any:
        sweeps.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(grid_mod, "forecast_sweep", counting)
    sets = ((), ("blocks.1",), _names(2))
    x = torch.randint(0, 128, (8, 64))
    for torch_has_it in (True, False):
        if not torch_has_it:
            monkeypatch.setattr(dynamo, "DYNAMO_SETTINGS", ("nested_graph_breaks",))
        sweeps.clear()
        torch.manual_seed(0)
        model = Stack([_Remembering(_Memo()), _Remembering(_Memo())])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = search(model, (x,), budgets=(1.0, 0.5), checkpoint_sets=sets, remat_budgets=(),
                          regional=_names(2)).plan
        notes = {c.checkpoint: c.note for c in plan.candidates if c.checkpoint}
        if torch_has_it:
            assert sweeps == [1, 1] and all(c.peak_bytes is not None for c in plan.candidates), notes
        else:
            assert sweeps == [1], notes  # ("blocks.1",) traced wrapped; the set of both not traced
            assert notes[("blocks.1",)].startswith(f"{NOT_A_PLAN}: dynamo runs blocks.1 eagerly"), notes
            assert notes[_names(2)].startswith(f"{NOT_A_PLAN}: dynamo runs blocks.1 eagerly"), notes


def test_every_plan_of_a_regional_sweep_is_forecast_as_its_own_compile() -> None:
    """The plans partitioned beside the one run (budget 0.3 here) know which graph inputs are
    parameters and which are the previous block's outputs, as the compiled plan does: a
    checkpointed block keeps its input to recompute from."""
    model, x = _model(4)
    with checkpointed(model, ("blocks.1", "blocks.3")):
        sweep = forecast_sweep(model, (x,), budgets=(1.0, 0.3), regional=_names(4))
        own = forecast(model, (x,), budget=0.3, backend="aot_eager", regional=_names(4))
    assert sweep[0.3].peak_bytes == own.peak_bytes


def test_blocks_of_another_width_compile_graphs_of_their_own() -> None:
    torch.manual_seed(0)
    model = Stack([Block(32), nn.Sequential(_Widen(32, 64), Block(64), _Widen(64, 32)), Block(32)])
    x = torch.randint(0, 128, (8, 64))
    fc = forecast(model, (x,), budget=0.3, backend="aot_eager", regional=("blocks.0", "blocks.1.1", "blocks.2"))
    assert fc.status == "ok", fc.problems
    # the two Block(32) share a graph, Block(64) has its own
    assert sorted(r.calls for r in fc.regions)[-2:] == [1, 2], [(r.index, r.calls) for r in fc.regions]
    fc.step()
    assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.01)


def test_bad_regional_names_are_named() -> None:
    model, x = _model(2)
    with pytest.raises(ValueError, match=r"forecast\(regional='0'\)` must be a sequence of submodule names"):
        forecast(model, (x,), regional="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\['blocks.9'\] are not submodules"):
        forecast(model, (x,), regional=("blocks.9",))
    with pytest.raises(ValueError, match=r"\['blocks.1', 'stem'\] mixes blocks compiled on their own"):
        forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[(), ("blocks.1", "stem")], regional=_names(2))
    with pytest.raises(ValueError, match=r"run=\(\('blocks.1',\), 1.0\)\)` must be one of the plans.*not a set of "
                                         r"blocks compiled on their own"):
        forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[(), ("blocks.1",)], regional=_names(2),
                      run=(("blocks.1",), 1.0))


def test_regional_without_repeated_blocks_is_said_and_compiles_whole() -> None:
    from lightning_memplan.planner.decision import decide_plan
    from lightning_memplan.planner.messages import MemPlanWarning
    from lightning_memplan.planner.settings import PlanSettings

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    settings = PlanSettings.from_args("MemPlanCallback", budget=0.5, regional=True)
    with pytest.warns(MemPlanWarning, match=r"regional=True, but Sequential has no repeated blocks"):
        plan = decide_plan(settings, model, model.forward, (torch.randn(2, 4),), {}, None, call="MemPlanCallback")
    assert plan.regional == ()
    stack, _ = _model(3)
    plan = decide_plan(settings, stack, stack.forward, (), {}, None, call="MemPlanCallback")
    assert plan.regional == _names(3)  # its loop is nn.Sequential's: nothing else runs in that frame


class LoopHere(nn.Module):
    """nanoGPT's layout: the loop over the blocks in the compiled module's own forward, beside the
    embeddings (added in that frame), a final norm and the head."""

    def __init__(self, layers: int = 3, dim: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(128, dim), nn.Embedding(64, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


def test_a_loop_in_the_compiled_frame_leaves_only_its_glue_eager() -> None:
    """The block calls break the graph inside the loop, so dynamo runs that frame eagerly; the
    modules beside the blocks compile on their own (else the embeddings run eagerly, unplanned), and
    the frame's own add of the two embeddings is measured as eager code between the regions."""
    from lightning_memplan.planner.regional import regional_blocks

    torch.manual_seed(0)
    model, x = LoopHere(), torch.randint(0, 128, (8, 64))
    names = regional_blocks(model, True)
    assert names == ("blocks.0", "blocks.1", "blocks.2", "tok", "pos", "ln", "head")
    fc = forecast(model, (x,), budget=0.3, backend="aot_eager", regional=names)
    assert fc.status == "ok", fc.problems
    fc.step()
    assert measure_peak(fc.step) == pytest.approx(fc.peak_bytes, rel=0.01)
    # the blocks only: the embeddings run eagerly, in no compiled graph (the plan cannot reach them)
    alone = forecast(model, (x,), budget=0.3, backend="aot_eager", regional=names[:3])
    eager = {id(p) for m in (model.tok, model.pos) for p in m.parameters()}
    assert alone.compiled_parameter_ids is not None and not eager & alone.compiled_parameter_ids
    assert fc.compiled_parameter_ids is not None and eager <= fc.compiled_parameter_ids


class _Shared(nn.Module):
    """A block that takes a second input from an earlier region (``m``, added, never saved); with
    ``norm`` its backward saves its hidden input ``h`` (the layer norm's), without it only the
    linear's cast of ``h`` under autocast."""

    def __init__(self, dim: int, norm: bool) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim) if norm else nn.Identity()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(F.gelu(self.fc1(self.ln(h)))) + m


class LoopDropout(nn.Module):
    """GPT-2's layout: the embedding dropped out by eager code in the looping frame, each block
    also given a tensor an earlier region made (GPT-2's causal mask), a final norm and the head."""

    def __init__(self, norm: bool, layers: int = 3, dim: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(128, dim), nn.Embedding(64, dim)
        self.blocks = nn.ModuleList(_Shared(dim, norm) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.pos(torch.arange(x.shape[1]))
        h = F.dropout(self.tok(x), 0.1, self.training)
        for block in self.blocks:
            h = block(h, m)
        return self.head(self.ln(h))


@pytest.mark.parametrize("budget", [1.0, 0.3])
@pytest.mark.parametrize(("norm", "amp"), [(True, False), (False, True)])
def test_the_blocks_inputs_live_as_every_call_of_their_shared_graph_and_the_eager_dropout_keep_them(
        budget: float, norm: bool, amp: bool) -> None:
    """With ``norm``, the first block's hidden input is eager code's (the dropout's), every later
    block's an earlier block's output, and the graph they share saves it: it lives to each call's
    backward (it was judged on the first call alone, where only ``m`` came from a region: 7-9%
    low). Without it, under autocast, the blocks keep only a cast of ``h`` and the dropout's output
    dies when the step's forward returns, but the mask the eager dropout saved lives to its
    backward (it died with the output: 3-4% low)."""
    from lightning_memplan.planner.regional import regional_blocks

    torch.manual_seed(0)
    model, x = LoopDropout(norm), torch.randint(0, 128, (8, 64))
    names = regional_blocks(model, True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        fc = forecast(model, (x,), budget=budget, backend="aot_eager", regional=names)
        assert fc.status == "ok", fc.problems
        fc.step()
        measured = measure_peak(fc.step)
    assert measured == pytest.approx(fc.peak_bytes, rel=0.01)
