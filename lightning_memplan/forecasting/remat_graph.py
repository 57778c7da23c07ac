"""The FX side of whole-graph rematerialization: a joint graph's forward as a :class:`RematProblem`,
and a plan written back as ``torch.utils.checkpoint``'s recompute tags.

Values are the joint graph's forward ``call_function`` nodes (those no tangent flows into). A value's
saved bytes are its storage's bytes (a view keeps its base alive); its recompute cost is
``max(FLOPs, bytes written)`` in FLOP-equivalents: FLOPs from ``torch.utils.flop_counter``, and at
least one FLOP per output byte, because an op without FLOPs (a pointwise kernel) still reads and
writes memory; a view costs 1. Random ops (``nondeterministic_seeded``) and impure ops are never
recomputed; a multi-output op's tuple is never saved (its ``getitem`` items are).

Tagging: saved values get ``recompute = MUST_SAVE``, recomputed ones ``PREFER_RECOMPUTE``, all with
one ``ac_graph_id``, exactly the tags selective activation checkpointing leaves under
``torch.compile``; torch's min-cut partitioner then honours them (run it at budget 1.0 so its own
knapsack does not run too).
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from lightning_memplan.core.remat import (
    RematProblem,
    RematSolution,
    remat_bounds,
    solve_remat_budget,
)

__all__ = ["REMAT_GRAPH_ID", "remat_problem", "tag_remat"]

REMAT_GRAPH_ID = 20_000
"""The ``ac_graph_id`` the tags carry (checkpointing emulation uses 10_000 + block index)."""


def _storage_bytes(val: Any) -> int:
    if isinstance(val, torch.Tensor):
        try:
            return int(val.untyped_storage().nbytes())
        except Exception:  # noqa: BLE001 - e.g. a tensor subclass without a storage
            return int(val.numel() * val.element_size())
    return 0


def _out_bytes(val: Any) -> int:
    if isinstance(val, torch.Tensor):
        return int(val.numel() * val.element_size())
    if isinstance(val, (tuple, list)):
        return sum(_out_bytes(v) for v in val)
    return 0


def _is_view(node: fx.Node) -> bool:
    return node.target is operator.getitem or bool(getattr(node.target, "is_view", False))


def remat_problem(gm: fx.GraphModule) -> tuple[RematProblem, list[fx.Node]]:
    """The rematerialization problem of a joint graph, and the node of each value (same order)."""
    from lightning_memplan.forecasting.fx import forward_nodes, node_flops

    fwd = forward_nodes(gm)
    index = {n: i for i, n in enumerate(fwd)}
    nbytes, cost, needed, saveable, recomputable = [], [], [], [], []
    edges: list[tuple[int, int]] = []
    for i, node in enumerate(fwd):
        val = node.meta.get("val")
        is_tuple = isinstance(val, (tuple, list))
        nbytes.append(0 if is_tuple else _storage_bytes(val))
        flops = 0 if node.target is operator.getitem else node_flops(node)
        cost.append(1.0 if _is_view(node) else float(max(flops, _out_bytes(val), 1)))
        needed.append(any(u.op == "call_function" and u not in index for u in node.users))
        saveable.append(not is_tuple)
        tags = getattr(node.target, "tags", ()) or ()
        recomputable.append(torch.Tag.nondeterministic_seeded not in tags and not node.is_impure())
        edges.extend((index[a], i) for a in dict.fromkeys(node.all_input_nodes) if a in index)
    problem = RematProblem(nbytes=tuple(nbytes), cost=tuple(cost), needed=tuple(needed),
                           saveable=tuple(saveable), recomputable=tuple(recomputable), edges=tuple(edges))
    return problem, fwd


def tag_remat(gm: fx.GraphModule, budget: float,
              cache: dict[str, Any] | None = None) -> RematSolution:
    """Solve ``gm``'s problem at ``budget`` (see :func:`lightning_memplan.core.remat.solve_remat_budget`)
    and tag its forward nodes with the plan. ``cache`` (a dict the caller keeps per joint graph)
    holds the problem's bounds, so several budgets on copies of one graph solve them once.

    Raises:
        ValueError: a budget outside [0, 1], or a graph without any plan.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    problem, nodes = remat_problem(gm)
    memo = cache if cache is not None else {}
    if "bounds" not in memo:
        memo["bounds"] = remat_bounds(problem)
    sol = solve_remat_budget(problem, budget, bounds=memo["bounds"])
    for i in sol.saved:
        nodes[i].meta["recompute"] = CheckpointPolicy.MUST_SAVE
        nodes[i].meta["ac_graph_id"] = REMAT_GRAPH_ID
    for i in sol.recomputed:
        nodes[i].meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
        nodes[i].meta["ac_graph_id"] = REMAT_GRAPH_ID
    return sol
