"""``MemPlanCallback(batch_size="max")``: before the first training step, the largest batch whose
step has a plan within the limit, set where Lightning's ``BatchSizeFinder`` sets it.

:func:`find_batch_size` runs at ``on_fit_start`` (the model is on its device, the data not loaded
yet): it takes the first batch of the train dataloader as built now, probes ``training_step`` on it
once (the forward without autograd), forecasts the step at candidate sizes on fake tensors
(:func:`~lightning_memplan.planner.batch_size.largest_batch`: nothing is allocated, no step runs),
sets the attribute to the largest that fits and has the fit loop build its dataloader again. Under
several processes rank 0 searches and every rank takes its size. The plan is then searched on the
first batch of that size as always, and compiled once.
"""
from __future__ import annotations

import warnings
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device, rank_zero_info

from lightning_memplan.core.batch_search import BatchSizeChoice
from lightning_memplan.planner.batch_size import batch_attribute, largest_batch
from lightning_memplan.planner.device_limit import device_limit
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.precompiled import compiled_by_user
from lightning_memplan.planner.rng import rng_kept
from lightning_memplan.planner.settings import PlanSettings, resolve_submodule
from lightning_memplan.planner.step_probe import called_module

__all__ = ["find_batch_size"]

_CALL = "MemPlanCallback"


def find_batch_size(trainer: Trainer, pl_module: LightningModule, settings: PlanSettings, name: str,
                    submodule: str | None, verbose: bool) -> BatchSizeChoice | None:
    """Search the batch size (see the module docstring) and set ``name`` to it; returns the search
    (``None`` on the ranks other than 0). When no size fits, or the search fails, the batch size stays
    as it is, with a :class:`MemPlanWarning`.

    Raises:
        ValueError: before training, when the search cannot be made: no attribute ``name``, dataloaders
            passed to ``fit`` as they are (they cannot be built again), no limit (the CPU without
            ``max_memory``), or a dataloader that ignores the attribute.
    """
    source = trainer.fit_loop._data_source
    if not source.is_module():
        raise ValueError(f"`{_CALL}(batch_size='max')`: the train dataloader was passed to `fit` as it is, so it "
                         "cannot be built again at another batch size. Define `train_dataloader()` on the "
                         f"LightningModule or a LightningDataModule, building it from `self.{name}`.")
    attribute = batch_attribute(pl_module, trainer.datamodule, name, _CALL)
    device = trainer.strategy.root_device
    limited = settings.with_device_limit(device_limit(device, processes=trainer.world_size))
    if limited.max_memory is None:
        raise ValueError(f"`{_CALL}(batch_size='max')` needs a memory limit to fit: on {device.type} there is no "
                         "device limit to read (CUDA's memory is one). Give `max_memory=` (e.g. '8GiB').")
    choice: BatchSizeChoice | None = None
    if trainer.global_rank == 0:
        loader = source.dataloader()
        batch = move_data_to_device(next(iter(loader)), device)
        attribute.check_batch(batch)
        try:
            choice = _search(trainer, pl_module, limited, attribute, loader, batch, submodule)
        except Exception as exc:  # noqa: BLE001 - a failed search never loses the run
            warnings.warn(f"{_CALL}(batch_size='max'): the batch-size search failed ({type(exc).__name__}: {exc}); "
                          f"training at {name}={attribute.get()} as it is.", MemPlanWarning, stacklevel=3)
    size = choice.batch_size if choice is not None else None
    if trainer.world_size > 1:
        size = trainer.strategy.broadcast(size, src=0)
    if choice is not None and size is None:
        warnings.warn(f"{_CALL}(batch_size='max'): no batch size fits: {choice.reason}; training at "
                      f"{name}={attribute.get()} as it is.\n{choice.table()}", MemPlanWarning, stacklevel=3)
    if size is None:
        return choice
    if verbose and choice is not None:
        rank_zero_info(f"MemPlan: batch size {size} ({name}; was {attribute.get()}):\n{choice.table()}")
    attribute.set(int(size))
    trainer.fit_loop._combined_loader = None  # built again from the attribute (as BatchSizeFinder has it)
    return choice


def _search(trainer: Trainer, pl_module: LightningModule, settings: PlanSettings, attribute: Any, loader: Any,
            batch: Any, submodule: str | None) -> BatchSizeChoice:
    """The search on rank 0: the planned module found as the first batch finds it, then
    :func:`~lightning_memplan.planner.batch_size.largest_batch`."""
    path = submodule
    if path is None:
        with trainer.strategy.precision_plugin.train_step_context(), rng_kept():
            path = called_module(pl_module, batch, api=_CALL)
    user = compiled_by_user(pl_module, resolve_submodule(pl_module, path, _CALL))
    return largest_batch(trainer, pl_module, batch, user.module, settings, attribute, loader, user.patches,
                         trainer.strategy.root_device, self_call=_CALL)
