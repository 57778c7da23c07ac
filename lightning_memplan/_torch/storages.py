"""Tensors, their storages and pytrees: a DTensor's local shard, a storage's identity and weak
reference, unique storage sizes, pytree maps and leaves, SymInt hints, and the dispatch-mode base
class that sees every op's tensors.

Storage keys are stable while the storage is alive (FakeTensors included); sizes are bytes. The
accessors of private symbols raise the :class:`RuntimeError` of
:func:`~lightning_memplan._torch.version.require` when this torch lacks them.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree

from lightning_memplan._torch.version import require

__all__ = [
    "concrete_int",
    "dispatch_mode_base",
    "held_tensors",
    "local_tensor",
    "storage_key",
    "storage_weak_ref",
    "storage_weakref",
    "tree_leaves",
    "tree_map",
    "tree_rebuilder",
    "unique_storages",
]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local shard (FSDP2, tensor parallelism), else ``t``."""
    to_local = getattr(t, "to_local", None)
    if to_local is not None and type(t).__name__ == "DTensor":
        return to_local()
    return t


def storage_key(t: torch.Tensor) -> int:
    """Identity of ``t``'s storage (stable while the storage is alive; FakeTensors included)."""
    return int(t.untyped_storage()._cdata)


def storage_weakref(t: torch.Tensor) -> Any:
    """A weak reference to ``t``'s storage (``torch.multiprocessing.reductions.StorageWeakRef``):
    ``.expired()`` once the storage is freed, ``.cdata`` its :func:`storage_key` while it is not."""
    return require("torch.multiprocessing.reductions", "StorageWeakRef")(t.untyped_storage())


def storage_weak_ref(storage: Any) -> Any:
    """A weak reference to an untyped storage with ``expired()``."""
    return require("torch.multiprocessing.reductions", "StorageWeakRef")(storage)


def unique_storages(tensors: Sequence[torch.Tensor], seen: set[int]) -> list[tuple[int, str]]:
    """(bytes, device type) of each storage not in ``seen`` (which it extends), in order; of a
    DTensor (FSDP2's sharded parameters, their gradients), this rank's local shard."""
    out: list[tuple[int, str]] = []
    for t in map(local_tensor, tensors):  # a DTensor: this rank's shard
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            out.append((int(t.untyped_storage().nbytes()), t.device.type))
    return out


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    return _pytree.tree_map(fn, tree)


def tree_rebuilder(tree: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """``tree``'s pytree leaves, and a function that builds a tree of the same structure from a
    list of as many leaves (a plain function: copies of an object holding it share it)."""
    leaves, spec = _pytree.tree_flatten(tree)
    return list(leaves), lambda new: _pytree.tree_unflatten(new, spec)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree``; traceable by dynamo (a default loss inside a compiled function calls
    it: no import happens at call time, so it adds no graph break)."""
    return list(_pytree.tree_leaves(tree))


def held_tensors(tree: Any, *, depth: int = 4) -> list[torch.Tensor]:
    """The tensors ``tree`` holds: its pytree leaves that are tensors, and those held in the
    attributes of its other leaves, objects pytree does not flatten (transformers' ``DynamicCache``
    keeps each layer's keys and values in ``cache.layers[i].keys``), down to ``depth`` objects deep;
    modules, classes and callables not entered. A tensor reached twice is listed twice. Traceable by
    dynamo (no ``id``, no sets): a stand-in loss inside a compiled function calls it."""
    found: list[torch.Tensor] = []
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, level = stack.pop()
        for leaf in _pytree.tree_leaves(node):
            if isinstance(leaf, torch.Tensor):
                found.append(leaf)
            elif (level < depth and hasattr(leaf, "__dict__") and not callable(leaf)
                  and not isinstance(leaf, (torch.nn.Module, type))):
                stack.append((list(leaf.__dict__.values()), level + 1))
    return found


def concrete_int(value: Any) -> int:
    """An int from an int or a (hinted) SymInt, without adding guards."""
    if isinstance(value, int):
        return value
    try:
        hint = importlib.import_module("torch.fx.experimental.symbolic_shapes").optimization_hint
        return int(hint(value, fallback=4096))
    except AttributeError:  # older torch: the SymNode carries the hint
        node_hint = getattr(getattr(value, "node", None), "hint", None)
        return int(node_hint) if node_hint is not None else 4096


def dispatch_mode_base() -> type:
    """``torch.utils._python_dispatch.TorchDispatchMode``."""
    return require("torch.utils._python_dispatch", "TorchDispatchMode")
