"""What the backend records for each compiled region: the partitioner's decision, the knapsack it
posed, inductor's memory estimates and the captured graphs (:class:`RegionCapture`), and the
helpers that fill those records from the partitioner's and inductor's observations.

Units: bytes, unless a field says otherwise. Records are plain data, read after one training step.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch.fx as fx

from lightning_memplan._torch.inductor_wrapper import NONFREEABLE_PREFIXES, TANGENT_PREFIX, WrapperReplay
from lightning_memplan._torch.partitioner import size_of_node
from lightning_memplan.core.remat import RematSolution
from lightning_memplan.forecasting.allocations import AllocEvent, share_inputs
from lightning_memplan.forecasting.estimator import GraphStorages

__all__ = [
    "REASON_WORDS",
    "DecisionReason",
    "KnapsackRecord",
    "PartitionDecision",
    "RegionCapture",
    "ScheduleEstimate",
    "cleared",
    "decide",
    "frame_of",
    "note_remat",
    "record_schedule",
    "record_wrapper",
    "share_saved_inputs",
]

#: Why the partitioner did or did not call the solver:
#:  ``"budget_0"``: budget 0 saves only the forward inputs (no solve).
#:  ``"budget_1"``: budget 1 keeps the runtime-optimal min-cut (no solve).
#:  ``"min_cut_below_inputs"``: the runtime-optimal min-cut saves no more than the inputs (no solve).
#:  ``"more_aggressive_fits"``: the min-cut with fewer bans already fits the budget (no solve).
#:  ``"aggressive_fits"``: the aggressive min-cut already fits the budget (no solve).
#:  ``"nothing_recomputable"``: no node left to recompute (no solve).
#:  ``"solved"``: the solver chose what to save.
#:  ``"remat"``: whole-graph rematerialization chose what to save (solver ``"remat"``).
#:  ``"unknown"``: the partitioner was not observed (e.g. an inference graph, or a probe failed).
DecisionReason = Literal[
    "budget_0", "budget_1", "min_cut_below_inputs", "more_aggressive_fits", "aggressive_fits",
    "nothing_recomputable", "solved", "remat", "unknown",
]

#: Each :data:`DecisionReason` in words, for people reading a plan table.
REASON_WORDS: dict[str, str] = {
    "budget_0": "budget 0: only the forward's inputs are saved, the rest recomputed",
    "budget_1": "budget 1: torch's fastest choice of what to save is kept, there is nothing to solve",
    "min_cut_below_inputs": "torch's fastest choice already saves no more than the forward's inputs",
    "more_aggressive_fits": "recomputing only cheap ops already fits the budget",
    "aggressive_fits": "recomputing every cheap op already fits the budget",
    "nothing_recomputable": "nothing in this graph can be recomputed",
    "solved": "the knapsack solver chose what to save",
    "remat": "whole-graph rematerialization chose what to save",
    "unknown": "the partitioner was not observed",
}


@dataclass(frozen=True, kw_only=True)
class KnapsackRecord:
    """One knapsack problem the partitioner posed, and the solver's answer.

    Item ``i`` is the recomputable node ``names[i]``. Invariant: ``saved_idx`` and
    ``recomputed_idx`` partition ``range(len(names))``.
    """

    #: Solver name (or a callable's qualified name).
    solver: str
    #: Names of the candidate nodes in the joint graph (largest first, the partitioner's order).
    names: tuple[str, ...]
    #: Bytes of each candidate's output.
    sizes_bytes: tuple[int, ...]
    #: Normalized memory of each candidate (bytes / (max - min activation bytes)), as given to the solver.
    memory: tuple[float, ...]
    #: FLOPs of each candidate (``flop_registry`` on ``meta["val"]``; 1 for ops without a formula).
    runtimes: tuple[float, ...]
    #: The budget, in normalized memory (``max_memory`` given to the solver).
    max_memory: float
    #: Summed runtime (FLOPs) of the saved items, as the solver returned it.
    value: float
    saved_idx: tuple[int, ...]
    recomputed_idx: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class PartitionDecision:
    """What the min-cut partitioner did for one region under a budget."""

    #: The activation memory budget in force (a ratio in [0, 1]).
    budget: float
    #: Which branch decided (see :data:`DecisionReason`).
    reason: str
    #: Whether the knapsack solver was called.
    solver_called: bool
    #: Names of the values the forward saves for the backward (the partitioner's choice).
    saved_names: tuple[str, ...]
    #: Bytes of those values according to the partitioner (``_size_of``): the solver's own estimate
    #: of activation memory.
    saved_bytes: int
    #: Bytes of the forward inputs (what budget 0 saves); ``-1`` when not observed.
    min_act_bytes: int
    #: Bytes saved by the runtime-optimal min-cut (budget 1); ``-1`` when not observed.
    max_act_bytes: int


@dataclass(frozen=True, kw_only=True)
class ScheduleEstimate:
    """Inductor's memory estimate of one graph: the scheduler's (fused nodes, final order) or a replay
    of the generated wrapper's allocations (after buffer reuse).

    Bytes above the graph's non-freeable inputs (primals; for the scheduler's estimate, tangents too);
    ``freeable_input_bytes`` are the inputs inductor may free (in a backward graph: the saved
    activations), included in ``timeline`` (``timeline[0]`` is before the first step,
    ``timeline[-1]`` after the last). The wrapper's replay also counts the tangents
    (``tangent_keys``).
    """

    peak_bytes: int
    timeline: tuple[int, ...]
    freeable_input_bytes: int
    #: Seconds spent computing this estimate inside inductor's compile.
    seconds: float = 0.0
    #: FX node names step ``i`` (``timeline[i]`` for the scheduler, ``timeline[i + 1]`` for the
    #: wrapper) was lowered from; may be empty.
    origins: tuple[tuple[str, ...], ...] = ()
    #: The wrapper's allocations and frees in order (storage ids as keys; the freeable inputs first);
    #: empty for the scheduler's estimate.
    events: tuple[AllocEvent, ...] = ()
    #: ``marks[i]``: how many of ``events`` had happened when ``timeline[i]`` was recorded.
    marks: tuple[int, ...] = ()
    #: Keys (in ``events``) of the incoming gradients (tangents) of a backward wrapper's replay,
    #: counted in ``timeline`` from the start and freed where the wrapper deletes them; empty for
    #: the scheduler's estimate, which counts no tangent.
    tangent_keys: frozenset[int] = frozenset()


@dataclass(kw_only=True)
class RegionCapture:
    """Everything recorded for one compiled region. Filled while compiling (the backward graph
    arrives at the first backward); read it after one training step."""

    #: Position of this region in the order dynamo compiled them (0, 1, ...).
    index: int
    #: torch's graph id for the region's AOT graphs (inductor only; ``None`` otherwise).
    graph_id: int | None = None
    fw_graph: fx.GraphModule | None = None
    bw_graph: fx.GraphModule | None = None
    decision: PartitionDecision | None = None
    knapsack: KnapsackRecord | None = None
    #: Inductor's scheduler estimate (fused nodes, final order), forward and backward.
    fw_schedule: ScheduleEstimate | None = None
    bw_schedule: ScheduleEstimate | None = None
    #: Replay of the allocations inductor's generated wrapper makes (buffer reuse included).
    fw_wrapper: ScheduleEstimate | None = None
    bw_wrapper: ScheduleEstimate | None = None
    #: Per graph input (in order): whether it is a parameter (or not a tensor) rather than an
    #: activation; ``None`` when unknown.
    param_inputs: tuple[bool, ...] | None = None
    #: Per graph input (in order): whether its storage is an output of an earlier region call of
    #: the same step, in any recorded call of the graph (seen at the compile and at each call while
    #: the backend recorded); ``None`` when unknown.
    chain_inputs: tuple[bool, ...] | None = None
    #: Bytes of the trainable parameters among the graph inputs (unique storages): the gradients
    #: the backward returns for them; and the largest one's.
    param_grad_bytes: int = 0
    param_grad_max: int = 0
    #: ``id``s of the trainable parameters the region read, at its compile and at every call while
    #: the backend recorded (the module's own ``nn.Parameter`` objects; a graph that serves every
    #: block reads each block's).
    param_ids: frozenset[int] = frozenset()
    #: ``id``s of the trainable parameters seen at each graph input position, at the compile and
    #: at every call while the backend recorded (see :meth:`gradless_param_ids`).
    param_at: dict[int, set[int]] = field(default_factory=dict)
    #: Kinds of the Python objects (not tensors) the region's frame mutates, one per object
    #: (:func:`~lightning_memplan._torch.dynamo.frame_mutations`): a KV cache a block appends to;
    #: ``None`` when unknown.
    mutations: tuple[str, ...] | None = None
    #: Wall seconds of the backend call (forward compile) plus inductor's backward compile.
    compile_seconds: float = 0.0
    #: Seconds spent recording inside that time (graph snapshots, inductor schedule estimates).
    capture_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    # partitioner observations, consumed when the decision is made
    _min_cuts: list[tuple[list[fx.Node], list[fx.Node]]] = field(default_factory=list, repr=False)
    _solver_called: bool = field(default=False, repr=False)

    def gradless_param_ids(self) -> frozenset[int]:
        """``id``s of the trainable parameters at graph inputs the backward graph returns no
        gradient for (its output there is ``None``: the forward read them under
        ``torch.no_grad()``, or only to compute something that does not require grad). Empty when
        unknown (no backward graph captured, or its outputs do not line up with the inputs)."""
        out = next((n for n in self.bw_graph.graph.nodes if n.op == "output"), None) if self.bw_graph else None
        grads = out.args[0] if out is not None and out.args else None
        if not isinstance(grads, (tuple, list)) or self.param_inputs is None or len(grads) != len(self.param_inputs):
            return frozenset()
        return frozenset(i for pos, g in enumerate(grads) if g is None for i in self.param_at.get(pos, ()))


def cleared(r: RegionCapture) -> RegionCapture:
    """``r`` with its partition record emptied: a later partitioner call on the same region (the main
    graph after a higher-order op's subgraph) replaces the record."""
    r.fw_graph = r.bw_graph = r.decision = r.knapsack = None
    r._min_cuts, r._solver_called, r.errors = [], False, []
    return r


def frame_of(r: RegionCapture, own: RegionCapture) -> RegionCapture:
    """A copy of ``r`` (a plan partitioned on the joint graph ``own`` was compiled from) with what
    ``own`` recorded of the frame and the graph's inputs: which inputs are parameters or outputs of
    earlier calls, the parameters read, the objects the frame mutates. They are the same under
    every plan of one joint graph; only the compiled region sees them (at its compile and at every
    recorded call)."""
    return dataclasses.replace(r, param_inputs=own.param_inputs, chain_inputs=own.chain_inputs,
                               param_grad_bytes=own.param_grad_bytes, param_grad_max=own.param_grad_max,
                               param_ids=own.param_ids, param_at=own.param_at, mutations=own.mutations)


def note_remat(region: RegionCapture, budget: float, sol: RematSolution) -> None:
    """Record that whole-graph rematerialization (``sol``) decided ``region``'s partition at ``budget``;
    the saved values stay the partitioner's when it was observed."""
    d = region.decision
    region.decision = PartitionDecision(
        budget=budget, reason="remat", solver_called=True,
        saved_names=d.saved_names if d else (), saved_bytes=d.saved_bytes if d else sol.saved_bytes,
        min_act_bytes=d.min_act_bytes if d else -1, max_act_bytes=d.max_act_bytes if d else -1)


def decide(region: RegionCapture, budget: float, saved: list[fx.Node]) -> PartitionDecision:
    """The partitioner's decision for ``region`` at ``budget`` from its observed min-cuts and whether
    the solver was called; ``saved``: the nodes the partition saves for the backward."""

    def nbytes(nodes: Sequence[fx.Node]) -> int:
        return sum(size_of_node(n) for n in nodes)

    cuts = region._min_cuts
    min_b = nbytes(cuts[0][0]) if cuts else -1
    max_b = nbytes(cuts[0][1]) if cuts else -1
    if budget == 0:
        reason = "budget_0"
    elif region._solver_called:
        reason = "solved"
    elif budget == 1:
        reason = "budget_1"
    elif len(cuts) == 1:
        reason = "min_cut_below_inputs"
    elif len(cuts) == 2:
        reason = "more_aggressive_fits"
    elif len(cuts) >= 3:
        ratio = (nbytes(cuts[2][1]) - min_b) / max(max_b - min_b, 1)
        reason = "aggressive_fits" if ratio < budget else "nothing_recomputable"
    else:
        reason = "unknown"
    return PartitionDecision(
        budget=budget, reason=reason, solver_called=region._solver_called,
        saved_names=tuple(n.name for n in saved), saved_bytes=nbytes(saved),
        min_act_bytes=min_b, max_act_bytes=max_b,
    )


def share_saved_inputs(
    replay: WrapperReplay, events: list[AllocEvent], fw_graph: fx.GraphModule
) -> tuple[list[AllocEvent], list[int], list[int], int]:
    """The backward wrapper's replay with its saved activations counted as the forward's storages.

    A saved value is a backward input named after the forward node that made it. Values the forward
    saved as views of one storage (q, k and v of one qkv buffer) are one allocation; a view of a
    forward input (a primal) is no allocation. See :func:`lightning_memplan.forecasting.allocations.share_inputs`.
    Returns the events, marks, timeline (bytes) and the freeable input bytes (tangents excluded).
    """
    fws = GraphStorages(fw_graph.graph)
    owner: dict[Any, Any] = {}
    sizes: dict[Any, int] = {}
    for name, sid in replay.inputs.items():
        keys = fws.produced.get(name)
        if not keys or name.startswith(NONFREEABLE_PREFIXES):
            continue
        key = keys[0]
        owner[sid] = None if key in fws.input_keys else key
        sizes[key] = fws.nbytes[key]
    new_events, marks, timeline = share_inputs(events, replay.marks, owner, sizes)
    counted = sum(e.nbytes for e in new_events[: marks[0]] if e.op == "alloc") if marks else 0
    return new_events, marks, timeline, counted - replay.tangents


def record_schedule(region: RegionCapture, peak: int, timeline: list[int], freeable: int, is_backward: bool,
                    seconds: float, origins: list[tuple[str, ...]]) -> None:
    """Record inductor's scheduler estimate of one of ``region``'s graphs (``fw_schedule`` or
    ``bw_schedule``; bytes, see :class:`ScheduleEstimate`); ``peak < 0``: the estimate failed, noted in
    ``errors``. ``seconds`` it took are added to ``capture_seconds``."""
    region.capture_seconds += seconds
    if peak < 0:
        region.errors.append("inductor schedule estimate failed")
        return
    est = ScheduleEstimate(peak_bytes=peak, timeline=tuple(timeline), freeable_input_bytes=freeable,
                           seconds=seconds, origins=tuple(origins))
    if is_backward:
        region.bw_schedule = est
    else:
        region.fw_schedule = est


def record_wrapper(region: RegionCapture, replay: WrapperReplay | None, is_backward: bool,
                   seconds: float) -> None:
    """Record the replay of the allocations of inductor's generated wrapper for one of ``region``'s
    graphs (``fw_wrapper`` or ``bw_wrapper``; a backward's saved activations counted as the forward's
    storages, :func:`share_saved_inputs`); no replay: the failure is noted in ``errors``. ``seconds``
    (and the matching's) are added to ``capture_seconds``."""
    region.capture_seconds += seconds
    if replay is None or not replay.timeline:
        region.errors.append("inductor wrapper replay failed")
        return
    events = [AllocEvent(op, sid, n, dev) for op, sid, n, dev in replay.events]  # type: ignore[arg-type]
    timeline, marks, freeable = list(replay.timeline), list(replay.marks), replay.freeable
    if is_backward and region.fw_graph is not None:
        t0 = time.perf_counter()
        try:
            events, marks, timeline, freeable = share_saved_inputs(replay, events, region.fw_graph)
        except Exception as err:  # noqa: BLE001 - keep the replay as it was
            region.errors.append(f"saved activations not matched to the forward: {type(err).__name__}: {err}")
        region.capture_seconds += time.perf_counter() - t0
    est = ScheduleEstimate(peak_bytes=max(timeline), timeline=tuple(timeline),
                           freeable_input_bytes=freeable, seconds=seconds,
                           origins=tuple(replay.origins[1:]), events=tuple(events), marks=tuple(marks),
                           tangent_keys=frozenset(sid for name, sid in replay.inputs.items()
                                                  if name.startswith(TANGENT_PREFIX)))
    if is_backward:
        region.bw_wrapper = est
    else:
        region.fw_wrapper = est
