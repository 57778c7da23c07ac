"""Forecast the peak memory of one training step compiled with a given budget and solver.

    fc = forecast(model, (x,), budget=0.5, solver="dp", backend="aot_eager_decomp_partition")
    fc.peak_bytes          # predicted peak of one steady-state step, above what was live before it
    fc.step()              # one training step, compiled with exactly this plan (warm-up)
    measure_peak(fc.step)  # the same quantity, measured

One step is: forward, loss (``loss_fn(output)``; by default ``output.sum()``), backward, then
``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)`` when an optimizer is given (without
one, the step sets the parameters' ``.grad`` back to ``None`` at its end, so each step starts alike).
Forward and loss are compiled together (one ``torch.compile`` of ``loss_fn(model(*inputs))``).

What is counted (bytes): before the step (``baseline_bytes``) the parameters, buffers, inputs and the
steady-state optimizer state (unique storages); during the step the activations of every compiled
region (from its captured forward and backward graphs: :mod:`lightning_memplan.forecasting.estimator`, or
inductor's scheduler estimate on its final node order), the gradients the backward creates, and the
optimizer's step temporaries (:mod:`lightning_memplan.forecasting.optim_memory`). On CUDA the same step,
storage by storage, is replayed through a model of the caching allocator
(:mod:`lightning_memplan.forecasting.allocations`), whose blocks ``max_memory_allocated`` counts. Not visible:
eager code between graph breaks, blocks other work left in the allocator's cache, kernels' internal
workspaces beyond the probed ones.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan.forecasting.assemble import PlanCapture, assemble_forecast
from lightning_memplan.forecasting.backend import memplan_backend
from lightning_memplan.forecasting.compile_step import compile_step
from lightning_memplan.forecasting.estimate import check_target, estimated, finish_estimate
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.forecasting.validate import (
    check_budget,
    check_inner,
    check_regional,
    check_step_args,
    resolve_solver,
)

__all__ = ["forecast"]


def forecast(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budget: float = 1.0,
    solver: str | Callable[..., Any] = "dp",
    backend: str = "inductor",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    regional: Sequence[str] = (),
    target: str | None = None,
) -> Forecast:
    """Compile one training step of ``model`` with this budget and solver, and forecast its peak.

    Compiles by running forward and backward once on ``example_inputs``; gradients, buffers (batch-norm
    statistics) and the RNG are restored afterwards and the optimizer is not stepped, so the model is
    left as it was.

    Args:
        model: the module to train (put it in train mode first if that matters).
        example_inputs: the batch, a tensor or a tuple of tensors (``model(*example_inputs)``).
        budget: activation memory budget in [0, 1].
        solver: ``"greedy"``, ``"dp"``, ``"hirschberg"``, ``"ilp"`` or a callable with torch's solver
            signature ``(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)``;
            or ``"remat"``: whole-graph rematerialization at ``budget`` (:mod:`lightning_memplan.core.remat`).
        backend: ``"inductor"`` or ``"aot_eager_decomp_partition"`` (alias ``"aot_eager"``).
        loss_fn: ``output -> scalar``; default ``output.sum()``.
        optimizer: stepped (and ``zero_grad(set_to_none=True)``) at the end of each ``step()``.
        regional: submodules (names from ``model.named_modules()``) compiled on their own, as
            regional compilation does (``for layer in model.layers: layer.compile()``): the graph
            breaks around each, and blocks of one class and shapes share one compiled graph, its
            budget applied to that graph. ``()``: one compile of the whole model.
        target: the device the step is forecast for without running: ``"cpu"``, ``"cuda"`` or a
            named GPU (:data:`lightning_memplan.targets.TARGETS`: ``"H100"``, ``"A100-80GB"``, ...).
            The model, inputs and optimizer are copied to fake tensors and nothing is allocated
            (:mod:`lightning_memplan.forecasting.estimate`); the result's ``step()`` raises. Required
            when the model or its inputs are on the meta device. ``loss_fn`` must not close over
            tensors of its own (compute the loss in the model, or from its output alone).

    Raises:
        ValueError: bad arguments (each message names the argument and what is allowed); with a
            target, a step that depends on tensor values.
        RuntimeError: a torch without the features needed (torch < 2.11).
    """
    b = check_budget(budget, "forecast")
    solver_name, _ = resolve_solver(solver, "forecast")  # type: ignore[arg-type]
    inner = check_inner(backend, "forecast", "backend")
    inputs = check_step_args(model, example_inputs, loss_fn, optimizer)
    blocks = check_regional(regional, model, "forecast")
    tgt = check_target(target, model, inputs, "forecast")
    if tgt is not None:
        with estimated(model, inputs, optimizer, tgt, "forecast") as (fake, ws):
            fc = forecast(fake.model, fake.inputs, budget=b, solver=solver, backend=backend, loss_fn=loss_fn,
                          optimizer=fake.optimizer, regional=regional)
        return finish_estimate(fc, tgt, ws)
    be = memplan_backend(budget=b, solver=solver, inner=inner)  # type: ignore[arg-type]
    run = compile_step(be, model, inputs, loss_fn, optimizer, blocks)
    plan = PlanCapture(backend=be, regions=be.regions, inner=inner, budget=b, solver_name=solver_name, step=run.step)
    return assemble_forecast(run, plan, stacklevel=3)
