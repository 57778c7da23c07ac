"""A plan the user gave (``plan=``) or a checkpoint restored: checked before training, and what it
overrides said in words.

A plan decides the budget, the solver and the checkpointed blocks, so the search's arguments are
not used beside it. Rules (each message names the argument and says which wins and why):

- ``plan=`` wins over ``budget=``, ``solver=``, ``max_memory=``, ``checkpoint=`` and the candidate
  lists: it is used as it is, no search runs.
- On resume, ``plan=`` wins over the checkpoint's plan (it is the newer statement of intent); without
  ``plan=``, the checkpoint's plan wins over ``budget=``, ``solver=`` and ``max_memory=`` (the run goes
  on with the memory it was planned with).

Knows nothing of the Trainer.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.settings import has_submodule
from lightning_memplan.units import format_bytes

__all__ = ["check_plan_blocks", "check_plan_solver", "ignored_beside_plan", "resume_conflicts"]


def check_plan_solver(plan: MemPlan, solver: str | Callable[..., Any], source: str) -> None:
    """Raise ``ValueError`` (naming ``source``, e.g. ``"`MemPlanCallback(plan='p.json')`"``) unless
    ``plan.solver`` can be compiled with: a name of ``SOLVER_NAMES``, or ``"custom:<name>"`` with a
    callable ``solver`` given to run it."""
    from lightning_memplan.forecasting.validate import SOLVER_NAMES

    if plan.solver in SOLVER_NAMES:
        return
    names = ", ".join(repr(s) for s in SOLVER_NAMES)
    if plan.solver.startswith("custom:"):
        if callable(solver) and not isinstance(solver, str):
            return
        raise ValueError(f"{source}: the plan was made with the custom solver {plan.solver[7:]!r}; pass that function "
                         f"as `solver=` to compile with it, or use a plan of a built-in solver ({names}).")
    raise ValueError(f"{source}: the plan names the solver {plan.solver!r}, which is not known. Expected one of "
                     f"{names} or 'custom:<name>'.")


def check_plan_blocks(plan: MemPlan, module: nn.Module, source: str, *, planned: nn.Module | None = None) -> None:
    """Raise ``ValueError`` (naming ``source``) unless the blocks ``plan`` checkpoints and the modules
    it compiles on their own (``regional``) are submodules of the planned module: ``planned`` when
    it is known (``submodule=``), else of some module of ``module`` (the LightningModule: the module
    ``training_step`` calls is found on the first batch)."""
    names = (*plan.checkpoint, *plan.regional)
    if not names:
        return
    roots = [planned] if planned is not None else [m for _, m in module.named_modules()]
    for root in roots:
        if all(has_submodule(root, name) for name in names):
            return
    root = planned if planned is not None else module
    where = type(root).__name__ if planned is not None else f"{type(module).__name__} or any of its submodules"
    for field, what in (("checkpoint", "checkpoints"), ("regional", "compiles on their own")):
        missing = [name for name in getattr(plan, field) if not has_submodule(root, name)]
        if missing:
            break
    raise ValueError(f"{source}: the plan {what} {missing!r}, which {where} does not have (its children: "
                     f"{[n for n, _ in root.named_children()]}). Make the plan for this model, or drop them from its "
                     f"`{field}` list.")


def ignored_beside_plan(call: str, given: Mapping[str, tuple[Any, Any]]) -> str | None:
    """The message for the search arguments given beside ``plan=`` (``given``: argument -> (value,
    default)); ``None`` when every one is at its default."""
    set_ = [f"{name}={value!r}" for name, (value, default) in given.items() if not _same(value, default)]
    if not set_:
        return None
    return (f"`{call}(plan=...)` is used as it is (no search), so {', '.join(set_)} "
            f"{'is' if len(set_) == 1 else 'are'} not used. Drop `plan=` to search with "
            f"{'it' if len(set_) == 1 else 'them'}.")


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default) if not isinstance(value, (list, tuple)) else tuple(value) == tuple(default)
    except Exception:  # noqa: BLE001 - a value without a plain comparison (an array): treat as given
        return False


def _describe(plan: MemPlan) -> str:
    blocks = f", checkpointing {', '.join(plan.checkpoint)}" if plan.checkpoint else ""
    return f"budget {plan.budget:g}, solver {plan.solver!r}{blocks}"


def resume_conflicts(call: str, restored: MemPlan, *, user_plan: MemPlan | None, budget: float | str,
                     solver_name: str, max_memory: int | None) -> list[str]:
    """What the checkpoint's plan ``restored`` and the explicit arguments disagree on, one message
    each, saying which wins (see the module docstring); ``[]`` when they agree."""
    ck = f"the checkpoint's plan ({_describe(restored)})"
    if user_plan is not None:
        if (user_plan.budget, user_plan.solver, user_plan.checkpoint) == (
                restored.budget, restored.solver, restored.checkpoint):
            return []
        return [f"`{call}(plan=...)` ({_describe(user_plan)}) differs from {ck}; resuming "
                "with `plan=`, as given."]
    out = []
    how = f"to change the plan on resume, pass `{call}(plan=MemPlan(...))`."
    if not isinstance(budget, str) and abs(float(budget) - restored.budget) > 1e-9:
        out.append(f"`{call}(budget={budget!r})` differs from {ck}; resuming with the checkpoint's plan, so the run "
                   f"keeps the memory it was planned with; {how}")
    if solver_name != "dp" and solver_name != restored.solver:
        out.append(f"`{call}(solver={solver_name!r})` differs from {ck}; resuming with the checkpoint's plan; {how}")
    if max_memory is not None:
        total = (restored.predicted_peak_bytes + restored.baseline_bytes
                 if restored.predicted_peak_bytes is not None and restored.baseline_bytes is not None else None)
        fits = ("its forecast is unknown" if total is None else
                f"its forecast {format_bytes(total)} is {'within' if total <= max_memory else 'OVER'} it")
        out.append(f"`{call}(max_memory={format_bytes(max_memory)})`: resuming with {ck}, not searching against "
                   f"max_memory ({fits}); {how}")
    return out
