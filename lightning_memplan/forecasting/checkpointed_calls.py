"""Activation checkpointing of blocks compiled on their own (``regional``), emulated on one trace.

A block compiled on its own runs one graph per call, shared by the blocks alike. Wrapped in
``torch.utils.checkpoint``, a block's call runs the same graph with its whole forward recomputed in
backward: the partition of that graph with every forward node tagged
(:data:`~lightning_memplan.forecasting.sweep.WHOLE_REGION`). So a checkpoint set of such blocks
needs no trace of its own: the step is the traced one, with the calls made by the set's blocks
running the checkpointed partition of their graph instead of the plain one. Which block made a
call is known from the trainable parameters it read (:attr:`CompiledStep.call_params`).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from lightning_memplan.forecasting.capture import RegionCapture
from lightning_memplan.forecasting.compile_step import CompiledStep

__all__ = ["with_checkpointed_calls"]


def with_checkpointed_calls(run: CompiledStep, plain: Sequence[RegionCapture], whole: Sequence[RegionCapture],
                            blocks: Mapping[str, frozenset[int]]) -> tuple[list[RegionCapture], CompiledStep]:
    """The regions and recorded run of the step with ``blocks`` checkpointed.

    ``plain``: the plan's captures, one per compiled region (index = position); ``whole``: the same
    regions partitioned with their whole forward checkpointed, at the same budget; ``blocks``:
    ``{qualified name: ids of its trainable parameters}``. Each call ``run`` recorded whose
    parameters all belong to one of ``blocks`` runs a copy of its region's ``whole`` capture,
    appended after ``plain`` (one per region, whatever the number of calls, its ``index`` numbered
    on from ``plain``'s); the other calls are unchanged, and a region of ``plain`` no call runs any
    more is left out. The positions of the calls are kept, so ``run.early`` and ``run.owners`` still apply.

    Raises:
        ValueError: the run recorded no parameters per call; a block made no compiled call or
            several (the graph broke inside it: a checkpointed block is traced whole); the frame of
            a region it ran mutates Python objects, or may (``mutations`` not ``()``: dynamo traces
            such a checkpointed block with its side effects kept apart, and the emulation is not
            exact for it: a transformers Llama, one of its two layers checkpointed, 2.9% off the
            wrapped trace at budget 0.5); or the checkpointed partition of that region failed.
    """
    if len(run.call_params) != len(run.executions):
        raise ValueError("the compiling run did not record the parameters each call read")
    made: dict[int, str] = {}
    for position, params in enumerate(run.call_params):
        owner = next((name for name, own in blocks.items() if params and params <= own), None)
        if owner is not None:
            made[position] = owner
    counts = Counter(made.values())
    for name in blocks:
        if counts[name] != 1:
            raise ValueError(f"block {name!r} made {counts[name]} compiled calls in the step, not one: its "
                             "checkpointing is traced with the block wrapped")
    regions = list(plain)
    copies: dict[int, int] = {}
    executions = list(run.executions)
    for position in sorted(made):
        index = executions[position]
        if index not in copies:
            if plain[index].mutations != ():
                kinds = "unknown objects" if plain[index].mutations is None else ", ".join(plain[index].mutations)
                raise ValueError(f"the graph of block {made[position]!r} mutates Python objects ({kinds}; e.g. a "
                                 "context variable it sets): its checkpointing is traced with the block wrapped")
            capture = whole[index]
            if capture.fw_graph is None or capture.errors:
                why = "; ".join(capture.errors) or "no forward graph"
                raise ValueError(f"region {index} partitioned with its forward checkpointed: {why}")
            copies[index] = len(regions)
            regions.append(dataclasses.replace(capture, index=len(regions)))
        executions[position] = copies[index]
    gone = set(run.executions) - set(executions)  # graphs only the set's blocks ran: no longer run
    return [r for r in regions if r.index not in gone], dataclasses.replace(run, executions=tuple(executions))
