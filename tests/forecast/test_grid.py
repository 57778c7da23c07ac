"""forecast_grid: every (checkpoint set, budget) plan from one compile, checkpointing emulated by tags."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lightning_memplan import forecast
from lightning_memplan.forecasting.grid import forecast_grid
from lightning_memplan.planner.checkpointing import checkpointed


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.ln, self.qkv, self.proj = heads, nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = Residual(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        return self.mlp(x + self.proj(y))


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module], width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, 1)
        self.unused = Residual(width)  # never called in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _mlp() -> tuple[Stack, torch.Tensor]:
    torch.manual_seed(0)
    return Stack([Residual(64) for _ in range(4)], 64), torch.randn(512, 64)


def _gpt() -> tuple[Stack, torch.Tensor]:
    torch.manual_seed(0)
    return Stack([Attention(32) for _ in range(2)], 32), torch.randn(8, 64, 32)


@pytest.mark.parametrize(("make", "sets", "budgets"), [
    (_mlp, [(), ("blocks.1", "blocks.3"), ("blocks.0", "blocks.1", "blocks.2", "blocks.3")], (1.0, 0.4)),
    (_gpt, [(), ("blocks.1",), ("blocks.0", "blocks.1")], (1.0, 0.3)),
], ids=["residual-mlp", "attention"])
def test_emulated_checkpointing_equals_the_real_wrapper(make, sets, budgets) -> None:  # noqa: ANN001
    model, x = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grid = forecast_grid(model, (x,), budgets=budgets, checkpoint_sets=sets, optimizer=opt)
    assert list(grid) == [(tuple(s), b) for s in sets for b in budgets]
    peaks = {}
    for s in sets:
        for b in budgets:
            torch._dynamo.reset()
            with checkpointed(model, s):
                real = forecast(model, (x,), budget=b, backend="aot_eager", optimizer=opt)
            got = grid[(tuple(s), b)]
            assert got.status == "ok", got.problems
            assert got.peak_bytes == real.peak_bytes, (s, b)
            # the same activations saved (node names may differ: the checkpoint wrapper traces its own aliases)
            assert [r.decision.saved_bytes for r in got.regions] == [r.decision.saved_bytes for r in real.regions]
            assert [len(r.decision.saved_names) for r in got.regions] == [len(r.decision.saved_names) for r in real.regions]
            peaks[(tuple(s), b)] = got.peak_bytes
    every = tuple(sets[-1])
    assert peaks[(every, 1.0)] < peaks[((), 1.0)]  # checkpointing every block saves memory


def test_only_the_compiled_plan_trains_and_bad_names_are_refused() -> None:
    model, x = _mlp()
    grid = forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[(), ("blocks.0",)])
    assert torch.isfinite(grid[((), 1.0)].step())
    with pytest.raises(RuntimeError, match=r"budget 1\.0 with \['blocks\.0'\] checkpointed came from the partition"):
        grid[(("blocks.0",), 1.0)].step()
    with pytest.raises(ValueError, match=r"`forecast_grid\(checkpoint_sets=\.\.\.\)`: \['blocks\.9'\] are not submodules"):
        forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[("blocks.9",)])
    with pytest.raises(ValueError, match=r"`forecast_grid\(checkpoint_sets='blocks\.0'\)` must be a sequence of sequences"):
        forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets="blocks.0")  # type: ignore[arg-type]


def test_a_block_that_never_runs_gives_a_failed_forecast_that_says_why() -> None:
    model, x = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        grid = forecast_grid(model, (x,), budgets=(1.0,), checkpoint_sets=[(), ("unused",)])
    bad = grid[(("unused",), 1.0)]
    assert bad.status == "failed" and bad.peak_bytes is None
    assert any("no forward node was traced inside these blocks" in p for p in bad.problems)
    assert grid[((), 1.0)].status == "ok"


def test_the_run_plan_is_compiled_and_needs_less_memory_to_decide() -> None:
    from lightning_memplan.measure import PeakWindow

    model, x = _mlp()
    every = ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    sets, budgets = [(), every], (1.0, 0.4)
    with PeakWindow("cpu") as unplanned:
        plain = forecast_grid(model, (x,), budgets=budgets, checkpoint_sets=sets)
    torch._dynamo.reset()
    with PeakWindow("cpu") as frugal:
        grid = forecast_grid(model, (x,), budgets=budgets, checkpoint_sets=sets, run=(every, 1.0))
    # the same forecasts, whichever plan was compiled to run
    assert {k: fc.peak_bytes for k, fc in grid.items()} == {k: fc.peak_bytes for k, fc in plain.items()}
    assert torch.isfinite(grid[(every, 1.0)].step())
    with pytest.raises(RuntimeError, match=r"only budget 1\.0 with \['blocks\.0', .*\] checkpointed was compiled"):
        grid[((), 1.0)].step()
    # deciding costs the memory of the plan that runs: here every block recomputed
    assert frugal.peak_bytes < unplanned.peak_bytes
    with PeakWindow("cpu") as step:
        grid[(every, 1.0)].step()
    assert step.peak_bytes == pytest.approx(grid[(every, 1.0)].peak_bytes, rel=0.02)
    with pytest.raises(ValueError, match=r"`forecast_grid\(run=\(\('blocks\.0',\), 1\.0\)\)` must be one of the plans"):
        forecast_grid(model, (x,), budgets=budgets, checkpoint_sets=sets, run=(("blocks.0",), 1.0))


def test_backend_arguments_for_emulated_checkpointing_are_checked() -> None:
    from lightning_memplan.forecasting.backend import memplan_backend

    model, _ = _mlp()
    with pytest.raises(ValueError, match=r"`memplan_backend\(run_checkpoint='blocks\.0'\)` must be a sequence of "
                                         r"submodule names, e\.g\. \('blocks\.0',\)"):
        memplan_backend(inner="aot_eager", model=model, run_checkpoint="blocks.0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`memplan_backend\(run_checkpoint=\('blocks\.0',\)\)` needs "
                                         r"inner='aot_eager' and capture=True"):
        memplan_backend(inner="inductor", model=model, run_checkpoint=("blocks.0",))
    with pytest.raises(ValueError, match=r"`memplan_backend\(sweep_checkpoints=\(\('blocks\.0',\),\)\)` needs "
                                         r"inner='aot_eager'"):
        memplan_backend(inner="aot_eager", capture=False, model=model, sweep_checkpoints=(("blocks.0",),))
    with pytest.raises(ValueError, match=r"`memplan_backend\(sweep_checkpoints=\[\('blocks\.0',\)\]\)` needs the "
                                         r"model, to name its submodules"):
        memplan_backend(inner="aot_eager", sweep_checkpoints=[("blocks.0",)])
    be = memplan_backend(inner="aot_eager", model=model, sweep=(0.5,), sweep_checkpoints=(("blocks.0",),))
    with pytest.raises(KeyError, match=r"plan \(budget 0\.3, checkpoint \('blocks\.0',\)\) is not in this backend's sweep"):
        be.sweep_regions(0.3, ("blocks.0",))


def test_blocks_are_found_by_module_id_or_by_source_path() -> None:
    from lightning_memplan.forecasting.sweep import _owner

    blocks = ("blocks.0", "blocks.10")
    assert _owner({"140": ("L['self'].blocks.0", nn.Module)}, blocks, {"140": "blocks.0"}) == "blocks.0"
    # without ids (another torch): the path's ending, dotted or with the index in brackets
    assert _owner({"L__self___blocks_10": ("L['self'].blocks[10]", nn.Module)}, blocks, {}) == "blocks.10"
    assert _owner({"k": ("L['model'].blocks.0", nn.Module)}, blocks, {}) == "blocks.0"
    assert _owner({"k": ("L['model'].blocks.1", nn.Module)}, blocks, {}) is None
    assert _owner({"k": ("L['model'].myblocks.0", nn.Module)}, blocks, {}) is None
