"""The callback's state in a checkpoint: what ``state_dict`` saves (the plan in force, the batch
size ``batch_size="max"`` found) and what ``load_state_dict`` gives back to the fit that resumes.

A checkpoint's plan is used without searching, unless it cannot serve: a solver other than the
callback's, or blocks the model no longer has (both warned of; the fit plans afresh).
"""
from __future__ import annotations

import warnings
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from torch import nn

from lightning_memplan.callback.options import CallbackOptions
from lightning_memplan.core.batch_search import BatchSizeChoice
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.batch_size import batch_attribute
from lightning_memplan.planner.given_plan import check_plan_blocks, check_plan_solver, resume_conflicts
from lightning_memplan.planner.messages import MemPlanWarning

__all__ = ["RestoredState", "saved_state"]

#: The version of the dict :func:`saved_state` returns.
FORMAT = 1


def saved_state(plan: MemPlan | None, choice: BatchSizeChoice | None) -> dict[str, Any]:
    """The checkpoint state: ``format``, the plan in force as a dict (``None`` without one) and the
    batch size the search found (``None`` without the search)."""
    return {"format": FORMAT, "plan": plan.to_dict() if plan is not None else None,
            "batch_size": choice.batch_size if choice is not None else None}


def _warn(message: str, stacklevel: int) -> None:
    warnings.warn(message, MemPlanWarning, stacklevel=stacklevel + 1)


class RestoredState:
    """What the checkpoint of a resumed fit gave back (Lightning loads it after ``setup``): the
    plan to use without searching and the batch size to train at; ``None`` for each it lacks."""

    def __init__(self) -> None:
        #: The checkpoint's plan (``None``: none, or dropped because it cannot serve this fit).
        self.plan: MemPlan | None = None
        #: The batch size the checkpointed fit's search found.
        self.batch_size: int | None = None

    def load(self, state: dict[str, Any], options: CallbackOptions) -> None:
        """Read :func:`saved_state`'s dict (older ones: missing keys read as ``None``); a plan made
        with another solver is dropped and conflicts with the callback's arguments warned of."""
        self.batch_size = state.get("batch_size")
        data = state.get("plan")
        if not data:
            return
        source = "the checkpoint's MemPlanCallback state"
        plan = MemPlan.from_dict(data, source=source)
        s = options.settings
        try:
            check_plan_solver(plan, s.solver, source)
        except ValueError as exc:
            _warn(f"MemPlanCallback: {exc} Planning afresh instead.", 3)
            return
        for message in resume_conflicts("MemPlanCallback", plan, user_plan=options.user_plan, budget=s.budget,
                                        solver_name=s.solver_name, max_memory=s.max_memory):
            _warn(message, 3)
        self.plan = plan

    def check_blocks(self, lit: LightningModule, planned: nn.Module | None, user_plan: MemPlan | None) -> None:
        """Before training: the blocks a given plan (``user_plan``) checkpoints must be in ``lit``
        (a ValueError); the checkpoint's plan whose blocks are gone (the model changed) is dropped
        with a warning. ``planned``: the module ``submodule=`` names, if given."""
        if user_plan is not None:
            check_plan_blocks(user_plan, lit, "`MemPlanCallback(plan=...)`", planned=planned)
        elif self.plan is not None:
            try:
                check_plan_blocks(self.plan, lit, "the checkpoint's plan", planned=planned)
            except ValueError as exc:
                _warn(f"MemPlanCallback: {exc} Planning afresh instead.", 3)
                self.plan = None

    def set_batch_size(self, trainer: Trainer, lit: LightningModule, name: str) -> None:
        """Train at the checkpoint's batch size: the attribute ``name`` set to it where
        ``BatchSizeFinder`` sets it, and the train dataloader built again from it."""
        assert self.batch_size is not None
        batch_attribute(lit, trainer.datamodule, name, "MemPlanCallback").set(self.batch_size)
        trainer.fit_loop._combined_loader = None  # built again from the attribute
