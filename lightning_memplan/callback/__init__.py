"""The Lightning adapter: :class:`MemPlanCallback` and its strategy hook for DDP/FSDP."""
from __future__ import annotations

from lightning_memplan.callback.memplan_callback import MemPlanCallback, MemPlanWarning

__all__ = ["MemPlanCallback", "MemPlanWarning"]
