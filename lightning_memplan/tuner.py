"""Plan before a long run, in the spirit of Lightning's ``Tuner.lr_find``: one batch, no training.

``plan = plan_memory(trainer, model, datamodule=dm)`` runs ``training_step`` once on the first
training batch (the forward without autograd, to see how many times the step calls it and to
measure the eager code after it: the loss on the outputs, metrics), forecasts the candidate plans on the real
compiled graphs of ``model`` with that batch, returns the chosen
:class:`~lightning_memplan.plan.MemPlan` (``plan.save("plan.json")``), and leaves the model, the
trainer and torch's settings as they were. ``MemPlanCallback(plan="plan.json")`` then trains with
it without searching again.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device, rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.batch_size import batch_attribute, check_batch_args, in_step, largest_batch
from lightning_memplan.planner.checkpointing import CheckpointPolicy
from lightning_memplan.planner.device_limit import device_limit
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.pipeline import PlannedStep, plan_step
from lightning_memplan.planner.precompiled import compiled_by_user
from lightning_memplan.planner.rng import rng_kept
from lightning_memplan.planner.search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS
from lightning_memplan.planner.settings import (
    PlanSettings,
    check_submodule,
    resolve_submodule,
)
from lightning_memplan.planner.step_probe import called_module, forward_arguments, probe_step

__all__ = ["plan_memory"]


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
    backend: str = "auto",
    candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
    search_backend: str = "aot_eager",
    remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
    submodule: str | None = None,
    regional: bool | Literal["auto"] = "auto",
    search_time_limit: float | None = None,
    batch_size: Literal["max"] | None = None,
    batch_arg_name: str = "batch_size",
) -> MemPlan:
    """Choose a memory plan for ``model`` on the first training batch, without training.

    The plan arguments (``submodule``, ``regional`` and ``search_time_limit`` too) mean what they mean for
    :class:`~lightning_memplan.MemPlanCallback`. The
    batch comes from ``train_dataloaders``, else ``datamodule.train_dataloader()`` (after
    ``setup("fit")``), else ``model.train_dataloader()``: the first of any iterable of batches
    (for inputs of varying length, ``train_dataloaders=[longest_batch]`` plans the largest step,
    which the fit's ``MemPlanCallback(plan=plan)`` then forecasts alike); it is moved to
    ``trainer.strategy.root_device`` with the model. Afterwards the model is back on its device and
    in its mode, with its parameters, gradients and buffers as they were.

    A model that overrides ``configure_model`` (which makes or compiles layers there) gets it called
    first, as ``fit`` calls it (Lightning asks for it to be idempotent). A model the user compiled
    (``torch.compile(model)``, a compiled submodule) is planned as written (:mod:`lightning_memplan.planner.precompiled`).

    The step is planned as ``fit`` runs it: inside the Trainer's precision plugin's step context
    (autocast for ``"16-mixed"`` / ``"bf16-mixed"``) and with its ``accumulate_grad_batches``. The
    ``"-true"`` precisions convert the module's parameters only when ``fit`` starts; for those the
    plan is forecast in the module's current dtype (the callback forecasts it again in training).

    ``training_step`` runs once first, with the planned forward run without autograd (its
    floating-point outputs made the outputs of one autograd node, as a compiled region's, so a loss
    the forward computes is measured too), ``self.log`` silenced and torchmetrics
    metrics put back afterwards: the calls of the forward per step and the eager code between the
    forward and the backward (the loss on the outputs, metrics; measured as the callback measures
    it on its first batch) are laid into every candidate's forecast. ``self.optimizers()`` and
    ``self.lr_schedulers()`` return stand-ins that step nothing, and under manual optimization the
    loss measured is the first ``manual_backward``'s (no backward runs). When that run fails (a step
    that needs the Trainer), the compiled forward is planned alone, as the callback then plans it
    until its first batch has run.

    ``batch_size="max"``: first the largest batch whose step has a plan within the limit (``max_memory``, else on
    CUDA the device's memory), found from forecasts at candidate sizes that allocate nothing
    (:mod:`lightning_memplan.planner.batch_size`), starting from the batch the dataloader makes now. The
    attribute ``batch_arg_name`` is set to it where ``BatchSizeFinder`` sets it (the model, its ``hparams``,
    the datamodule and its ``hparams``; it stays set, for the fit), the train dataloader is built again
    and the plan is chosen on its first batch; ``plan.batch_size`` and ``plan.batch_trials`` record the
    size and every trial (batch, plan, forecast total, extra compute, fits?). When no size fits, a
    warning says so and the plan is made at the batch size as it was.

    Raises:
        ValueError: a bad argument (before anything runs); with ``batch_size="max"``: no limit (the CPU
            without ``max_memory``), no attribute ``batch_arg_name``, ``train_dataloaders`` given (it
            cannot be built again at another size), or a dataloader that ignores the attribute.
        RuntimeError: ``training_step`` does not call ``self(...)``, or no candidate could be forecast.
    """
    settings = PlanSettings.from_args(
        "plan_memory", budget=budget, max_memory=max_memory, solver=solver, checkpoint=checkpoint,
        backend=backend, candidate_budgets=candidate_budgets, search_backend=search_backend,
        remat_budgets=remat_budgets, regional=regional, search_time_limit=search_time_limit)
    model = getattr(model, "_orig_mod", model) if not isinstance(model, LightningModule) else model  # torch.compile
    path = check_submodule(submodule, "plan_memory")
    attribute = None
    if check_batch_args("plan_memory", batch_size, batch_arg_name):
        if train_dataloaders is not None:
            raise ValueError("`plan_memory(batch_size='max', train_dataloaders=...)`: a dataloader given as it is "
                             "cannot be built again at another batch size. Give the datamodule, or define "
                             f"train_dataloader() on the model, building it from `self.{batch_arg_name}`.")
        attribute = batch_attribute(model, datamodule, batch_arg_name)
    if is_overridden("configure_model", model):  # it makes (or compiles) the model, as fit calls it
        model.configure_model()
    if datamodule is not None and train_dataloaders is None:
        datamodule.setup("fit")
    loader = _train_loader(model, datamodule, train_dataloaders)
    batch = next(iter(loader))
    device = trainer.strategy.root_device
    # backend="auto": inductor on CUDA, aot_eager elsewhere; budget="auto" without max_memory on CUDA: the
    # device's memory is the limit
    settings = settings.on_device(device).with_device_limit(device_limit(device, processes=trainer.world_size))
    if attribute is not None and settings.max_memory is None:
        raise ValueError(f"`plan_memory(batch_size='max')` needs a memory limit to fit: on {device.type} there is "
                         "no device limit to read (CUDA's memory is one). Give `max_memory=` (e.g. '8GiB').")
    param = next(model.parameters(), None)
    home = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    try:
        model.to(device)
        model.train()
        batch = move_data_to_device(batch, device)
        if path is None:  # training_step may call self.model(...) rather than self(...)
            with trainer.strategy.precision_plugin.train_step_context(), rng_kept():
                path = called_module(model, batch)
        user = compiled_by_user(model, resolve_submodule(model, path, "plan_memory"))
    finally:
        model.to(home)
        model.train(was_training)
    target = user.module
    call = f"self.{path}(...)" if path else "self(...)"
    trials: tuple[dict[str, Any], ...] = ()
    if attribute is not None:
        choice = largest_batch(trainer, model, batch, target, settings, attribute, loader, user.patches, device)
        trials = tuple(dataclasses.asdict(t) for t in choice.trials)
        if choice.batch_size is None:
            warnings.warn(f"plan_memory(batch_size='max'): no batch size fits: {choice.reason}; planning at "
                          f"{batch_arg_name}={attribute.get()} as it is.\n{choice.table()}", MemPlanWarning,
                          stacklevel=2)
        else:
            rank_zero_info(f"plan_memory: batch size {choice.batch_size} ({batch_arg_name}; was {attribute.get()}):\n"
                           f"{choice.table()}")
            attribute.set(choice.batch_size)
            batch = next(iter(_train_loader(model, datamodule, None)))
            attribute.check_batch(batch)
    planned = _plan_at(trainer, model, batch, target, settings, user.patches, device, call)
    if attribute is None:
        return planned.plan
    return dataclasses.replace(planned.plan, batch_size=attribute.get(), batch_trials=trials)


def _train_loader(model: LightningModule, datamodule: LightningDataModule | None, given: Any) -> Any:
    """The train dataloader: ``given``, else the datamodule's, else the model's (built now)."""
    if given is not None:
        return given
    return datamodule.train_dataloader() if datamodule is not None else model.train_dataloader()


def _plan_at(trainer: Trainer, model: LightningModule, batch: Any, target: nn.Module, settings: PlanSettings,
             patches: Sequence[Any], device: torch.device, call: str) -> PlannedStep:
    """The plan of ``model``'s step on ``batch``: ``training_step`` probed once, then decided, re-judged,
    forecast and laid out (:func:`~lightning_memplan.planner.pipeline.plan_step`)."""
    batch = move_data_to_device(batch, device)
    with in_step(trainer, model, target, patches, device) as (optimizer, loop):
        forward = target.forward
        probed = probe_step(model, batch, target, device)
        args, kwargs = (probed.args, probed.kwargs) if probed else forward_arguments(model, batch, target, call)
        return plan_step(target, settings=settings, args=args, kwargs=kwargs, forward=forward,
                         optimizer=optimizer, call="plan_memory", loop=loop,
                         step=probed.observed if probed is not None else None)
