"""Per-region plans: what one compiled region contributes to the step's timeline, from its captured
graphs (the FX profile of :mod:`lightning_memplan.forecasting.estimator`) or inductor's estimates
(the replay of its generated wrapper, else its scheduler's estimate), with the extern kernels'
workspaces (:mod:`lightning_memplan.forecasting.workspace`) added at the steps they run in.

Units: bytes. Timelines are above what was live when the graph started.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightning_memplan.forecasting.allocations import (
    AllocEvent,
    GraphTrace,
    RegionTrace,
)
from lightning_memplan.forecasting.capture import RegionCapture, ScheduleEstimate
from lightning_memplan.forecasting.estimator import (
    GRADIENTS,
    RegionMemory,
    node_device,
    profile_region,
)
from lightning_memplan.forecasting.workspace import probe_workspace

__all__ = ["RegionPlan", "region_memory", "region_plan"]


@dataclass(frozen=True, kw_only=True)
class RegionPlan:
    """What one compiled region contributes to the step (bytes): its forward and backward timelines,
    each above what was live when that graph started, and what stays or is handed over between them.
    ``fw_nodes[k]`` ran at ``fw_timeline[k]`` (likewise backward)."""

    #: The region's index (:attr:`~lightning_memplan.forecasting.capture.RegionCapture.index`).
    index: int
    #: ``"fx"``, ``"inductor_wrapper"`` or ``"inductor_scheduler"`` (see
    #: :attr:`~lightning_memplan.forecasting.result.RegionForecast.method`).
    method: str
    fw_nodes: tuple[str, ...]
    #: Bytes live above the forward's start after each of ``fw_nodes``.
    fw_timeline: tuple[int, ...]
    #: Bytes the forward leaves live: its outputs and the activations saved for the backward.
    fw_retained: int
    #: Of ``fw_retained``, the saved activations (freed by the backward).
    saved: int
    bw_nodes: tuple[str, ...]
    #: Bytes live above the backward's start (saved activations included) after each of ``bw_nodes``.
    bw_timeline: tuple[int, ...]
    #: Bytes live above that start when the backward has returned (its gradients).
    bw_end: int
    #: The highest of ``bw_timeline``, and the gradients' share of it.
    bw_peak: int
    bw_grads_at_peak: int
    #: Bytes of the gradients the backward returns (parameters' and activations').
    gradients: int
    #: Bytes of the backward's incoming gradients, and whether ``bw_timeline`` counts them.
    tangents: int
    tangents_in_timeline: bool
    #: Transient copy of a non-contiguous gradient right after the backward (see RegionMemory).
    grad_copy: int
    #: The same step as allocations and frees, for the allocator model; ``None`` when the
    #: estimate has no per-storage detail (inductor's scheduler estimate).
    trace: RegionTrace | None = None
    #: Whether the backward keeps one of the forward's activation inputs (unknown: ``True``); of a
    #: region fed by an earlier region call, one of that call's outputs (the batch, or a tensor the
    #: loss closes over, is live anyway). When it keeps none, the previous region's outputs die once
    #: this forward has run (see :func:`~lightning_memplan.forecasting.layout.lay_out`).
    keeps_inputs: bool = True
    #: Whether the backward keeps one of the activation inputs the eager code before this region
    #: made (``inputs`` of :func:`~lightning_memplan.forecasting.layout.lay_out`; unknown: ``True``);
    #: of a call's first region, ``keeps_inputs``.
    keeps_glue: bool = True
    #: Of ``gradients``, the bytes of the parameters' gradients, and the largest one's (see
    #: :meth:`~lightning_memplan.forecasting.result.Forecast.repeated`).
    param_gradients: int = 0
    largest_param_gradient: int = 0
    #: The step of ``bw_timeline`` that last reads the region's incoming gradient (its tangents or
    #: views of them); ``None`` when unknown. An eager loss's gradients of the outputs, handed to
    #: this backward instead, die there (:meth:`~lightning_memplan.forecasting.result.Forecast.with_eager_loss`).
    tangent_last_use: int | None = None
    #: The step of ``bw_timeline`` that last reads one of the activation inputs the backward saved
    #: (``None`` when unknown or none): earlier regions' outputs it held last die after it.
    input_last_use: int | None = None
    #: ``(bytes, steps)`` per view of the stand-in loss's gradient as large as an output (empty:
    #: unknown): the steps of ``bw_timeline`` that read it, in order (under inductor the kernels
    #: lowered from its readers). One view stands for
    #: every output of its shape (the compiler merges equal expands), each of its readers for one
    #: of them: a zero gradient autograd hands this backward for such an output dies there.
    tangent_views: tuple[tuple[int, tuple[int, ...]], ...] = ()


def region_memory(region: RegionCapture, every_op: bool) -> RegionMemory:
    """The FX profile of ``region``'s captured forward and backward graphs, workspaces probed
    (``every_op``: for every op, else for extern kernels only, as inductor runs them).

    Raises:
        RuntimeError: no forward graph was captured.
    """
    if region.fw_graph is None:
        raise RuntimeError(f"region {region.index}: no forward graph was captured")
    # the partitioned forward's placeholders are the region's inputs, in order
    holders = [n.name for n in region.fw_graph.graph.nodes if n.op == "placeholder"]
    flags, chain = region.param_inputs, region.chain_inputs
    acts = ([name for name, is_param in zip(holders, flags) if not is_param]
            if flags is not None and len(flags) == len(holders) else None)
    others: list[str] | None = None
    if chain is not None and len(chain) == len(holders) and any(chain):
        # a region fed by an earlier one: whether it keeps those outputs (the batch or a tensor
        # the loss closes over, also inputs, live anyway); a call's first region: its inputs.
        # Apart: whether it keeps one of its other activation inputs (what eager code made)
        others = [name for name, earlier in zip(holders, chain) if not earlier and name in (acts or ())]
        acts = [name for name, earlier in zip(holders, chain) if earlier]
    return profile_region(region.fw_graph.graph, region.bw_graph.graph if region.bw_graph is not None else None,
                          workspace=functools.partial(probe_workspace, every_op=every_op), activation_inputs=acts,
                          other_inputs=others)


def _workspaces(est: ScheduleEstimate, gm: torch.fx.GraphModule | None, shift: int) -> dict[int, tuple[int, str]]:
    """Each extern kernel's workspace at the step of ``est.timeline`` it runs in: step -> (bytes, device).

    Steps are matched to FX nodes by the names they were lowered from; without origins the largest
    workspace is added at the peak step (an upper bound).
    """
    out = list(est.timeline or (0,))
    if gm is None:
        return {}
    nodes = {n.name: n for n in gm.graph.nodes}
    ws = {k: probe_workspace(n) for k, n in nodes.items()}
    ws = {k: v for k, v in ws.items() if v}
    if not ws:
        return {}
    steps: dict[int, tuple[int, str]] = {}
    if est.origins:
        for i, names in enumerate(est.origins[: len(out) - shift]):
            top = max((n for n in names if n in ws), key=ws.__getitem__, default=None)
            if top is not None:
                steps[i + shift] = (ws[top], node_device(nodes[top]))
    else:
        top = max(ws, key=ws.__getitem__)
        steps[max(range(len(out)), key=out.__getitem__)] = (ws[top], node_device(nodes[top]))
    return steps


def _with_workspace(est: ScheduleEstimate, steps: dict[int, tuple[int, str]]) -> tuple[int, ...]:
    """The estimate's timeline plus the workspaces of :func:`_workspaces`."""
    out = list(est.timeline or (0,))
    for i, (n, _) in steps.items():
        out[i] += n
    return tuple(out)


