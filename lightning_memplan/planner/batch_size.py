"""The largest batch that fits, from forecasts that allocate nothing: :func:`max_batch_size`.

Each trial forecasts the planned module's step at one batch size on fake tensors
(:func:`~lightning_memplan.forecast` with ``target=``: nothing is allocated, no kernel runs). Its
inputs are the first batch's, with every tensor whose first dimension is the batch size grown or
shrunk along it (the dimension a ``DataLoader``'s ``batch_size`` makes); the eager code after the
forward measured on the first batch (the loss on the outputs) is scaled with the batch. A trial
forecasts the two ends of the plan search: no plan (budget 1, nothing checkpointed) and the
frugal plan (the least candidate budget with every repeated block checkpointed), and a batch fits
when the frugal one does; the trial's plan is the faster of the two that fits. Checkpointing found
not a plan at one size (dynamo runs the wrapped blocks eagerly) is not tried at the next. The search over
sizes is :func:`~lightning_memplan.core.batch_search.largest_fitting`. The plan at the chosen size
is then searched in full on the real batch, as without ``batch_size="max"``.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device
from torch import nn

from lightning_memplan._torch.storages import tree_leaves, tree_rebuilder
from lightning_memplan.core.instance_patch import instance_attributes
from lightning_memplan.core.batch_search import BatchSizeChoice, BatchTrial, largest_fitting
from lightning_memplan.forecasting.eager_loss import EagerLoss, scaled_eager_loss
from lightning_memplan.planner.checkpointing import resolve_blocks
from lightning_memplan.planner.kv_cache import cache_off_patches
from lightning_memplan.planner.plan_forecast import sum_outputs
from lightning_memplan.planner.regional import regional_blocks, wants_regional
from lightning_memplan.planner.rng import rng_kept
from lightning_memplan.planner.search import NOT_A_PLAN, PlanDoesNotFit, held_bytes, search
from lightning_memplan.planner.settings import PlanSettings
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    eager_losses_laid_in,
    laid_out_for_step,
    lightning_step_memory,
    other_optimizer_state_bytes,
    step_grad_bytes,
)
from lightning_memplan.planner.step_probe import configured_optimizers, forward_arguments, probe_step

__all__ = ["BatchAttribute", "batch_attribute", "check_batch_args", "in_step", "largest_batch", "max_batch_size",
           "resized_inputs"]


class _TensorsIn(nn.Module):
    """``forward(*args, **kwargs)`` of ``module`` called with the tensors of ``(args, kwargs)`` as
    positional inputs (``forward(*tensors)``), the rest fixed: a forecast fakes its inputs, and
    tensors held in keyword arguments would stay real."""

    def __init__(self, module: nn.Module, forward: Callable[..., Any], args: Sequence[Any],
                 kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self._forward = forward
        leaves, self._unflatten = tree_rebuilder((tuple(args), dict(kwargs)))
        self._at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self._leaves = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.tensors = tuple(leaves[i] for i in self._at)

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self._leaves)
        for i, t in zip(self._at, tensors):
            leaves[i] = t
        args, kwargs = self._unflatten(leaves)
        return self._forward(*args, **kwargs)


def resized_inputs(tensors: Sequence[torch.Tensor], batch: int, size: int) -> tuple[torch.Tensor, ...]:
    """``tensors`` at batch ``size``: each whose first dimension is ``batch`` as a meta tensor with
    ``size`` rows (nothing allocated); the others as they are.

    Raises:
        ValueError: no tensor has ``batch`` rows (the batch dimension cannot be found).
    """
    if not any(t.dim() > 0 and t.shape[0] == batch for t in tensors):
        shapes = [tuple(t.shape) for t in tensors]
        raise ValueError(f"no input of the planned forward has the batch size ({batch}) as its first dimension "
                         f"(input shapes {shapes}), so it cannot be forecast at other batch sizes")
    return tuple(torch.empty((size, *t.shape[1:]), dtype=t.dtype, device="meta")
                 if t.dim() > 0 and t.shape[0] == batch else t for t in tensors)


def max_batch_size(
    module: nn.Module,
    *,
    settings: PlanSettings,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    batch_size: int,
    limit_bytes: int,
    limit_source: str,
    device: torch.device,
    forward: Callable[..., Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    loop: TrainingLoop = TrainingLoop(),
    eager_losses: Sequence[EagerLoss] = (),
    max_size: int | None = None,
    max_trials: int = 16,
) -> BatchSizeChoice:
    """The largest batch size whose step, forecast without allocating on ``device``'s kind, has a
    plan within ``limit_bytes`` (see the module docstring). ``args``/``kwargs``: the planned forward's
    first call at ``batch_size``; ``eager_losses``: the eager code measured on that call's outputs;
    ``max_size``: the most samples a batch can hold (the dataset's length), if known.

    Raises:
        ValueError: the inputs have no batch dimension of ``batch_size`` rows.
    """
    forward = module.forward if forward is None else forward
    bound = _TensorsIn(module, forward, args, kwargs)
    resized_inputs(bound.tensors, batch_size, batch_size)  # the batch dimension must be there
    target = "cuda" if device.type == "cuda" else "cpu"
    blocks = tuple(f"module.{b}" for b in (resolve_blocks(module, settings.checkpoint) if settings.checkpoint
                                             else ()))
    regional = tuple(f"module.{b}" for b in regional_blocks(module, wants_regional(settings.regional, True)))
    frugal_budget = min(settings.candidate_budgets)
    grads = step_grad_bytes(module, loop)
    # the checkpoint sets still tried: one found not a plan at a size is not one at any (NOT_A_PLAN)
    sets = list(dict.fromkeys([(), blocks]))

    def trial(size: int) -> BatchTrial:
        losses, eager_grads = eager_losses_laid_in([scaled_eager_loss(m, size / batch_size) for m in eager_losses],
                                                   loop)

        def judge(fc: Any) -> tuple[int, int | None]:
            laid = laid_out_for_step(fc, calls=1, new_input_bytes=0, eager_losses=losses, made_input_bytes=0)
            return lightning_step_memory(laid, grads + eager_grads, loop)

        try:
            result = search(bound, resized_inputs(bound.tensors, batch_size, size),
                            budgets=tuple(dict.fromkeys((1.0, frugal_budget))),
                            checkpoint_sets=list(sets), solver=settings.solver,
                            backend=settings.search_backend, optimizer=optimizer, loss_fn=sum_outputs,
                            max_memory=limit_bytes, remat_budgets=(), step_memory=judge, regional=regional,
                            target=target)
            plan, fits = result.plan, True
        except PlanDoesNotFit as exc:
            plan, fits = exc.plan, False
        except Exception as exc:  # noqa: BLE001 - a size that cannot be forecast is not taken
            return BatchTrial(batch_size=size, fits=False, note=f"not forecast: {type(exc).__name__}: {exc}"[:200])
        for ck in [ck for ck in sets if ck]:
            mine = [c for c in plan.candidates if c.checkpoint == ck]
            if mine and all(c.note.startswith(NOT_A_PLAN) for c in mine):
                sets.remove(ck)
        chosen = plan.candidates[plan.chosen] if plan.chosen is not None else None
        fastest = next((c for c in plan.candidates if c.budget == 1.0 and not c.checkpoint and c.cost), None)
        if chosen is None or chosen.peak_bytes is None:
            return BatchTrial(batch_size=size, fits=False, note="no candidate could be forecast")
        extra = chosen.cost / fastest.cost - 1 if fastest is not None and chosen.cost is not None else None
        totals = [held_bytes(c, plan.baseline_bytes or 0) for c in plan.candidates if c.peak_bytes is not None]
        return BatchTrial(batch_size=size, fits=fits, plan=chosen.label,
                          total_bytes=held_bytes(chosen, plan.baseline_bytes or 0), extra_compute=extra,
                          least_bytes=min(totals, default=None))

    return largest_fitting(trial, start=batch_size, limit_bytes=limit_bytes, limit_source=limit_source,
                           max_size=max_size, max_trials=max_trials)


@contextlib.contextmanager
def in_step(trainer: Trainer, model: LightningModule, target: nn.Module, patches: Sequence[Any],
             device: torch.device) -> Any:
    """The model on ``device`` in training mode, its compile undone and key/value caches off, inside the
    precision plugin's step context with the generator kept: as ``fit`` runs a step. Yields
    ``(optimizer, loop)``; the model goes back to its device and mode afterwards."""
    param = next(model.parameters(), None)
    home = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    # the user's torch.compile undone meanwhile: the plan compiles the forward (precompiled.py); the
    # key/value cache off, as the fit has it (planner.kv_cache)
    with instance_attributes([*patches, *cache_off_patches(target)]):
        try:
            model.to(device)
            model.train()
            optimizers = configured_optimizers(model.configure_optimizers())[0]
            loop = dataclasses.replace(TrainingLoop.of(trainer, model, target),
                                       other_optimizer_state_bytes=other_optimizer_state_bytes(optimizers))
            # in the precision plugin's step context (autocast for "16-mixed" / "bf16-mixed"), as fit runs it
            with trainer.strategy.precision_plugin.train_step_context(), rng_kept():
                yield (optimizers[0] if optimizers else None), loop
        finally:
            model.to(home)
            model.train(was_training)


def largest_batch(trainer: Trainer, model: LightningModule, batch: Any, target: nn.Module, settings: PlanSettings,
                  attribute: BatchAttribute, loader: Any, patches: Sequence[Any], device: torch.device,
                  self_call: str = "plan_memory") -> BatchSizeChoice:
    """The largest batch size with a plan within ``settings.max_memory``, from forecasts at candidate
    sizes (:func:`max_batch_size`), from ``batch`` (at the size ``attribute`` holds now, on ``device``):
    ``training_step`` probed once on it (:func:`~lightning_memplan.planner.step_probe.probe_step`)
    inside :func:`in_step`. ``loader``: the dataloader ``batch`` came from (its dataset's length caps
    the size). ``self_call``: the API name messages start with.

    Raises:
        ValueError: ``batch`` does not have the attribute's rows (the dataloader ignores it).
    """
    assert settings.max_memory is not None
    size = attribute.get()
    batch = move_data_to_device(batch, device)
    attribute.check_batch(batch)
    dataset = getattr(loader, "dataset", None)
    try:
        most = len(dataset) if dataset is not None else None  # type: ignore[arg-type]
    except TypeError:  # an iterable dataset
        most = None
    with in_step(trainer, model, target, patches, device) as (optimizer, loop):
        probed = probe_step(model, batch, target, device)
        args, kwargs = ((probed.args, probed.kwargs) if probed
                        else forward_arguments(model, batch, target, api=self_call))
        return max_batch_size(target, settings=settings, args=args, kwargs=kwargs, batch_size=size,
                              limit_bytes=settings.max_memory, limit_source=settings.limit_source,
                              device=device, forward=target.forward, optimizer=optimizer, loop=loop,
                              eager_losses=probed.observed.eager_losses if probed else (), max_size=most)


class BatchAttribute:
    """The attribute ``name`` that sets the batch size, where ``BatchSizeFinder`` looks for it: the
    model, its ``hparams``, the datamodule and its ``hparams``. Read from the last that has it; set
    on every one."""

    def __init__(self, name: str, holders: list[Any], call: str = "plan_memory") -> None:
        self.name, self._holders, self._call = name, holders, call

    def get(self) -> int:
        holder = self._holders[-1]
        return int(holder[self.name] if isinstance(holder, dict) else getattr(holder, self.name))

    def set(self, value: int) -> None:
        for holder in self._holders:
            if isinstance(holder, dict):
                holder[self.name] = value
            else:
                setattr(holder, self.name, value)

    def check_batch(self, batch: Any) -> None:
        """A ValueError unless some tensor of ``batch`` has :meth:`get` rows: the dataloader follows the attribute."""
        size = self.get()
        rows = {t.shape[0] for t in tree_leaves(batch) if isinstance(t, torch.Tensor) and t.dim() > 0}
        if size not in rows:
            raise ValueError(f"`{self._call}(batch_size='max', batch_arg_name={self.name!r})`: the train dataloader "
                             f"made a batch of {sorted(rows)} rows with {self.name}={size}, so it does not build its "
                             f"batches from `{self.name}`. Pass it to the DataLoader: "
                             f"`DataLoader(..., batch_size=self.{self.name})`.")


def check_batch_args(call: str, batch_size: object, name: object) -> bool:
    """Whether ``batch_size`` asks for the search (``"max"``; ``None``: not); a ValueError naming
    ``call`` for any other value, or a ``batch_arg_name`` that is not an attribute name."""
    if batch_size is None:
        return False
    if batch_size != "max":
        raise ValueError(f"`{call}(batch_size={batch_size!r})` is not valid. Expected 'max' (the largest batch "
                         "that fits) or None (the batch size as it is).")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"`{call}(batch_arg_name={name!r})` must be the name of the attribute that sets the "
                         "batch size, such as 'batch_size'.")
    return True


def batch_attribute(model: LightningModule, datamodule: Any, name: str, call: str = "plan_memory") -> BatchAttribute:
    """The attribute ``name`` that sets the batch size, on ``model``, its ``hparams``, ``datamodule`` and
    its ``hparams`` (as ``BatchSizeFinder`` finds it); a ValueError naming what was searched when
    none has it."""
    holders: list[Any] = []
    for owner in (model, datamodule):
        if owner is None:
            continue
        if hasattr(owner, name):
            holders.append(owner)
        hparams = getattr(owner, "hparams", None)
        if hparams is not None and name in hparams:
            holders.append(hparams)
    if not holders:
        searched = "the model, its hparams" + (", the datamodule and its hparams" if datamodule is not None else "")
        raise ValueError(f"`{call}(batch_size='max', batch_arg_name={name!r})`: no attribute {name!r} in "
                         f"{searched}. Store the batch size there (`self.{name} = 32`) and build the train "
                         "dataloader from it, or name the attribute with `batch_arg_name=`.")
    return BatchAttribute(name, holders, call)
