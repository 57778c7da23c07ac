"""Walks of a live autograd graph: what a loss's backward reaches and what its nodes saved.

Every function reads the graph as it stands (``grad_fn`` / ``next_functions``), keeps nothing of it
and changes nothing; node identities are Python ``id``\ s, valid while the caller keeps the graph
alive. Used to measure the eager code between a compiled forward and its backward
(:mod:`lightning_memplan.forecasting.eager_loss`) and which parameters a step gives gradients.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

from lightning_memplan._torch.storages import storage_key

__all__ = ["edges_reached", "inner_edges", "parameters_reached", "reach_down", "saved_storage_keys",
           "saved_tensors_of"]


def saved_tensors_of(node: Any) -> Iterable[torch.Tensor]:
    """The tensors an autograd node saved for its backward (its ``_saved_*`` attributes)."""
    for name in dir(node):
        if not name.startswith("_saved_"):
            continue
        try:
            value = getattr(node, name)
        except Exception:  # noqa: BLE001 - freed, or not readable
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        yield from (v for v in values if isinstance(v, torch.Tensor))


def reach_down(root: Any, stops: dict[int, int]) -> tuple[dict[int, Any], dict[int, frozenset[int]]]:
    """Every autograd node from ``root`` down to the output nodes ``stops`` (node id -> call), and
    for each the calls whose outputs it reaches. Iterative depth-first (autograd graphs are DAGs)."""
    nodes: dict[int, Any] = {}
    reach: dict[int, frozenset[int]] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            below = (reach.get(id(n), frozenset()) for n, _ in node.next_functions if n is not None)
            reach[key] = frozenset({stops[key]}) if key in stops else frozenset().union(*below)
            continue
        if key in nodes:
            continue
        nodes[key] = node
        stack.append((node, True))
        if key not in stops:
            stack.extend((n, False) for n, _ in node.next_functions if n is not None)
    return nodes, reach


def edges_reached(loss: torch.Tensor, nodes: dict[int, Any], stops: dict[int, int]) -> set[tuple[int, int]]:
    """``(node id, output_nr)`` of every output edge the backward of ``loss`` sends a gradient
    along: the loss's own edge and the ``next_functions`` of every node walked (``nodes``, from
    :func:`reach_down`) that is not one of the ``stops``."""
    reached = {(id(loss.grad_fn), loss.output_nr)}
    for key, node in nodes.items():
        if key not in stops:
            reached.update((id(n), nr) for n, nr in node.next_functions if n is not None)
    return reached


def parameters_reached(loss: torch.Tensor, stop_at: Iterable[GradientEdge] = ()) -> set[int]:
    """``id``s of the leaf tensors whose gradients ``loss``'s backward accumulates: the
    ``AccumulateGrad`` nodes its autograd graph reaches, through compiled regions' backward nodes
    too. A trainable parameter not among them gets no gradient in this step (its ``.grad`` stays
    None); empty when ``loss`` has no autograd graph. ``stop_at``: the walk does not go past these
    edges' nodes (a call's outputs: then only the parameters the code after the call reads)."""
    if loss.grad_fn is None:
        return set()
    nodes, _ = reach_down(loss.grad_fn, {id(e.node): 0 for e in stop_at})
    stops = {id(e.node) for e in stop_at}
    return {id(v) for k, v in ((k, getattr(n, "variable", None)) for k, n in nodes.items())
            if k not in stops and isinstance(v, torch.Tensor)}


def saved_storage_keys(edges: Sequence[GradientEdge]) -> set[int]:
    """Storage keys of the tensors the nodes of ``edges`` saved for their backward (a compiled
    region's ``CompiledFunctionBackward`` is its ``ctx``: ``saved_tensors``); none where unreadable."""
    keys: set[int] = set()
    for node in {id(e.node): e.node for e in edges}.values():
        try:
            saved = node.saved_tensors
        except Exception:  # noqa: BLE001 - freed, or not a custom Function's node
            continue
        keys.update(storage_key(t) for t in saved if isinstance(t, torch.Tensor))
    return keys


def inner_edges(edges: Sequence[GradientEdge]) -> set[tuple[int, int]]:
    """``(node id, output_nr)`` of the output edges that another output is computed from: walking
    down from every edge's node, the edges of ``edges`` met in ``next_functions``."""
    outputs = {(id(e.node), e.output_nr) for e in edges}
    inner: set[tuple[int, int]] = set()
    seen: set[int] = set()
    stack = [e.node for e in edges]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for n, nr in node.next_functions:
            if n is not None and (id(n), nr) in outputs:
                inner.add((id(n), nr))
            stack.append(n)
    return inner
