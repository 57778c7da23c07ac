"""A ``torch.compile`` backend that installs an activation memory budget and a knapsack solver for
one model only, and records what the partitioner decided and which graphs it produced.

    backend = memplan_backend(budget=0.5, solver="dp", inner="aot_eager")
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    backend.regions[0].decision.reason      # "solved", "budget_1", "aggressive_fits", ...
    backend.regions[0].fw_graph             # the partitioned forward graph (torch.fx.GraphModule)

Scope: ``activation_memory_budget`` and ``activation_memory_budget_solver`` are patched with
``torch._functorch.config.patch`` *inside* the backend call (compilation is lazy: it happens at the
first forward), together with AOTAutograd's and inductor's FX-graph caches off, so that no entry
made under another budget is reused (inductor's kernel cache stays on:
:func:`~lightning_memplan._torch.dynamo.graph_caches_off_patch`). Nothing stays changed afterwards.

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
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.fx as fx
import torch.nn as nn

from lightning_memplan._torch.autograd import in_backward
from lightning_memplan._torch.dynamo import frame_mutations, graph_caches_off_patch, lazy_graph_module
from lightning_memplan._torch.fake import running_nothing
from lightning_memplan._torch.inductor import (
    codegen_only,
    compile_fx,
    compile_fx_inner,
    inductor_partitioner,
    probe_inductor_schedule,
)
from lightning_memplan._torch.inductor_wrapper import probe_inductor_wrapper
from lightning_memplan._torch.partitioner import (
    aot_autograd,
    boxed_nop,
    functorch_config,
    min_cut_rematerialization_partition,
    node_inputs_of,
    opaque_handles_patch,
    probe_partitioner,
    random_ops_saved,
    select_decomp_table,
    stand_in_outputs_not_donated,
)
from lightning_memplan._torch.storages import held_tensors, storage_key, storage_weakref
from lightning_memplan._torch.version import check_torch_version
from lightning_memplan.forecasting.capture import (
    RegionCapture,
    decide,
    record_schedule,
    record_wrapper,
)
from lightning_memplan.forecasting.eager_glue import EagerGlue
from lightning_memplan.forecasting.solver_adapter import solver_adapter_class
from lightning_memplan.forecasting.sweep import WHOLE_REGION, PlanSweep, partition_remat
from lightning_memplan.forecasting.validate import (
    SolverFn,
    check_budget,
    check_budgets,
    check_checkpoint_sets,
    check_inner,
    resolve_solver,
)

__all__ = ["MemplanBackend", "memplan_backend"]



def _snapshot(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm``'s graph whose nodes share ``meta`` values (FakeTensors, hence storages)
    with the original; taken before inductor's passes rewrite the graph."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return lazy_graph_module(gm, graph)


class MemplanBackend:
    """A dynamo backend (``torch.compile(model, backend=...)``); build it with :func:`memplan_backend`.

    Public results: ``regions`` (one :class:`~lightning_memplan.forecasting.capture.RegionCapture` per
    compiled region, in order) and
    ``errors`` (capture failures of all regions, as strings; compilation went on).
    """

    def __init__(self, *, budget: float, solver_name: str, solver_fn: SolverFn,
                 inner: Literal["inductor", "aot_eager"], capture: bool,
                 sweep: tuple[float, ...] = (), sweep_checkpoints: tuple[tuple[str, ...], ...] = (),
                 module_names: dict[str, str] | None = None, run_checkpoint: tuple[str, ...] = (),
                 sweep_remat: tuple[float, ...] = (), whole_region: bool = False) -> None:
        self.budget = budget
        self.solver_name = solver_name
        self.inner = inner
        self.capture = capture
        self.regions: list[RegionCapture] = []
        self._solver = solver_adapter_class()(solver_name, solver_fn, budget)
        #: The plans partitioned besides this one on the same joint graphs (and the probes' scope).
        self._plans = PlanSweep(budget=budget, solver_name=solver_name, solver_fn=solver_fn, sweep=sweep,
                                sweep_checkpoints=sweep_checkpoints, module_names=module_names,
                                run_checkpoint=run_checkpoint, sweep_remat=sweep_remat, whole_region=whole_region)
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
        #: ``id``s of the trainable parameters each recorded call read (aligned with ``executions``):
        #: which block a call of a graph that serves several blocks ran for.
        self.call_params: list[frozenset[int]] = []
        #: While recording: ``{(position j, position i): bytes}`` of position ``i``'s outputs that
        #: were live when position ``j``'s backward started and freed when it ended (``j`` held them
        #: last: an input it saved, released at its last read). Positions index ``executions``.
        self.early_frees: dict[tuple[int, int], int] = {}
        #: While recording: ``{(position k, position i): bytes}`` of position ``i``'s outputs that
        #: died during the forward, after position ``k``'s call and before the next one: the eager
        #: code between calls dropped them (two embeddings' outputs summed in a frame that loops
        #: over blocks compiled on their own), or, for the last call, the code after it before the
        #: backward started (a KV cache in an output object the forward dropped). A storage two
        #: calls returned counts once, for the first.
        self.forward_frees: dict[tuple[int, int], int] = {}
        self._position_outputs: dict[int, list[tuple[Any, int]]] = {}
        #: While recording: what the eager code before each call made and something holds
        #: (:class:`~lightning_memplan.forecasting.eager_glue.EagerGlue`).
        self.glue = EagerGlue()
        #: Storage keys never counted as glue: the step's inputs, parameters and buffers (set by
        #: the caller before recording).
        self.step_storages: set[int] = set()
        self._output_keys: set[int] = set()  # storage keys of every recorded call's outputs
        self._forward_open = True  # no backward node of the recorded run has started yet
        #: Whether :attr:`forward_frees` and :attr:`glue` are recorded (set by the caller for
        #: regional compiles, whose looping frame runs eagerly between the regions).
        self.watch_eager_code = False
        #: Outputs not yet seen dead in the forward: (position, storage weakref, bytes, storage key).
        self._forward_live: list[tuple[int, Any, int, int]] = []

    def clear_recording(self) -> None:
        """Forget what the recorded calls noted (``executions``, ``owners``, ``call_params``, ``early_frees``,
        ``forward_frees``, ``glue`` and the outputs watched), before a run is recorded anew."""
        self.executions.clear()
        self.owners.clear()
        self.call_params.clear()
        self.early_frees.clear()
        self.forward_frees.clear()
        self.glue.clear()
        self._output_keys.clear()
        self._forward_open = True
        self._position_outputs.clear()
        self._forward_live.clear()

    def sweep_regions(self, budget: float, checkpoint: Sequence[str] = ()) -> list[RegionCapture]:
        """The regions captured for a sweep plan, one per compiled region, in order: the backend's
        own plan (``run_checkpoint``, ``budget``) gives ``regions`` (graphs as compiled and run); any
        other plan gives the partitioner's output for it on the same joint graph (never run)."""
        return self._plans.regions(budget, checkpoint, self.regions)

    def remat_regions(self, budget: float) -> list[RegionCapture]:
        """The regions captured for the whole-graph rematerialization plan at ``budget`` (one of
        ``sweep_remat``, or the backend's own when its solver is ``"remat"``), as :meth:`sweep_regions`."""
        return self._plans.remat_regions(budget, self.regions)

    def whole_region_regions(self, budget: float) -> list[RegionCapture]:
        """Each region partitioned at ``budget`` with its whole forward checkpointed (the backend
        built with ``whole_region=True``), as :meth:`sweep_regions`: the graph a block compiled on
        its own gives under ``torch.utils.checkpoint``."""
        return self._plans.regions(budget, WHOLE_REGION, self.regions)

    @property
    def sweep(self) -> tuple[float, ...]:
        """Budgets partitioned besides (or including) ``budget`` on the same joint graph."""
        return self._plans.sweep

    @property
    def sweep_checkpoints(self) -> tuple[tuple[str, ...], ...]:
        """Checkpoint sets emulated on the same joint graph (each with every budget)."""
        return self._plans.sweep_checkpoints

    @property
    def run_checkpoint(self) -> tuple[str, ...]:
        """Blocks whose checkpointing is emulated in the plan that is compiled and run (with ``budget``)."""
        return self._plans.run_checkpoint

    @property
    def remat(self) -> bool:
        """Whether the compiled plan is whole-graph rematerialization (solver ``"remat"``) at ``budget``."""
        return self._plans.remat

    @property
    def sweep_remat(self) -> tuple[float, ...]:
        """Budgets of whole-graph rematerialization plans partitioned on the same joint graph."""
        return self._plans.sweep_remat

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
            r = self._plans.probe_region or region
            try:
                r._min_cuts.append((node_inputs_of(node_info), list(result[0])))
            except Exception as err:  # noqa: BLE001
                r.errors.append(f"min-cut probe: {type(err).__name__}: {err}")

        def on_choose(budget: float, saved: list[fx.Node]) -> None:
            r = self._plans.probe_region or region
            try:
                r.decision = decide(r, budget, saved)
            except Exception as err:  # noqa: BLE001
                r.errors.append(f"decision: {type(err).__name__}: {err}")

        try:
            stack.enter_context(probe_partitioner(on_min_cut, on_choose, lambda: self._plans.min_cut_scope))
        except RuntimeError as err:
            region.errors.append(f"partitioner probe unavailable: {err}")
        return stack

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        t0 = time.perf_counter()
        region = RegionCapture(index=len(self.regions))
        region.param_inputs = tuple(not isinstance(e, torch.Tensor) or isinstance(e, nn.Parameter)
                                    for e in example_inputs)
        if self.recording:
            region.chain_inputs = self._chained(example_inputs)
        trainable = {storage_key(e): e.untyped_storage().nbytes() for e in example_inputs
                     if isinstance(e, nn.Parameter) and e.requires_grad}
        region.param_grad_bytes = int(sum(trainable.values()))
        region.param_grad_max = int(max(trainable.values(), default=0))
        region.param_ids = frozenset(id(e) for e in example_inputs if isinstance(e, nn.Parameter) and e.requires_grad)
        region.mutations = frame_mutations()
        for pos, e in enumerate(example_inputs):
            if isinstance(e, nn.Parameter) and e.requires_grad:
                region.param_at.setdefault(pos, set()).add(id(e))
        self.regions.append(region)
        self._plans.add_region(region.index)
        fconfig = functorch_config()
        self._solver.region = region
        with contextlib.ExitStack() as stack:
            # a remat plan partitions at budget 1.0: its recompute tags decide, torch's knapsack must not
            stack.enter_context(fconfig.patch(activation_memory_budget=1.0 if self.remat else self.budget,
                                              activation_memory_budget_solver=self._solver,
                                              **opaque_handles_patch()))
            stack.enter_context(graph_caches_off_patch())
            stack.enter_context(random_ops_saved())  # a recomputed dropout would draw another mask
            stack.enter_context(stand_in_outputs_not_donated())  # they are the user's outputs
            stack.enter_context(self._probes(region))
            try:
                if self.inner == "inductor":
                    compiled = self._inductor(gm, example_inputs, region)
                else:
                    compiled = self._aot_eager(gm, example_inputs, region)
            finally:
                region.compile_seconds += time.perf_counter() - t0
        return self._counted(compiled, region.index) if self.capture else compiled

    def _chained(self, inputs: Sequence[Any]) -> tuple[bool, ...]:
        """Per input: whether it is a tensor (not a parameter) whose storage is an output of one of
        the step's earlier region calls, still live."""
        earlier = {ref.cdata for outs in self._position_outputs.values() for ref, _ in outs if not ref.expired()}
        return tuple(isinstance(e, torch.Tensor) and not isinstance(e, nn.Parameter) and storage_key(e) in earlier
                     for e in inputs)

    def _counted(self, fn: Callable[..., Any], index: int) -> Callable[..., Any]:
        """``fn`` (region ``index``'s compiled forward), appending ``index`` to ``executions`` at
        each call while ``recording``."""
        executions, owners = self.executions, self.owners

        def memplan_region(*args: Any, **kwargs: Any) -> Any:
            if not self.recording:
                return fn(*args, **kwargs)
            position = len(executions)
            if self.watch_eager_code and not in_backward():  # a forward call, not a recompute in a backward
                self._note_forward_frees(position - 1)
                try:
                    self.glue.note(position, args, self.step_storages | self._output_keys)
                except Exception as err:  # noqa: BLE001 - no glue counted for this call
                    self.regions[index].errors.append(f"eager glue not measured: {type(err).__name__}: {err}")
            executions.append(index)
            owners.append(self.call_owner() if self.call_owner is not None else None)
            region = self.regions[index]  # a graph that serves several blocks reads each block's parameters
            if region.chain_inputs is not None and len(region.chain_inputs) == len(args):
                # an input fed by an earlier call in any call of the graph (a block's hidden state,
                # made by eager code before the first block, by a block before the others)
                chained = self._chained(args)
                region.chain_inputs = tuple(a or b for a, b in zip(region.chain_inputs, chained))
            read = [(pos, id(a)) for pos, a in enumerate(args) if isinstance(a, nn.Parameter) and a.requires_grad]
            self.call_params.append(frozenset(i for _, i in read))
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

    def _note_forward_frees(self, position: int) -> None:
        """Record in :attr:`forward_frees` the watched outputs that died since the last note: after
        the call at ``position``, in the forward."""
        alive = []
        for i, ref, n, key in self._forward_live:
            if ref.expired():
                self.forward_frees[(position, i)] = self.forward_frees.get((position, i), 0) + n
            else:
                alive.append((i, ref, n, key))
        self._forward_live[:] = alive

    def _watch_outputs(self, position: int, out: Any) -> None:
        """Note the storages of the outputs of the region call at ``position`` (:attr:`forward_frees`
        watches them) and hook its backward node: which earlier calls' outputs die while it runs
        (:attr:`early_frees`)."""
        leaves = held_tensors(out)
        unique = {storage_key(t): t for t in leaves}
        self._position_outputs[position] = [(storage_weakref(t), int(t.untyped_storage().nbytes()))
                                            for t in unique.values()]
        self._output_keys.update(unique)
        if self.watch_eager_code:
            watched = {key for _, ref, _, key in self._forward_live if not ref.expired()}
            self._forward_live.extend((position, ref, n, key) for key, (ref, n)
                                      in zip(unique, self._position_outputs[position]) if key not in watched)
        node = next((t.grad_fn for t in leaves
                     if t.grad_fn is not None and "CompiledFunction" in t.grad_fn.name()), None)
        if node is None:
            return
        live: list[tuple[int, Any, int]] = []
        outputs, frees = self._position_outputs, self.early_frees

        def before(grad_outputs: Any) -> None:
            if self._forward_open and self.watch_eager_code:  # the backward starts: what died since the last call
                self._forward_open = False
                self._note_forward_frees(len(self.executions) - 1)
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
        nop = boxed_nop()

        def make(is_backward: bool) -> Callable[..., Any]:
            def compiler(g: fx.GraphModule, ex: Sequence[Any]) -> Callable[..., Any]:
                t0 = time.perf_counter()
                self._record_graph(region, g, is_backward)
                region.capture_seconds += time.perf_counter() - t0
                return nop(g, ex)
            return compiler

        fconfig = functorch_config()
        with fconfig.patch(unlift_effect_tokens=True):
            return aot_autograd()(
                fw_compiler=make(False),
                bw_compiler=make(True),
                decompositions=select_decomp_table(keep_random_ops=True),  # eager code's draws
                partition_fn=self._partition_fn(region),
            )(gm, example_inputs)

    def _partition_fn(self, region: RegionCapture) -> Callable[..., Any]:
        """The min-cut partitioner; with a sweep, one that also partitions a copy of the joint graph
        under every other plan (:meth:`PlanSweep.partition_fn`)."""
        partition = functools.partial(min_cut_rematerialization_partition(), compiler="inductor")
        return self._plans.partition_fn(region, partition)

    def _inductor(self, gm: fx.GraphModule, example_inputs: Sequence[Any], region: RegionCapture) -> Callable[..., Any]:
        compile_inner = compile_fx_inner()
        capture = self.capture

        def inner(g: fx.GraphModule, ex: Sequence[Any], **kw: Any) -> Any:
            t0 = time.perf_counter()
            is_backward = bool(kw.get("is_backward", False))
            if kw.get("graph_id") is not None:
                region.graph_id = int(kw["graph_id"])
            self._record_graph(region, g, is_backward)
            region.capture_seconds += time.perf_counter() - t0
            with contextlib.ExitStack() as stack:
                # the backward compiles lazily, outside the backend call: scope caches again
                stack.enter_context(graph_caches_off_patch())
                if capture:
                    try:
                        stack.enter_context(probe_inductor_schedule(functools.partial(record_schedule, region)))
                    except RuntimeError as err:
                        region.errors.append(f"inductor schedule probe unavailable: {err}")
                    try:
                        stack.enter_context(probe_inductor_wrapper(functools.partial(record_wrapper, region)))
                    except RuntimeError as err:
                        region.errors.append(f"inductor wrapper probe unavailable: {err}")
                t1 = time.perf_counter()
                try:
                    if not running_nothing():
                        return compile_inner(g, ex, **kw)
                    # fake tensors: inductor plans and writes its code, nothing is built; the
                    # graph as it was before inductor's passes runs in its place
                    runner = _snapshot(g)
                    with codegen_only():
                        compile_inner(g, ex, **kw)
                    return boxed_nop()(runner, ex)
                finally:
                    if is_backward:  # the forward is timed by the backend call around it
                        region.compile_seconds += time.perf_counter() - t1

        if not self.remat:
            return compile_fx()(gm, example_inputs, inner_compile=inner)

        def with_remat(partition: Callable[..., Any]) -> Callable[..., Any]:
            def partition_fn(joint: fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
                return partition_remat(partition, joint, joint_inputs, kw, region, self.budget, {})
            return partition_fn

        with inductor_partitioner(with_remat):
            return compile_fx()(gm, example_inputs, inner_compile=inner)


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
    whole_region: bool = False,
) -> MemplanBackend:
    """A ``torch.compile`` backend with this activation memory budget and knapsack solver.

    Args:
        budget: activation memory budget, a ratio in [0, 1] (torch's ``activation_memory_budget``).
        solver: a name in :data:`~lightning_memplan.forecasting.validate.SOLVER_NAMES` or a callable
            with torch's solver signature.
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
        whole_region: partition each region also under the own budget and every sweep budget
            with its whole forward checkpointed (every forward node tagged): a block compiled on
            its own, checkpointed; read with :meth:`MemplanBackend.whole_region_regions`. Needs
            ``inner="aot_eager"``.

    With ``solver="remat"`` the compiled plan itself is whole-graph rematerialization at
    ``budget`` (see :mod:`lightning_memplan.core.remat`); ``sweep``, ``sweep_checkpoints`` and
    ``run_checkpoint`` are knapsack plans and are refused then.

    Raises:
        ValueError: a budget outside [0, 1], an unknown solver name or backend, a sweep with inductor
            or without capture.
        RuntimeError: torch older than 2.11 (no ``CustomKnapsackSolver``).
    """
    b = check_budget(budget, "memplan_backend")
    name, fn = resolve_solver(solver, "memplan_backend")
    kind = check_inner(inner, "memplan_backend")
    sw = check_budgets(sweep, "memplan_backend", "sweep")
    cks = check_checkpoint_sets(sweep_checkpoints, model, "memplan_backend", "sweep_checkpoints")
    if isinstance(run_checkpoint, str):
        raise ValueError(f"`memplan_backend(run_checkpoint={run_checkpoint!r})` must be a sequence of submodule "
                         f"names, e.g. ({run_checkpoint!r},).")
    run_ck = check_checkpoint_sets([tuple(run_checkpoint)], model, "memplan_backend", "run_checkpoint")
    rm = check_budgets(sweep_remat, "memplan_backend", "sweep_remat")
    if name == "remat":
        for arg, given in (("sweep", sw), ("sweep_checkpoints", cks), ("run_checkpoint", run_ck),
                           ("whole_region", whole_region)):
            if given:
                raise ValueError(f"`memplan_backend(solver='remat', {arg}=...)`: {arg} plans use a knapsack "
                                 "solver; with solver='remat' sweep remat budgets with `sweep_remat`.")
    # every sweep option partitions copies of the joint graph and captures them: aot_eager, capture on
    for arg, given, used in (("sweep", sweep, sw), ("sweep_checkpoints", sweep_checkpoints, cks),
                             ("run_checkpoint", run_checkpoint, run_ck), ("sweep_remat", sweep_remat, rm),
                             ("whole_region", whole_region, whole_region)):
        if used and (kind != "aot_eager" or not capture):
            shown = given if isinstance(given, bool) else tuple(given)
            raise ValueError(f"`memplan_backend({arg}={shown!r})` needs inner='aot_eager' and capture=True "
                             f"(got inner={inner!r}, capture={capture!r}).")
    named = cks or run_ck
    names = {str(id(m)): n for n, m in model.named_modules()} if named and model is not None else {}
    check_torch_version()
    return MemplanBackend(budget=b, solver_name=name, solver_fn=fn, inner=kind, capture=capture, sweep=sw,
                          sweep_checkpoints=cks, module_names=names, run_checkpoint=run_ck[0] if run_ck else (),
                          sweep_remat=rm, whole_region=bool(whole_region))
