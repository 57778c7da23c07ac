"""Planning settings: a plan's validated arguments, and the submodule it is for.

:class:`PlanSettings` holds what :class:`~lightning_memplan.MemPlanCallback` or
:func:`~lightning_memplan.tuner.plan_memory` was given, checked once (every error message names the
call and the argument); :func:`plan_solver` is the knapsack solver a plan is compiled with;
:func:`check_submodule` and :func:`resolve_submodule` check and find ``submodule=``. Knows nothing of
the Trainer.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import CheckpointPolicy, _policy_classes
from lightning_memplan.planner.device_limit import DeviceLimit
from lightning_memplan.planner.regional import RegionalFlag, check_regional_flag
from lightning_memplan.planner.search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS
from lightning_memplan.units import parse_bytes

__all__ = ["PlanSettings", "auto_backend", "check_submodule", "has_submodule", "plan_solver",
           "resolve_submodule"]


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """Validated planning arguments (see :class:`~lightning_memplan.MemPlanCallback` for each)."""

    budget: float | Literal["auto", "knee"]
    """A fixed budget in [0, 1]; ``"auto"``: the fastest plan within ``max_memory`` (on CUDA without
    it, the device's memory: :meth:`with_device_limit`), else the knee; ``"knee"``: the knee of the
    forecast front, or with ``max_memory`` the fastest plan within it."""
    max_memory: int | None
    """Byte target for baseline + step peak, or None."""
    limit_source: str = ""
    """Where ``max_memory`` came from, in words (``"max_memory='20GiB'"``, the device's memory);
    empty when there is none."""
    solver: str | Callable[..., Any]
    solver_name: str
    checkpoint: Any
    """None, ``"auto"`` or a frozenset of module classes."""
    backend: Literal["auto", "inductor", "aot_eager"]
    """The backend the plan is compiled with; ``"auto"`` until :meth:`on_device` resolves it."""
    candidate_budgets: tuple[float, ...]
    search_backend: Literal["inductor", "aot_eager"]
    remat_budgets: tuple[float, ...] = DEFAULT_REMAT_BUDGETS
    """Whole-graph rematerialization budgets the search adds (``()``: none)."""
    regional: RegionalFlag = False
    """Whether the repeated blocks are compiled each on its own (:mod:`lightning_memplan.planner.regional`);
    ``"auto"``: when the plan is searched (:func:`~lightning_memplan.planner.regional.wants_regional`)."""
    search_time_limit: float | None = None
    """Seconds the ``"auto"`` search may take before it chooses among the candidates forecast so far
    (``None``: no limit); see :func:`~lightning_memplan.planner.search.search`'s ``time_limit``."""

    @classmethod
    def from_args(
        cls,
        call: str,
        *,
        budget: float | str = "auto",
        max_memory: int | str | None = None,
        solver: str | Callable[..., Any] = "dp",
        checkpoint: CheckpointPolicy = "auto",
        backend: str = "auto",
        candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
        search_backend: str = "aot_eager",
        remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
        regional: RegionalFlag = False,
        search_time_limit: float | None = None,
    ) -> PlanSettings:
        """Validate the arguments of ``call`` (named in every error message)."""
        from lightning_memplan.forecasting.validate import check_budget, check_budgets, check_inner, resolve_solver

        if isinstance(budget, str):
            if budget not in ("auto", "knee"):
                close = difflib.get_close_matches(budget.lower(), ["auto", "knee"], n=1, cutoff=0.5)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"`{call}(budget={budget!r})` is not valid. Expected a float in [0.0, 1.0], 'auto' (the "
                    f"fastest plan that fits the limit) or 'knee' (the knee of the forecast front).{hint}"
                )
        else:
            budget = check_budget(budget, call)
        max_bytes = None if max_memory is None else parse_bytes(max_memory, argument="max_memory")
        if max_bytes == 0:
            raise ValueError(f"`{call}(max_memory={max_memory!r})` leaves no memory to train in. Expected a positive "
                             "byte size such as '20GiB', or None for no limit.")
        name, _ = resolve_solver(solver, call)  # type: ignore[arg-type]
        if isinstance(checkpoint, (set, frozenset, list, tuple)) and not checkpoint:
            checkpoint = None  # an empty set of block classes: checkpoint nothing
        if checkpoint is not None and checkpoint != "auto":
            checkpoint = frozenset(_policy_classes(checkpoint))
        remat = check_budgets(remat_budgets, call, "remat_budgets")
        cands = check_budgets(candidate_budgets, call, "candidate_budgets", empty=False)
        return cls(
            budget=budget, max_memory=max_bytes, solver=solver,  # type: ignore[arg-type]
            limit_source=f"max_memory={max_memory!r}" if max_bytes is not None else "",
            solver_name=solver if isinstance(solver, str) else f"custom:{name}",
            checkpoint=checkpoint, backend=_check_backend(backend, call),
            candidate_budgets=cands,
            search_backend=check_inner(search_backend, call, "search_backend"),
            remat_budgets=remat, regional=check_regional_flag(regional, call),
            search_time_limit=_check_time_limit(search_time_limit, call),
        )


    def on_device(self, device: torch.device | str) -> PlanSettings:
        """These settings for a step on ``device``: ``backend="auto"`` becomes ``"inductor"`` on CUDA
        and ``"aot_eager"`` elsewhere (see :func:`auto_backend`); an explicit backend is kept."""
        if self.backend != "auto":
            return self
        return dataclasses.replace(self, backend=auto_backend(device))

    @property
    def limit_name(self) -> str:
        """What ``max_memory`` is, in the plan's words: ``"max_memory"`` when given, else where it came
        from (:attr:`DeviceLimit.source`: the device's free and held memory, less the margin)."""
        return "max_memory" if not self.limit_source or self.limit_source.startswith("max_memory=") \
            else self.limit_source

    @property
    def wants_device_limit(self) -> bool:
        """Whether the plan is to fit the device's memory: ``budget="auto"`` and no ``max_memory``."""
        return self.budget == "auto" and self.max_memory is None

    def with_device_limit(self, limit: DeviceLimit | None) -> PlanSettings:
        """These settings with ``limit`` as ``max_memory`` when they want one (:attr:`wants_device_limit`)
        and there is one (a CUDA device: :func:`~lightning_memplan.planner.device_limit.device_limit`);
        else unchanged."""
        if limit is None or not self.wants_device_limit:
            return self
        return dataclasses.replace(self, max_memory=limit.bytes, limit_source=limit.source)


def _check_time_limit(limit: object, call: str) -> float | None:
    """``limit`` as seconds (a positive finite number), or None; else a ValueError naming ``call``."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < math.inf:
        raise ValueError(f"`{call}(search_time_limit={limit!r})` is not valid. Expected a positive number of "
                         "seconds, or None for no limit.")
    return float(limit)


def _check_backend(backend: object, call: str) -> Literal["auto", "inductor", "aot_eager"]:
    from lightning_memplan.forecasting.validate import INNER_BACKENDS, check_inner

    if isinstance(backend, str) and backend == "auto":
        return "auto"
    try:
        return check_inner(backend, call, "backend")
    except ValueError:
        allowed = ", ".join(repr(b) for b in INNER_BACKENDS)
        raise ValueError(f"`{call}(backend={backend!r})` is not a supported backend. Expected 'auto' (inductor on "
                         f"CUDA, aot_eager elsewhere) or one of {allowed}.") from None


def auto_backend(device: torch.device | str) -> Literal["inductor", "aot_eager"]:
    """The backend ``backend="auto"`` compiles with on ``device``: ``"inductor"`` on CUDA (its fused
    kernels are what users compile for there); ``"aot_eager"`` on every other device, where inductor
    generates and builds C++ for each graph (over a minute for a small model on a CPU) while
    ``aot_eager`` runs the same partitioner, so the same plan and the same activation memory, with
    eager kernels."""
    return "inductor" if torch.device(device).type == "cuda" else "aot_eager"


def plan_solver(settings: PlanSettings, plan: MemPlan) -> str | Callable[..., Any]:
    """The solver to compile ``plan`` with: the plan's own when it names one (a search may choose a
    ``"remat"`` plan; a loaded plan keeps its solver), else the user's callable from ``settings``."""
    from lightning_memplan.forecasting.validate import SOLVER_NAMES

    return plan.solver if plan.solver in SOLVER_NAMES else settings.solver


def check_submodule(path: str | None, call: str) -> str | None:
    """``path`` if it is None or a module path as ``nn.Module.get_submodule`` takes it (``"model"``,
    ``"model.backbone"``, ``"model.layers.0"``: names and indices), else a ValueError."""
    if path is not None and (not isinstance(path, str)
                             or not all(p.isidentifier() or p.isdigit() for p in path.split("."))):
        raise ValueError(f"`{call}(submodule={path!r})` must be None or a module path of the "
                         "LightningModule such as 'model', 'model.backbone' or 'model.layers.0'.")
    return path


def has_submodule(module: nn.Module, path: str) -> bool:
    """Whether ``module.get_submodule(path)`` finds a module."""
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def resolve_submodule(module: nn.Module, path: str | None, call: str) -> nn.Module:
    """``module`` itself (``path`` None) or its submodule at ``path``; a ValueError naming the
    argument and ``module``'s children when there is none."""
    if path is None:
        return module
    try:
        return module.get_submodule(path)
    except AttributeError:
        children = [name for name, _ in module.named_children()]
        raise ValueError(f"`{call}(submodule={path!r})`: {type(module).__name__} has no submodule {path!r}; "
                         f"its children are {children}.") from None
