"""Plan before a long run, in the spirit of Lightning's ``Tuner.lr_find``: one batch, no training.

``plan = plan_memory(trainer, model, datamodule=dm)`` forecasts the candidate plans on the real
compiled graphs of ``model`` with the first training batch, returns the chosen
:class:`~lightning_memplan.plan.MemPlan` (``plan.save("plan.json")``), and leaves the model, the
trainer and torch's settings as they were. ``MemPlanCallback(plan="plan.json")`` then trains with
it without searching again.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device
from torch import nn

from .checkpointing import CheckpointPolicy, checkpointed
from .plan import MemPlan
from .planner import (
    PlanSettings,
    TrainingLoop,
    check_submodule,
    decide_plan,
    forecast_plan,
    resolve_submodule,
)
from .search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS

__all__ = ["plan_memory"]


class _Captured(Exception):
    """Raised by the capturing forward once it has the arguments of the first call."""


def _first_optimizer(configured: Any) -> torch.optim.Optimizer | None:
    """The first optimizer of whatever ``configure_optimizers`` returned (None if there is none)."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, dict):
        return _first_optimizer(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)) and configured:
        return _first_optimizer(configured[0])
    return None


def _forward_arguments(model: LightningModule, batch: Any, target: nn.Module | None = None,
                       call: str = "self(...)") -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments ``training_step`` passes to ``target`` (default: ``self(...)``), without running
    the step."""
    target = model if target is None else target
    captured: dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> Any:
        captured["call"] = (args, kwargs)
        raise _Captured

    saved = target.__dict__.get("forward")
    target.forward = capture  # type: ignore[method-assign]
    try:
        with torch.enable_grad():
            model.training_step(batch, 0)
    except _Captured:
        pass
    finally:
        if saved is None:
            del target.forward
        else:
            target.forward = saved  # type: ignore[method-assign]
    if "call" not in captured:
        raise RuntimeError(
            f"plan_memory: `training_step` never called the module itself (`{call}`), so there is "
            "no forward to compile. Call it in training_step, or plan the submodule you run "
            "(`submodule=\"model\"` for `self.model(x)`)."
        )
    return captured["call"]


def plan_memory(
    trainer: Trainer,
    model: LightningModule,
    *,
    datamodule: LightningDataModule | None = None,
    train_dataloaders: Any = None,
    budget: float | str = "auto",
    max_memory: int | str | None = None,
    solver: str | Callable[..., Any] = "dp",
    checkpoint: CheckpointPolicy = "auto",
    backend: str = "inductor",
    candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
    search_backend: str = "aot_eager",
    remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
    submodule: str | None = None,
) -> MemPlan:
    """Choose a memory plan for ``model`` on the first training batch, without training.

    The plan arguments (``submodule`` too) mean what they mean for
    :class:`~lightning_memplan.MemPlanCallback`. The
    batch comes from ``train_dataloaders``, else ``datamodule.train_dataloader()`` (after
    ``setup("fit")``), else ``model.train_dataloader()``; it is moved to
    ``trainer.strategy.root_device`` with the model. Afterwards the model is back on its device and
    in its mode, with its parameters, gradients and buffers as they were.

    The step is planned as ``fit`` runs it: inside the Trainer's precision plugin's step context
    (autocast for ``"16-mixed"`` / ``"bf16-mixed"``) and with its ``accumulate_grad_batches``. The
    ``"-true"`` precisions convert the module's parameters only when ``fit`` starts; for those the
    plan is forecast in the module's current dtype (the callback forecasts it again in training).

    Raises:
        ValueError: a bad argument (before anything runs).
        RuntimeError: ``training_step`` does not call ``self(...)``, or no candidate could be forecast.
    """
    settings = PlanSettings.from_args(
        "plan_memory", budget=budget, max_memory=max_memory, solver=solver, checkpoint=checkpoint,
        backend=backend, candidate_budgets=candidate_budgets, search_backend=search_backend,
        remat_budgets=remat_budgets)
    target = resolve_submodule(model, check_submodule(submodule, "plan_memory"), "plan_memory")
    call = f"self.{submodule}(...)" if submodule else "self(...)"
    if train_dataloaders is not None:
        loader = train_dataloaders
    elif datamodule is not None:
        datamodule.setup("fit")
        loader = datamodule.train_dataloader()
    else:
        loader = model.train_dataloader()
    batch = next(iter(loader))
    device = trainer.strategy.root_device
    param = next(model.parameters(), None)
    home = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    try:
        model.to(device)
        model.train()
        batch = move_data_to_device(batch, device)
        args, kwargs = _forward_arguments(model, batch, target, call)
        optimizer = _first_optimizer(model.configure_optimizers())
        forward = target.forward
        loop = TrainingLoop.of(trainer, model)
        # in the precision plugin's step context (autocast for "16-mixed" / "bf16-mixed"), as fit runs it
        with trainer.strategy.precision_plugin.train_step_context():
            plan = decide_plan(settings, target, forward, args, kwargs, optimizer, call="plan_memory",
                               loop=loop)
            with checkpointed(target, plan.checkpoint):
                plan, _ = forecast_plan(settings, plan, target, forward, args, kwargs, optimizer,
                                        loop=loop)
    finally:
        model.to(home)
        model.train(was_training)
    return plan
