"""A ``torch.compile`` backend that installs an activation memory budget and a knapsack solver for
one model only, and records what the partitioner decided and which graphs it produced.

    backend = memplan_backend(budget=0.5, solver="dp", inner="aot_eager")
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    backend.regions[0].decision.reason      # "solved", "budget_1", "aggressive_fits", ...
    backend.regions[0].fw_graph             # the partitioned forward graph (torch.fx.GraphModule)

Scope: ``activation_memory_budget`` and ``activation_memory_budget_solver`` are patched with
``torch._functorch.config.patch`` *inside* the backend call (compilation is lazy: it happens at the
first forward), together with ``torch.compiler.config.force_disable_caches`` so that no AOTAutograd or
FX-graph cache entry made under another budget is reused. Nothing stays changed afterwards.

Regions: dynamo calls the backend once per compiled region (a graph break makes several); each call
appends one :class:`RegionCapture` to ``backend.regions``, in call order.

Recompile limit: dynamo keeps at most ``torch._dynamo.config.recompile_limit`` compiled versions per
code object, then runs eagerly without calling any backend; every ``memplan_backend`` is a new backend,
so compile a fresh function per plan (as :func:`lightning_memplan.forecast` does) or reset dynamo.

Faults: recording never breaks compilation. Anything that goes wrong while capturing lands in
``RegionCapture.errors`` and ``MemplanBackend.errors``, and the compiled code is returned as usual.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.fx as fx
import torch.nn as nn

from lightning_memplan._torch import compat as _compat
from lightning_memplan.forecasting.allocations import AllocEvent, share_inputs
from lightning_memplan.forecasting.fx import forward_nodes, node_flops

__all__ = [
    "INNER_BACKENDS",
    "SOLVER_NAMES",
    "KnapsackRecord",
    "MemplanBackend",
    "PartitionDecision",
    "RegionCapture",
    "ScheduleEstimate",
    "SolverFn",
    "memplan_backend",
    "resolve_solver",
]

#: torch's solver signature: ``(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)``.
SolverFn = Callable[[list[float], list[float], float], tuple[float, list[int], list[int]]]

#: Names accepted by ``solver=`` (see :func:`lightning_memplan.solvers.get_solver`).
SOLVER_NAMES: tuple[str, ...] = ("greedy", "dp", "hirschberg", "ilp", "remat")
"""Solver names: the four knapsack solvers of :mod:`lightning_memplan.solvers`, and ``"remat"``:
whole-graph rematerialization (:mod:`lightning_memplan.core.remat`), which decides every forward value
(not only the knapsack's candidates) and hands the plan to the partitioner as recompute tags."""

#: Accepted ``inner=`` values; ``"aot_eager_decomp_partition"`` is an alias of ``"aot_eager"``.
INNER_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "aot_eager_decomp_partition")

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


# --------------------------------------------------------------------------- validation
def _check_budget(budget: object, call: str) -> float:
    ok = isinstance(budget, (int, float)) and not isinstance(budget, bool) and math.isfinite(budget)
    if not ok or not 0.0 <= float(budget) <= 1.0:  # type: ignore[arg-type]
        raise ValueError(
            f"`{call}(budget={budget!r})` is not a valid activation memory budget. Expected a float "
            "in [0.0, 1.0]: 1.0 keeps torch's runtime-optimal plan, 0.0 recomputes all it can."
        )
    return float(budget)  # type: ignore[arg-type]


def resolve_solver(solver: str | SolverFn, call: str = "memplan_backend") -> tuple[str, SolverFn]:
    """``(name, function)`` for a solver name in :data:`SOLVER_NAMES` or a user callable.

    Names resolve through :func:`lightning_memplan.solvers.get_solver`. A callable must have torch's
    solver signature (:data:`SolverFn`); its name is its qualified name.
    """
    if callable(solver) and not isinstance(solver, str):
        name = f"{getattr(solver, '__module__', '')}.{getattr(solver, '__qualname__', type(solver).__name__)}"
        return name, solver
    if not isinstance(solver, str) or solver not in SOLVER_NAMES:
        raise ValueError(
            f"`{call}(solver={solver!r})` is not a known solver. Expected one of "
            f"{', '.join(repr(s) for s in SOLVER_NAMES)}, or a callable "
            "`(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)`."
        )
    from lightning_memplan.solvers import get_solver

    # "remat" partitions at budget 1.0 (its tags decide), so no knapsack is ever posed to it
    return solver, get_solver("dp" if solver == "remat" else solver)


def _check_inner(inner: object, call: str, arg: str = "inner") -> Literal["inductor", "aot_eager"]:
    if inner not in INNER_BACKENDS:
        raise ValueError(
            f"`{call}({arg}={inner!r})` is not a supported backend. Expected one of "
            f"{', '.join(repr(s) for s in INNER_BACKENDS)}."
        )
    return "inductor" if inner == "inductor" else "aot_eager"


# --------------------------------------------------------------------------- records
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


