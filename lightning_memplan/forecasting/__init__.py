"""Forecast the peak memory of a compiled training step from its real graphs.

The scoped compile backend and graph capture (:mod:`.backend`), the FX estimator with alias
tracking (:mod:`.estimator`), the step's other memory (allocations, workspaces, optimizer state,
the eager loss, FSDP buffers) and the step forecast itself (:mod:`.step_forecast`).
"""
from __future__ import annotations

from typing import Any

__all__ = ["Forecast", "forecast"]


def __getattr__(name: str) -> Any:
    # lazy: the submodules import one another, and importing one must not import them all
    if name in __all__:
        from lightning_memplan.forecasting import step_forecast

        return getattr(step_forecast, name)
    raise AttributeError(f"module 'lightning_memplan.forecasting' has no attribute {name!r}")
