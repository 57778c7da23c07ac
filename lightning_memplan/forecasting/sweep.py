"""The plans a backend partitions besides the one it compiles, on copies of each region's joint
graph: other budgets, emulated activation checkpointing of chosen blocks (their forward nodes tagged
as ``torch.utils.checkpoint`` tags them under ``torch.compile``), and whole-graph rematerialization
(:mod:`lightning_memplan.forecasting.remat_graph`). One trace serves every plan; only the compiled
plan runs. Each failure is recorded on that plan's region (``errors``), never raised: a sweep plan
must not break the compile.
"""
from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

from lightning_memplan._torch.dynamo import lazy_graph_module
from lightning_memplan._torch.partitioner import functorch_config
from lightning_memplan.core.remat import RematSolution
from lightning_memplan.forecasting.capture import RegionCapture, cleared, frame_of, note_remat
from lightning_memplan.forecasting.fx import forward_nodes, module_path
from lightning_memplan.forecasting.solver_adapter import solver_adapter_class
from lightning_memplan.forecasting.validate import SolverFn

__all__ = ["WHOLE_REGION", "PlanSweep", "SweepKey", "partition_remat"]

SweepKey = tuple[tuple[str, ...], float]
"""(checkpointed blocks, budget): one plan partitioned in a sweep."""

WHOLE_REGION: tuple[str, ...] = ("<the whole region>",)
"""The checkpoint set of a sweep plan whose every forward node is tagged: each region's graph
partitioned as the graph of one checkpointed call (a block compiled on its own, its forward under
``torch.utils.checkpoint``). Not a submodule name."""


