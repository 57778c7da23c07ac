"""Argument validators of the forecasting entry points (:func:`~lightning_memplan.forecasting.step_forecast.forecast`,
the grid, :func:`~lightning_memplan.forecasting.backend.memplan_backend`) and of the plan settings that call them.

Each validator takes the name of the public call it validates for (``call``) and raises a
``ValueError`` whose message quotes that call with the value given (``!r``) and says what is
allowed; on success it returns the value normalized.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
import torch.nn as nn

__all__ = [
    "INNER_BACKENDS",
    "SOLVER_NAMES",
    "SolverFn",
    "check_budget",
    "check_budgets",
    "check_checkpoint_sets",
    "check_inner",
    "check_step_args",
    "resolve_solver",
]

#: torch's solver signature: ``(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)``.
SolverFn = Callable[[list[float], list[float], float], tuple[float, list[int], list[int]]]

#: Names accepted by ``solver=`` (see :func:`lightning_memplan.solvers.get_solver`).
SOLVER_NAMES: tuple[str, ...] = ("greedy", "dp", "hirschberg", "ilp", "remat")
"""Solver names: the four knapsack solvers of :mod:`lightning_memplan.solvers`, and ``"remat"``:
whole-graph rematerialization (:mod:`lightning_memplan.core.remat`), which decides every forward value
(not only the knapsack's candidates) and hands the plan to the partitioner as recompute tags."""

#: Accepted ``inner=`` values; ``"aot_eager_decomp_partition"`` is an alias of ``"aot_eager"``.
INNER_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "aot_eager_decomp_partition")


def check_budget(budget: object, call: str) -> float:
    """``budget`` as a float: an activation memory budget, a ratio in [0.0, 1.0]; any real number
    type (``numpy.float32`` too), bool refused."""
    ok = isinstance(budget, numbers.Real) and not isinstance(budget, bool) and math.isfinite(budget)
    if not ok or not 0.0 <= float(budget) <= 1.0:  # type: ignore[arg-type]
        raise ValueError(
            f"`{call}(budget={budget!r})` is not a valid activation memory budget. Expected a float "
            "in [0.0, 1.0]: 1.0 keeps torch's runtime-optimal plan, 0.0 recomputes all it can."
        )
    return float(budget)  # type: ignore[arg-type]


def check_budgets(budgets: object, call: str, arg: str, *, empty: bool = True) -> tuple[float, ...]:
    """``budgets`` (argument ``arg`` of ``call``), a sequence of activation memory budgets, as
    floats in its order, duplicates dropped; a ValueError showing the whole argument and the bad
    element otherwise (an empty sequence too, unless ``empty``)."""
    allowed = f"Expected a {'' if empty else 'non-empty '}sequence of budgets in [0.0, 1.0]"
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, Iterable):
        raise ValueError(f"`{call}({arg}={budgets!r})` is not valid. {allowed}.")
    values = tuple(budgets)
    if not values and not empty:
        raise ValueError(f"`{call}({arg}={budgets!r})` is empty. {allowed}.")
    out = []
    for b in values:
        try:
            out.append(check_budget(b, call))
        except ValueError:
            raise ValueError(f"`{call}({arg}={budgets!r})`: {b!r} is not a valid activation memory budget. "
                             f"{allowed}.") from None
    return tuple(dict.fromkeys(out))


def resolve_solver(solver: str | SolverFn, call: str = "memplan_backend") -> tuple[str, SolverFn]:
    """``(name, function)`` for a solver name in :data:`SOLVER_NAMES` or a user callable.

    Names resolve through :func:`lightning_memplan.solvers.get_solver`. A callable must have torch's
    solver signature (:data:`SolverFn`); its name is its qualified name.
    """
    if callable(solver) and not isinstance(solver, str):
        name = f"{getattr(solver, '__module__', '')}.{getattr(solver, '__qualname__', type(solver).__name__)}"
        return name, solver
    if not isinstance(solver, str) or solver not in SOLVER_NAMES:
        raise ValueError(
            f"`{call}(solver={solver!r})` is not a known solver. Expected one of "
            f"{', '.join(repr(s) for s in SOLVER_NAMES)}, or a callable "
            "`(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)`."
        )
    from lightning_memplan.solvers import get_solver

    # "remat" partitions at budget 1.0 (its tags decide), so no knapsack is ever posed to it
    return solver, get_solver("dp" if solver == "remat" else solver)