# --------------------------------------------------------------------------- FLOPs
# --------------------------------------------------------------------------- solver adapter
@functools.lru_cache(maxsize=None)
def _adapter_class() -> type:
    base = _compat.custom_knapsack_solver_base()

    class _MemplanKnapsackSolver(base):  # type: ignore[misc, valid-type]
        """``CustomKnapsackSolver`` that computes runtimes (FLOPs) itself and calls our solver."""

        def __init__(self, name: str, fn: SolverFn, budget: float) -> None:
            self.name, self.fn, self.budget = name, fn, budget
            self.region: RegionCapture | None = None

        def __call__(self, memory: list[float], joint_graph: Any, max_memory: float,
                     node_info: Any, all_recomputable_banned_nodes: list[fx.Node]) -> tuple[list[int], list[int]]:
            nodes = list(all_recomputable_banned_nodes)
            runtimes = [float(node_flops(n)) for n in nodes]
            value, saved, recomputed = self.fn(list(memory), runtimes, float(max_memory))
            saved, recomputed = [int(i) for i in saved], [int(i) for i in recomputed]
            if self.region is not None:
                self.region._solver_called = True
                try:
                    self.region.knapsack = KnapsackRecord(
                        solver=self.name,
                        names=tuple(n.name for n in nodes),
                        sizes_bytes=tuple(_compat.size_of_node(n) for n in nodes),
                        memory=tuple(float(m) for m in memory),
                        runtimes=tuple(runtimes),
                        max_memory=float(max_memory),
                        value=float(value),
                        saved_idx=tuple(saved),
                        recomputed_idx=tuple(recomputed),
                    )
                except Exception as err:  # noqa: BLE001
                    self.region.errors.append(f"knapsack record: {type(err).__name__}: {err}")
            return saved, recomputed

        def uuid(self) -> Any:
            # part of the AOTAutograd cache key: a different solver or budget is a different plan
            return ("lightning_memplan", self.name, repr(self.budget))

    return _MemplanKnapsackSolver


