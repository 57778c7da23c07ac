"""Regional compilation: which blocks of a module are compiled on their own.

A transformer's layers are one block class repeated. Compiled on its own, each layer's call breaks
the caller's graph, and layers alike (the same class and shapes, reading no constant of their own)
run ONE compiled graph: it is traced, partitioned and forecast once whatever the depth, so both the
compile and the plan search cost about the same for 16 layers as for 4 (PyTorch's regional
compilation recipe: ``for layer in model.layers: layer.compile()``). The activation memory
budget is then torch's ratio applied to one layer's graph (and to the stem's and the head's
graphs on their own), not to one graph of the whole model. Layers that read a constant of their
own (transformers' pass their ``layer_idx`` to a KV cache) compile a graph each: planned and
forecast all the same, without the saving.
"""
from __future__ import annotations

from torch import nn

from lightning_memplan.planner.checkpointing import repeated_blocks

__all__ = ["check_regional", "regional_blocks"]


def check_regional(regional: object, call: str) -> bool:
    """``regional`` if it is ``True`` or ``False``; else a ValueError naming ``call``."""
    if regional is True or regional is False:
        return regional
    raise ValueError(f"`{call}(regional={regional!r})` is not valid. Expected True (compile the repeated blocks, "
                     "e.g. a transformer's layers, each on its own) or False (compile the module whole).")


def regional_blocks(module: nn.Module, regional: bool) -> tuple[str, ...]:
    """Qualified names of ``module``'s submodules to compile on their own: its repeated blocks
    (:func:`~lightning_memplan.planner.checkpointing.repeated_blocks`) when ``regional``, else
    ``()`` (also when it has none)."""
    return tuple(repeated_blocks(module)) if regional else ()
