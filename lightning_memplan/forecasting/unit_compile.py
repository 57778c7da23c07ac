"""Compile each FSDP2 unit's forward on its own, as torchtitan and Lightning's FSDP2 guides do, and
the repeated blocks of a regional compile (``blocks``) likewise.

FSDP2 (``fully_shard``) runs hooks around every unit's call that dynamo does not trace (a
``torch._dynamo.disable``-d function), so each unit call breaks the graph. A model's forward that
calls its units in a loop (``for block in self.layers: h = block(h)``) then has a graph break
inside a loop, and dynamo skips the whole frame: it runs eagerly, and only the frames it calls
are offered to dynamo again. A unit whose class is user code is then compiled as a frame of its
own; one of torch's classes (``nn.TransformerEncoderLayer``) is not, because dynamo never starts
tracing at a frame in torch's own files. Nothing of such a model was compiled, so no plan could
change anything.

:class:`UnitCompile` gives each unit (every FSDP2 module inside the compiled model, not the model
itself) an instance-level ``forward`` that calls the unit's current ``forward`` through one
compiled function, for as long as it is installed. FSDP's hooks still run around the unit's call,
eagerly, as they would anyway; the compiled graph sees the unit's unsharded parameters. Every unit
shares that one compiled function (a fresh code object per :class:`UnitCompile`, so a new plan never
meets an old cache entry): units of one class share its graph as they would as frames of their own.
A ``forward`` already set on the instance (activation checkpointing's wrapper) is what is called,
so checkpointed units are compiled checkpointed.

Regional compilation (``blocks``: modules without FSDP2, e.g. the layers of a transformer) does the
same for modules no hook separates from their caller: each block's call goes through a
``torch._dynamo.disable``-d function, so the caller's graph breaks there (dynamo would otherwise
inline the block, and the nested compiled function with it, into the caller's graph), and the block
runs in the one compiled function shared by every block. Identical blocks then run ONE compiled
graph (partitioned once, its activation memory budget applied to one block's graph); the code
around them (a stem, a head) compiles as regions of its own, resumed after the break
(``with_dynamo_settings``). A block that reads a constant of its own (transformers' layers
pass their ``layer_idx`` to a KV cache) compiles a graph of its own: still planned and forecast,
but not shared.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lightning_memplan._torch.dynamo import breaking_call
from lightning_memplan.core.instance_patch import instance_attributes

__all__ = ["UnitCompile", "fsdp2_unit_modules"]


def fsdp2_unit_modules(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 (``fully_shard``) modules inside ``model``, in ``named_modules`` order, without
    ``model`` itself (it is compiled as the whole); ``[]`` without FSDP2."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    return [m for m in model.modules() if m is not model and isinstance(m, FSDPModule)]


def _call_unit(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return forward(*args, **kwargs)


def _regional_call(compiled: Callable[..., Any], forward: Callable[..., Any], graphs: int) -> Callable[..., Any]:
    """``forward`` called through ``compiled`` from a frame dynamo does not trace (a caller being
    compiled breaks its graph there), with room for ``graphs`` compiled graphs: blocks that read a
    constant of their own (a KV cache's layer index) compile a graph each, and past dynamo's
    recompile limit the rest would run eagerly."""
    return breaking_call(functools.partial(compiled, forward), recompile_limit=graphs)


class UnitCompile:
    """One compiled function through which ``model``'s FSDP2 units run their forwards.

    Built once per plan; :meth:`installed` puts the units' ``forward`` attributes in place for the
    duration of a block and restores whatever was there before. Without FSDP2 units it installs
    nothing (``units`` is empty).

    Args:
        model: the module compiled as a whole (the LightningModule or its planned submodule).
        backend: the dynamo backend of the whole (the same plan and the same region recording).
        compile_kwargs: ``torch.compile`` options of the whole (``dynamic``, ``isolate_recompiles``).
        blocks: further modules inside ``model`` compiled on their own (regional compilation);
            FSDP2 units among them are units already.
    """

    def __init__(self, model: nn.Module, backend: Any, compile_kwargs: dict[str, Any],
                 blocks: Sequence[nn.Module] = ()) -> None:
        from lightning_memplan.core.fresh_code import fresh_function

        fsdp = fsdp2_unit_modules(model)
        self._regional = tuple(b for b in dict.fromkeys(blocks) if b is not model and b not in fsdp)
        self.units: tuple[nn.Module, ...] = (*fsdp, *self._regional)
        self._compiled = torch.compile(fresh_function(_call_unit), backend=backend, **compile_kwargs)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Within the block, each unit's ``forward`` runs compiled (nested blocks are fine: an
        installed unit is left as it is)."""
        todo = [unit for unit in self.units if not self._installed_on(unit)]  # nested blocks: once
        with instance_attributes([(u, "forward", self._call(u)) for u in todo]):
            yield

    def _call(self, unit: nn.Module) -> Callable[..., Any]:
        """``unit``'s forward through this compile. A forward another ``UnitCompile`` installed (the
        training compile, while a forecast at new input shapes compiles the plan again) is replaced
        by the unit's own forward: compiled inside the other's graph, it would not be captured."""
        forward = getattr(unit.__dict__.get("forward"), "__memplan_forward__", unit.forward)
        call: Any
        if any(unit is b for b in self._regional):
            call = _regional_call(self._compiled, forward, 2 * len(self.units) + 8)
        else:
            call = functools.partial(self._compiled, forward)
        call.__memplan_unit__ = self._compiled
        call.__memplan_forward__ = forward
        return call

    def _installed_on(self, unit: nn.Module) -> bool:
        current = unit.__dict__.get("forward")
        return getattr(current, "__memplan_unit__", None) is self._compiled
