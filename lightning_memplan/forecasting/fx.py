"""Small readings of FX graphs: the forward part of a joint graph, a node's FLOPs, the modules a
node was traced in."""
from __future__ import annotations

import re
from typing import Any

import torch.fx as fx

from lightning_memplan._torch.partitioner import flop_registry
from lightning_memplan._torch.storages import tree_map

__all__ = ["forward_nodes", "module_path", "node_flops"]


def forward_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The joint graph's forward ``call_function`` nodes: those no tangent input flows into."""
    backward: set[fx.Node] = set()
    for node in gm.graph.nodes:  # topological order: users come after their inputs
        if (node.op == "placeholder" and node.name.startswith("tangents")) or any(
                a in backward for a in node.all_input_nodes):
            backward.add(node)
    return [n for n in gm.graph.nodes if n.op == "call_function" and n not in backward]


def node_flops(node: fx.Node) -> int:
    """FLOPs of ``node`` from ``torch.utils.flop_counter.flop_registry`` on its inputs' ``meta["val"]``.

    Ops without a formula (pointwise, views) count 1, like torch's ``estimate_runtime`` in "flops"
    mode. Needs no dispatch, so it works inside the partitioner's ``no_dispatch()``.
    """
    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry().get(packet) if packet is not None else None
    if formula is None:
        return 1

    def unwrap(a: object) -> object:
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    try:
        args, kwargs = tree_map(unwrap, (node.args, node.kwargs))
        return max(int(formula(*args, **kwargs, out_val=node.meta.get("val"))), 1)
    except Exception:  # noqa: BLE001 - an unusual signature must not break the partitioner
        return 1


def module_path(key: object, value: Any) -> str:
    """The source path of one ``nn_module_stack`` entry (``(path, type)`` values, or the key on a
    torch that keys by path), list indices written ``.0`` (``L['model'].blocks[0]`` ->
    ``L['model'].blocks.0``)."""
    path = value[0] if isinstance(value, tuple) and value and isinstance(value[0], str) else str(key)
    return re.sub(r"\[(\d+)\]", r".\1", path)
