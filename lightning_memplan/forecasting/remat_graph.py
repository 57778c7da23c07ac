"""The FX side of whole-graph rematerialization: a joint graph's forward as a :class:`RematProblem`,
and a plan written back as ``torch.utils.checkpoint``'s recompute tags.

Values are the joint graph's forward ``call_function`` nodes (those no tangent flows into). A value's
saved bytes are its storage's bytes (a view keeps its base alive); its recompute cost is
``max(FLOPs, bytes written)`` in FLOP-equivalents: FLOPs from ``torch.utils.flop_counter``, and at
least one FLOP per output byte, because an op without FLOPs (a pointwise kernel) still reads and
writes memory; a view costs 1. Random ops (``nondeterministic_seeded``) and impure ops are never
recomputed; a multi-output op's tuple is never saved (its ``getitem`` items are).

Repeated blocks: the values traced inside the children of one container (``layers.0``,
``layers.1``, ...; :func:`repeated_groups`) that pose one problem are solved one block for all, the
blocks' boundaries saved (:mod:`lightning_memplan.core.remat_parts`), so the MILPs' size and count do not
grow with depth; other graphs are solved whole.

Tagging: saved values get ``recompute = MUST_SAVE``, recomputed ones ``PREFER_RECOMPUTE``, all with
one ``ac_graph_id``, exactly the tags selective activation checkpointing leaves under
``torch.compile``; torch's min-cut partitioner then honours them (run it at budget 1.0 so its own
knapsack does not run too).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from lightning_memplan.core.remat import (
    RematProblem,
    RematSolution,
    check_solution,
    remat_bounds,
    solve_remat_budget,
)
from lightning_memplan.core.remat_parts import RepeatedParts, parts_bounds, solve_parts_budget, split_repeated
from lightning_memplan.forecasting.fx import module_path

__all__ = ["REMAT_GRAPH_ID", "remat_problem", "repeated_groups", "tag_remat"]

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


_INDEXED = re.compile(r"^(.*)\.(\d+)$")


def repeated_groups(nodes: Sequence[fx.Node]) -> list[list[int]]:
    """The values (positions in ``nodes``) of each child of the container with indexed children
    (``layers.0``, ``layers.1``, ...) whose children hold the most values, one ascending list per
    child in index order; ``[]`` when no container has two children with values.

    A value traced inside a child belongs to it; a value without any module (an op of the joint
    graph's backward that reads no gradient, such as a GELU's derivative of its saved input) belongs
    to the last child its inputs come from (a child's input is the output of the one before it).
    Whether the children pose the same problem is
    :func:`~lightning_memplan.core.remat_parts.split_repeated`'s to check."""
    owners: dict[str, dict[int, list[int]]] = {}
    paths = [list(dict.fromkeys(module_path(k, v) for k, v in (n.meta.get("nn_module_stack") or {}).items()))
             for n in nodes]
    for i, ps in enumerate(paths):
        for path in ps:
            m = _INDEXED.match(path)
            if m:
                owners.setdefault(m.group(1), {}).setdefault(int(m.group(2)), []).append(i)
    best = max((c for c in owners.values() if len(c) >= 2), key=lambda c: sum(map(len, c.values())), default=None)
    if best is None:
        return []
    child = {i: k for k, members in best.items() for i in members}
    index = {n: i for i, n in enumerate(nodes)}
    for i, node in enumerate(nodes):
        if paths[i]:  # traced in a module: a child's, or the stem's or head's
            continue
        kinds = [child[index[a]] for a in node.all_input_nodes if a in index and index[a] in child]
        if kinds:
            child[i] = max(kinds)
    groups: dict[int, list[int]] = {}
    for i in sorted(child):
        groups.setdefault(child[i], []).append(i)
    return [groups[k] for k in sorted(groups)]


def _split(problem: RematProblem, nodes: Sequence[fx.Node]) -> RepeatedParts | None:
    """The problem cut at its repeated blocks (``None``: solve it whole)."""
    groups = repeated_groups(nodes)
    return split_repeated(problem, groups) if len(groups) >= 2 else None


def tag_remat(gm: fx.GraphModule, budget: float,
              cache: dict[str, Any] | None = None) -> RematSolution:
    """Solve ``gm``'s problem at ``budget`` (see :func:`lightning_memplan.core.remat.solve_remat_budget`)
    and tag its forward nodes with the plan. A graph of repeated blocks (:func:`repeated_groups`
    whose copies pose one problem) is solved one block for all, its boundaries saved
    (:mod:`lightning_memplan.core.remat_parts`); any other graph whole. ``cache`` (a dict the caller
    keeps per joint graph) holds the split and the bounds, so several budgets on copies of one graph
    solve them once; ``cache["split"]`` is the :class:`~lightning_memplan.core.remat_parts.RepeatedParts`
    solved (``None``: the whole graph).

    Raises:
        ValueError: a budget outside [0, 1], or a graph without any plan.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    problem, nodes = remat_problem(gm)
    memo = cache if cache is not None else {}
    if "split" not in memo:
        memo["split"] = _split(problem, nodes)
    parts: RepeatedParts | None = memo["split"]
    sol = None
    if parts is not None:
        if "part_bounds" not in memo:
            memo["part_bounds"] = parts_bounds(parts)
        sol = solve_parts_budget(parts, budget, bounds=memo["part_bounds"])
        if check_solution(problem, sol.saved, sol.recomputed):  # never expected: the whole graph decides
            memo["split"], sol = None, None
    if sol is None:
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
