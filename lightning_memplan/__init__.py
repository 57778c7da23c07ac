"""lightning_memplan: train under a memory limit without guessing.

Pure libraries (no Trainer): :mod:`lightning_memplan.solvers` (exact 0/1 knapsack solvers and the
one-pass Pareto frontier) and :mod:`lightning_memplan.placement` (static tensor placement).
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Forecast", "MemPlanCallback", "MemPlanWarning", "__version__", "forecast", "measure_peak"]

# torch-backed entry points load on first use, so the pure packages import without torch
# (the module is `forecasting`, not `forecast`: a submodule would shadow the function)
_LAZY = {
    "Forecast": "lightning_memplan.forecasting.result",
    "forecast": "lightning_memplan.forecasting.step_forecast",
    "measure_peak": "lightning_memplan.measure",
    "MemPlanCallback": "lightning_memplan.callback.memplan_callback",
    "MemPlanWarning": "lightning_memplan.planner.messages",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_memplan' has no attribute {name!r}")