def _wrapper_trace(est: ScheduleEstimate, steps: dict[int, tuple[int, str]], tag: str) -> GraphTrace:
    """The wrapper replay's events as a trace: keys ``(tag, storage id)``, workspaces inserted at their step."""
    events = [e._replace(key=(tag, e.key)) for e in est.events]
    n_inputs = est.marks[0] if est.marks else 0
    for i in sorted(steps, reverse=True):  # insert from the back: earlier positions stay valid
        n, dev = steps[i]
        at = est.marks[i] if i < len(est.marks) else len(events)
        key = (tag, "workspace", i)
        events[at:at] = [AllocEvent("alloc", key, n, dev), AllocEvent("free", key, n, dev)]
    return GraphTrace(inputs=tuple(events[:n_inputs]), events=tuple(events[n_inputs:]),
                      tangent_keys=frozenset((tag, k) for k in est.tangent_keys))


def region_plan(region: RegionCapture, mem: RegionMemory, use_scheduler: bool) -> RegionPlan:
    """``region``'s plan from its FX profile ``mem``; with ``use_scheduler`` (inductor), from the
    replay of the generated wrapper when captured (``method="inductor_wrapper"``), else from the
    scheduler's estimate (``"inductor_scheduler"``), else the FX profile (``"fx"``)."""
    bw = mem.bw
    keeps = mem.saves_activation_inputs is not False
    keeps_glue = keeps if mem.saves_other_inputs is None else mem.saves_other_inputs
    fx_plan = RegionPlan(
        index=region.index, method="fx",
        fw_nodes=mem.fw.order, fw_timeline=mem.fw.timeline or (0,), fw_retained=mem.fw_retained_bytes,
        saved=mem.saved_bytes,
        bw_nodes=bw.order if bw else (), bw_timeline=(bw.timeline or (bw.start_bytes,)) if bw else (),
        bw_end=bw.end_bytes if bw else 0, bw_peak=bw.peak_bytes if bw else 0,
        bw_grads_at_peak=bw.peak_by_tag.get(GRADIENTS, 0) if bw else 0,
        gradients=mem.gradient_bytes, tangents=mem.tangent_bytes, tangents_in_timeline=True,
        grad_copy=mem.grad_copy_bytes,
        trace=RegionTrace(
            forward=GraphTrace(inputs=mem.fw.inputs, events=mem.fw.events),
            backward=(GraphTrace(inputs=bw.inputs, tangent_keys=frozenset(mem.tangent_keys), events=bw.events)
                      if bw is not None else None),
            grad_copy=mem.grad_copy_bytes, keeps_inputs=keeps, keeps_glue=keeps_glue,
            param_gradients=min(region.param_grad_bytes, mem.gradient_bytes)),
        keeps_inputs=keeps, keeps_glue=keeps_glue,
        param_gradients=min(region.param_grad_bytes, mem.gradient_bytes),
        largest_param_gradient=min(region.param_grad_max, mem.gradient_bytes),
    )
    readers = set(mem.tangent_readers)
    if readers and bw is not None:
        used = [i for i, name in enumerate(bw.order) if name in readers]
        fx_plan = dataclasses.replace(fx_plan, tangent_last_use=max(used) if used else None)
    if mem.tangent_views and bw is not None:
        step = {name: i for i, name in enumerate(bw.order)}
        views = tuple((b, tuple(sorted(step[u] for u in users if u in step))) for b, users in mem.tangent_views
                      if any(u in step for u in users))
        fx_plan = dataclasses.replace(fx_plan, tangent_views=views)
    act_readers = set(mem.activation_input_readers)
    if act_readers and bw is not None:
        used = [i for i, name in enumerate(bw.order) if name in act_readers]
        fx_plan = dataclasses.replace(fx_plan, input_last_use=max(used) if used else None)
    if not use_scheduler:
        return fx_plan
    # prefer the replay of the generated wrapper (it sees buffer reuse); else the scheduler estimate
    method, shift, fs, bs = "inductor_wrapper", 1, region.fw_wrapper, region.bw_wrapper
    if fs is None or (bw is not None and bs is None):
        method, shift, fs, bs = "inductor_scheduler", 0, region.fw_schedule, region.bw_schedule
    if fs is None or (bw is not None and bs is None):
        return fx_plan
    # neither sees kernel workspaces: add each extern kernel's at its step
    fw_ws = _workspaces(fs, region.fw_graph, shift)
    bw_ws = _workspaces(bs, region.bw_graph, shift) if bs is not None else {}
    fw_tl = _with_workspace(fs, fw_ws)
    bw_tl = _with_workspace(bs, bw_ws) if bs is not None else ()
    trace = None
    if method == "inductor_wrapper":
        trace = RegionTrace(forward=_wrapper_trace(fs, fw_ws, "fw"),
                            backward=_wrapper_trace(bs, bw_ws, "bw") if bs is not None else None,
                            grad_copy=mem.grad_copy_bytes, keeps_inputs=keeps, keeps_glue=keeps_glue,
                            param_gradients=fx_plan.param_gradients)
    return RegionPlan(
        index=region.index, method=method,
        fw_nodes=tuple(f"sched{i}" for i in range(len(fw_tl))), fw_timeline=tuple(fw_tl),
        fw_retained=fw_tl[-1], saved=bs.freeable_input_bytes if bs is not None else 0,
        bw_nodes=tuple(f"sched{i}" for i in range(len(bw_tl))), bw_timeline=tuple(bw_tl),
        bw_end=bw_tl[-1] if bw_tl else 0, bw_peak=max(bw_tl) if bw_tl else 0,
        # the scheduler does not tag buffers: take the gradients' share from the FX profile
        bw_grads_at_peak=min(fx_plan.bw_grads_at_peak, max(bw_tl) if bw_tl else 0),
        gradients=mem.gradient_bytes, tangents=mem.tangent_bytes,
        # the wrapper's replay counts the tangents (freed at their ``del``); the scheduler does not
        tangents_in_timeline=method == "inductor_wrapper",
        grad_copy=mem.grad_copy_bytes,
        trace=trace,
        keeps_inputs=keeps, keeps_glue=keeps_glue,
        param_gradients=fx_plan.param_gradients,
        largest_param_gradient=fx_plan.largest_param_gradient,
        tangent_last_use=_last_step_reading(bs, readers, shift) if bs is not None else None,
        tangent_views=_kernel_views(bs, mem.tangent_views, shift) if bs is not None else (),
        input_last_use=_last_step_reading(bs, act_readers, shift) if bs is not None and act_readers else None,
    )


def _kernel_views(est: ScheduleEstimate, views: Sequence[tuple[int, frozenset[str]]],
                  shift: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The FX plan's ``tangent_views`` (bytes, readers' node names) as steps of ``est``'s timeline:
    the kernels lowered from a reader (in order); a view no kernel was lowered from is left out."""
    return tuple((nbytes, steps) for nbytes, users in views if (steps := _steps_reading(est, set(users), shift)))


def _steps_reading(est: ScheduleEstimate, names: set[str], shift: int) -> tuple[int, ...]:
    """The steps of ``est``'s timeline (in order) whose kernels were lowered from one of ``names``."""
    return tuple(i + shift for i, origin in enumerate(est.origins or ()) if names & set(origin))


def _last_step_reading(est: ScheduleEstimate, names: set[str], shift: int) -> int | None:
    """The last step of ``est``'s timeline whose kernels were lowered from one of ``names``."""
    steps = _steps_reading(est, names, shift)
    return max(steps) if steps else None
