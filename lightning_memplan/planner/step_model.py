"""The model of a Lightning training step around the planned forward: its loop, its calls, its bytes.

Every size is in bytes; a *storage key* names a tensor's storage (``_torch.storages.storage_key``), so
views of one storage count once. Knows nothing of the Trainer (:meth:`TrainingLoop.of` reads one
duck-typed).

- :class:`TrainingLoop`: how Lightning runs the step (gradient accumulation, manual optimization,
  bytes outside the planned module);
- the calls of the planned forward: :func:`call_signature`, :func:`input_storages`,
  :func:`fresh_input_bytes`, :func:`made_input_bytes`, :func:`storage_keys`;
- gradients and optimizer state: :func:`grad_bytes`, :func:`step_grad_bytes`, :func:`live_grad_bytes`,
  :func:`gradless_parameters`, :func:`gradless_bytes`, :func:`other_optimizer_state_bytes`;
- the step's memory from a forecast: :func:`lightning_step_memory`, :func:`lightning_step_peak`,
  :func:`lightning_step_timeline`; the forecast laid out for the step's calls and eager code:
  :func:`laid_out_for_step`, with the eager losses as the loop lays them in
  (:func:`eager_losses_laid_in`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_memplan._torch.storages import unique_storages
from lightning_memplan.forecasting.eager_loss import EagerLoss

if TYPE_CHECKING:
    from lightning_memplan.forecasting.result import Forecast

__all__ = [
    "TrainingLoop", "call_signature", "eager_losses_laid_in", "fresh_input_bytes", "grad_bytes", "gradless_bytes",
    "gradless_parameters", "input_storages", "laid_out_for_step", "lightning_step_memory", "lightning_step_peak",
    "lightning_step_timeline", "live_grad_bytes", "made_input_bytes", "other_optimizer_state_bytes",
    "step_grad_bytes", "storage_keys",
]


@dataclass(frozen=True)
class TrainingLoop:
    """How Lightning runs the training step around the compiled forward: what decides which
    gradients are live when (see :func:`lightning_step_peak`)."""

    accumulate_grad_batches: int = 1
    """The Trainer's argument: micro-batches per optimizer step (>= 1)."""
    automatic_optimization: bool = True
    """The LightningModule's flag; ``False``: ``training_step`` calls ``zero_grad``, ``manual_backward``
    and ``step`` itself, in an order the plan cannot see."""
    resident_bytes: int = 0
    """Bytes of the LightningModule's parameters and buffers outside the planned submodule (a head
    ``training_step`` runs eagerly): live through every step, in the baseline, not in the forecast
    of the planned module. 0 when the whole LightningModule is planned."""
    param_bytes: int | None = None
    """Bytes of the planned module's parameters between steps when they differ from what its
    forecast counted (FSDP2: each parameter's padded shard, while the forecast, run inside the
    root's forward, saw the root's own parameters unsharded); ``None``: as the forecast counted."""
    gradless_bytes: int = 0
    """Bytes of the planned module's trainable parameters that the step gives no gradient (no path
    from the loss reaches them: a head only validation uses), so they hold none between steps
    (:func:`gradless_bytes`, from the first batch's loss); 0 until that is known."""
    other_optimizer_state_bytes: int = 0
    """Bytes of the state of the optimizers after the first (manual optimization with several, as a
    GAN's discriminator's): live through every step, in the baseline; the forecast counts the
    first optimizer's (:func:`other_optimizer_state_bytes`)."""

    def __post_init__(self) -> None:
        n = self.accumulate_grad_batches
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`accumulate_grad_batches={n!r}` must be an int >= 1 (Lightning's Trainer argument).")
        for name, v in (("resident_bytes", self.resident_bytes), ("param_bytes", self.param_bytes),
                        ("gradless_bytes", self.gradless_bytes),
                        ("other_optimizer_state_bytes", self.other_optimizer_state_bytes)):
            if v is None and name == "param_bytes":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"`{name}={v!r}` must be an int >= 0.")

    @classmethod
    def of(cls, trainer: Any, module: Any, planned: nn.Module | None = None) -> TrainingLoop:
        """The loop ``trainer`` runs for ``module`` (defaults for what either lacks), whose submodule
        ``planned`` is the one planned (default: ``module`` itself)."""
        from lightning_memplan._torch.fsdp import fsdp2_shard_bytes
        from lightning_memplan._torch.storages import local_tensor, storage_key

        n = getattr(trainer, "accumulate_grad_batches", 1)
        resident, params = 0, None
        if isinstance(module, nn.Module):
            shards = fsdp2_shard_bytes(module)
            planned = planned if planned is not None else module
            mine = {id(p): p for p in planned.parameters()}
            if shards:
                params = sum(shards.get(k, local_tensor(p).numel() * local_tensor(p).element_size())
                             for k, p in mine.items())
            if planned is not module:
                seen = {storage_key(local_tensor(t)) for t in (*mine.values(), *planned.buffers())}
                for t in (*module.parameters(), *module.buffers()):
                    key = storage_key(local_tensor(t))
                    if key not in seen:
                        seen.add(key)
                        resident += shards.get(id(t), int(local_tensor(t).untyped_storage().nbytes()))
        return cls(accumulate_grad_batches=n if isinstance(n, int) and n >= 1 else 1,
                   automatic_optimization=bool(getattr(module, "automatic_optimization", True)),
                   resident_bytes=int(resident), param_bytes=params)


