"""A :class:`~lightning_memplan.forecasting.result.Forecast` of one plan, assembled from what the
compiling run recorded (:class:`~lightning_memplan.forecasting.compile_step.CompiledStep`) and the
regions the backend captured for that plan: the baseline, one plan per region
(:mod:`lightning_memplan.forecasting.regions`), the step laid out
(:mod:`lightning_memplan.forecasting.layout`) with FSDP2's buffers and the outputs that die early,
the allocation stream and, on CUDA, the caching allocator's model.

Units: bytes. Failures are reported (``status``, ``problems`` and a ``RuntimeWarning``), never raised.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from lightning_memplan._torch.fsdp import Fsdp2Units
from lightning_memplan._torch.storages import unique_storages
from lightning_memplan.core.fsdp_memory import Collectives, Point, fsdp_step_events
from lightning_memplan.core.fsdp_memory import Event as FsdpEvent
from lightning_memplan.forecasting.allocations import (
    AllocatorForecast,
    StepAllocations,
    simulate_cuda_allocator,
    stitch_step,
)
from lightning_memplan.forecasting.backend import MemplanBackend
from lightning_memplan.forecasting.capture import RegionCapture
from lightning_memplan.forecasting.compile_step import CompiledStep
from lightning_memplan.forecasting.layout import (
    StepParts,
    TimelineStep,
    lay_out,
    run_order,
)
from lightning_memplan.forecasting.optim_memory import OptimizerMemory, optimizer_memory
from lightning_memplan.forecasting.regions import RegionPlan, region_memory, region_plan
from lightning_memplan.forecasting.result import (
    Forecast,
    MemoryBreakdown,
    RegionForecast,
)

__all__ = ["PlanCapture", "assemble_forecast"]


@dataclass(frozen=True, kw_only=True)
class PlanCapture:
    """One plan of a compiled step: the regions the backend captured for it, and how it is named."""

    #: The backend the plan's regions come from (the forecast's ``_backend``).
    backend: MemplanBackend
    #: One capture per compiled region, in compile order.
    regions: Sequence[RegionCapture]
    #: ``"inductor"`` or ``"aot_eager"``: which estimates the regions carry.
    inner: str
    #: The plan's activation memory budget, a ratio in [0, 1].
    budget: float
    solver_name: str
    #: The forecast's ``step()``: the compiled step, or one that raises for a plan never compiled to run.
    step: Callable[[], torch.Tensor]
    #: Seconds added to the forecast's ``overhead_seconds`` (a sweep plan's partitioning).
    extra_seconds: float = 0.0


def assemble_forecast(run: CompiledStep, plan: PlanCapture, *, opt_mem: OptimizerMemory | None = None,
                      stacklevel: int) -> Forecast:
    """The forecast of ``plan`` after ``run``, the compiling run (which may have run another plan).

    Regions are laid out once per call ``run.executions`` records (empty: each region once, in
    compile order); under FSDP2 (``run.fsdp``) the units' buffers are laid in at the calls that ran
    inside them (``run.owners``; :func:`~lightning_memplan.core.fsdp_memory.fsdp_step_events`), and
    outputs a later call's backward held last (``run.early``) die there, and those the eager code
    between calls dropped (``run.forward_frees``) die after the call before. ``opt_mem``: the
    optimizer's memory when already predicted (else predicted here from ``run.optimizer``).
    ``stacklevel``: of the ``RuntimeWarning`` issued when the forecast is not ``"ok"``.
    """
    t1 = time.perf_counter()
    problems: list[str] = [f"region {r.index}: {e}" for r in plan.regions for e in r.errors]
    seen: set[int] = set()
    storages = {
        "parameters": unique_storages(run.params, seen),
        "buffers": unique_storages(list(run.model.buffers()), seen),
        "inputs": unique_storages(list(run.inputs), seen),
    }
    baseline = {k: sum(n for n, _ in v) for k, v in storages.items()}
    if opt_mem is None and run.optimizer is not None:
        opt_mem = optimizer_memory(run.optimizer)
    if opt_mem is not None and opt_mem.problem:
        problems.append(opt_mem.problem)
    baseline["optimizer_state"] = opt_mem.state_bytes if opt_mem is not None else 0
    baseline_bytes = sum(baseline.values())

    region_plans: list[RegionPlan] = []
    regions: list[RegionForecast] = []
    calls = Counter(run.executions)  # calls of each region in one step
    for region in plan.regions:
        try:
            mem = region_memory(region, every_op=plan.inner == "aot_eager")  # inductor: extern kernels only
            rp = region_plan(region, mem, use_scheduler=plan.inner == "inductor")
            if plan.inner == "inductor" and rp.method == "fx":
                problems.append(f"region {region.index}: no inductor estimate; used the FX profile")
        except Exception as err:  # noqa: BLE001 - report, never lose the compiled run
            problems.append(f"region {region.index}: forecast failed: {type(err).__name__}: {err}")
            continue
        region_plans.append(rp)
        regions.append(RegionForecast(
            index=region.index, graph_id=region.graph_id, decision=region.decision, knapsack=region.knapsack,
            method=rp.method, fw_peak_bytes=max(rp.fw_timeline), bw_peak_bytes=rp.bw_peak,
            saved_bytes=rp.saved, gradient_bytes=rp.gradients,
            calls=max(1, calls[region.index]),
            _graphs=(region.fw_graph, region.bw_graph),
        ))
    if not plan.regions:
        problems.append("nothing was compiled: dynamo captured no region (the model is not traceable, or "
                        "torch._dynamo.config.recompile_limit was hit and dynamo fell back to eager)")

    peak: int | None = None
    breakdown: MemoryBreakdown | None = None
    timeline: list[TimelineStep] = []
    allocations: StepAllocations | None = None
    allocator: AllocatorForecast | None = None
    requested: int | None = None
    overlay: dict[Point, list[FsdpEvent]] = {}
    run_early: dict[int, dict[int, int]] = {}
    run_forward: dict[int, dict[int, int]] = {}
    run_glue: tuple[int, ...] = ()
    run_kept: tuple[int, ...] = ()
    if region_plans:
        order = run_order(region_plans, run.executions)
        device = run.params[0].device.type if run.params else "cpu"
        if run.fsdp is not None:
            overlay = _fsdp_overlay(run.fsdp, region_plans, run.executions, run.owners, device, problems)
        run_early = _run_early(region_plans, run.executions, run.early) if run.executions else {}
        run_forward = _run_early(region_plans, run.executions, run.forward_frees) if run.executions else {}
        run_glue = _run_glue(region_plans, run.executions, run.glue) if run.executions else ()
        run_kept = _run_glue(region_plans, run.executions, run.glue_saved) if run.executions else ()
        if run.fsdp is not None and overlay and not run_early:
            run_early = _fsdp_unit_chain_early(run.fsdp, order, run.executions, run.owners)
        timeline, peak, (acts, grads, temps, fsdp_bytes) = lay_out(order, opt_mem, overlay=overlay, early=run_early,
                                                                   forward_freed=run_forward, inputs=run_glue,
                                                                   inputs_saved=run_kept)
        requested = peak
        breakdown = MemoryBreakdown(**baseline, activations=acts, gradients=grads, optimizer_temporaries=temps,
                                    fsdp_buffers=fsdp_bytes)
        # the allocation stream does not model outputs dying in a later backward (run_early): where
        # that lowers the peak, the two disagree and the allocator model is not run
        allocations = None if overlay else _allocations(order, opt_mem, [s for v in storages.values() for s in v], run_forward,
                                                       run_glue, run_kept)
        consistent = allocations is not None and allocations.requested_peak_bytes == requested
        if allocations is not None and not consistent and device == "cuda":  # only CUDA reads the stream
            problems.append(f"the step's allocations peak at {allocations.requested_peak_bytes} bytes, the "
                            f"timeline at {requested}: the CUDA allocator model was not run")
        if allocations is not None and consistent and device == "cuda" and len(region_plans) == len(plan.regions):
            try:
                allocator = simulate_cuda_allocator(allocations, device=device)
                peak = allocator.allocated_peak_bytes
            except Exception as err:  # noqa: BLE001 - the requested peak stands
                problems.append(f"CUDA allocator model failed: {type(err).__name__}: {err}")
    status = "failed" if peak is None else ("partial" if len(region_plans) < len(plan.regions) else "ok")
    if status != "ok":
        warnings.warn(f"lightning_memplan.forecast: {status}: " + "; ".join(problems), RuntimeWarning, stacklevel=stacklevel)

    decisions = [r.decision for r in regions]
    solver_est = (sum(d.saved_bytes - max(d.min_act_bytes, 0) for d in decisions if d is not None)
                  if decisions and all(d is not None for d in decisions) else None)
    overhead = sum(r.capture_seconds for r in plan.regions) + (time.perf_counter() - t1) + plan.extra_seconds
    return Forecast(
        peak_bytes=peak, requested_peak_bytes=requested, allocations=allocations, cuda_allocator=allocator,
        baseline_bytes=baseline_bytes, breakdown=breakdown, regions=tuple(regions),
        timeline=tuple(timeline), budget=plan.budget, solver=plan.solver_name, backend=plan.inner, status=status,
        problems=tuple(problems), optimizer=opt_mem, solver_estimate_bytes=solver_est,
        compile_seconds=run.compile_seconds, overhead_seconds=overhead, _step=plan.step, _backend=plan.backend,
        _parts=StepParts(plans=tuple(region_plans), executions=run.executions, optimizer=opt_mem, overlay=overlay,
                         early=run_early, forward_freed=run_forward, glue=run_glue,
                         glue_saved=run_kept),
    )


def _allocations(plans: list[RegionPlan], opt: OptimizerMemory | None, baseline: list[tuple[int, str]],
                 forward_freed: Mapping[int, Mapping[int, int]], glue: Sequence[int],
                 glue_saved: Sequence[int]) -> StepAllocations | None:
    """The step's allocations (``plans`` in run order, ``baseline``: (bytes, device) of the storages
    live before the step; ``forward_freed``: outputs dropped in the forward, ``glue``: bytes the
    eager code made before each forward, by run position, ``glue_saved`` of them saved by its ops),
    stitched as :func:`~lightning_memplan.forecasting.layout.lay_out` lays the timeline out;
    ``None`` when a region has no per-storage trace."""
    if any(p.trace is None for p in plans):
        return None
    existing = opt is not None and opt.state_source == "existing"
    state = opt.state_storages if opt is not None else ()
    step = stitch_step([p.trace for p in plans if p.trace is not None], opt.step_events if opt is not None else None,
                       forward_freed, glue, glue_saved)
    return dataclasses.replace(step, baseline=(*baseline, *(state if existing else ())),
                               new_state=() if existing else state)


def _fsdp_overlay(fsdp: Fsdp2Units, plans: list[RegionPlan], executions: Sequence[int],
                  owners: Sequence[int | None], device: str, problems: list[str]) -> dict[Point, list[FsdpEvent]]:
    """FSDP2's buffers as layout events (``overlay`` of :func:`~lightning_memplan.forecasting.layout.lay_out`)
    at the calls of :func:`~lightning_memplan.forecasting.layout.run_order`'s run (``owners`` aligned
    with ``executions``). On a failure the timeline goes without them, with a problem noted."""
    indices = {p.index for p in plans}
    run_owners = [o for i, o in zip(executions, owners) if i in indices] if len(owners) == len(executions) else []
    if not run_owners or all(o is None for o in run_owners):
        problems.append("FSDP: no compiled call ran inside an FSDP unit's forward; its buffers are not forecast")
        return {}
    comm = Collectives(copies=fsdp.backend == "gloo", pad_copies=device == "cpu")
    try:
        events = fsdp_step_events(fsdp.units, run_owners, comm)
    except Exception as err:  # noqa: BLE001 - the forecast stands without them
        problems.append(f"FSDP: laying out its buffers failed: {type(err).__name__}: {err}")
        return {}
    problems.append("FSDP: its buffers are laid into the timeline; the allocation stream and the CUDA "
                    "allocator model leave them out (not run)")
    return events


def _run_positions(plans: Sequence[RegionPlan], executions: Sequence[int]) -> dict[int, int]:
    """``{position in executions: position in run_order's run}`` of the calls of regions in ``plans``."""
    indices = {p.index for p in plans}
    run_pos: dict[int, int] = {}
    for k, i in enumerate(executions):
        if i in indices:
            run_pos[k] = len(run_pos)
    return run_pos


def _run_early(plans: Sequence[RegionPlan], executions: Sequence[int],
               early: Mapping[tuple[int, int], int]) -> dict[int, dict[int, int]]:
    """The backend's :attr:`~lightning_memplan.forecasting.backend.MemplanBackend.early_frees` or
    :attr:`~lightning_memplan.forecasting.backend.MemplanBackend.forward_frees` (keyed by positions in
    ``executions``) by position in :func:`~lightning_memplan.forecasting.layout.run_order`'s run:
    where they die -> {producer: bytes}."""
    run_pos = _run_positions(plans, executions)
    out: dict[int, dict[int, int]] = {}
    for (j, i), n in early.items():
        if j in run_pos and i in run_pos and n > 0:
            out.setdefault(run_pos[j], {})[run_pos[i]] = n
    return out


def _run_glue(plans: Sequence[RegionPlan], executions: Sequence[int], glue: Mapping[int, int]) -> tuple[int, ...]:
    """The backend's :attr:`~lightning_memplan.forecasting.backend.MemplanBackend.glue` (keyed by
    positions in ``executions``) aligned with :func:`~lightning_memplan.forecasting.layout.run_order`'s
    run: bytes the eager code made before each position's forward; empty when there are none."""
    out = [glue.get(k, 0) for k in _run_positions(plans, executions)]  # in run order
    return tuple(out) if any(out) else ()


def _fsdp_unit_chain_early(fsdp: Fsdp2Units, run: Sequence[RegionPlan], executions: Sequence[int],
                           owners: Sequence[int | None]) -> dict[int, dict[int, int]]:
    """Where FSDP2 units' outputs die, when no steady run could watch them (under FSDP2 the
    backward is compiled, not run): by position in ``run`` (:func:`~lightning_memplan.forecasting.layout.run_order`'s),
    consumer -> {producer: bytes}, as :func:`_run_early`. Of two consecutive calls inside FSDP2 units
    other than the root (one block's output is the next block's input), when the later one's
    backward keeps its activation input and knows its last read (a checkpointed block saves its
    input to recompute from), the earlier one's outputs die there, as a run of the step shows
    without FSDP. ``owners`` aligned with ``executions``."""
    indices = {p.index for p in run}
    if len(owners) != len(executions):
        return {}
    run_owners = [o for i, o in zip(executions, owners) if i in indices]
    units = fsdp.units

    def in_block(o: int | None) -> bool:
        return o is not None and 0 <= o < len(units) and not units[o].is_root

    out: dict[int, dict[int, int]] = {}
    for j in range(1, min(len(run), len(run_owners))):
        before, now = run[j - 1], run[j]
        if (in_block(run_owners[j - 1]) and in_block(run_owners[j]) and now.keeps_inputs
                and now.input_last_use is not None and before.fw_retained > before.saved):
            out[j] = {j - 1: before.fw_retained - before.saved}
    return out
