"""Choose the plan for a Lightning step: decide it (a fixed budget, or the search's choice), and
judge the search's candidates again once the step is known.

:func:`decide_plan` forecasts the candidates on the search backend (:func:`~lightning_memplan.planner.search.search`)
and keeps their forecasts; :func:`rejudge_plan` lays those out again for the step's calls and eager
code and chooses again, compiling nothing. Both judge a candidate by the memory of the Lightning
step (:func:`~lightning_memplan.planner.step_model.lightning_step_memory`, bytes).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.optim_memory import OptimizerMemory
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import (
    checkpoint_candidates,
    resolve_blocks,
)
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.plan_forecast import BoundForward, sum_outputs
from lightning_memplan.planner.regional import regional_blocks, wants_regional
from lightning_memplan.planner.search import OUT_OF_TIME, PlanDoesNotFit, rejudge, search
from lightning_memplan.planner.settings import PlanSettings
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    eager_losses_laid_in,
    laid_out_for_step,
    lightning_step_memory,
    step_grad_bytes,
)

if TYPE_CHECKING:
    from lightning_memplan.forecasting.result import Forecast

__all__ = ["decide_plan", "rejudge_plan"]


def decide_plan(
    settings: PlanSettings,
    module: nn.Module,
    forward: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    *,
    call: str,
    loop: TrainingLoop = TrainingLoop(),
    kept: list[Forecast | None] | None = None,
    stacklevel: int = 2,
    warned: list[str] | None = None,
) -> MemPlan:
    """A fixed-budget plan, or the search's choice (knee, or cheapest within ``max_memory``).

    ``forward`` is ``module``'s original forward, called as ``forward(*args, **kwargs)``; the
    candidates are forecast on ``settings.search_backend`` (the plan's blocks are named relative to
    ``module``, its ``backend`` is ``settings.backend``; its ``regional`` blocks, from
    ``settings.regional`` (:func:`~lightning_memplan.planner.regional.wants_regional`), are compiled
    on their own in every candidate). Candidates are judged by the memory of the Lightning training
    step ``loop`` runs (:func:`lightning_step_memory`, bytes).
    When nothing fits ``max_memory``, warns (:class:`MemPlanWarning`, ``f"{call}: ..."``, ``stacklevel``
    as for ``warnings.warn``: 2 points at the caller) and returns the plan with the smallest
    forecast; ``warned``, a list, receives that message. ``kept``: a list that receives the
    candidates' forecasts when a search ran (aligned with ``plan.candidates``; ``None`` where one
    failed; plain data), for :func:`rejudge_plan`.

    Raises:
        RuntimeError: every candidate's forecast failed (from the search).
    """
    def say(message: str) -> None:  # warned at the caller of decide_plan, and kept in ``warned``
        warnings.warn(message, MemPlanWarning, stacklevel=stacklevel + 1)
        if warned is not None:
            warned.append(message)

    regional = regional_blocks(module, wants_regional(settings.regional, isinstance(settings.budget, str)))
    if settings.regional is True and not regional:
        message = (f"{call}: regional=True, but {type(module).__name__} has no repeated blocks (two or more "
                   "sibling submodules of one class with trainable parameters); it is compiled whole.")
        say(message)
    if not isinstance(settings.budget, str):
        return MemPlan(budget=float(settings.budget), solver=settings.solver_name,
                       backend=settings.backend, reason="budget given", regional=regional)
    sets = checkpoint_candidates(resolve_blocks(module, settings.checkpoint))
    target = BoundForward(module, forward, kwargs)
    grads = step_grad_bytes(module, loop)
    try:
        result = search(target, tuple(args), budgets=settings.candidate_budgets,
                        checkpoint_sets=[tuple(f"module.{b}" for b in s) for s in sets],
                        solver=settings.solver, backend=settings.search_backend, optimizer=optimizer,
                        loss_fn=sum_outputs, max_memory=settings.max_memory, limit_name=settings.limit_name,
                        remat_budgets=settings.remat_budgets,
                        step_memory=lambda fc: lightning_step_memory(fc, grads, loop),
                        keep_forecasts=kept is not None, regional=[f"module.{b}" for b in regional],
                        time_limit=settings.search_time_limit)
        plan, forecasts = result.plan, result.forecasts
    except PlanDoesNotFit as exc:
        message = f"{call}: {exc} Training with the smallest plan."
        say(message)
        plan, forecasts = exc.plan, exc.forecasts
    if kept is not None:
        kept.extend(forecasts)
    late = [c for c in plan.candidates if c.note == OUT_OF_TIME]
    if late:
        message = (f"{call}: the search stopped at search_time_limit={settings.search_time_limit:g} s; "
                   f"{len(late)} of {len(plan.candidates)} candidate plans were not forecast (first: {late[0].label}) "
                   f"and the plan is chosen among the {len(plan.candidates) - len(late)} that were. Raise "
                   "search_time_limit (or set None) to search them all.")
        say(message)
    failed = [c for c in plan.candidates if c.note.startswith("forecast failed")]
    if failed:
        message = (f"{call}: {len(failed)} of {len(plan.candidates)} candidate plans could not be forecast and were "
                   f"not considered (first: {failed[0].label}, {failed[0].note[:300]}); the plan is chosen among "
                   "the others (`plan.candidates` has every note).")
        say(message)
    return dataclasses.replace(_relative_to_module(plan, settings), regional=regional)


def _relative_to_module(plan: MemPlan, settings: PlanSettings) -> MemPlan:
    """The search named blocks relative to :class:`BoundForward`: the plan names them relative to
    the module."""
    strip = lambda names: tuple(n.removeprefix("module.") for n in names)  # noqa: E731
    cands = tuple(dataclasses.replace(c, checkpoint=strip(c.checkpoint)) for c in plan.candidates)
    return dataclasses.replace(plan, checkpoint=strip(plan.checkpoint), candidates=cands,
                               backend=settings.backend)


def rejudge_plan(
    settings: PlanSettings,
    plan: MemPlan,
    forecasts: Sequence[Forecast | None],
    grads: int,
    *,
    calls: int,
    new_input_bytes: int | Sequence[int] = 0,
    eager_loss: EagerLoss | Sequence[EagerLoss] | None = None,
    made_input_bytes: int = 0,
    loop: TrainingLoop = TrainingLoop(),
    optimizer: OptimizerMemory | None = None,
) -> MemPlan:
    """``plan``'s candidates judged again for a training step that calls the model ``calls`` times
    (``Forecast.repeated``; ``new_input_bytes`` as it takes them) with the measured ``eager_loss``
    (one per call) laid in (``Forecast.with_eager_loss``) and the first call's inputs the step made
    (``Forecast.with_inputs_made_in_step``), and chosen again, as
    :func:`decide_plan` chooses; nothing is compiled. ``grads``: gradient bytes live when a step
    starts (see :func:`lightning_step_memory`); ``optimizer``: the optimizer's memory, when it
    differs from the forecasts' (``Forecast.with_optimizer_memory``). When nothing fits
    ``max_memory``, the smallest plan (as :func:`decide_plan`, without a warning: the caller reports it).

    Raises:
        ValueError: ``forecasts`` does not match ``plan.candidates``.
    """
    losses, eager_grads = eager_losses_laid_in(
        (eager_loss,) if isinstance(eager_loss, EagerLoss) else tuple(eager_loss or ()), loop)

    def judge(fc: Forecast) -> tuple[int, int | None]:
        if optimizer is not None:
            fc = fc.with_optimizer_memory(optimizer)
        return lightning_step_memory(laid_out_for_step(fc, calls=calls, new_input_bytes=new_input_bytes,
                                                       eager_losses=losses, made_input_bytes=made_input_bytes),
                                     grads + eager_grads, loop)

    try:
        new = rejudge(plan, forecasts, judge, max_memory=settings.max_memory, solver=settings.solver,
                      limit_name=settings.limit_name)
    except PlanDoesNotFit as exc:
        new = exc.plan
    how = "judged " + ", ".join(
        ([f"on {calls} forward calls per step"] if calls > 1 or not (eager_loss or made_input_bytes) else [])
        + (["with the inputs training_step makes"] if made_input_bytes else [])
        + (["with the loss on the outputs measured on the first batch"] if eager_loss else []))
    return dataclasses.replace(new, backend=settings.backend, reason=f"{new.reason}, {how}", regional=plan.regional)
