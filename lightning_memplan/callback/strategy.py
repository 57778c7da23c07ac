"""The distributed side of planning, over Lightning's ``Strategy`` (Lightning is the engine).

* :func:`decide_on_rank_zero`: rank 0's decision, received by every rank (a failure on rank 0 is sent
  too, so no rank waits forever). When the planned forward issues collectives itself (FSDP's
  all-gathers, tensor parallelism: :func:`forward_has_collectives`) every rank runs the decision in
  lockstep, since the candidates' forecasts run that forward, and rank 0's result is kept;
* :func:`max_over_ranks`: the largest measured peak over all ranks, for logging.

Single-device strategies pass through. The compile itself is applied to the LightningModule's own
``forward`` (an instance attribute set in ``setup``, before DDP/FSDP wrap the module, or at
``on_fit_start`` for a submodule that ``configure_model`` makes), so every strategy's wrapper calls
the planned, compiled forward on each rank.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["decide_on_rank_zero", "forward_has_collectives", "max_over_ranks"]

T = TypeVar("T")


def forward_has_collectives(module: nn.Module) -> bool:
    """Whether running ``module``'s forward issues collectives on its own: some of its parameters
    are sharded by FSDP (FSDP2's ``fully_shard``, as in Lightning's ``ModelParallelStrategy``, or
    FSDP1's ``FullyShardedDataParallel``, Lightning's ``FSDPStrategy``) or are DTensors (tensor
    parallelism). Their forward all-gathers, so every rank must run it together. DDP's collectives
    are in its wrapper's backward hooks, which a forecast bypasses: ``False`` there."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without these: nothing in the module can be sharded by them
        return False
    if any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in module.modules()):
        return True
    return any(isinstance(p, DTensor) for p in module.parameters())


def decide_on_rank_zero(strategy: Any, decide: Callable[[], T], *, all_ranks_run: bool = False) -> T:
    """Rank 0's ``decide()``, returned on every rank.

    ``strategy`` is ``trainer.strategy`` (anything with ``global_rank``, ``world_size`` and
    ``broadcast(obj, src)``). The result must be picklable. By default only rank 0 runs ``decide()``
    while the others wait for its result. With ``all_ranks_run`` every rank runs it (needed when it
    runs collectives, see :func:`forward_has_collectives`; the ranks must reach them in the same
    order) and rank 0's result replaces the others'. An exception on rank 0 is re-raised on every
    rank (as a ``RuntimeError`` naming it on the others).
    """
    if getattr(strategy, "world_size", 1) <= 1:
        return decide()
    payload: tuple[str, Any] | None = None
    if strategy.global_rank == 0 or all_ranks_run:
        try:
            payload = ("ok", decide())
        except Exception as exc:  # noqa: BLE001 - sent to every rank, then raised
            payload = ("error", exc)
    if strategy.global_rank != 0:
        payload = None  # rank 0's result wins
    status, value = strategy.broadcast(payload, src=0)
    if status == "error":
        if strategy.global_rank == 0:
            raise value
        raise RuntimeError(f"memory planning failed on rank 0: {value!r}")
    return value


def max_over_ranks(strategy: Any, value: int | None) -> int | None:
    """The maximum of ``value`` over all ranks (``None`` where a rank has no value; ``None`` if
    no rank has one). A collective call: every rank must call it."""
    if getattr(strategy, "world_size", 1) <= 1:
        return value
    t = torch.tensor(float(-1 if value is None else value), dtype=torch.float64,
                     device=getattr(strategy, "root_device", torch.device("cpu")))
    out = strategy.reduce(t, reduce_op="max")
    v = int(out.item())
    return None if v < 0 else v
