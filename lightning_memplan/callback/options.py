"""The callback's arguments, validated before training starts (each message names the argument,
shows the value and says what is allowed)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.batch_size import check_batch_args
from lightning_memplan.planner.checkpointing import CheckpointPolicy
from lightning_memplan.planner.given_plan import check_plan_solver, ignored_beside_plan
from lightning_memplan.planner.regional import RegionalFlag
from lightning_memplan.planner.search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS
from lightning_memplan.planner.settings import PlanSettings, check_submodule

__all__ = ["CallbackOptions", "callback_options"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CallbackOptions:
    """``MemPlanCallback``'s arguments, validated (see its docstring for each)."""

    #: The planning settings shared with the tuner (budget, max_memory in bytes, solver, ...).
    settings: PlanSettings
    #: A plan given by the user (``plan=``), loaded from its file.
    user_plan: MemPlan | None
    replan: bool
    measure_batches: int
    log_plots: bool
    compile_kwargs: dict[str, Any]
    verbose: bool
    submodule: str | None
    forecast_new_shapes: bool
    #: ``"max"``: search the largest batch that fits before the first step (``None``: the batch as it is)
    batch_size: Literal["max"] | None = None
    #: the attribute that sets the batch size (the module's, its hparams', the datamodule's)
    batch_arg_name: str = "batch_size"
    #: what the arguments override of each other, in words (warned when the callback is made)
    notes: tuple[str, ...] = ()

    def on_device(self, device: torch.device | str) -> CallbackOptions:
        """These options for a fit on ``device`` (``backend="auto"`` resolved: see ``PlanSettings.on_device``)."""
        return dataclasses.replace(self, settings=self.settings.on_device(device))


def callback_options(
    *, budget: float | str, max_memory: int | str | None, solver: str | Callable[..., Any],
    checkpoint: CheckpointPolicy, backend: str, candidate_budgets: Sequence[float], search_backend: str,
    remat_budgets: Sequence[float], plan: MemPlan | str | Path | None, replan: bool, measure_batches: int,
    log_plots: bool, compile_kwargs: dict[str, Any] | None, verbose: bool, submodule: str | None,
    forecast_new_shapes: bool, regional: RegionalFlag, search_time_limit: float | None,
    batch_size: str | None = None, batch_arg_name: str = "batch_size",
) -> CallbackOptions:
    """Validate ``MemPlanCallback``'s arguments; raises ``ValueError`` naming the bad one."""
    call = "MemPlanCallback"
    check_submodule(submodule, call)
    searches_batch = check_batch_args(call, batch_size, batch_arg_name)
    settings = PlanSettings.from_args(
        call, budget=budget, max_memory=max_memory, solver=solver, checkpoint=checkpoint, backend=backend,
        candidate_budgets=candidate_budgets, search_backend=search_backend, remat_budgets=remat_budgets,
        regional=regional, search_time_limit=search_time_limit)
    if isinstance(measure_batches, bool) or not isinstance(measure_batches, int) or measure_batches < 1:
        raise ValueError(f"`{call}(measure_batches={measure_batches!r})` must be an int >= 1.")
    if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
        raise ValueError(f"`{call}(compile_kwargs={compile_kwargs!r})` must be a dict of torch.compile options.")
    if not isinstance(forecast_new_shapes, bool):
        raise ValueError(f"`{call}(forecast_new_shapes={forecast_new_shapes!r})` must be True or False.")
    if compile_kwargs and "backend" in compile_kwargs:
        raise ValueError(f"`{call}(compile_kwargs={compile_kwargs!r})`: set the backend with `backend=`.")
    user_plan = None
    if isinstance(plan, MemPlan):
        user_plan = plan
    elif plan is not None:
        if not isinstance(plan, (str, Path)):
            raise ValueError(f"`{call}(plan={plan!r})` must be a MemPlan or the path of a plan JSON file.")
        if not Path(plan).is_file():
            raise ValueError(f"`{call}(plan={str(plan)!r})`: no such file. Save one with `plan_memory(...).save(path)`.")
        user_plan = MemPlan.load(plan)
    notes: list[str] = []
    if user_plan is not None:
        source = f"`{call}(plan={'MemPlan(...)' if isinstance(plan, MemPlan) else repr(str(plan))})`"
        check_plan_solver(user_plan, solver, source)
        custom = callable(solver) and user_plan.solver.startswith("custom:")  # the plan's own solver, given
        ignored = ignored_beside_plan(call, {
            "budget": (budget, "auto"), "max_memory": (max_memory, None),
            "solver": (solver, solver if custom else "dp"),
            "checkpoint": (checkpoint, "auto"), "candidate_budgets": (candidate_budgets, DEFAULT_BUDGETS),
            "remat_budgets": (remat_budgets, DEFAULT_REMAT_BUDGETS), "regional": (regional, "auto"),
            "search_time_limit": (search_time_limit, None), "batch_size": (batch_size, None)})
        notes += [ignored] if ignored else []
    return CallbackOptions(settings=settings, user_plan=user_plan, replan=bool(replan),
                           measure_batches=measure_batches, log_plots=bool(log_plots),
                           compile_kwargs=dict(compile_kwargs or {}), verbose=bool(verbose), submodule=submodule,
                           forecast_new_shapes=forecast_new_shapes, notes=tuple(notes),
                           batch_size="max" if searches_batch and user_plan is None else None,
                           batch_arg_name=batch_arg_name)
