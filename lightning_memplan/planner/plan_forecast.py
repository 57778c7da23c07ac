"""The chosen plan's forecast on the final backend, and that forecast laid out for the Lightning step.

:func:`forecast_plan` compiles the planned forward once with the plan (its blocks wrapped by the
caller) and fills the plan's prediction in; :func:`other_call_forecasts` forecasts the calls of the
step whose inputs have other shapes; :func:`lay_out_step` lays a forecast out for the step the first
batch showed, compiling nothing. Predictions are bytes above the step's baseline
(:func:`~lightning_memplan.planner.step_model.lightning_step_memory`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_memplan._torch.materialized import materialized_sum
from lightning_memplan._torch.storages import held_tensors
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.optim_memory import OptimizerMemory
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.settings import PlanSettings, plan_solver
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    eager_losses_laid_in,
    laid_out_for_step,
    lightning_step_memory,
    step_grad_bytes,
)

if TYPE_CHECKING:
    from lightning_memplan.forecasting.result import Forecast

__all__ = ["BoundForward", "forecast_plan", "lay_out_step", "other_call_forecasts", "sum_outputs"]


def sum_outputs(out: Any) -> torch.Tensor:
    """Default loss for forecasting: the sum of every floating tensor in the output (those an
    output object holds, such as a KV cache's keys and values, too: each output's gradient then
    has a place in the backward, where the zero gradient autograd hands it is read). They are
    summed by one :func:`~lightning_memplan._torch.materialized.materialized_sum`, so that under
    inductor each lives until all are made, as the outputs of the user's compiled forward do."""
    leaves = [t for t in held_tensors(out) if t.is_floating_point()]
    if not leaves:
        raise ValueError("the module's forward returned no floating-point tensor to differentiate")
    plain = [t for t in leaves if type(t) is torch.Tensor]
    parts = [t.float().sum() for t in leaves if type(t) is not torch.Tensor]  # tensor subclasses (DTensor)
    total = materialized_sum(plain) if plain else parts.pop(0)
    for part in parts:
        total = total + part
    return total