# --------------------------------------------------------------------------- graph snapshots
def _snapshot(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm``'s graph whose nodes share ``meta`` values (FakeTensors, hence storages)
    with the original; taken before inductor's passes rewrite the graph."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return _compat.lazy_graph_module(gm, graph)


def _cleared(r: RegionCapture) -> RegionCapture:
    """``r`` with its partition record emptied: a later partitioner call on the same region (the main
    graph after a higher-order op's subgraph) replaces the record."""
    r.fw_graph = r.bw_graph = r.decision = r.knapsack = None
    r._min_cuts, r._solver_called, r.errors = [], False, []
    return r


def _note_remat(region: RegionCapture, budget: float, sol: Any) -> None:
    """Record that whole-graph rematerialization decided ``region``'s partition at ``budget``."""
    d = region.decision
    region.decision = PartitionDecision(
        budget=budget, reason="remat", solver_called=True,
        saved_names=d.saved_names if d else (), saved_bytes=d.saved_bytes if d else sol.saved_bytes,
        min_act_bytes=d.min_act_bytes if d else -1, max_act_bytes=d.max_act_bytes if d else -1)


def _decide(region: RegionCapture, budget: float, saved: list[fx.Node]) -> PartitionDecision:
    def nbytes(nodes: Sequence[fx.Node]) -> int:
        return sum(_compat.size_of_node(n) for n in nodes)

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


def _copy_joint(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of a joint graph module the partitioner may rewrite (dead code, CSE, recompute tags):
    new graph and nodes with shallow-copied ``meta`` (FakeTensors shared with the original)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's pytree codegen deep copy (LeafSpec)
        graph = copy.deepcopy(gm.graph)
    new = _compat.lazy_graph_module(gm, graph)
    new.meta = dict(getattr(gm, "meta", {}))
    return new


def _owner(stack: dict[str, Any], blocks: Sequence[str], module_names: dict[str, str]) -> str | None:
    """The block of ``blocks`` a node was traced in, from its ``nn_module_stack``: keys are the
    modules' ids in torch 2.13; otherwise the values' source paths are matched by their ending
    (``L['model'].blocks.0``, or ``L['model'].blocks[0]`` with the index in brackets)."""
    for key, value in stack.items():
        name = module_names.get(str(key))
        if name in blocks:
            return name
        path = value[0] if isinstance(value, tuple) and value and isinstance(value[0], str) else ""
        path = re.sub(r"\[(\d+)\]", r".\1", path)
        for block in blocks:
            if path == block or path.endswith("." + block):
                return block
    return None


def _tag_checkpointed(gm: fx.GraphModule, blocks: Sequence[str], module_names: dict[str, str]) -> int:
    """Tag the forward nodes traced inside ``blocks`` as ``torch.utils.checkpoint`` does under
    ``torch.compile`` (``recompute = PREFER_RECOMPUTE`` and one ``ac_graph_id`` per block), so the
    partitioner recomputes them as if those blocks were checkpointed. Returns the nodes tagged."""
    from torch.utils.checkpoint import CheckpointPolicy

    graph_ids = {b: 10_000 + i for i, b in enumerate(blocks)}
    tagged = 0
    for node in forward_nodes(gm):
        owner = _owner(node.meta.get("nn_module_stack") or {}, blocks, module_names)
        if owner is not None:
            node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
            node.meta["ac_graph_id"] = graph_ids[owner]
            tagged += 1
    return tagged


SweepKey = tuple[tuple[str, ...], float]
"""(checkpointed blocks, budget): one plan partitioned in a sweep."""


# --------------------------------------------------------------------------- the backend
def _share_saved_inputs(
    replay: _compat.WrapperReplay, events: list[AllocEvent], fw_graph: fx.GraphModule
) -> tuple[list[AllocEvent], list[int], list[int], int]:
    """The backward wrapper's replay with its saved activations counted as the forward's storages.

    A saved value is a backward input named after the forward node that made it. Values the forward
    saved as views of one storage (q, k and v of one qkv buffer) are one allocation; a view of a
    forward input (a primal) is no allocation. See :func:`lightning_memplan.forecasting.allocations.share_inputs`.
    Returns the events, marks, timeline (bytes) and the freeable input bytes (tangents excluded).
    """
    from lightning_memplan.forecasting.estimator import GraphStorages

    fws = GraphStorages(fw_graph.graph)
    owner: dict[Any, Any] = {}
    sizes: dict[Any, int] = {}
    for name, sid in replay.inputs.items():
        keys = fws.produced.get(name)
        if not keys or name.startswith(_compat.NONFREEABLE_PREFIXES):
            continue
        key = keys[0]
        owner[sid] = None if key in fws.input_keys else key
        sizes[key] = fws.nbytes[key]
    new_events, marks, timeline = share_inputs(events, replay.marks, owner, sizes)
    counted = sum(e.nbytes for e in new_events[: marks[0]] if e.op == "alloc") if marks else 0
    return new_events, marks, timeline, counted - replay.tangents


class MemplanBackend:
    """A dynamo backend (``torch.compile(model, backend=...)``); build it with :func:`memplan_backend`.

    Public results: ``regions`` (one :class:`RegionCapture` per compiled region, in order) and
    ``errors`` (capture failures of all regions, as strings; compilation went on).
    """

    def __init__(self, *, budget: float, solver_name: str, solver_fn: SolverFn,
                 inner: Literal["inductor", "aot_eager"], capture: bool,
                 sweep: tuple[float, ...] = (), sweep_checkpoints: tuple[tuple[str, ...], ...] = (),
                 module_names: dict[str, str] | None = None, run_checkpoint: tuple[str, ...] = (),
                 sweep_remat: tuple[float, ...] = ()) -> None:
        self.budget = budget
        self.solver_name = solver_name
        self.inner = inner
        self.capture = capture
        self.regions: list[RegionCapture] = []
        self._solver = _adapter_class()(solver_name, solver_fn, budget)
        #: Budgets partitioned besides (or including) ``budget`` on the same joint graph.
        self.sweep = sweep
        #: Checkpoint sets emulated on the same joint graph (each with every budget).
        self.sweep_checkpoints = sweep_checkpoints
        self._module_names = dict(module_names or {})
        #: Blocks whose checkpointing is emulated in the plan that is compiled and run (with ``budget``).
        self.run_checkpoint = run_checkpoint
        budgets = tuple(dict.fromkeys((budget, *sweep)))
        sets = tuple(dict.fromkeys(((), *sweep_checkpoints, run_checkpoint)))
        keys = [(ck, b) for ck in sets for b in budgets if (ck, b) != (run_checkpoint, budget)]
        self._sweep_solvers = {b: _adapter_class()(solver_name, solver_fn, b) for b in budgets if keys}
        self._sweep_regions: dict[SweepKey, list[RegionCapture]] = {k: [] for k in keys}
        #: Whether the compiled plan is whole-graph rematerialization (solver ``"remat"``) at ``budget``.
        self.remat = solver_name == "remat"
        #: Budgets of whole-graph rematerialization plans partitioned on the same joint graph.
        self.sweep_remat = sweep_remat
        self._remat_regions: dict[float, list[RegionCapture]] = {
            b: [] for b in sweep_remat if not (self.remat and b == budget)}
        self._remat_solver = _adapter_class()(solver_name, solver_fn, 1.0)
        # the region the partitioner probes report to while a sweep plan is partitioned
        self._probe_region: RegionCapture | None = None
        # the joint graph being partitioned (region, call, checkpoint set): min cuts are memoized per
        # scope while a sweep partitions copies of one graph; None outside sweeps
        self._min_cut_scope: tuple[int, int, tuple[str, ...]] | None = None
        self._partition_calls: dict[int, int] = {}
        #: Indices of the regions called while ``recording`` is on, in call order (capture only). A
        #: region that runs several times in a step appears each time: one compiled block called in
        #: a loop with a graph break in it, or one FSDP unit's forward per ``fully_shard``ed module.
        self.executions: list[int] = []
        #: Whether calls of the compiled regions are appended to ``executions``.
        self.recording = False
        #: Called at each recorded call; its results, aligned with ``executions``, go to ``owners``
        #: (e.g. the FSDP unit whose forward is running).
        self.call_owner: Callable[[], int | None] | None = None
        self.owners: list[int | None] = []
        #: While recording: ``{(position j, position i): bytes}`` of position ``i``'s outputs that
        #: were live when position ``j``'s backward started and freed when it ended (``j`` held them
        #: last: an input it saved, released at its last read). Positions index ``executions``.
        self.early_frees: dict[tuple[int, int], int] = {}
        self._position_outputs: dict[int, list[tuple[Any, int]]] = {}

    def sweep_regions(self, budget: float, checkpoint: Sequence[str] = ()) -> list[RegionCapture]:
        """The regions captured for a sweep plan, one per compiled region, in order: the backend's
        own plan (``run_checkpoint``, ``budget``) gives ``regions`` (graphs as compiled and run); any
        other plan gives the partitioner's output for it on the same joint graph (never run)."""
        key = (tuple(checkpoint), budget)
        if key == (self.run_checkpoint, self.budget):
            return self.regions
        if key not in self._sweep_regions:
            raise KeyError(f"plan (budget {budget!r}, checkpoint {tuple(checkpoint)!r}) is not in this backend's "
                           f"sweep (budgets {self.sweep!r}, checkpoint sets {self.sweep_checkpoints!r})")
        return self._sweep_regions[key]

    def remat_regions(self, budget: float) -> list[RegionCapture]:
        """The regions captured for the whole-graph rematerialization plan at ``budget`` (one of
        ``sweep_remat``, or the backend's own when its solver is ``"remat"``), as :meth:`sweep_regions`."""
        if self.remat and budget == self.budget:
            return self.regions
        if budget not in self._remat_regions:
            raise KeyError(f"remat plan (budget {budget!r}) is not in this backend's sweep_remat {self.sweep_remat!r}")
        return self._remat_regions[budget]

    @property
    def errors(self) -> list[str]:
        return [f"region {r.index}: {e}" for r in self.regions for e in r.errors]

    def __repr__(self) -> str:
        sweep = f", sweep={self.sweep!r}" if self.sweep else ""
        return (f"MemplanBackend(budget={self.budget!r}, solver={self.solver_name!r}, "
                f"inner={self.inner!r}{sweep}, regions={len(self.regions)})")

    # -- probes (each failure is recorded, never raised) --
    def _probes(self, region: RegionCapture) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if not self.capture:
            return stack

        def on_min_cut(node_info: Any, result: Any) -> None:
            r = self._probe_region or region
            try:
                r._min_cuts.append((_compat.node_inputs_of(node_info), list(result[0])))
            except Exception as err:  # noqa: BLE001
                r.errors.append(f"min-cut probe: {type(err).__name__}: {err}")

        def on_choose(budget: float, saved: list[fx.Node]) -> None:
            r = self._probe_region or region
            try:
                r.decision = _decide(r, budget, saved)
            except Exception as err:  # noqa: BLE001
                r.errors.append(f"decision: {type(err).__name__}: {err}")

        try:
            stack.enter_context(_compat.probe_partitioner(on_min_cut, on_choose, lambda: self._min_cut_scope))
        except RuntimeError as err:
            region.errors.append(f"partitioner probe unavailable: {err}")
        return stack

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        import time

        t0 = time.perf_counter()
        region = RegionCapture(index=len(self.regions))
        region.param_inputs = tuple(not isinstance(e, torch.Tensor) or isinstance(e, nn.Parameter)
                                    for e in example_inputs)
        trainable = {_compat.storage_key(e): e.untyped_storage().nbytes() for e in example_inputs
                     if isinstance(e, nn.Parameter) and e.requires_grad}
        region.param_grad_bytes = int(sum(trainable.values()))
        region.param_grad_max = int(max(trainable.values(), default=0))
        region.param_ids = frozenset(id(e) for e in example_inputs if isinstance(e, nn.Parameter) and e.requires_grad)
        for pos, e in enumerate(example_inputs):
            if isinstance(e, nn.Parameter) and e.requires_grad:
                region.param_at.setdefault(pos, set()).add(id(e))
        self.regions.append(region)
        for regions in (*self._sweep_regions.values(), *self._remat_regions.values()):
            regions.append(RegionCapture(index=region.index))
        fconfig = _compat.functorch_config()
        self._solver.region = region
        with contextlib.ExitStack() as stack:
            # a remat plan partitions at budget 1.0: its recompute tags decide, torch's knapsack must not
            stack.enter_context(fconfig.patch(activation_memory_budget=1.0 if self.remat else self.budget,
                                              activation_memory_budget_solver=self._solver,
                                              **_compat.opaque_handles_patch()))
            stack.enter_context(_compat.force_disable_caches_patch())
            stack.enter_context(self._probes(region))
            try:
                if self.inner == "inductor":
                    compiled = self._inductor(gm, example_inputs, region)
                else:
                    compiled = self._aot_eager(gm, example_inputs, region)
            finally:
                region.compile_seconds += time.perf_counter() - t0
        return self._counted(compiled, region.index) if self.capture else compiled

    def _counted(self, fn: Callable[..., Any], index: int) -> Callable[..., Any]:
        """``fn`` (region ``index``'s compiled forward), appending ``index`` to ``executions`` at
        each call while ``recording``."""
        executions, owners = self.executions, self.owners

        def memplan_region(*args: Any, **kwargs: Any) -> Any:
            if not self.recording:
                return fn(*args, **kwargs)
            position = len(executions)
            executions.append(index)
            owners.append(self.call_owner() if self.call_owner is not None else None)
            region = self.regions[index]  # a graph that serves several blocks reads each block's parameters
            read = [(pos, id(a)) for pos, a in enumerate(args) if isinstance(a, nn.Parameter) and a.requires_grad]
            region.param_ids = region.param_ids | {i for _, i in read}
            for pos, i in read:
                region.param_at.setdefault(pos, set()).add(i)
            out = fn(*args, **kwargs)
            try:
                self._watch_outputs(position, out)
            except Exception as err:  # noqa: BLE001 - no early frees for this call
                self.regions[index].errors.append(f"output lifetimes not watched: {type(err).__name__}: {err}")
            return out

        return memplan_region

    def _watch_outputs(self, position: int, out: Any) -> None:
        """Note the storages of the outputs of the region call at ``position`` and hook its
        backward node: which earlier calls' outputs die while it runs (:attr:`early_frees`)."""
        leaves = [t for t in _compat.tree_leaves(out) if isinstance(t, torch.Tensor)]
        unique = {_compat.storage_key(t): t for t in leaves}
        self._position_outputs[position] = [(_compat.storage_weakref(t), int(t.untyped_storage().nbytes()))
                                            for t in unique.values()]
        node = next((t.grad_fn for t in leaves
                     if t.grad_fn is not None and "CompiledFunction" in t.grad_fn.name()), None)
        if node is None:
            return
        live: list[tuple[int, Any, int]] = []
        outputs, frees = self._position_outputs, self.early_frees

        def before(grad_outputs: Any) -> None:
            live[:] = [(i, ref, n) for i in range(position) for ref, n in outputs.get(i, ()) if not ref.expired()]

        def after(grad_inputs: Any, grad_outputs: Any) -> None:
            for i, ref, n in live:
                if ref.expired():
                    frees[(position, i)] = frees.get((position, i), 0) + n
            live.clear()

        node.register_prehook(before)
        node.register_hook(after)

    def _record_graph(self, region: RegionCapture, gm: fx.GraphModule, is_backward: bool) -> None:
        if not self.capture:
            return
        try:
            snap = _snapshot(gm)
            if is_backward:
                region.bw_graph = snap
            else:
                region.fw_graph = snap
        except Exception as err:  # noqa: BLE001
            region.errors.append(f"{'backward' if is_backward else 'forward'} graph snapshot: "
                                 f"{type(err).__name__}: {err}")

    def _aot_eager(self, gm: fx.GraphModule, example_inputs: Sequence[Any], region: RegionCapture) -> Callable[..., Any]:
        boxed_nop = _compat.boxed_nop()

        def make(is_backward: bool) -> Callable[..., Any]:
            def compiler(g: fx.GraphModule, ex: Sequence[Any]) -> Callable[..., Any]:
                import time

                t0 = time.perf_counter()
                self._record_graph(region, g, is_backward)
                region.capture_seconds += time.perf_counter() - t0
                return boxed_nop(g, ex)
            return compiler

        fconfig = _compat.functorch_config()
        with fconfig.patch(unlift_effect_tokens=True):
            return _compat.aot_autograd()(
                fw_compiler=make(False),
                bw_compiler=make(True),
                decompositions=_compat.select_decomp_table(),
                partition_fn=self._partition_fn(region),
            )(gm, example_inputs)

    def _partition_fn(self, region: RegionCapture) -> Callable[..., Any]:
        """The min-cut partitioner; with a sweep, it also partitions a copy of the joint graph under
        every other sweep budget (same config scope, that budget's solver adapter, the same probes)
        and records each (forward, backward) pair and decision; the own budget's partition runs."""
        partition = functools.partial(_compat.min_cut_rematerialization_partition(), compiler="inductor")
        if not self._sweep_regions and not self._remat_regions and not self.remat:
            return partition

        def partition_fn(joint: fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
            import time

            copies: dict[SweepKey, fx.GraphModule] = {}
            for key in self._sweep_regions:
                r = _cleared(self._sweep_regions[key][region.index])
                try:
                    copies[key] = gm = _copy_joint(joint)
                    if key[0] and not _tag_checkpointed(gm, key[0], self._module_names):
                        del copies[key]
                        r.errors.append(f"sweep checkpoint {key[0]!r}: no forward node was traced inside "
                                        "these blocks (no nn_module_stack names them)")
                except Exception as err:  # noqa: BLE001
                    copies.pop(key, None)
                    r.errors.append(f"sweep plan {key!r}: joint graph copy: {type(err).__name__}: {err}")
            remat_copies: dict[float, fx.GraphModule] = {}
            for b in self._remat_regions:
                r = _cleared(self._remat_regions[b][region.index])
                try:
                    remat_copies[b] = _copy_joint(joint)
                except Exception as err:  # noqa: BLE001
                    r.errors.append(f"remat plan {b!r}: joint graph copy: {type(err).__name__}: {err}")
            call = self._partition_calls[region.index] = self._partition_calls.get(region.index, -1) + 1
            run_ck = self.run_checkpoint
            if run_ck and not _tag_checkpointed(joint, run_ck, self._module_names):
                region.errors.append(f"run checkpoint {run_ck!r}: no forward node was traced inside these "
                                     "blocks; the run plan is not checkpointed")
            bounds: dict[str, Any] = {}  # the rematerialization bounds of this joint graph, solved once
            self._min_cut_scope = (region.index, call, (f"remat:{self.budget!r}",) if self.remat else run_ck)
            try:
                out = (self._partition_remat(partition, joint, joint_inputs, kw, region, bounds) if self.remat
                       else partition(joint, joint_inputs, **kw))
            finally:
                self._min_cut_scope = None
            fconfig = _compat.functorch_config()
            # a plan whose partitioner found nothing more to recompute gives the same partition
            # under every lower budget: (budget, region) where that happened, per checkpoint set
            floor: dict[tuple[str, ...], tuple[float, RegionCapture]] = {}
            for (ck, b), gm in copies.items():
                t0 = time.perf_counter()
                r = self._sweep_regions[(ck, b)][region.index]
                if ck in floor and b <= floor[ck][0]:
                    same = floor[ck][1]
                    r.fw_graph, r.bw_graph, r.knapsack = same.fw_graph, same.bw_graph, same.knapsack
                    r.decision = dataclasses.replace(same.decision, budget=b) if same.decision else None
                    continue
                adapter = self._sweep_solvers[b]
                adapter.region = r
                self._probe_region = r
                self._min_cut_scope = (region.index, call, ck)
                try:
                    with fconfig.patch(activation_memory_budget=b, activation_memory_budget_solver=adapter):
                        r.fw_graph, r.bw_graph = partition(gm, joint_inputs, **kw)
                except Exception as err:  # noqa: BLE001 - a sweep plan must not break the compile
                    r.errors.append(f"sweep plan (budget {b!r}, checkpoint {ck!r}): partition: "
                                    f"{type(err).__name__}: {err}")
                finally:
                    self._probe_region = None
                    self._min_cut_scope = None
                    adapter.region = None
                    r.compile_seconds += time.perf_counter() - t0
                if r.decision is not None and r.decision.reason == "nothing_recomputable" and not r.errors:
                    floor[ck] = (b, r)
            for b, gm in remat_copies.items():
                t0 = time.perf_counter()
                r = self._remat_regions[b][region.index]
                self._remat_solver.region = r
                self._probe_region = r
                self._min_cut_scope = (region.index, call, (f"remat:{b!r}",))
                try:
                    sol = self._tag_remat(gm, b, r, bounds)
                    if sol is not None:
                        with fconfig.patch(activation_memory_budget=1.0,
                                           activation_memory_budget_solver=self._remat_solver):
                            r.fw_graph, r.bw_graph = partition(gm, joint_inputs, **kw)
                        _note_remat(r, b, sol)
                except Exception as err:  # noqa: BLE001 - a sweep plan must not break the compile
                    r.errors.append(f"remat plan (budget {b!r}): partition: {type(err).__name__}: {err}")
                finally:
                    self._probe_region = None
                    self._min_cut_scope = None
                    self._remat_solver.region = None
                    r.compile_seconds += time.perf_counter() - t0
            return out

        return partition_fn

    def _partition_remat(self, partition: Callable[..., Any], joint: fx.GraphModule, joint_inputs: Any,
                         kw: dict[str, Any], region: RegionCapture, bounds: dict[str, Any]) -> Any:
        """The compiled plan's partition under solver ``"remat"``: tag ``joint`` at ``budget``,
        partition it, record the decision (untagged, torch's budget 1.0, if the MILP failed)."""
        sol = self._tag_remat(joint, self.budget, region, bounds)
        out = partition(joint, joint_inputs, **kw)
        if sol is not None:
            _note_remat(region, self.budget, sol)
        return out

    @staticmethod
    def _tag_remat(gm: fx.GraphModule, budget: float, region: RegionCapture, bounds: dict[str, Any]) -> Any:
        """Tag ``gm`` with the rematerialization plan at ``budget``; on failure the error is recorded
        and None returned (the graph then partitions untagged: torch's plan at budget 1.0)."""
        import time

        from lightning_memplan.forecasting.remat_graph import tag_remat

        t0 = time.perf_counter()
        try:
            return tag_remat(gm, budget, bounds)
        except Exception as err:  # noqa: BLE001 - planning must not break the compile
            region.errors.append(f"remat plan (budget {budget!r}): {type(err).__name__}: {err}; "
                                 "partitioned as torch's budget 1.0")
            return None
        finally:
            region.capture_seconds += time.perf_counter() - t0

    def _inductor(self, gm: fx.GraphModule, example_inputs: Sequence[Any], region: RegionCapture) -> Callable[..., Any]:
        compile_fx_inner = _compat.compile_fx_inner()
        capture = self.capture

        def on_schedule(peak: int, timeline: list[int], freeable: int, is_backward: bool, seconds: float,
                        origins: list[tuple[str, ...]]) -> None:
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

        def on_plan(replay: _compat.WrapperReplay | None, is_backward: bool, seconds: float) -> None:
            region.capture_seconds += seconds
            if replay is None or not replay.timeline:
                region.errors.append("inductor wrapper replay failed")
                return
            events = [AllocEvent(op, sid, n, dev) for op, sid, n, dev in replay.events]  # type: ignore[arg-type]
            timeline, marks, freeable = list(replay.timeline), list(replay.marks), replay.freeable
            if is_backward and region.fw_graph is not None:
                t0 = time.perf_counter()
                try:
                    events, marks, timeline, freeable = _share_saved_inputs(replay, events, region.fw_graph)
                except Exception as err:  # noqa: BLE001 - keep the replay as it was
                    region.errors.append(f"saved activations not matched to the forward: {type(err).__name__}: {err}")
                region.capture_seconds += time.perf_counter() - t0
            est = ScheduleEstimate(peak_bytes=max(timeline), timeline=tuple(timeline),
                                   freeable_input_bytes=freeable, seconds=seconds,
                                   origins=tuple(replay.origins[1:]), events=tuple(events), marks=tuple(marks),
                                   tangent_keys=frozenset(sid for name, sid in replay.inputs.items()
                                                          if name.startswith(_compat.TANGENT_PREFIX)))
            if is_backward:
                region.bw_wrapper = est
            else:
                region.fw_wrapper = est

        def inner(g: fx.GraphModule, ex: Sequence[Any], **kw: Any) -> Any:
            import time

            t0 = time.perf_counter()
            is_backward = bool(kw.get("is_backward", False))
            if kw.get("graph_id") is not None:
                region.graph_id = int(kw["graph_id"])
            self._record_graph(region, g, is_backward)
            region.capture_seconds += time.perf_counter() - t0
            with contextlib.ExitStack() as stack:
                # the backward compiles lazily, outside the backend call: scope caches again
                stack.enter_context(_compat.force_disable_caches_patch())
                if capture:
                    try:
                        stack.enter_context(_compat.probe_inductor_schedule(on_schedule))
                    except RuntimeError as err:
                        region.errors.append(f"inductor schedule probe unavailable: {err}")
                    try:
                        stack.enter_context(_compat.probe_inductor_wrapper(on_plan))
                    except RuntimeError as err:
                        region.errors.append(f"inductor wrapper probe unavailable: {err}")
                t1 = time.perf_counter()
                try:
                    return compile_fx_inner(g, ex, **kw)
                finally:
                    if is_backward:  # the forward is timed by the backend call around it
                        region.compile_seconds += time.perf_counter() - t1

        if not self.remat:
            return _compat.compile_fx()(gm, example_inputs, inner_compile=inner)

        def with_remat(partition: Callable[..., Any]) -> Callable[..., Any]:
            def partition_fn(joint: fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
                return self._partition_remat(partition, joint, joint_inputs, kw, region, {})
            return partition_fn

        with _compat.inductor_partitioner(with_remat):
            return _compat.compile_fx()(gm, example_inputs, inner_compile=inner)


def memplan_backend(
    *,
    budget: float = 1.0,
    solver: str | SolverFn = "dp",
    inner: str = "inductor",
    capture: bool = True,
    sweep: Sequence[float] = (),
    sweep_checkpoints: Sequence[Sequence[str]] = (),
    model: nn.Module | None = None,
    run_checkpoint: Sequence[str] = (),
    sweep_remat: Sequence[float] = (),
) -> MemplanBackend:
    """A ``torch.compile`` backend with this activation memory budget and knapsack solver.

    Args:
        budget: activation memory budget, a ratio in [0, 1] (torch's ``activation_memory_budget``).
        solver: a name in :data:`SOLVER_NAMES` or a callable with torch's solver signature.
        inner: ``"inductor"`` (codegen) or ``"aot_eager"`` (alias ``"aot_eager_decomp_partition"``:
            inductor's decompositions and min-cut partitioner, eager kernels).
        capture: record graphs, decisions and estimates (``False``: only install budget and solver).
        sweep: further budgets to partition the same joint graph under (``inner="aot_eager"`` only):
            one trace, one partition per budget, the own ``budget``'s runs; read each budget's
            captures with :meth:`MemplanBackend.sweep_regions`.
        sweep_checkpoints: sets of ``model``'s submodules (qualified names) to emulate activation
            checkpointing of, each partitioned under the own budget and every sweep budget: the
            forward nodes traced inside them are tagged as ``torch.utils.checkpoint`` tags them
            under ``torch.compile``. Needs ``model`` (the module compiled), an uncheckpointed trace
            and ``inner="aot_eager"``.
        model: the module compiled; only used to name submodules for ``sweep_checkpoints``.
        run_checkpoint: blocks whose checkpointing is emulated (the same tags) in the plan that is
            compiled and run, e.g. every block, so a sweep's one real step needs the least memory.
        sweep_remat: budgets of whole-graph rematerialization plans (solver ``"remat"``) to partition
            the same joint graph under besides; read each with :meth:`MemplanBackend.remat_regions`.
            Needs ``inner="aot_eager"``.

    With ``solver="remat"`` the compiled plan itself is whole-graph rematerialization at
    ``budget`` (see :mod:`lightning_memplan.core.remat`); ``sweep``, ``sweep_checkpoints`` and
    ``run_checkpoint`` are knapsack plans and are refused then.

    Raises:
        ValueError: a budget outside [0, 1], an unknown solver name or backend, a sweep with inductor
            or without capture.
        RuntimeError: torch older than 2.11 (no ``CustomKnapsackSolver``).
    """
    b = _check_budget(budget, "memplan_backend")
    name, fn = resolve_solver(solver, "memplan_backend")
    kind = _check_inner(inner, "memplan_backend")
    sw = tuple(dict.fromkeys(_check_budget(x, "memplan_backend") for x in sweep))
    cks = _check_checkpoint_sets(sweep_checkpoints, model, "memplan_backend", "sweep_checkpoints")
    if isinstance(run_checkpoint, str):
        raise ValueError(f"`memplan_backend(run_checkpoint={run_checkpoint!r})` must be a sequence of submodule "
                         f"names, e.g. ({run_checkpoint!r},).")
    run_ck = _check_checkpoint_sets([tuple(run_checkpoint)], model, "memplan_backend", "run_checkpoint")
    if isinstance(sweep_remat, (int, float)):
        raise ValueError(f"`memplan_backend(sweep_remat={sweep_remat!r})` must be a sequence of budgets in [0, 1].")
    rm = tuple(dict.fromkeys(_check_budget(x, "memplan_backend") for x in sweep_remat))
    if name == "remat":
        for arg, given in (("sweep", sw), ("sweep_checkpoints", cks), ("run_checkpoint", run_ck)):
            if given:
                raise ValueError(f"`memplan_backend(solver='remat', {arg}=...)`: {arg} plans use a knapsack "
                                 "solver; with solver='remat' sweep remat budgets with `sweep_remat`.")
    # every sweep option partitions copies of the joint graph and captures them: aot_eager, capture on
    for arg, given, used in (("sweep", sweep, sw), ("sweep_checkpoints", sweep_checkpoints, cks),
                             ("run_checkpoint", run_checkpoint, run_ck), ("sweep_remat", sweep_remat, rm)):
        if used and (kind != "aot_eager" or not capture):
            raise ValueError(f"`memplan_backend({arg}={tuple(given)!r})` needs inner='aot_eager' and capture=True "
                             f"(got inner={inner!r}, capture={capture!r}).")
    named = cks or run_ck
    names = {str(id(m)): n for n, m in model.named_modules()} if named and model is not None else {}
    _compat.check_torch_version()
    return MemplanBackend(budget=b, solver_name=name, solver_fn=fn, inner=kind, capture=capture, sweep=sw,
                          sweep_checkpoints=cks, module_names=names, run_checkpoint=run_ck[0] if run_ck else (),
                          sweep_remat=rm)


def _check_checkpoint_sets(sets: Sequence[Sequence[str]], model: nn.Module | None, call: str,
                           arg: str = "checkpoint_sets") -> tuple[tuple[str, ...], ...]:
    """Validated non-empty checkpoint sets (the empty set, no checkpointing, is always planned)."""
    if isinstance(sets, str) or not isinstance(sets, Sequence) or any(
            isinstance(s, str) or not isinstance(s, Sequence) or not all(isinstance(n, str) for n in s) for s in sets):
        raise ValueError(f"`{call}({arg}={sets!r})` must be a sequence of sequences of submodule names, "
                         "e.g. [(), ('blocks.0', 'blocks.1')].")
    out = tuple(dict.fromkeys(tuple(s) for s in sets if len(s)))
    if not out:
        return out
    if model is None:
        raise ValueError(f"`{call}({arg}={sets!r})` needs the model, to name its submodules.")
    known = {n for n, _ in model.named_modules()}
    missing = sorted({n for s in out for n in s} - known)
    if missing:
        raise ValueError(f"`{call}({arg}=...)`: {missing!r} are not submodules of the model; use names "
                         f"from `model.named_modules()`, e.g. {sorted(known - {''})[:4]!r}.")
    return out
