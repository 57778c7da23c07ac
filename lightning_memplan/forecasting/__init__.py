"""Forecast the peak memory of a compiled training step from its real graphs.

The scoped compile backend (:mod:`.backend`; its sweep of other plans :mod:`.sweep`, the knapsack
solver adapter :mod:`.solver_adapter`, the capture records :mod:`.capture`, argument validators
:mod:`.validate`), the FX estimator with alias tracking (:mod:`.estimator`), the step's other memory
(allocations, workspaces, optimizer state, the eager loss, FSDP buffers), and the step forecast:
:func:`~.step_forecast.forecast` compiles the step (:mod:`.compile_step`), plans each region
(:mod:`.regions`), lays the step out (:mod:`.layout`) and assembles the result (:mod:`.assemble`,
:mod:`.result`); :mod:`.grid` forecasts many plans from one compile.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Forecast", "forecast"]


def __getattr__(name: str) -> Any:
    # lazy: the submodules import one another, and importing one must not import them all
    if name == "forecast":
        from lightning_memplan.forecasting.step_forecast import forecast

        return forecast
    if name == "Forecast":
        from lightning_memplan.forecasting.result import Forecast

        return Forecast
    raise AttributeError(f"module 'lightning_memplan.forecasting' has no attribute {name!r}")
