"""Transitional: the names ``lightning_memplan.planner.step`` held before it was split, re-exported
for :mod:`lightning_memplan.callback.memplan_callback` until it imports them from their modules
(:mod:`.settings`, :mod:`.step_model`, :mod:`.messages`, :mod:`.decision`, :mod:`.plan_forecast`;
the pipeline is :mod:`.pipeline`). New code imports from those; this module goes then.
"""
from __future__ import annotations

from lightning_memplan.planner.decision import decide_plan, rejudge_plan
from lightning_memplan.planner.messages import (
    PlanWarning,
    eager_forward_warning,
    uncompiled_warnings,
)
from lightning_memplan.planner.plan_forecast import (
    BoundForward,
    forecast_plan,
    lay_out_step,
    other_call_forecasts,
    sum_outputs,
)
from lightning_memplan.planner.settings import (
    PlanSettings,
    check_submodule,
    plan_solver,
    resolve_submodule,
)
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    call_signature,
    fresh_input_bytes,
    grad_bytes,
    gradless_bytes,
    gradless_parameters,
    input_storages,
    lightning_step_memory,
    lightning_step_peak,
    lightning_step_timeline,
    live_grad_bytes,
    made_input_bytes,
    other_optimizer_state_bytes,
    step_grad_bytes,
    storage_keys,
)

__all__ = [
    "BoundForward", "PlanSettings", "PlanWarning", "TrainingLoop", "call_signature", "check_submodule",
    "decide_plan", "eager_forward_warning", "forecast_plan", "fresh_input_bytes", "grad_bytes", "gradless_bytes",
    "gradless_parameters", "input_storages", "lay_out_step", "lightning_step_memory", "lightning_step_peak",
    "lightning_step_timeline", "live_grad_bytes", "made_input_bytes", "other_call_forecasts",
    "other_optimizer_state_bytes", "plan_solver", "rejudge_plan", "resolve_submodule", "step_grad_bytes",
    "storage_keys", "sum_outputs", "uncompiled_warnings",
]