def grad_bytes(module: nn.Module) -> int:
    """Bytes of the gradients of ``module``'s trainable parameters between steps (unique
    parameters; of a sharded parameter, a DTensor, this rank's shard; of an FSDP2 parameter, its
    padded shard, also inside a unit's forward where the module holds the unsharded one)."""
    from lightning_memplan._torch.fsdp import fsdp2_shard_bytes
    from lightning_memplan._torch.storages import local_tensor

    shards = fsdp2_shard_bytes(module)
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            t = local_tensor(p)
            total += shards.get(id(p), t.numel() * t.element_size())
    return total


def step_grad_bytes(module: nn.Module, loop: TrainingLoop) -> int:
    """Bytes of the gradients ``module``'s parameters hold between steps of ``loop``:
    :func:`grad_bytes` less the parameters the step gives none (``loop.gradless_bytes``)."""
    return max(grad_bytes(module) - loop.gradless_bytes, 0)


def live_grad_bytes(module: nn.Module) -> int:
    """Bytes of the gradients ``module``'s parameters hold right now (unique storages)."""

    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return sum(n for n, _ in unique_storages(grads, set()))


def gradless_parameters(module: nn.Module, reached: Collection[int]) -> list[nn.Parameter]:
    """``module``'s trainable parameters (each once) whose ``id`` is not in ``reached``
    (:func:`~lightning_memplan.forecasting.autograd_walk.parameters_reached` of a step's loss): the step gives
    them no gradient."""
    unique = {id(p): p for p in module.parameters() if p.requires_grad and id(p) not in reached}
    return list(unique.values())


def gradless_bytes(module: nn.Module, reached: Collection[int]) -> int:
    """Bytes of the gradients :func:`grad_bytes` counts for :func:`gradless_parameters`: none."""
    from lightning_memplan._torch.storages import local_tensor

    return sum(local_tensor(p).numel() * local_tensor(p).element_size() for p in gradless_parameters(module, reached))


