"""The largest batch that fits, from forecasts that allocate nothing: :func:`max_batch_size`.

Each trial forecasts the planned module's step at one batch size on fake tensors
(:func:`~lightning_memplan.forecast` with ``target=``: nothing is allocated, no kernel runs). Its
inputs are the first batch's, with every tensor whose first dimension is the batch size grown or
shrunk along it (the dimension a ``DataLoader``'s ``batch_size`` makes); the eager code after the
forward measured on the first batch (the loss on the outputs) is scaled with the batch. A trial
forecasts the two ends of the plan search: no plan (budget 1, nothing checkpointed) and the
frugal plan (the least candidate budget with every repeated block checkpointed), and a batch fits
when the frugal one does; the trial's plan is the faster of the two that fits. The search over
sizes is :func:`~lightning_memplan.core.batch_search.largest_fitting`. The plan at the chosen size
is then searched in full on the real batch, as without ``batch_size="max"``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from lightning_memplan._torch.storages import tree_rebuilder
from lightning_memplan.core.batch_search import BatchSizeChoice, BatchTrial, largest_fitting
from lightning_memplan.forecasting.eager_loss import EagerLoss, scaled_eager_loss
from lightning_memplan.planner.checkpointing import resolve_blocks
from lightning_memplan.planner.plan_forecast import sum_outputs
from lightning_memplan.planner.regional import regional_blocks, wants_regional
from lightning_memplan.planner.search import PlanDoesNotFit, held_bytes, search
from lightning_memplan.planner.settings import PlanSettings
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    eager_losses_laid_in,
    laid_out_for_step,
    lightning_step_memory,
    step_grad_bytes,
)

__all__ = ["max_batch_size", "resized_inputs"]


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

    def trial(size: int) -> BatchTrial:
        losses, eager_grads = eager_losses_laid_in([scaled_eager_loss(m, size / batch_size) for m in eager_losses],
                                                   loop)

        def judge(fc: Any) -> tuple[int, int | None]:
            laid = laid_out_for_step(fc, calls=1, new_input_bytes=0, eager_losses=losses, made_input_bytes=0)
            return lightning_step_memory(laid, grads + eager_grads, loop)

        try:
            result = search(bound, resized_inputs(bound.tensors, batch_size, size),
                            budgets=tuple(dict.fromkeys((1.0, frugal_budget))),
                            checkpoint_sets=list(dict.fromkeys([(), blocks])), solver=settings.solver,
                            backend=settings.search_backend, optimizer=optimizer, loss_fn=sum_outputs,
                            max_memory=limit_bytes, remat_budgets=(), step_memory=judge, regional=regional,
                            target=target)
            plan, fits = result.plan, True
        except PlanDoesNotFit as exc:
            plan, fits = exc.plan, False
        except Exception as exc:  # noqa: BLE001 - a size that cannot be forecast is not taken
            return BatchTrial(batch_size=size, fits=False, note=f"not forecast: {type(exc).__name__}: {exc}"[:200])
        chosen = plan.candidates[plan.chosen] if plan.chosen is not None else None
        fastest = next((c for c in plan.candidates if c.budget == 1.0 and not c.checkpoint and c.cost), None)
        if chosen is None or chosen.peak_bytes is None:
            return BatchTrial(batch_size=size, fits=False, note="no candidate could be forecast")
        extra = chosen.cost / fastest.cost - 1 if fastest is not None and chosen.cost is not None else None
        return BatchTrial(batch_size=size, fits=fits, plan=chosen.label,
                          total_bytes=held_bytes(chosen, plan.baseline_bytes or 0), extra_compute=extra)

    return largest_fitting(trial, start=batch_size, limit_bytes=limit_bytes, limit_source=limit_source,
                           max_size=max_size, max_trials=max_trials)