def check_inner(inner: object, call: str, arg: str = "inner") -> Literal["inductor", "aot_eager"]:
    """The backend ``inner`` (one of :data:`INNER_BACKENDS`, passed as argument ``arg``) with its alias
    resolved: ``"inductor"`` or ``"aot_eager"``."""
    if inner not in INNER_BACKENDS:
        raise ValueError(
            f"`{call}({arg}={inner!r})` is not a supported backend. Expected one of "
            f"{', '.join(repr(s) for s in INNER_BACKENDS)}."
        )
    return "inductor" if inner == "inductor" else "aot_eager"


def check_checkpoint_sets(sets: Sequence[Sequence[str]], model: nn.Module | None, call: str,
                          arg: str = "checkpoint_sets") -> tuple[tuple[str, ...], ...]:
    """The non-empty checkpoint sets of ``sets`` (qualified submodule names of ``model``), duplicates
    dropped, in the order given (the empty set, no checkpointing, is always planned)."""
    if isinstance(sets, str) or not isinstance(sets, Sequence) or any(
            isinstance(s, str) or not isinstance(s, Sequence) or not all(isinstance(n, str) for n in s) for s in sets):
        raise ValueError(f"`{call}({arg}={sets!r})` must be a sequence of sequences of submodule names, "
                         "e.g. [(), ('blocks.0', 'blocks.1')].")
    out = tuple(dict.fromkeys(tuple(s) for s in sets if len(s)))
    if not out:
        return out
    if model is None:
        raise ValueError(f"`{call}({arg}={sets!r})` needs the model, to name its submodules.")
    known = {n for n, _ in model.named_modules()}
    missing = sorted({n for s in out for n in s} - known)
    if missing:
        raise ValueError(f"`{call}({arg}=...)`: {missing!r} are not submodules of the model; use names "
                         f"from `model.named_modules()`, e.g. {sorted(known - {''})[:4]!r}.")
    return out


def check_regional(names: object, model: nn.Module, call: str) -> tuple[nn.Module, ...]:
    """The modules named by ``regional`` (qualified submodule names of ``model``, compiled on their
    own), in the order given, duplicates dropped; ``()`` for none."""
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"`{call}(regional={names!r})` must be a sequence of submodule names compiled on their "
                         "own, e.g. ('layers.0', 'layers.1'), or () for one compile of the whole model.")
    modules = dict(model.named_modules())
    missing = sorted(set(names) - set(modules) | ({""} & set(names)))
    if missing:
        raise ValueError(f"`{call}(regional=...)`: {missing!r} are not submodules of the model; use names "
                         f"from `model.named_modules()`, e.g. {sorted(set(modules) - {''})[:4]!r}.")
    return tuple(modules[n] for n in dict.fromkeys(names))


def check_step_args(model: object, example_inputs: object, loss_fn: object, optimizer: object) -> tuple[Any, ...]:
    """The training step's arguments of ``forecast`` (and the grid) checked; returns
    ``example_inputs`` as a tuple of tensors (one tensor becomes a 1-tuple)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"`forecast(model={model!r})` is not a torch.nn.Module. Pass the model to train.")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError(
            f"`forecast(example_inputs={example_inputs!r})` is not a tensor or a tuple of tensors. "
            "Pass the batch the model is called with: `model(*example_inputs)`."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"`forecast(loss_fn={loss_fn!r})` is not callable. Pass `output -> scalar loss`, or None.")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"`forecast(optimizer={optimizer!r})` is not a torch.optim.Optimizer, or None.")
    return tuple(inputs)
