"""The distributed side of planning, over Lightning's ``Strategy`` (Lightning is the engine).

* :func:`decide_on_rank_zero`: rank 0 runs the decision, every rank receives the same result (a
  failure on rank 0 is sent too, so no rank waits forever);
* :func:`max_over_ranks`: the largest measured peak over all ranks, for logging.

Single-device strategies pass through. The compile itself is applied to the LightningModule's own
``forward`` (an instance attribute set in ``setup``, before DDP/FSDP wrap the module), so every
strategy's wrapper calls the planned, compiled forward on each rank.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["decide_on_rank_zero", "max_over_ranks"]

T = TypeVar("T")


def decide_on_rank_zero(strategy: Any, decide: Callable[[], T]) -> T:
    """Run ``decide()`` on global rank 0 only and return its result on every rank.

    ``strategy`` is ``trainer.strategy`` (anything with ``global_rank``, ``world_size`` and
    ``broadcast(obj, src)``). The result must be picklable. An exception on rank 0 is re-raised on
    every rank (as a ``RuntimeError`` naming it on the others).
    """
    if getattr(strategy, "world_size", 1) <= 1:
        return decide()
    payload: tuple[str, Any] | None = None
    if strategy.global_rank == 0:
        try:
            payload = ("ok", decide())
        except Exception as exc:  # noqa: BLE001 - sent to every rank, then raised
            payload = ("error", exc)
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
