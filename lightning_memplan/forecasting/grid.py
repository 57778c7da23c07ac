"""Forecast many plans from ONE compile: :func:`forecast_sweep` (several budgets) and
:func:`forecast_grid` (budgets x emulated checkpoint sets, plus whole-graph rematerialization plans).

One trace, the joint graph partitioned under every plan (``aot_eager``), one forward and backward
run with the plan compiled to run; each other plan's forecast is assembled from its partition.
:func:`forecast` below is :func:`lightning_memplan.forecasting.step_forecast.forecast`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan.forecasting.assemble import PlanCapture, assemble_forecast
from lightning_memplan.forecasting.backend import memplan_backend
from lightning_memplan.forecasting.capture import RegionCapture
from lightning_memplan.forecasting.checkpointed_calls import with_checkpointed_calls
from lightning_memplan.forecasting.compile_step import compile_step
from lightning_memplan.forecasting.estimate import check_target, estimated, finish_estimate
from lightning_memplan.forecasting.optim_memory import optimizer_memory
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.forecasting.validate import (
    check_budgets,
    check_checkpoint_sets,
    check_regional,
    check_step_args,
    resolve_solver,
)

__all__ = ["GridKey", "forecast_grid", "forecast_sweep"]

GridKey = tuple[tuple[str, ...] | str, float]
"""A plan of :func:`forecast_grid`: ``(checkpointed blocks, budget)`` with the grid's knapsack
solver, or ``("remat", budget)`` for whole-graph rematerialization."""


def forecast_sweep(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budgets: Sequence[float],
    solver: str | Callable[..., Any] = "dp",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    regional: Sequence[str] = (),
    target: str | None = None,
) -> dict[float, Forecast]:
    """Forecast several budgets from ONE compile: trace once, partition the same joint graph under
    every budget (``aot_eager``), run forward and backward once with the first budget's plan.

    Returns ``{budget: Forecast}`` in the order of ``budgets`` (duplicates dropped). Each forecast is
    what :func:`forecast` with ``backend="aot_eager"`` gives at that budget (same graphs, decisions,
    peak); only the first budget's ``step()`` trains, the others raise a ``RuntimeError`` (their plan
    was partitioned, never compiled to run: call :func:`forecast` with that budget to train with it).
    ``compile_seconds`` is the shared compiling run's, the same in every forecast. ``regional``: as
    :func:`forecast`'s (each region's graph partitioned under every budget). ``target``: as
    :func:`forecast`'s (an estimate on fake tensors; no forecast's ``step()`` trains).

    Raises:
        ValueError: bad arguments (as :func:`forecast`), or no budget.
        RuntimeError: a torch without the features needed (torch < 2.11).
    """
    grid = _grid(model, example_inputs, budgets=budgets, checkpoint_sets=((),), solver=solver, loss_fn=loss_fn,
                 optimizer=optimizer, call="forecast_sweep", regional=regional, target=target)
    return {b: fc for (_, b), fc in grid.items()}


def forecast_grid(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budgets: Sequence[float],
    checkpoint_sets: Sequence[Sequence[str]],
    solver: str | Callable[..., Any] = "dp",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    run: tuple[Sequence[str], float] | None = None,
    remat_budgets: Sequence[float] = (),
    regional: Sequence[str] = (),
    target: str | None = None,
) -> dict[GridKey, Forecast]:
    """Forecast every plan (checkpointed blocks, budget) from ONE compile of the unchanged model.

    Like :func:`forecast_sweep`, and each non-empty checkpoint set (qualified names from
    ``model.named_modules()``) is emulated on the same joint graph: the forward nodes traced inside
    those blocks are tagged as ``torch.utils.checkpoint`` tags them under ``torch.compile``, so the
    partitioner recomputes them. Each forecast equals :func:`forecast` (``aot_eager``) of the model
    with those blocks wrapped by :func:`lightning_memplan.planner.checkpointing.checkpointed`. Only
    the plan compiled to run, ``run`` (default ``((), budgets[0])``), trains; the compiling forward
    and backward run that plan, so naming the most frugal one (e.g. every block checkpointed) keeps
    the search's one real step small when the unplanned model would not fit. A plan whose blocks could not be found in the graph gets a
    ``"failed"`` forecast saying so.

    ``remat_budgets`` adds whole-graph rematerialization plans (solver ``"remat"``, see
    :mod:`lightning_memplan.core.remat`) partitioned on the same joint graph, under the keys
    ``("remat", budget)``; each equals :func:`forecast` with ``solver="remat"`` at that budget.

    ``regional``: submodules compiled on their own (as :func:`forecast`'s). A checkpoint set of
    them is emulated too: each region's graph is also partitioned with its whole forward
    checkpointed, and the calls the set's blocks make run that partition
    (:mod:`~lightning_memplan.forecasting.checkpointed_calls`). A set with a block that makes no
    compiled call or several, or whose graph mutates Python objects (a context variable it
    sets), gets a ``"failed"`` forecast saying so
    (forecast it with :func:`forecast_sweep` inside
    :func:`~lightning_memplan.planner.checkpointing.checkpointed`). A set may not mix them with
    other blocks, nor be ``run``.

    Returns ``{(checkpoint_set, budget): Forecast}``, sets in the order given, then budgets, then
    ``{("remat", budget): Forecast}`` in the order of ``remat_budgets``. ``target``: as
    :func:`forecast`'s (every plan an estimate on fake tensors, made without running).

    Raises:
        ValueError: bad arguments (as :func:`forecast`), no budget, a name that is not a submodule,
            ``solver="remat"`` (give its budgets as ``remat_budgets``), a checkpoint set that
            mixes ``regional`` blocks with others, or ``run`` naming a set of ``regional`` blocks.
        RuntimeError: a torch without the features needed (torch < 2.11).
    """
    return _grid(model, example_inputs, budgets=budgets, checkpoint_sets=checkpoint_sets, solver=solver,
                 loss_fn=loss_fn, optimizer=optimizer, call="forecast_grid", run=run, remat_budgets=remat_budgets,
                 regional=regional, target=target)


def _grid(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budgets: Sequence[float],
    checkpoint_sets: Sequence[Sequence[str]],
    solver: str | Callable[..., Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: torch.optim.Optimizer | None,
    call: str,
    run: tuple[Sequence[str], float] | None = None,
    remat_budgets: Sequence[float] = (),
    regional: Sequence[str] = (),
    target: str | None = None,
) -> dict[GridKey, Forecast]:
    """:func:`forecast_grid`'s work, its errors naming ``call`` (the public function called)."""
    bs = check_budgets(budgets, call, "budgets", empty=False)
    rbs = check_budgets(remat_budgets, call, "remat_budgets")
    solver_name, _ = resolve_solver(solver, call)  # type: ignore[arg-type]
    if solver_name == "remat":
        raise ValueError(f"`{call}(solver='remat')`: the grid's budgets and checkpoint sets are knapsack plans; "
                         "give a knapsack solver and the remat budgets as `remat_budgets=...`.")
    inputs = check_step_args(model, example_inputs, loss_fn, optimizer)
    emulated = check_checkpoint_sets(checkpoint_sets, model, call)
    blocks = check_regional(regional, model, call)
    on_own = {tuple(s) for s in emulated if set(s) & set(regional)}  # sets of blocks compiled on their own
    mixed = [s for s in on_own if not set(s) <= set(regional)]
    if mixed:
        raise ValueError(f"`{call}(checkpoint_sets=...)`: {list(mixed[0])!r} mixes blocks compiled on their own "
                         f"(regional={list(regional)!r}) with others; the grid emulates a set of either kind, not "
                         "both: forecast it with `forecast_sweep(..., regional=...)` inside `checkpointed(model, "
                         "blocks)`.")
    sets = tuple(dict.fromkeys(tuple(s) for s in checkpoint_sets))
    run_ck, run_b = ((), bs[0]) if run is None else (tuple(run[0]), run[1])
    if run is not None and (run_ck not in sets or run_b not in bs or run_ck in on_own):
        raise ValueError(f"`{call}(run={run!r})` must be one of the plans: a checkpoint set of checkpoint_sets "
                         f"and a budget of budgets, e.g. ({list(sets[-1])!r}, {bs[0]!r}); not a set of blocks "
                         "compiled on their own (regional).")
    tgt = check_target(target, model, inputs, call)
    if tgt is not None:
        with estimated(model, inputs, optimizer, tgt, call) as (fake, ws):
            grid = _grid(fake.model, fake.inputs, budgets=bs, checkpoint_sets=checkpoint_sets, solver=solver,
                         loss_fn=loss_fn, optimizer=fake.optimizer, call=call, run=run, remat_budgets=rbs,
                         regional=regional)
        return {key: finish_estimate(fc, tgt, ws) for key, fc in grid.items()}
    be = memplan_backend(budget=run_b, solver=solver, inner="aot_eager", sweep=bs,  # type: ignore[arg-type]
                         sweep_checkpoints=[s for s in emulated if s not in on_own], model=model,
                         run_checkpoint=run_ck, sweep_remat=rbs, whole_region=bool(on_own))
    compiled = compile_step(be, model, inputs, loss_fn, optimizer, blocks)
    params = {block: frozenset(id(p) for p in model.get_submodule(block).parameters() if p.requires_grad)
              for s in on_own for block in s}

    out: dict[GridKey, Forecast] = {}
    opt_mem = optimizer_memory(optimizer) if optimizer is not None else None  # the same for every plan
    plans: list[tuple[GridKey, str]] = [((ck, b), solver_name) for ck in sets for b in bs]
    plans += [(("remat", b), "remat") for b in rbs]
    for key, name in plans:
        ck, b = key
        step_run = compiled
        if key == (run_ck, run_b):
            view, regions, run_step = be, be.regions, compiled.step
        else:
            regions = list(be.remat_regions(b) if ck == "remat" else be.sweep_regions(b, () if ck in on_own else ck))
            for i, (r, own) in enumerate(zip(regions, be.regions)):
                if r.fw_graph is None and not r.errors and own.bw_graph is None and own.decision is None:
                    regions[i] = own  # not partitioned (an inference graph): the same under every plan
            if ck in on_own:
                try:
                    regions, step_run = with_checkpointed_calls(compiled, regions, be.whole_region_regions(b),
                                                                {block: params[block] for block in ck})
                except ValueError as err:
                    regions = [RegionCapture(index=r.index, errors=[f"checkpoint {list(ck)!r} not emulated: {err}"])
                               for r in regions]
            view = memplan_backend(budget=b, solver=name if name == "remat" else solver,  # type: ignore[arg-type]
                                   inner="aot_eager")
            view.regions = regions
            run_step = functools.partial(_not_compiled, b, ck, run_ck, run_b)
        plan = PlanCapture(backend=view, regions=regions, inner="aot_eager", budget=b, solver_name=name,
                           step=run_step,
                           extra_seconds=sum(r.compile_seconds for r in regions) if run_step is not compiled.step else 0.0)
        out[key] = assemble_forecast(step_run, plan, opt_mem=opt_mem, stacklevel=4)
    return out


def _not_compiled(budget: float, checkpoint: tuple[str, ...] | str, ran_checkpoint: tuple[str, ...],
                  ran: float) -> torch.Tensor:
    """The ``step()`` of a plan never compiled to run: raises a ``RuntimeError`` naming the call that
    would train with it (``ran_checkpoint`` at ``ran``: the plan that was compiled)."""
    if checkpoint == "remat":
        raise RuntimeError(
            f"this forecast of the remat plan at budget {budget!r} came from the partition of a shared compile; "
            f"call `forecast(..., budget={budget!r}, solver='remat')` to train with it.")
    ck = f" with {list(checkpoint)!r} checkpointed" if checkpoint else ""
    ran_ck = f"with {list(ran_checkpoint)!r} checkpointed" if ran_checkpoint else "without checkpointing"
    raise RuntimeError(
        f"this forecast of budget {budget!r}{ck} came from the partition of a shared compile; only budget "
        f"{ran!r} {ran_ck} was compiled to run. Call `forecast(..., budget={budget!r})` (inside "
        "`checkpointed(model, blocks)` for checkpointed blocks) to train with this plan."
    )