def _copy_joint(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of a joint graph module the partitioner may rewrite (dead code, CSE, recompute tags):
    new graph and nodes with shallow-copied ``meta`` (FakeTensors shared with the original)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's pytree codegen deep copy (LeafSpec)
        graph = copy.deepcopy(gm.graph)
    new = lazy_graph_module(gm, graph)
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
        path = module_path("", value)
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


def _tag_whole(gm: fx.GraphModule) -> int:
    """Tag every forward node of ``gm`` as ``torch.utils.checkpoint`` tags the nodes of one
    checkpointed call under ``torch.compile`` (``PREFER_RECOMPUTE``, one ``ac_graph_id``): the
    graph of a block compiled on its own, partitioned as if its forward were checkpointed. Returns
    the nodes tagged."""
    from torch.utils.checkpoint import CheckpointPolicy

    nodes = forward_nodes(gm)
    for node in nodes:
        node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
        node.meta["ac_graph_id"] = 10_000
    return len(nodes)


def _tag_remat(gm: fx.GraphModule, budget: float, region: RegionCapture,
               bounds: dict[str, Any]) -> RematSolution | None:
    """Tag ``gm`` with the rematerialization plan at ``budget``; on failure the error is recorded
    and None returned (the graph then partitions untagged: torch's plan at budget 1.0). A plan
    HiGHS did not prove optimal within its time limit is used and said (``region.errors``)."""
    from lightning_memplan.forecasting.remat_graph import tag_remat

    t0 = time.perf_counter()
    try:
        sol = tag_remat(gm, budget, bounds)
        if not sol.optimal:
            region.errors.append(f"remat plan (budget {budget!r}): HiGHS stopped at its time limit before proving "
                                 "the plan optimal; the best plan it found is used")
        return sol
    except Exception as err:  # noqa: BLE001 - planning must not break the compile
        region.errors.append(f"remat plan (budget {budget!r}): {type(err).__name__}: {err}; "
                             "partitioned as torch's budget 1.0")
        return None
    finally:
        region.capture_seconds += time.perf_counter() - t0


def partition_remat(partition: Callable[..., Any], joint: fx.GraphModule, joint_inputs: Any,
                    kw: dict[str, Any], region: RegionCapture, budget: float, bounds: dict[str, Any]) -> Any:
    """The compiled plan's partition under solver ``"remat"``: tag ``joint`` at ``budget``,
    partition it, record the decision (untagged, torch's budget 1.0, if the MILP failed).
    ``bounds``: the joint graph's rematerialization bounds, solved once per graph (a dict kept by
    the caller). Returns what ``partition`` returns."""
    sol = _tag_remat(joint, budget, region, bounds)
    out = partition(joint, joint_inputs, **kw)
    if sol is not None:
        note_remat(region, budget, sol)
    return out


class PlanSweep:
    """The sweep of one :class:`~lightning_memplan.forecasting.backend.MemplanBackend`: the plans it
    partitions besides its own (``run_checkpoint`` at ``budget``), one
    :class:`~lightning_memplan.forecasting.capture.RegionCapture` per plan and compiled region.

    ``sweep``: further budgets; ``sweep_checkpoints``: checkpoint sets, each partitioned under every
    budget; ``module_names``: ``{str(id(module)): qualified name}`` to find the blocks by;
    ``whole_region``: each region also partitioned under every budget with its whole forward
    checkpointed (checkpoint set :data:`WHOLE_REGION`); ``sweep_remat``: budgets of whole-graph
    rematerialization plans. With ``solver_name="remat"`` the compiled plan itself is
    rematerialization at ``budget``.
    """

    def __init__(self, *, budget: float, solver_name: str, solver_fn: SolverFn,
                 sweep: tuple[float, ...] = (), sweep_checkpoints: tuple[tuple[str, ...], ...] = (),
                 module_names: dict[str, str] | None = None, run_checkpoint: tuple[str, ...] = (),
                 sweep_remat: tuple[float, ...] = (), whole_region: bool = False) -> None:
        adapter = solver_adapter_class()
        self.budget = budget
        #: Budgets partitioned besides (or including) ``budget`` on the same joint graph.
        self.sweep = sweep
        #: Checkpoint sets emulated on the same joint graph (each with every budget).
        self.sweep_checkpoints = sweep_checkpoints
        self._module_names = dict(module_names or {})
        #: Blocks whose checkpointing is emulated in the plan that is compiled and run (with ``budget``).
        self.run_checkpoint = run_checkpoint
        budgets = tuple(dict.fromkeys((budget, *sweep)))
        whole = [WHOLE_REGION] if whole_region else []  # each region also with its whole forward checkpointed
        sets = tuple(dict.fromkeys(((), *sweep_checkpoints, run_checkpoint, *whole)))
        keys = [(ck, b) for ck in sets for b in budgets if (ck, b) != (run_checkpoint, budget)]
        self._sweep_solvers = {b: adapter(solver_name, solver_fn, b) for b in budgets if keys}
        self._sweep_regions: dict[SweepKey, list[RegionCapture]] = {k: [] for k in keys}
        #: Whether the compiled plan is whole-graph rematerialization (solver ``"remat"``) at ``budget``.
        self.remat = solver_name == "remat"
        #: Budgets of whole-graph rematerialization plans partitioned on the same joint graph.
        self.sweep_remat = sweep_remat
        self._remat_regions: dict[float, list[RegionCapture]] = {
            b: [] for b in sweep_remat if not (self.remat and b == budget)}
        self._remat_solver = adapter(solver_name, solver_fn, 1.0)
        #: The region the partitioner probes report to while a sweep plan is partitioned (else ``None``:
        #: the region being compiled).
        self.probe_region: RegionCapture | None = None
        #: The joint graph being partitioned (region, call, checkpoint set): min cuts are memoized per
        #: scope while a sweep partitions copies of one graph; ``None`` outside sweeps.
        self.min_cut_scope: tuple[int, int, tuple[str, ...]] | None = None
        self._partition_calls: dict[int, int] = {}

    def add_region(self, index: int) -> None:
        """Start the captures of compiled region ``index`` (the next one) for every sweep plan."""
        for regions in (*self._sweep_regions.values(), *self._remat_regions.values()):
            regions.append(RegionCapture(index=index))

    def regions(self, budget: float, checkpoint: Sequence[str], own: list[RegionCapture]) -> list[RegionCapture]:
        """The captures of the plan (``checkpoint``, ``budget``); ``own`` for the compiled plan.
        Another plan's are copies carrying what ``own`` recorded of each region's frame and graph
        inputs (:func:`~lightning_memplan.forecasting.capture.frame_of`).

        Raises:
            KeyError: the plan is not in this sweep.
        """
        key = (tuple(checkpoint), budget)
        if key == (self.run_checkpoint, self.budget):
            return own
        if key not in self._sweep_regions:
            raise KeyError(f"plan (budget {budget!r}, checkpoint {tuple(checkpoint)!r}) is not in this backend's "
                           f"sweep (budgets {self.sweep!r}, checkpoint sets {self.sweep_checkpoints!r})")
        return [frame_of(r, o) for r, o in zip(self._sweep_regions[key], own)]

    def remat_regions(self, budget: float, own: list[RegionCapture]) -> list[RegionCapture]:
        """The captures of the rematerialization plan at ``budget``; ``own`` for the compiled plan
        (another's as :meth:`regions`).

        Raises:
            KeyError: the plan is not in this sweep.
        """
        if self.remat and budget == self.budget:
            return own
        if budget not in self._remat_regions:
            raise KeyError(f"remat plan (budget {budget!r}) is not in this backend's sweep_remat {self.sweep_remat!r}")
        return [frame_of(r, o) for r, o in zip(self._remat_regions[budget], own)]

    def partition_fn(self, region: RegionCapture, partition: Callable[..., Any]) -> Callable[..., Any]:
        """The partition function for compiled region ``region``: ``partition`` (torch's min-cut
        partitioner) when there is nothing to sweep; otherwise one that partitions a copy of the
        joint graph under every other plan (same config scope, that budget's solver adapter, the same
        probes) and records each (forward, backward) pair and decision, and returns the compiled
        plan's partition."""
        if not self._sweep_regions and not self._remat_regions and not self.remat:
            return partition

        def partition_fn(joint: fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
            copies: dict[SweepKey, fx.GraphModule] = {}
            for key in self._sweep_regions:
                r = cleared(self._sweep_regions[key][region.index])
                try:
                    copies[key] = gm = _copy_joint(joint)
                    if key[0] == WHOLE_REGION:
                        if not _tag_whole(gm):
                            del copies[key]
                            r.errors.append("whole-region checkpoint: the joint graph has no forward node")
                    elif key[0] and not _tag_checkpointed(gm, key[0], self._module_names):
                        del copies[key]
                        r.errors.append(f"sweep checkpoint {key[0]!r}: no forward node was traced inside "
                                        "these blocks (no nn_module_stack names them)")
                except Exception as err:  # noqa: BLE001
                    copies.pop(key, None)
                    r.errors.append(f"sweep plan {key!r}: joint graph copy: {type(err).__name__}: {err}")
            remat_copies: dict[float, fx.GraphModule] = {}
            for b in self._remat_regions:
                r = cleared(self._remat_regions[b][region.index])
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
            self.min_cut_scope = (region.index, call, (f"remat:{self.budget!r}",) if self.remat else run_ck)
            try:
                out = (partition_remat(partition, joint, joint_inputs, kw, region, self.budget, bounds) if self.remat
                       else partition(joint, joint_inputs, **kw))
            finally:
                self.min_cut_scope = None
            fconfig = functorch_config()
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
                self.probe_region = r
                self.min_cut_scope = (region.index, call, ck)
                try:
                    with fconfig.patch(activation_memory_budget=b, activation_memory_budget_solver=adapter):
                        r.fw_graph, r.bw_graph = partition(gm, joint_inputs, **kw)
                except Exception as err:  # noqa: BLE001 - a sweep plan must not break the compile
                    r.errors.append(f"sweep plan (budget {b!r}, checkpoint {ck!r}): partition: "
                                    f"{type(err).__name__}: {err}")
                finally:
                    self.probe_region = None
                    self.min_cut_scope = None
                    adapter.region = None
                    r.compile_seconds += time.perf_counter() - t0
                if r.decision is not None and r.decision.reason == "nothing_recomputable" and not r.errors:
                    floor[ck] = (b, r)
            for b, gm in remat_copies.items():
                t0 = time.perf_counter()
                r = self._remat_regions[b][region.index]
                self._remat_solver.region = r
                self.probe_region = r
                self.min_cut_scope = (region.index, call, (f"remat:{b!r}",))
                try:
                    sol = _tag_remat(gm, b, r, bounds)
                    if sol is not None:
                        with fconfig.patch(activation_memory_budget=1.0,
                                           activation_memory_budget_solver=self._remat_solver):
                            r.fw_graph, r.bw_graph = partition(gm, joint_inputs, **kw)
                        note_remat(r, b, sol)
                except Exception as err:  # noqa: BLE001 - a sweep plan must not break the compile
                    r.errors.append(f"remat plan (budget {b!r}): partition: {type(err).__name__}: {err}")
                finally:
                    self.probe_region = None
                    self.min_cut_scope = None
                    self._remat_solver.region = None
                    r.compile_seconds += time.perf_counter() - t0
            return out

        return partition_fn