def other_optimizer_state_bytes(optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """Bytes of the steady-state state of every optimizer but the first (existing, or simulated on
    meta tensors: :func:`~lightning_memplan.forecasting.optim_memory.optimizer_memory`)."""
    from lightning_memplan.forecasting.optim_memory import optimizer_memory

    return sum(optimizer_memory(o).state_bytes for o in optimizers[1:])


def input_storages(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[int, int]:
    """``{storage key: bytes}`` of the tensors among a call's arguments (no reference kept)."""
    from lightning_memplan._torch.storages import storage_key, tree_leaves

    leaves = [t for t in tree_leaves((tuple(args), kwargs)) if isinstance(t, torch.Tensor)]
    return {storage_key(t): int(t.untyped_storage().nbytes()) for t in leaves}


def call_signature(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``(shape, dtype, device type)`` of each tensor among a call's arguments, in order: calls
    that differ in it run graphs of their own (the callback compiles with ``dynamic=False``)."""
    from lightning_memplan._torch.storages import tree_leaves

    return tuple((tuple(t.shape), t.dtype, t.device.type)
                 for t in tree_leaves((tuple(args), kwargs)) if isinstance(t, torch.Tensor))


def fresh_input_bytes(call_inputs: Sequence[dict[int, int]], calls: int,
                      before: Collection[int] = ()) -> list[int] | int:
    """Bytes of the inputs each call after the first got that no earlier call had (another view
    of the batch), from :func:`input_storages` of each call; storages in ``before`` (live before
    the step: the batch, parameters) are not fresh. 0 when they were not recorded for every call."""
    seen: dict[int, int] = dict.fromkeys(before, 0)
    fresh = []
    for i, storages in enumerate(call_inputs[:calls]):
        if i:
            fresh.append(sum(n for k, n in storages.items() if k not in seen))
        seen.update(storages)
    return fresh if len(fresh) == calls - 1 else 0


def made_input_bytes(call_inputs: Sequence[dict[int, int]], before: Collection[int]) -> int:
    """Bytes of the first call's inputs (:func:`input_storages`) that were not live before the
    step (storage keys ``before``: the batch, parameters, buffers): ``training_step`` made them
    (``x.float() / 255``). 0 when no call was recorded."""
    return sum(n for k, n in call_inputs[0].items() if k not in before) if call_inputs else 0


def storage_keys(*trees: Any) -> set[int]:
    """Storage keys of every tensor in ``trees`` (any nesting; modules give their parameters
    and buffers)."""
    from lightning_memplan._torch.storages import storage_key, tree_leaves

    keys: set[int] = set()
    for tree in trees:
        tensors = [*tree.parameters(), *tree.buffers()] if isinstance(tree, nn.Module) else tree_leaves(tree)
        keys.update(storage_key(t) for t in tensors if isinstance(t, torch.Tensor))
    return keys


def lightning_step_memory(fc: Forecast, grads: int, loop: TrainingLoop = TrainingLoop()) -> tuple[int, int | None]:
    """``(baseline bytes, peak bytes above it)`` of a Lightning training step from its forecast. The
    baseline holds the gradients (``grads`` bytes) under automatic optimization, where they are live
    when a step starts; the peak is ``None`` when the forecast failed."""
    base = (fc.baseline_bytes + loop.resident_bytes + loop.other_optimizer_state_bytes
            + (grads if loop.automatic_optimization else 0))
    if loop.param_bytes is not None and fc.breakdown is not None:
        base += loop.param_bytes - fc.breakdown.parameters
    return base, None if fc.peak_bytes is None else lightning_step_peak(fc, grads, loop)


def lightning_step_peak(fc: Forecast, grads: int, loop: TrainingLoop = TrainingLoop()) -> int:
    """The forecast peak of a Lightning training step, above its baseline (:func:`lightning_step_memory`).

    ``forecast()`` models a step that starts without gradients. Lightning's automatic optimization
    keeps the previous step's gradients until ``zero_grad`` (``set_to_none``), which it calls after
    ``training_step`` and before ``backward``: during the forward they are still live (they belong
    to the starting bytes), and from the backward on they are gone while the new ones are created.
    So the forward part of the forecast timeline stands as it is, and the rest is ``grads`` lower.

    With gradient accumulation (``accumulate_grad_batches`` N > 1) the highest of the N micro-batches
    is the last: ``zero_grad`` runs only in the first, so the backward creates its gradients on top
    of the accumulated ones (``AccumulateGrad`` adds them in place and frees them), and the optimizer
    steps with only the accumulated ones live: the forward and backward stand as forecast, the
    optimizer step is ``grads`` lower (:func:`lightning_step_timeline`).

    With manual optimization the step is ``forecast()``'s own, above a baseline without gradients:
    ``zero_grad`` either ends the step (the next starts without gradients) or opens it, before the
    forward (the gradients live at the start are freed before anything else is allocated); either
    way the bytes above the gradient-free baseline are the forecast's.

    On CUDA (``fc.cuda_allocator`` set) the peak is the caching allocator's, in blocks as
    ``torch.cuda.max_memory_allocated`` counts them: the forecast's allocations in Lightning's order
    (:func:`~lightning_memplan.forecasting.allocations.lightning_order`, or
    :func:`~lightning_memplan.forecasting.allocations.accumulation_order`) replayed through its model.
    """
    if not loop.automatic_optimization:
        return int(fc.peak_bytes)
    if fc.cuda_allocator is not None and fc.allocations is not None:
        from lightning_memplan.forecasting.allocations import (
            accumulation_order,
            lightning_order,
            simulate_cuda_allocator,
        )

        order = lightning_order if loop.accumulate_grad_batches == 1 else accumulation_order
        return simulate_cuda_allocator(order(fc.allocations), device=fc.cuda_allocator.device).allocated_peak_bytes
    return max([0, *(b for _, b in lightning_step_timeline(fc, grads, loop))])


def lightning_step_timeline(fc: Forecast, grads: int, loop: TrainingLoop = TrainingLoop()) -> list[tuple[str, int]]:
    """``(phase, bytes above the step's baseline)`` of a Lightning training step, for every step of
    the forecast schedule (see :func:`lightning_step_peak`); with ``accumulate_grad_batches`` > 1, of
    the micro-batch that steps the optimizer."""
    if not loop.automatic_optimization:
        shifted: tuple[str, ...] = ()
    elif loop.accumulate_grad_batches > 1:
        shifted = ("optimizer",)
    else:
        shifted = ("backward", "optimizer")
    return [(s.phase, s.bytes - grads if s.phase in shifted else s.bytes) for s in fc.timeline]


def eager_losses_laid_in(losses: Sequence[EagerLoss], loop: TrainingLoop) -> tuple[tuple[EagerLoss, ...], int]:
    """The eager losses as a Lightning step ``loop`` lays them in, and the bytes of the gradients of
    the parameters only their eager code reads (``EagerLoss.param_grad_bytes``). Under automatic
    optimization those gradients are live when a step starts, like the planned module's, and
    ``zero_grad`` frees them before the backward makes them again (:func:`lightning_step_memory`
    takes them with the others). With ``accumulate_grad_batches`` > 1, ``AccumulateGrad`` sums the
    new ones into them in place: a transient, not laid in."""
    grads = sum(m.param_grad_bytes for m in losses)
    if loop.automatic_optimization and loop.accumulate_grad_batches > 1:
        losses = [dataclasses.replace(m, param_grad_bytes=0) for m in losses]
    return tuple(losses), grads


def laid_out_for_step(fc: Forecast, *, calls: int, new_input_bytes: int | Sequence[int],
                      eager_losses: Sequence[EagerLoss], made_input_bytes: int) -> Forecast:
    """``fc`` laid out with the first call's inputs the step made, for ``calls`` calls, with the
    eager losses (one per call) laid in; nothing is compiled."""
    if made_input_bytes:
        fc = fc.with_inputs_made_in_step(made_input_bytes)
    if calls > 1 and fc.calls != calls:  # (laid out already for calls of other shapes: with_calls)
        fc = fc.repeated(calls, new_input_bytes=new_input_bytes)
    return fc.with_eager_loss(tuple(eager_losses)) if eager_losses else fc
