"""The adapter that hands torch's partitioner our knapsack solver: a ``CustomKnapsackSolver``
(torch >= 2.11) that computes each candidate's runtime (FLOPs) itself, calls a solver with torch's
signature (:data:`~lightning_memplan.forecasting.validate.SolverFn`) and records the problem and the
answer on the region being compiled (:class:`~lightning_memplan.forecasting.capture.KnapsackRecord`).
"""
from __future__ import annotations

import functools
from typing import Any

import torch.fx as fx

from lightning_memplan._torch.partitioner import custom_knapsack_solver_base, size_of_node
from lightning_memplan.forecasting.capture import KnapsackRecord, RegionCapture
from lightning_memplan.forecasting.fx import node_flops
from lightning_memplan.forecasting.validate import SolverFn

__all__ = ["solver_adapter_class"]


@functools.lru_cache(maxsize=None)
def solver_adapter_class() -> type:
    """The adapter class, made once per process (its base is torch's ``CustomKnapsackSolver``).

    An instance ``cls(name, fn, budget)`` is the ``activation_memory_budget_solver`` to install: the
    partitioner calls it with the knapsack's normalized memory and its candidate nodes, and it returns
    ``(saved_idx, recomputed_idx)`` as ``fn`` chose them. While its ``region`` is set (a
    :class:`~lightning_memplan.forecasting.capture.RegionCapture`), each call is recorded there
    (``knapsack``, and that the solver was called); a failure to record lands in the region's ``errors``.
    ``uuid()`` (part of AOTAutograd's cache key) names the solver and the budget.
    """
    base = custom_knapsack_solver_base()

    class _MemplanKnapsackSolver(base):  # type: ignore[misc, valid-type]
        """``CustomKnapsackSolver`` that computes runtimes (FLOPs) itself and calls our solver."""

        def __init__(self, name: str, fn: SolverFn, budget: float) -> None:
            self.name, self.fn, self.budget = name, fn, budget
            self.region: RegionCapture | None = None

        def __call__(self, memory: list[float], joint_graph: Any, max_memory: float,
                     node_info: Any, all_recomputable_banned_nodes: list[fx.Node]) -> tuple[list[int], list[int]]:
            nodes = list(all_recomputable_banned_nodes)
            runtimes = [float(node_flops(n)) for n in nodes]
            value, saved, recomputed = self.fn(list(memory), runtimes, float(max_memory))
            saved, recomputed = [int(i) for i in saved], [int(i) for i in recomputed]
            if self.region is not None:
                self.region._solver_called = True
                try:
                    self.region.knapsack = KnapsackRecord(
                        solver=self.name,
                        names=tuple(n.name for n in nodes),
                        sizes_bytes=tuple(size_of_node(n) for n in nodes),
                        memory=tuple(float(m) for m in memory),
                        runtimes=tuple(runtimes),
                        max_memory=float(max_memory),
                        value=float(value),
                        saved_idx=tuple(saved),
                        recomputed_idx=tuple(recomputed),
                    )
                except Exception as err:  # noqa: BLE001
                    self.region.errors.append(f"knapsack record: {type(err).__name__}: {err}")
            return saved, recomputed

        def uuid(self) -> Any:
            # part of the AOTAutograd cache key: a different solver or budget is a different plan
            return ("lightning_memplan", self.name, repr(self.budget))

    return _MemplanKnapsackSolver
