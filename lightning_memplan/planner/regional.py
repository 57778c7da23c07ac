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

A graph break inside a loop makes dynamo run the frame that loops eagerly (it compiles the frames
that frame calls, but not torch's own modules). So the modules that frame calls beside the blocks
(an embedding, a final norm, a head: :func:`modules_beside`) are compiled on their own too; only
the glue code of the looping frame itself (an add of two embeddings) stays eager.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import nn

from lightning_memplan.planner.checkpointing import repeated_blocks

__all__ = ["RegionalFlag", "check_regional_flag", "modules_beside", "regional_blocks", "wants_regional"]

RegionalFlag = bool | Literal["auto"]
"""``True``, ``False``, or ``"auto"``: regional when the plan is searched (``budget="auto"``)."""


def check_regional_flag(regional: object, call: str) -> RegionalFlag:
    """``regional`` if it is ``True``, ``False`` or ``"auto"``; else a ValueError naming ``call``."""
    if regional is True or regional is False or regional == "auto":
        return regional  # type: ignore[return-value]
    raise ValueError(f"`{call}(regional={regional!r})` is not valid. Expected True (compile the repeated blocks, "
                     "e.g. a transformer's layers, each on its own), False (compile the module whole) or 'auto' "
                     "(each on its own when the plan is searched, budget='auto').")


def wants_regional(regional: RegionalFlag, searching: bool) -> bool:
    """Whether the repeated blocks are to be compiled each on its own: ``regional`` itself, or for
    ``"auto"``, whether the plan is searched. The search forecasts many candidates: on the whole
    model each partitions the joint graph of every block (its cost grows with depth), on the blocks
    compiled each on its own it partitions one graph per distinct block, whatever the depth. A
    given budget is torch's ratio of the whole module's graph, compiled whole as the user set it."""
    return searching if regional == "auto" else bool(regional)


def _is_container(module: nn.Module) -> bool:
    """A module without a forward of its own (``nn.ModuleList``, ``nn.ModuleDict``)."""
    return type(module).forward is nn.Module.forward


def modules_beside(module: nn.Module, blocks: Sequence[str]) -> list[str]:
    """Qualified names of the submodules the frame that loops over ``blocks`` calls besides them:
    the children of the blocks' nearest ancestor with a forward of its own (the module whose
    ``forward`` loops; containers such as ``nn.ModuleDict`` on the way looked into) that hold
    parameters or buffers and are no block and lead to none; in ``named_modules`` order."""
    if not blocks:
        return []
    path = blocks[0].split(".")[:-1]
    while path and _is_container(module.get_submodule(".".join(path))):
        path.pop()
    looping = ".".join(path)
    on_the_way = {".".join(b.split(".")[:k]) for b in blocks for k in range(1, b.count(".") + 1)}
    beside: list[str] = []

    def visit(prefix: str, parent: nn.Module) -> None:
        for name, child in parent.named_children():
            qualified = prefix + name
            if qualified in blocks:
                continue
            if qualified in on_the_way or _is_container(child):
                visit(qualified + ".", child)
            elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
                beside.append(qualified)

    visit(f"{looping}." if looping else "", module.get_submodule(looping))
    return beside


def regional_blocks(module: nn.Module, regional: bool) -> tuple[str, ...]:
    """Qualified names of ``module``'s submodules to compile on their own: its repeated blocks
    (:func:`~lightning_memplan.planner.checkpointing.repeated_blocks`) and the modules beside them
    (:func:`modules_beside`) when ``regional`` and it has repeated blocks, else ``()``."""
    blocks = repeated_blocks(module) if regional else []
    return (*blocks, *modules_beside(module, blocks)) if blocks else ()
