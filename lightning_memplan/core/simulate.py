"""Backward-pass memory simulation of a save/recompute plan, and the knee of the Pareto frontier.

Pure functions on plain data (no torch, no Trainer). The model, after torch's
``KnapsackEvaluator`` (our own code, with its double count of saved inputs fixed):

* after the forward pass, the saved activations are live;
* backward visits the recomputable forward nodes in reverse topological order; when a node's turn
  comes and its value is not live, it is recomputed together with every ancestor that is needed
  and not live (saved nodes stop the walk); recomputed values stay live until their own turn;
* at its turn a node's value is used and freed.

The knee is the frontier point closest to the origin after min-max normalizing memory and
recompute cost; :func:`knee_point` needs one :func:`~lightning_memplan.solvers.pareto_frontier`
pass instead of torch's 100 separate solves.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter

import numpy as np

from lightning_memplan.core.front import knee
from lightning_memplan.solvers import ParetoFrontier, pareto_frontier

__all__ = [
    "BackwardSimulation",
    "KneePoint",
    "RecomputeGraph",
    "knee_point",
    "simulate_backward",
]


@dataclass(frozen=True, kw_only=True)
class RecomputeGraph:
    """The recomputable forward subgraph the knapsack decides on.

    Invariants: ``memory`` and ``runtimes`` have one entry per name; ``edges`` are
    ``(producer, consumer)`` index pairs among these nodes and form a DAG. Node ``i`` is knapsack
    item ``i``.
    """

    names: tuple[str, ...]
    """Node names, in knapsack item order."""
    memory: tuple[float, ...]
    """Bytes of each node's output (any unit works; results use the same unit)."""
    runtimes: tuple[float, ...]
    """Cost of recomputing each node (FLOPs or seconds)."""
    edges: tuple[tuple[int, int], ...]
    """Data dependencies ``(producer, consumer)`` between recomputable nodes."""

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.memory) != n or len(self.runtimes) != n:
            raise ValueError(
                f"`RecomputeGraph` needs one memory and runtime entry per name: {n} names, "
                f"{len(self.memory)} memory, {len(self.runtimes)} runtimes."
            )
        for e in self.edges:
            if not (0 <= e[0] < n and 0 <= e[1] < n) or e[0] == e[1]:
                raise ValueError(
                    f"`RecomputeGraph.edges` entry {e!r} must join two different nodes in "
                    f"range({n})."
                )
        try:
            _ = self.topological_order()
        except CycleError as exc:
            raise ValueError(f"`RecomputeGraph.edges` contain a cycle: {exc.args[1]!r}.") from None

    def predecessors(self) -> list[list[int]]:
        preds: list[list[int]] = [[] for _ in self.names]
        for a, b in self.edges:
            preds[b].append(a)
        return preds

    def topological_order(self) -> list[int]:
        """A deterministic topological order (ties by index)."""
        ts: TopologicalSorter[int] = TopologicalSorter()
        for i in range(len(self.names)):
            ts.add(i)
        for a, b in sorted(self.edges):
            ts.add(b, a)
        ts.prepare()
        order: list[int] = []
        while ts.is_active():
            ready = sorted(ts.get_ready())
            order.extend(ready)
            ts.done(*ready)
        return order


@dataclass(frozen=True, kw_only=True)
class BackwardSimulation:
    """Result of :func:`simulate_backward` (memory in the unit of ``RecomputeGraph.memory``)."""

    saved_memory: float
    """Memory of the saved activations: live when backward starts."""
    peak_memory: float
    """Highest live memory during backward, recomputed values included."""
    recompute_runtime: float
    """Summed runtime of every node recomputed (each at most once)."""
    recomputed: tuple[int, ...]
    """Nodes recomputed, in the order backward recomputes them."""
    timeline: tuple[float, ...]
    """Live memory after each event (start, each recompute, each free)."""


def simulate_backward(graph: RecomputeGraph, saved: Iterable[int]) -> BackwardSimulation:
    """Simulate the backward pass of a plan that saves the nodes in ``saved`` (indices)."""
    n = len(graph.names)
    saved_set = set(int(i) for i in saved)
    bad = [i for i in saved_set if not 0 <= i < n]
    if bad:
        raise ValueError(f"`saved` holds indices outside range({n}): {sorted(bad)!r}.")
    preds = graph.predecessors()
    mem = graph.memory
    live = set(saved_set)
    current = float(sum(mem[i] for i in saved_set))
    timeline = [current]
    peak = current
    recomputed: list[int] = []
    runtime = 0.0
    order = graph.topological_order()
    position = {v: k for k, v in enumerate(order)}
    for v in reversed(order):
        if v not in live:
            # every ancestor needed to recompute v that is not live, recomputed in forward order
            need: set[int] = set()
            stack = [v]
            while stack:
                u = stack.pop()
                if u in need or u in live:
                    continue
                need.add(u)
                stack.extend(preds[u])
            for u in sorted(need, key=position.__getitem__):
                live.add(u)
                current += mem[u]
                runtime += graph.runtimes[u]
                recomputed.append(u)
                timeline.append(current)
            peak = max(peak, current)
        live.discard(v)
        current -= mem[v]
        timeline.append(current)
    return BackwardSimulation(
        saved_memory=float(sum(mem[i] for i in saved_set)),
        peak_memory=peak,
        recompute_runtime=runtime,
        recomputed=tuple(recomputed),
        timeline=tuple(timeline),
    )


@dataclass(frozen=True, kw_only=True)
class KneePoint:
    """The knee of a runtime-vs-memory Pareto frontier."""

    index: int
    """Index of the knee in the frontier's points."""
    budget: float
    """Memory of the knee plan, normalized units: use it as the activation memory budget."""
    runtime: float
    """Runtime kept by the knee plan (same unit as the solver's runtimes)."""
    distance: float
    """Distance to the origin in the min-max normalized (memory, recompute cost) plane, in [0, sqrt(2)]."""
    frontier: ParetoFrontier
    """The frontier the knee was taken from."""


def knee_point(
    frontier_or_memory: ParetoFrontier | Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray | None = None,
) -> KneePoint:
    """The frontier point closest to the origin after min-max normalizing both axes.

    Pass a :class:`~lightning_memplan.solvers.ParetoFrontier`, or ``(memory, runtimes)`` to compute
    one first (one pass). Ties go to the point with less memory. A frontier with one point returns
    it.
    """
    if isinstance(frontier_or_memory, ParetoFrontier):
        if runtimes is not None:
            raise ValueError("`knee_point(frontier, runtimes)`: pass runtimes only with memory.")
        fr = frontier_or_memory
    else:
        if runtimes is None:
            raise ValueError("`knee_point(memory)` needs `runtimes` too: knee_point(memory, runtimes).")
        fr = pareto_frontier(frontier_or_memory, runtimes)
    k, distance = knee(fr.memory.tolist(), (fr.total_runtime - fr.runtime).tolist())
    return KneePoint(
        index=k,
        budget=float(fr.memory[k]),
        runtime=float(fr.runtime[k]),
        distance=float(distance),
        frontier=fr,
    )