class BoundForward(nn.Module):
    """``module``'s original forward as a module of its own, with fixed keyword arguments, so a
    forecast can compile it without going through any planned or wrapped forward."""

    def __init__(self, module: nn.Module, forward: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self._forward = forward
        self._kwargs = kwargs

    def forward(self, *args: Any) -> Any:
        return self._forward(*args, **self._kwargs)


def forecast_plan(
    settings: PlanSettings,
    plan: MemPlan,
    module: nn.Module,
    forward: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    *,
    loop: TrainingLoop = TrainingLoop(),
) -> tuple[MemPlan, Forecast]:
    """Forecast ``plan`` on ``settings.backend`` (the plan's blocks must already be wrapped; its
    ``regional`` blocks are compiled on their own) and
    return the plan with the prediction for the Lightning step ``loop`` runs
    (:func:`lightning_step_memory`), breakdown and partitioner notes filled in, and the
    :class:`~lightning_memplan.forecasting.result.Forecast`. Raises what the forecast raises."""
    from lightning_memplan.forecasting.step_forecast import forecast

    fc = forecast(BoundForward(module, forward, kwargs), tuple(args), budget=plan.budget,
                  solver=plan_solver(settings, plan), backend=settings.backend, loss_fn=sum_outputs,
                  optimizer=optimizer, regional=tuple(f"module.{n}" for n in plan.regional))
    if fc.peak_bytes is None:
        return plan, fc
    grads = step_grad_bytes(module, loop)
    breakdown: dict[str, int] = {}
    if fc.breakdown is not None:
        b = fc.breakdown
        params = b.parameters if loop.param_bytes is None else loop.param_bytes
        breakdown = {"activations": b.activations, "parameters": params + b.buffers + loop.resident_bytes,
                     "gradients": grads, "optimizer_state": b.optimizer_state + loop.other_optimizer_state_bytes,
                     "inputs": b.inputs,
                     "optimizer_temporaries": b.optimizer_temporaries}
        if b.fsdp_buffers:
            breakdown["fsdp_buffers"] = b.fsdp_buffers
    notes = tuple(
        f"region {r.index}: " + ("solver called" if r.decision and r.decision.solver_called
                                 else f"solver not called ({r.decision.reason if r.decision else 'unknown'})")
        for r in fc.regions)
    baseline, peak = lightning_step_memory(fc, grads, loop)
    plan = dataclasses.replace(plan, predicted_peak_bytes=peak, baseline_bytes=baseline, breakdown=breakdown,
                               notes=notes)
    return plan, fc


def other_call_forecasts(settings: PlanSettings, plan: MemPlan, module: nn.Module, forward: Callable[..., Any],
                         optimizer: torch.optim.Optimizer | None, loop: TrainingLoop, first: Forecast,
                         signatures: Sequence[tuple[Any, ...]],
                         others: Mapping[tuple[Any, ...], tuple[Sequence[Any], dict[str, Any]]]) -> list[Forecast]:
    """One forecast per call of a step after the first, for ``Forecast.with_calls``: ``first`` (the
    first call's forecast) for a call of its shapes (``signatures``: :func:`call_signature` of
    every call, in order), else ``plan`` forecast (:func:`forecast_plan`; its blocks must already be
    wrapped) on the arguments ``others`` holds for that call's signature: dynamo compiles graphs of
    their own for them. Raises when one fails."""
    by_signature: dict[tuple[Any, ...], Forecast] = {}
    for signature, (args, kwargs) in others.items():
        _, fc = forecast_plan(settings, plan, module, forward, args, kwargs, optimizer, loop=loop)
        if fc.peak_bytes is None:
            raise RuntimeError("the forecast for a call of other input shapes failed: " + "; ".join(fc.problems))
        by_signature[signature] = fc
    return [first if sig == signatures[0] else by_signature[sig] for sig in signatures[1:]]


def lay_out_step(plan: MemPlan, fc: Forecast | None, *, calls: int, new_input_bytes: int | Sequence[int] = 0,
                 eager_losses: Sequence[EagerLoss] = (), made_input_bytes: int = 0,
                 loop: TrainingLoop = TrainingLoop(), grads: int | None = None,
                 optimizer: OptimizerMemory | None = None) -> tuple[MemPlan, Forecast | None]:
    """``plan`` and its forecast ``fc`` laid out for the step the first batch showed (nothing is
    compiled): ``calls`` calls of the forward per step (``Forecast.repeated``, ``new_input_bytes``
    as it takes them), the eager code between the forward and the backward (``eager_losses``,
    one per call; ``Forecast.with_eager_loss``) and the first call's inputs the step made
    (``made_input_bytes``; ``Forecast.with_inputs_made_in_step``). The plan's prediction, baseline
    and activations are those of the Lightning step ``loop`` runs (:func:`lightning_step_memory`),
    with ``grads`` bytes of the planned module's gradients between steps (:func:`step_grad_bytes`;
    default: the plan's breakdown) and ``optimizer``'s prediction of the optimizer's memory
    (``Forecast.with_optimizer_memory``; default: the forecast's). Returns them unchanged when there
    is nothing to lay out or no forecast. Raises what the layout raises."""
    module_grads = plan.breakdown.get("gradients", 0) if grads is None else grads
    nothing = (calls <= 1 and not eager_losses and not made_input_bytes and optimizer is None
               and module_grads == plan.breakdown.get("gradients", 0))
    if nothing or fc is None or fc.peak_bytes is None:
        return plan, fc
    losses, eager_grads = eager_losses_laid_in(eager_losses, loop)
    if optimizer is not None:
        fc = fc.with_optimizer_memory(optimizer)
    fc = laid_out_for_step(fc, calls=calls, new_input_bytes=new_input_bytes, eager_losses=losses,
                           made_input_bytes=made_input_bytes)
    grads = module_grads + eager_grads
    baseline, peak = lightning_step_memory(fc, grads, loop)
    breakdown = dict(plan.breakdown)
    if fc.breakdown:
        breakdown.update(activations=fc.breakdown.activations, inputs=fc.breakdown.inputs, gradients=grads,
                         optimizer_state=fc.breakdown.optimizer_state + loop.other_optimizer_state_bytes,
                         optimizer_temporaries=fc.breakdown.optimizer_temporaries)
        if "fsdp_buffers" in breakdown:  # those live at the new peak
            breakdown["fsdp_buffers"] = fc.breakdown.fsdp_buffers
    return dataclasses.replace(plan, predicted_peak_bytes=peak, baseline_bytes=baseline, breakdown=breakdown), fc
