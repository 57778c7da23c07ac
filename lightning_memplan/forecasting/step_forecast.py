"""Forecast the peak memory of one training step compiled with a given budget and solver.

    fc = forecast(model, (x,), budget=0.5, solver="dp", backend="aot_eager_decomp_partition")
    fc.peak_bytes          # predicted peak of one steady-state step, above what was live before it
    fc.step()              # one training step, compiled with exactly this plan (warm-up)
    measure_peak(fc.step)  # the same quantity, measured

One step is: forward, loss (``loss_fn(output)``; by default ``output.sum()``), backward, then
``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)`` when an optimizer is given (without
one, the step sets the parameters' ``.grad`` back to ``None`` at its end, so each step starts alike).
Forward and loss are compiled together (one ``torch.compile`` of ``loss_fn(model(*inputs))``).

What is counted (bytes): before the step (``baseline_bytes``) the parameters, buffers, inputs and the
steady-state optimizer state (unique storages); during the step the activations of every compiled
region (from its captured forward and backward graphs: :mod:`lightning_memplan.forecasting.estimator`, or
inductor's scheduler estimate on its final node order), the gradients the backward creates, and the
optimizer's step temporaries (:mod:`lightning_memplan.forecasting.optim_memory`). On CUDA the same step,
storage by storage, is replayed through a model of the caching allocator
(:mod:`lightning_memplan.forecasting.allocations`), whose blocks ``max_memory_allocated`` counts. Not visible:
eager code between graph breaks, blocks other work left in the allocator's cache, kernels' internal
workspaces beyond the probed ones.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan._torch import compat as _compat
from lightning_memplan.core.fresh_code import fresh_function
from lightning_memplan.core.fsdp_memory import Collectives, Point, fsdp_step_events
from lightning_memplan.core.fsdp_memory import Event as FsdpEvent
from lightning_memplan.forecasting.allocations import (
    AllocatorForecast,
    AllocEvent,
    GraphTrace,
    RegionTrace,
    StepAllocations,
    simulate_cuda_allocator,
    stitch_step,
)
from lightning_memplan.forecasting.backend import MemplanBackend, memplan_backend
from lightning_memplan.forecasting.capture import (
    KnapsackRecord,
    PartitionDecision,
    RegionCapture,
    ScheduleEstimate,
)
from lightning_memplan.forecasting.eager_loss import EagerLoss, eager_loss_events
from lightning_memplan.forecasting.estimator import (
    GRADIENTS,
    RegionMemory,
    node_device,
    profile_region,
)
from lightning_memplan.forecasting.optim_memory import OptimizerMemory, optimizer_memory
from lightning_memplan.forecasting.unit_compile import UnitCompile
from lightning_memplan.forecasting.validate import check_budget as _check_budget
from lightning_memplan.forecasting.validate import (
    check_checkpoint_sets as _check_checkpoint_sets,
)
from lightning_memplan.forecasting.validate import check_inner as _check_inner
from lightning_memplan.forecasting.validate import resolve_solver
from lightning_memplan.forecasting.workspace import probe_workspace

__all__ = ["Forecast", "GridKey", "MemoryBreakdown", "RegionForecast", "TimelineStep", "forecast", "forecast_grid",
           "forecast_sweep"]

GridKey = tuple[tuple[str, ...] | str, float]
"""A plan of :func:`forecast_grid`: ``(checkpointed blocks, budget)`` with the grid's knapsack
solver, or ``("remat", budget)`` for whole-graph rematerialization."""


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes by category. Invariants: ``parameters + buffers + inputs + optimizer_state`` is the
    baseline; ``activations + gradients + optimizer_temporaries + fsdp_buffers`` is the peak above it."""

    parameters: int
    buffers: int
    inputs: int
    optimizer_state: int
    #: Saved activations and intermediates live at the peak.
    activations: int
    #: Gradients live at the peak.
    gradients: int
    #: Optimizer step temporaries live at the peak.
    optimizer_temporaries: int
    #: FSDP2's buffers live at the peak (all-gathered parameters, all-gather outputs, reduce-scatter
    #: inputs, the collectives' copies; :mod:`lightning_memplan.core.fsdp_memory`); 0 without FSDP.
    fsdp_buffers: int = 0


@dataclass(frozen=True, kw_only=True)
class TimelineStep:
    """One step of the predicted schedule: bytes live above the baseline right after ``node`` ran."""

    #: ``"forward"``, ``"backward"`` or ``"optimizer"``.
    phase: str
    #: Region index (``-1`` for the optimizer).
    region: int
    #: Node (FX node name; ``"step"`` for the optimizer).
    node: str
    bytes: int


@dataclass(frozen=True, kw_only=True)
class RegionForecast:
    """Per compiled region: the partitioner's decision and the predicted memory (bytes)."""

    index: int
    graph_id: int | None
    decision: PartitionDecision | None
    knapsack: KnapsackRecord | None
    #: ``"fx"`` (our FX-graph profile), ``"inductor_wrapper"`` (replay of the generated wrapper's
    #: allocations) or ``"inductor_scheduler"`` (inductor's estimate on its final fused node order).
    method: str
    #: Peak of the forward graph, above what was live when it started.
    fw_peak_bytes: int
    #: Peak of the backward graph, saved activations included.
    bw_peak_bytes: int
    #: Saved activations the forward keeps for the backward.
    saved_bytes: int
    #: Gradients the backward returns.
    gradient_bytes: int
    #: Times one training step runs this region (> 1: one compiled graph called again, e.g. a block
    #: with a graph break inside a loop, or each FSDP unit's forward); every call's saved activations
    #: are laid out in the step.
    calls: int = 1
    #: The captured (forward, backward) graph modules the peer estimate reads.
    _graphs: tuple[Any, Any] = field(default=(None, None), repr=False, compare=False)

    @functools.cached_property
    def torch_fx_peak_bytes(self) -> int | None:
        """torch's FX-level estimate of this region in bytes (``torch._inductor.fx_passes.memory_estimator``
        with CPU counted), a peer; ``None`` when it could not run. Computed on first access: a plan
        search never reads it."""
        return _torch_fx_peak(*self._graphs)


@dataclass(frozen=True, kw_only=True)
class Forecast:
    """Predicted memory of one steady-state training step, and the step itself.

    ``peak_bytes`` is ``None`` when capturing or forecasting failed; ``status`` and ``problems`` say
    why, and ``step()`` still trains with the compiled plan.
    """

    #: Predicted peak of one step above the bytes live before it; ``None`` on failure. On CUDA the
    #: caching allocator's bytes (``cuda_allocator.allocated_peak_bytes``: blocks, as
    #: ``torch.cuda.max_memory_allocated`` counts them) when its model ran, else ``requested_peak_bytes``.
    peak_bytes: int | None
    #: The same peak in bytes requested: the highest sum of live storages, no allocator rounding.
    requested_peak_bytes: int | None = None
    #: Bytes live before the step: parameters, buffers, inputs, optimizer state (unique storages).
    baseline_bytes: int
    breakdown: MemoryBreakdown | None
    regions: tuple[RegionForecast, ...]
    #: Bytes above the baseline at every step of the predicted schedule, in execution order.
    timeline: tuple[TimelineStep, ...] = field(repr=False)
    budget: float
    solver: str
    backend: str
    #: ``"ok"``, ``"partial"`` (some regions could not be forecast) or ``"failed"``.
    status: str
    problems: tuple[str, ...]
    optimizer: OptimizerMemory | None
    #: The partitioner's own estimate: saved activation bytes (its ``_size_of``), inputs excluded.
    solver_estimate_bytes: int | None
    #: Wall seconds of the first (compiling) forward+backward.
    compile_seconds: float
    #: Seconds spent snapshotting graphs during compilation, plus computing this forecast.
    overhead_seconds: float
    #: The step's allocations and frees in order (the forecast's timeline, storage by storage);
    #: ``None`` when a region's estimate has no per-storage detail.
    allocations: StepAllocations | None = field(default=None, repr=False)
    #: What the CUDA caching allocator reports for this step (:mod:`lightning_memplan.forecasting.allocations`),
    #: when the parameters are on CUDA; ``None`` otherwise.
    cuda_allocator: AllocatorForecast | None = None
    #: The eager losses laid in by :meth:`with_eager_loss` (bytes measured on a real step), one per
    #: call of the model; empty when the loss was forecast inside the compiled graph (``loss_fn``)
    #: or none was laid in.
    eager_losses: tuple[EagerLoss, ...] = ()
    _step: Callable[[], torch.Tensor] = field(repr=False, compare=False)
    #: Calls of the model per step the timeline is laid out for (:meth:`repeated`).
    _calls: int = field(default=1, repr=False, compare=False)
    #: Bytes of the fresh inputs of each call after the first (:meth:`repeated`).
    _extra: tuple[int, ...] = field(default=(), repr=False, compare=False)
    #: Bytes of the first call's inputs made in the step (:meth:`with_inputs_made_in_step`).
    _made: int = field(default=0, repr=False, compare=False)
    #: Forecasts of the calls after the first, when they run other graphs (:meth:`with_calls`).
    _others: tuple[Forecast, ...] = field(default=(), repr=False, compare=False)
    _backend: MemplanBackend = field(repr=False, compare=False)
    #: What the timeline was laid out from: (per-region plans, executions, optimizer memory, FSDP
    #: overlay).
    _parts: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def step(self) -> torch.Tensor:
        """Run one training step compiled with this plan; return the (detached) loss."""
        return self._step()

    @property
    def calls(self) -> int:
        """Calls of the model per step the timeline is laid out for (:meth:`repeated`,
        :meth:`with_calls`; 1 unless laid out again)."""
        return self._calls

    def repeated(self, calls: int, new_input_bytes: int | Sequence[int] = 0) -> Forecast:
        """This forecast for a step that calls the model ``calls`` times on inputs of the same shapes
        (two views of a batch, as contrastive objectives do) and backpropagates through all of them.

        The compiled regions run once per call, in the order of one call; every call's saved
        activations stay live until its own backward, and the backwards run from the last call to
        the first (autograd's order). A parameter's ``AccumulateGrad`` waits for every call: the
        last call's backward leaves its gradients in autograd's input buffers, and each earlier
        call's are summed into them there (out of place, one parameter at a time) and freed; then
        ``.grad`` takes the sums. The timeline, peak
        and breakdown are laid out again from the same graphs (nothing is compiled); ``step()`` is
        still one call. The allocation stream and the CUDA allocator model are not (``allocations``
        and ``cuda_allocator`` are ``None``; on CUDA the peak is the requested one).

        ``new_input_bytes``: bytes of the fresh inputs each call after the first is given (another
        view of the batch, e.g. ``x.flip(0)`` or an augmentation: made before that call, live until
        its backward), one number for all of them or one per later call; 0 when every call gets the
        same tensors (SimCSE-style dropout views).

        Raises:
            ValueError: ``calls`` is not an int >= 1, or ``new_input_bytes`` is not one int >= 0 or
                ``calls - 1`` of them.
        """
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ValueError(f"`Forecast.repeated(calls={calls!r})` must be an int >= 1.")
        extra = _per_later_call(new_input_bytes, calls, "Forecast.repeated")
        if calls == 1 or not self._parts or self.peak_bytes is None or self.breakdown is None:
            return self
        return self._laid_out(calls, tuple(extra), (), self._made)

    def with_calls(self, others: Sequence[Forecast], new_input_bytes: int | Sequence[int] = 0) -> Forecast:
        """This forecast for a step that calls the model on this forecast's inputs, then once on
        each of ``others``' inputs, and backpropagates through all of them: ``others`` are forecasts
        of the same model under the same plan for inputs dynamo compiles other graphs for (another
        shape: a labeled and a larger unlabeled batch, crops of two sizes), where :meth:`repeated`
        would lay out this call's graphs again. Laid out as :meth:`repeated` lays out its calls
        (forwards in call order, each call's saved activations live until its backward, backwards
        from the last call to the first, earlier calls' parameter gradients summed into the last's);
        nothing is compiled. ``new_input_bytes`` as for :meth:`repeated`. ``regions`` stay this
        call's (each ``other`` has its own); the allocation stream and the CUDA allocator model are
        not laid out (``None``).

        Raises:
            ValueError: ``others`` is empty, holds something that is not a forecast of the same budget
                and solver that succeeded, or this forecast is already laid out for several calls.
        """
        others = tuple(others)
        bad = [o for o in others if not isinstance(o, Forecast) or o.peak_bytes is None or not o._parts
               or (o.budget, o.solver) != (self.budget, self.solver)]
        if not others or bad or self._calls != 1:
            raise ValueError(f"`Forecast.with_calls(others=...)` takes successful forecasts of the same budget "
                             f"({self.budget}) and solver ({self.solver!r}), at least one, on a forecast laid out "
                             f"for one call; got {len(others)} ({len(bad)} unusable) on one laid out for "
                             f"{self._calls}.")
        calls = 1 + len(others)
        extra = _per_later_call(new_input_bytes, calls, "Forecast.with_calls")
        if not self._parts or self.peak_bytes is None or self.breakdown is None:
            return self
        return dataclasses.replace(self, _others=others)._laid_out(calls, tuple(extra), (), self._made)

    def with_inputs_made_in_step(self, nbytes: int) -> Forecast:
        """This forecast for a step that makes ``nbytes`` of the model's inputs itself
        (``training_step`` converts the batch: ``x.float() / 255``): they are not live before the
        step, so they move from the baseline (``baseline_bytes``, ``breakdown.inputs``) into the
        step, made just before the first forward and live until its backward has run (or until
        ``training_step`` returns, when the compiled graph saves none of them: see ``_layout``).
        Laid out again (nothing is compiled), as :meth:`repeated`; calls and eager losses laid in
        stay.

        Raises:
            ValueError: ``nbytes`` is not an int in [0, the inputs' bytes].
        """
        inputs = (self.breakdown.inputs + self._made) if self.breakdown is not None else 0
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= inputs:
            raise ValueError(f"`Forecast.with_inputs_made_in_step(nbytes={nbytes!r})` must be an int from 0 to the "
                             f"inputs' {inputs} bytes.")
        if nbytes == self._made or not self._parts or self.peak_bytes is None or self.breakdown is None:
            return self
        return self._laid_out(self._calls, self._extra, self.eager_losses, nbytes)

    def with_eager_loss(self, loss: EagerLoss | Sequence[EagerLoss]) -> Forecast:
        """This forecast with the eager code between the forward and the backward laid in (the
        loss ``training_step`` computes on the outputs, metrics, logging; measured once:
        :func:`~lightning_memplan.forecasting.eager_loss.measure_eager_losses`) around the end of each call
        (:func:`~lightning_memplan.forecasting.eager_loss.eager_loss_events`); the outputs' gradients live in
        the call's last region's backward until its last read of its incoming gradient (FX plans;
        under inductor the stand-in loss's realized gradient already holds those bytes).
        ``loss``: one :class:`~lightning_memplan.forecasting.eager_loss.EagerLoss`, or one per call when the
        forecast is laid out for several (:meth:`repeated`). The timeline, peak and breakdown are
        laid out again (nothing is compiled); the allocation stream and the CUDA allocator model
        are not (``None``; on CUDA the peak is the requested one).

        Raises:
            ValueError: not one measurement per call.
        """
        losses = (loss,) if isinstance(loss, EagerLoss) else tuple(loss)
        if len(losses) != self._calls or not all(isinstance(m, EagerLoss) for m in losses):
            raise ValueError(f"`Forecast.with_eager_loss(loss={loss!r})` must be one EagerLoss per call of the "
                             f"model: this forecast is laid out for {self._calls}.")
        if not self._parts or self.peak_bytes is None or self.breakdown is None:
            return self
        return self._laid_out(self._calls, self._extra, losses, self._made)

    def with_optimizer_memory(self, optimizer: OptimizerMemory) -> Forecast:
        """This forecast with another prediction of the optimizer's memory (one that leaves out the
        parameters the step gives no gradient: ``optimizer_memory(opt, gradless=...)``): its state in
        the baseline and the breakdown, its step's temporaries in the timeline. Laid out again
        (nothing is compiled), as :meth:`repeated`; calls, eager losses and inputs made in the step
        stay; the allocation stream and the CUDA allocator model are not (``None``)."""
        if not self._parts or self.peak_bytes is None or self.breakdown is None:
            return self
        plans, executions, old, overlay, early = self._parts
        before = old.state_bytes if old is not None else 0
        fc = dataclasses.replace(
            self, optimizer=optimizer, _parts=(plans, executions, optimizer, overlay, early),
            baseline_bytes=self.baseline_bytes - before + optimizer.state_bytes,
            breakdown=dataclasses.replace(self.breakdown, optimizer_state=optimizer.state_bytes))
        return fc._laid_out(self._calls, self._extra, self.eager_losses, self._made, relaid=True)

    @property
    def eager_loss(self) -> EagerLoss | None:
        """The eager loss laid in (:meth:`with_eager_loss`) when the step calls the model once;
        ``None`` when none was laid in (the loss was forecast inside the compiled graph: ``loss_fn``)
        or there are several calls (:attr:`eager_losses`)."""
        return self.eager_losses[0] if len(self.eager_losses) == 1 else None

    def _laid_out(self, calls: int, extra: tuple[int, ...], losses: tuple[EagerLoss, ...], made: int, *,
                  relaid: bool = False) -> Forecast:
        """The timeline laid out again from the compiled plans for ``calls`` calls per step
        (``extra``: fresh input bytes of each later call) with ``losses`` (none, or one per call)
        laid in and ``made`` bytes of the first call's inputs made in the step (see
        :meth:`repeated`, :meth:`with_eager_loss`, :meth:`with_inputs_made_in_step`)."""
        assert self.breakdown is not None
        plans, executions, opt, overlay, early = self._parts
        one = _executed(list(plans), executions)
        if self._others:  # each later call runs the graphs of its own forecast (with_calls)
            assert calls == 1 + len(self._others)
            ones = [one, *(_executed(list(o._parts[0]), o._parts[1]) for o in self._others)]
            earlies = [early, *(o._parts[4] for o in self._others)]
        else:
            ones, earlies = [one] * calls, [early] * calls
        starts = [0]
        for run in ones:
            starts.append(starts[-1] + len(run))
        seq = [p for run in ones for p in run]
        ends = [starts[c + 1] - 1 for c in range(calls)]
        acc = [p.param_gradients if j < starts[calls - 1] else 0 for j, p in enumerate(seq)]
        fresh = [0] * len(seq)
        for c in range(1, calls):
            fresh[starts[c]] = extra[c - 1]
        fresh[0] += made
        events: dict[Point, list[FsdpEvent]] = {k: list(v) for k, v in (overlay or {}).items()} if calls == 1 else {}
        hold: dict[int, int] = {}
        for end, loss in zip(ends, losses):
            for point, evs in eager_loss_events(loss, end).items():
                events.setdefault(point, []).extend(evs)
            # Under inductor the stand-in loss's gradient, broadcast to the outputs' shape, is
            # realized as a buffer of their size wherever a matmul reads it, until its last read:
            # it already stands in for the real gradients there. In an FX graph it stays a view
            # of the scalar.
            hold[end] = loss.output_grad_bytes if seq[end].method == "fx" else 0
        # each call's outputs die where the compiling run's did, in that call's own backwards, unless
        # training_step took hold of one of them (returned it: Lightning keeps it through the backward)
        held = [c < len(losses) and losses[c].held_inner_bytes > 0 for c in range(calls)]
        run_early = {starts[c] + j: {starts[c] + i: b for i, b in by.items()}
                     for c in range(calls) if not held[c] for j, by in (earlies[c] or {}).items()}
        timeline, peak, (acts, grads, temps, fsdp) = _layout(seq, opt, ends=frozenset(ends), accumulate=acc,
                                                             inputs=fresh, overlay=events, bw_hold=hold,
                                                             early=run_early)
        notes = []
        if calls > 1 and self.cuda_allocator is not None:
            notes.append(f"{calls} calls per step: the CUDA allocator model was not run (requested bytes)")
        if calls > 1 and overlay:
            notes.append(f"{calls} calls per step: FSDP's buffers are not laid out for several calls")
        if losses:
            notes.append("the eager code between the forward and the backward (the loss on the outputs) is laid in "
                         "from one measured step")
        per_call = max(1, self._calls)
        relaid = bool(relaid or calls > 1 or losses or made)
        return dataclasses.replace(
            self, peak_bytes=peak, requested_peak_bytes=peak, timeline=tuple(timeline),
            baseline_bytes=self.baseline_bytes + self._made - made,
            breakdown=dataclasses.replace(self.breakdown, activations=acts, gradients=grads,
                                          optimizer_temporaries=temps, fsdp_buffers=fsdp,
                                          inputs=self.breakdown.inputs + self._made - made),
            regions=self.regions if self._others else tuple(
                dataclasses.replace(r, calls=r.calls // per_call * calls) for r in self.regions),
            allocations=None if relaid else self.allocations,
            cuda_allocator=None if relaid else self.cuda_allocator,
            problems=self.problems + tuple(m for m in notes if m not in self.problems),
            _calls=calls, _extra=extra, eager_losses=losses, _made=made)

    def _detached(self) -> Forecast:
        """This forecast without its compiled step, backend and graphs: plain data that
        :meth:`repeated` can still lay out (``step()`` no longer runs), cheap to keep for many
        candidate plans."""
        return dataclasses.replace(self, _step=None, _backend=None,  # type: ignore[arg-type]
                                   regions=tuple(dataclasses.replace(r, _graphs=(None, None)) for r in self.regions),
                                   _others=tuple(o._detached() for o in self._others))

    @property
    def compiled_parameter_bytes(self) -> int | None:
        """Bytes of the trainable parameters the compiled graphs take as inputs (each region's
        unique storages, summed over regions): 0 when dynamo compiled none of the model's own
        computation (it ran the forward eagerly, e.g. after a graph break inside a loop over
        FSDP2 units of a torch-internal block class); ``None`` when unknown (a detached forecast)."""
        backend = self._backend
        if backend is None:
            return None
        return int(sum(r.param_grad_bytes for r in backend.regions))

    @property
    def compiled_parameter_ids(self) -> frozenset[int] | None:
        """``id``s of the trainable parameters the compiled graphs take as inputs (the model's own
        ``nn.Parameter`` objects; under FSDP2 the unsharded ones of the forward); ``None`` when
        unknown (a detached forecast)."""
        backend = self._backend
        if backend is None:
            return None
        return frozenset().union(*(r.param_ids for r in backend.regions))

    @property
    def compiled_gradless_parameter_ids(self) -> frozenset[int] | None:
        """``id``s of the trainable parameters the compiled graphs read but give no gradient in any
        region (read under ``torch.no_grad()`` inside the forward: a frozen stem): autograd's
        graph still links them to the compiled backward, so a walk of it (``parameters_reached``)
        counts them, but their ``.grad`` stays ``None``. ``None`` when unknown (a detached forecast)."""
        backend = self._backend
        if backend is None:
            return None
        nograd = [r.gradless_param_ids() for r in backend.regions]
        given = frozenset().union(*(r.param_ids - g for r, g in zip(backend.regions, nograd)))
        return frozenset().union(*nograd) - given

    @functools.cached_property
    def torch_fx_estimate_bytes(self) -> int | None:
        """torch's FX-level estimate of the step in bytes (the regions' ``torch_fx_peak_bytes``
        summed), a peer; ``None`` if unavailable for any region. Computed on first access."""
        peers = [r.torch_fx_peak_bytes for r in self.regions]
        return sum(p for p in peers if p is not None) if peers and all(p is not None for p in peers) else None


# --------------------------------------------------------------------------- helpers
def _make_loss(model: nn.Module, loss_fn: Callable[[Any], torch.Tensor] | None) -> Callable[..., torch.Tensor]:
    def memplan_loss(*inputs: Any) -> torch.Tensor:
        out = model(*inputs)
        return loss_fn(out) if loss_fn is not None else out.sum()

    return fresh_function(memplan_loss)


@contextlib.contextmanager
def _no_side_effects(model: nn.Module, devices: list[int]) -> Any:
    """Restore grads, buffers and RNG after a compile run, so ``forecast`` leaves the model as it was."""
    grads = {p: p.grad for p in model.parameters()}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    for p in grads:
        p.grad = None
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            for p, g in grads.items():
                p.grad = g
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def _region_memory(region: RegionCapture, every_op: bool) -> RegionMemory:
    if region.fw_graph is None:
        raise RuntimeError(f"region {region.index}: no forward graph was captured")
    # the partitioned forward's placeholders are the region's inputs, in order
    holders = [n.name for n in region.fw_graph.graph.nodes if n.op == "placeholder"]
    flags = region.param_inputs
    acts = ([name for name, is_param in zip(holders, flags) if not is_param]
            if flags is not None and len(flags) == len(holders) else None)
    return profile_region(region.fw_graph.graph, region.bw_graph.graph if region.bw_graph is not None else None,
                          workspace=functools.partial(probe_workspace, every_op=every_op), activation_inputs=acts)


def _torch_fx_peak(fw_graph: Any, bw_graph: Any) -> int | None:
    try:
        if fw_graph is None or bw_graph is None:
            return None
        return _compat.torch_fx_peak_estimate(fw_graph.graph, bw_graph.graph)
    except Exception:  # noqa: BLE001 - a peer; absent when torch's estimator fails
        return None


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """Per-region numbers used to lay out the step: forward and backward timelines above their start."""

    index: int
    method: str
    fw_nodes: tuple[str, ...]
    fw_timeline: tuple[int, ...]
    fw_retained: int
    saved: int
    bw_nodes: tuple[str, ...]
    bw_timeline: tuple[int, ...]
    bw_end: int
    bw_peak: int
    bw_grads_at_peak: int
    gradients: int
    #: Bytes of the backward's incoming gradients, and whether ``bw_timeline`` counts them.
    tangents: int
    tangents_in_timeline: bool
    #: Transient copy of a non-contiguous gradient right after the backward (see RegionMemory).
    grad_copy: int
    #: The same step as allocations and frees, for the allocator model; ``None`` when the
    #: estimate has no per-storage detail (inductor's scheduler estimate).
    trace: RegionTrace | None = None
    #: Whether the backward keeps one of the forward's activation inputs (unknown: ``True``). When it
    #: keeps none, the previous region's outputs die once this forward has run (see :func:`_layout`).
    keeps_inputs: bool = True
    #: Of ``gradients``, the bytes of the parameters' gradients, and the largest one's (see
    #: :meth:`Forecast.repeated`).
    param_gradients: int = 0
    largest_param_gradient: int = 0
    #: The step of ``bw_timeline`` that last reads the region's incoming gradient (its tangents or
    #: views of them); ``None`` when unknown. An eager loss's gradients of the outputs, handed to
    #: this backward instead, die there (:meth:`Forecast.with_eager_loss`).
    tangent_last_use: int | None = None
    #: The step of ``bw_timeline`` that last reads one of the activation inputs the backward saved
    #: (``None`` when unknown or none): earlier regions' outputs it held last die after it.
    input_last_use: int | None = None


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


def _plan(region: RegionCapture, mem: RegionMemory, use_scheduler: bool) -> _Plan:
    bw = mem.bw
    keeps = mem.saves_activation_inputs is not False
    fx_plan = _Plan(
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
            grad_copy=mem.grad_copy_bytes, keeps_inputs=keeps,
            param_gradients=min(region.param_grad_bytes, mem.gradient_bytes)),
        keeps_inputs=keeps,
        param_gradients=min(region.param_grad_bytes, mem.gradient_bytes),
        largest_param_gradient=min(region.param_grad_max, mem.gradient_bytes),
    )
    readers = set(mem.tangent_readers)
    if readers and bw is not None:
        used = [i for i, name in enumerate(bw.order) if name in readers]
        fx_plan = dataclasses.replace(fx_plan, tangent_last_use=max(used) if used else None)
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
                            grad_copy=mem.grad_copy_bytes, keeps_inputs=keeps,
                            param_gradients=fx_plan.param_gradients)
    return _Plan(
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
        keeps_inputs=keeps,
        param_gradients=fx_plan.param_gradients,
        largest_param_gradient=fx_plan.largest_param_gradient,
        tangent_last_use=_last_step_reading(bs, readers, shift) if bs is not None else None,
        input_last_use=_last_step_reading(bs, act_readers, shift) if bs is not None and act_readers else None,
    )


def _last_step_reading(est: ScheduleEstimate, names: set[str], shift: int) -> int | None:
    """The last step of ``est``'s timeline whose kernels were lowered from one of ``names``."""
    if not names or not est.origins:
        return None
    steps = [i + shift for i, origin in enumerate(est.origins) if names & set(origin)]
    return max(steps) if steps else None


def _fsdp_overlay(fsdp: _compat.Fsdp2Units, plans: list[_Plan], executions: Sequence[int],
                  owners: Sequence[int | None], device: str, problems: list[str]) -> dict[Point, list[FsdpEvent]]:
    """FSDP2's buffers as layout events at the calls of :func:`_executed` (``owners`` aligned with
    ``executions``). On a failure the timeline goes without them, with a problem noted."""
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


def _run_early(plans: Sequence[_Plan], executions: Sequence[int],
               early: Mapping[tuple[int, int], int]) -> dict[int, dict[int, int]]:
    """The backend's :attr:`~lightning_memplan.forecasting.backend.MemplanBackend.early_frees` (keyed by
    positions in ``executions``) by position in :func:`_executed`'s run: consumer -> {producer: bytes}."""
    indices = {p.index for p in plans}
    run_pos: dict[int, int] = {}
    for k, i in enumerate(executions):
        if i in indices:
            run_pos[k] = len(run_pos)
    out: dict[int, dict[int, int]] = {}
    for (j, i), n in early.items():
        if j in run_pos and i in run_pos and n > 0:
            out.setdefault(run_pos[j], {})[run_pos[i]] = n
    return out


def _fsdp_unit_chain_early(fsdp: _compat.Fsdp2Units, run: Sequence[_Plan], executions: Sequence[int],
                           owners: Sequence[int | None]) -> dict[int, dict[int, int]]:
    """Where FSDP2 units' outputs die, when no steady run could watch them (under FSDP2 the
    backward is compiled, not run): by position in :func:`_executed`'s run, consumer -> {producer:
    bytes}, as :func:`_run_early`. Of two consecutive calls inside FSDP2 units other than the root
    (one block's output is the next block's input), when the later one's backward keeps its
    activation input and knows its last read (a checkpointed block saves its input to recompute
    from), the earlier one's outputs die there, as a run of the step shows without FSDP. (FSDP2 +
    checkpointed blocks with ``nn.MultiheadAttention``: +4.3% before, its first reads of the input
    come early in the recomputation.) ``run``: :func:`_executed`'s; ``owners`` aligned with ``executions``."""
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


def _per_later_call(new_input_bytes: int | Sequence[int], calls: int, call: str) -> list[int]:
    """``new_input_bytes`` as one number of bytes per call after the first (``calls - 1``); a
    ValueError naming ``call`` when it is not one int >= 0 or that many of them."""
    extra = [new_input_bytes] * (calls - 1) if isinstance(new_input_bytes, int) else list(new_input_bytes)
    if len(extra) != calls - 1 or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in extra):
        raise ValueError(f"`{call}(new_input_bytes={new_input_bytes!r})` must be an int >= 0 or "
                         f"{calls - 1} of them (one per call after the first).")
    return extra


def _executed(plans: list[_Plan], executions: Sequence[int]) -> list[_Plan]:
    """``plans`` in the order the step ran them, once per call (``executions``: region indices;
    regions without a plan are skipped); ``plans`` as they are when nothing was recorded."""
    by_index = {p.index: p for p in plans}
    run = [by_index[i] for i in executions if i in by_index]
    return run if run else list(plans)


def _layout(
    plans: list[_Plan], opt: OptimizerMemory | None, *, ends: frozenset[int] | None = None,
    accumulate: Sequence[int] = (), inputs: Sequence[int] = (),
    overlay: Mapping[Point, Sequence[FsdpEvent]] | None = None,
    bw_hold: Mapping[int, int] | None = None,
    early: Mapping[int, Mapping[int, int]] | None = None,
) -> tuple[list[TimelineStep], int, tuple[int, int, int, int]]:
    """Lay the regions out as one step: forwards in order, backwards in reverse, then the optimizer.

    ``plans`` are in the order the step runs them, once per call. Regions form a chain: region
    ``r``'s user outputs feed region ``r + 1`` and live until region ``r``'s backward starts, unless
    region ``r + 1``'s backward keeps none of its activation inputs (``keeps_inputs``): then nothing
    holds them once ``r + 1``'s forward has run (the Python frame between two graph breaks inside a
    block ends), and they die there. The gradients region ``r + 1``'s backward returned are region
    ``r``'s tangents (handed over, up to the activations' gradients it returned: more or fewer when
    uncompiled code ran between the two regions; a non-contiguous one is copied by AOTAutograd, so
    counted again). The last region's outputs (the loss) stay. After each backward, a
    non-contiguous gradient is copied once (``grad_copy``, transient).

    ``ends``: the positions that end one call of the model (their outputs, the loss, stay, and their
    incoming gradient is fresh); default: the last. ``accumulate[j]``: bytes of position ``j``'s
    gradients that autograd sums into the ones already waiting for the same parameters (an earlier
    call of the same model; default 0): out of place in its input buffers, one parameter at a time
    (``sum = old + new``, the old one freed), so the largest sum is transient on top of the
    backward's end; then the new ones are freed.
    ``inputs[j]``: bytes of fresh inputs made just before position ``j``'s forward (another view of
    the batch for a later call), live until its backward has run (default 0); when that region's
    backward keeps none of its activation inputs (it saved a cast or a product of them, as under
    autocast), only ``training_step`` refers to them, and they die when it returns, before the
    backward.

    ``overlay``: allocations and frees of others at points of the step (FSDP's buffers,
    :func:`~lightning_memplan.core.fsdp_memory.fsdp_step_events`; the eager loss,
    :func:`~lightning_memplan.forecasting.eager_loss.eager_loss_events`): ``("fw" | "bw", j, "before" |
    "after")`` position ``j``'s forward or backward; each event is a step of its own, counted as
    FSDP buffers or, category ``"gradients"``, as gradients (``zero_grad`` frees them), or,
    category ``"activations"``, as activations.
    ``bw_hold[j]``: bytes live from the start of position ``j``'s backward until its last read of
    its incoming gradient (``tangent_last_use``; unknown: the whole backward), then freed: an
    eager loss's gradients of the outputs, handed to that backward instead of its own tangents.
    ``early[j]``: ``{i: bytes}`` of position ``i``'s outputs that position ``j``'s backward held
    last (an activation input it saved; watched on a run of the compiled step): they die after its last
    read of its activation inputs (``input_last_use``; unknown: its end) instead of when position
    ``i``'s backward starts.

    Returns the timeline, the peak, and (activations, gradients, optimizer temporaries, FSDP
    buffers) at the peak.
    """
    ends = frozenset({len(plans) - 1}) if ends is None else ends
    acc = list(accumulate) + [0] * (len(plans) - len(accumulate))
    fresh = list(inputs) + [0] * (len(plans) - len(inputs))
    timeline: list[TimelineStep] = []
    best = (0, (0, 0, 0, 0))
    offset = 0
    grads = 0
    fsdp = 0  # FSDP's buffers live
    freed_early = [0] * len(plans)  # bytes of a position's outputs a later backward freed

    def apply(point: Point, phase: str, region: int) -> None:
        nonlocal offset, grads, fsdp, best
        for name, category, delta in (overlay or {}).get(point, ()):
            offset += delta
            if category == "gradients":
                grads += delta
            elif category != "activations":
                fsdp += delta
            timeline.append(TimelineStep(phase=phase, region=region, node=name, bytes=offset))
            if offset > best[0]:
                best = (offset, (offset - grads - fsdp, grads, 0, fsdp))
    dropped = [False] * len(plans)  # outputs freed after the next forward
    for j, p in enumerate(plans):
        offset += fresh[j]
        apply(("fw", j, "before"), "forward", p.index)
        for node, b in zip(p.fw_nodes, p.fw_timeline):
            timeline.append(TimelineStep(phase="forward", region=p.index, node=node, bytes=offset + b))
        if offset + max(p.fw_timeline) > best[0]:
            best = (offset + max(p.fw_timeline), (offset + max(p.fw_timeline) - grads - fsdp, grads, 0, fsdp))
        offset += p.fw_retained
        if j > 0 and not p.keeps_inputs and plans[j - 1].bw_timeline and j - 1 not in ends:
            dropped[j - 1] = True
            offset -= plans[j - 1].fw_retained - plans[j - 1].saved
        apply(("fw", j, "after"), "forward", p.index)
    for j, p in enumerate(plans):
        if fresh[j] and not p.keeps_inputs:  # freed when training_step returns
            offset -= fresh[j]
            fresh[j] = 0
    produced = 0  # gradients of activations the previous backward returned
    for i, p in enumerate(reversed(plans)):
        pos = len(plans) - 1 - i
        apply(("bw", pos, "before"), "backward", p.index)
        if not p.bw_timeline:
            apply(("bw", pos, "after"), "backward", p.index)
            continue
        last = pos in ends
        handed = 0 if last else min(p.tangents, produced)  # gradients of this region's outputs, live
        grads -= handed
        gone = last or dropped[pos]
        start = offset - p.saved - (0 if gone else max(0, p.fw_retained - p.saved - freed_early[pos]))
        if p.tangents_in_timeline:
            start -= handed
        held = (bw_hold or {}).get(pos, 0)
        upto = len(p.bw_timeline) - 1 if p.tangent_last_use is None else p.tangent_last_use
        # earlier positions' outputs this backward held last (not those already dropped)
        cuts = {i: min(n, max(0, plans[i].fw_retained - plans[i].saved - freed_early[i]))
                for i, n in (early or {}).get(pos, {}).items() if i < pos and not dropped[i] and i not in ends}
        cut = sum(cuts.values())
        at = len(p.bw_timeline) - 1 if p.input_last_use is None else p.input_last_use
        steps = [b + (held if k <= upto else 0) - (cut if k > at else 0) for k, b in enumerate(p.bw_timeline)]
        for node, b in zip(p.bw_nodes, steps):
            timeline.append(TimelineStep(phase="backward", region=p.index, node=node, bytes=start + b))
        if not cut:
            if start + p.bw_peak > best[0]:
                g = grads + p.bw_grads_at_peak
                best = (start + p.bw_peak, (start + p.bw_peak - g - fsdp, g, 0, fsdp))
            if held and start + held + max(p.bw_timeline[: upto + 1]) > best[0]:
                top = start + held + max(p.bw_timeline[: upto + 1])
                best = (top, (top - grads - fsdp, grads, 0, fsdp))
        elif start + max(steps) > best[0]:
            top = start + max(steps)
            g = grads + min(p.bw_grads_at_peak, max(steps))
            best = (top, (top - g - fsdp, g, 0, fsdp))
        for i, n in cuts.items():
            freed_early[i] += n
        offset = start + p.bw_end - (0 if p.tangents_in_timeline else handed) - cut
        if acc[pos]:
            top = offset + p.largest_param_gradient  # one accumulated sum beside the new gradients
            timeline.append(TimelineStep(phase="backward", region=p.index, node="accumulate_grad", bytes=top))
            if top > best[0]:
                best = (top, (offset - grads - fsdp - p.gradients, grads + p.gradients + p.largest_param_gradient,
                              0, fsdp))
            offset -= acc[pos]
        offset -= fresh[pos]
        grads += p.gradients - acc[pos]
        produced = p.gradients - p.param_gradients
        if p.grad_copy:
            timeline.append(TimelineStep(phase="backward", region=p.index, node="accumulate_grad",
                                         bytes=offset + p.grad_copy))
            if offset + p.grad_copy > best[0]:
                best = (offset + p.grad_copy, (offset - grads - fsdp, grads + p.grad_copy, 0, fsdp))
        apply(("bw", pos, "after"), "backward", p.index)
    if opt is not None:
        top = offset + opt.step_peak_bytes
        timeline.append(TimelineStep(phase="optimizer", region=-1, node="step", bytes=top))
        if top > best[0]:
            best = (top, (offset - grads - fsdp, grads, opt.step_peak_bytes, fsdp))
        timeline.append(TimelineStep(phase="optimizer", region=-1, node="zero_grad", bytes=offset - grads))
    return timeline, best[0], best[1]


def _allocations(plans: list[_Plan], opt: OptimizerMemory | None,
                 baseline: list[tuple[int, str]]) -> StepAllocations | None:
    """The step's allocations, stitched as :func:`_layout` lays the timeline out; ``None`` when a
    region has no per-storage trace."""
    if any(p.trace is None for p in plans):
        return None
    existing = opt is not None and opt.state_source == "existing"
    state = opt.state_storages if opt is not None else ()
    step = stitch_step([p.trace for p in plans if p.trace is not None], opt.step_events if opt is not None else None)
    return dataclasses.replace(step, baseline=(*baseline, *(state if existing else ())),
                               new_state=() if existing else state)


def _check_args(model: object, example_inputs: object, loss_fn: object, optimizer: object) -> tuple[Any, ...]:
    if not isinstance(model, nn.Module):
        raise ValueError(f"`forecast(model={model!r})` is not a torch.nn.Module. Pass the model to train.")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError(
            f"`forecast(example_inputs={example_inputs!r})` is not a tensor or a tuple of tensors. "
            "Pass the batch the model is called with: `model(*example_inputs)`."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"`forecast(loss_fn={loss_fn!r})` is not callable. Pass `output -> scalar loss`, or None.")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"`forecast(optimizer={optimizer!r})` is not a torch.optim.Optimizer, or None.")
    return tuple(inputs)


def _compile_step(
    be: MemplanBackend,
    model: nn.Module,
    inputs: tuple[Any, ...],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: torch.optim.Optimizer | None,
) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor], float, _compat.Fsdp2Units | None]:
    """Compile one training step with ``be`` by running forward and backward once (model restored;
    under FSDP2 the backward graphs are compiled with the forward and not run). Returns the step,
    the parameters, the seconds of the compiling run and the model's FSDP2 units (``be.owners``
    then says which unit each recorded call ran in)."""
    # static: a forecast is of these inputs' shapes. With dynamic=None, dynamo's profile of earlier
    # compiles of the same code in this process (automatic_dynamic_local_pgo) could make it a
    # dynamic-shape graph, and AOTAutograd would mark the caller's tensors dynamic for later compiles.
    compile_kwargs = {"dynamic": False, **_compat.isolated_compile_kwargs()}
    whole = torch.compile(_make_loss(model, loss_fn), backend=be, **compile_kwargs)
    params = [p for p in model.parameters()]
    fsdp = _compat.fsdp2_units(model)
    groups = fsdp.groups if fsdp is not None else ()
    be.call_owner = (lambda: _compat.fsdp2_active_unit(groups)) if fsdp is not None else None
    units = UnitCompile(model, be, compile_kwargs)  # FSDP2 units: each compiled on its own

    def compiled(*args: Any) -> torch.Tensor:
        with units.installed():
            return whole(*args)

    def step() -> torch.Tensor:
        loss = compiled(*inputs)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        return loss.detach()

    devices = sorted({t.device.index or 0 for t in [*params, *inputs] if t.device.type == "cuda"})
    t0 = time.perf_counter()
    be.executions.clear()
    be.owners.clear()
    be.early_frees.clear()
    be._position_outputs.clear()
    be.recording = True  # which regions one step runs, and how often
    try:
        with _no_side_effects(model, devices):
            eager_bw = _compat.eager_backward_compile() if fsdp is not None else None
            if eager_bw is not None:
                # FSDP2: its backward hooks would reshard and reduce-scatter (inside a strategy's
                # forward, the root must stay unsharded): compile the backwards without running them
                with eager_bw:
                    compiled(*inputs)
            else:
                _backward_without_hooks(compiled(*inputs), [*params, *inputs])
                if len(be.regions) > 1:
                    # the compiling run's region outputs are held by the compiles of the later regions
                    # (their example inputs): watch where they die (be.early_frees) on a steady run
                    be.executions.clear()
                    be.owners.clear()
                    be.early_frees.clear()
                    be._position_outputs.clear()
                    _backward_without_hooks(compiled(*inputs), [*params, *inputs])
    finally:
        be.recording = False
    return step, params, time.perf_counter() - t0, fsdp


def _backward_without_hooks(loss: torch.Tensor, leaves: list[torch.Tensor]) -> None:
    """Run ``loss``'s backward (compiling it) without accumulating into ``.grad``.

    ``torch.autograd.grad`` stops at ``leaves`` instead of running their AccumulateGrad nodes, so the
    hooks strategies put there (DDP's gradient reducer, FSDP's post-backward reshard) do not fire:
    the forecast may run inside a strategy's forward, where those hooks must not run.
    """
    targets = [t for t in leaves if t.requires_grad]
    if not targets:
        loss.backward()
        return
    torch.autograd.grad(loss, targets, allow_unused=True)


# --------------------------------------------------------------------------- forecast
def forecast(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budget: float = 1.0,
    solver: str | Callable[..., Any] = "dp",
    backend: str = "inductor",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Forecast:
    """Compile one training step of ``model`` with this budget and solver, and forecast its peak.

    Compiles by running forward and backward once on ``example_inputs``; gradients, buffers (batch-norm
    statistics) and the RNG are restored afterwards and the optimizer is not stepped, so the model is
    left as it was.

    Args:
        model: the module to train (put it in train mode first if that matters).
        example_inputs: the batch, a tensor or a tuple of tensors (``model(*example_inputs)``).
        budget: activation memory budget in [0, 1].
        solver: ``"greedy"``, ``"dp"``, ``"hirschberg"``, ``"ilp"`` or a callable with torch's solver
            signature ``(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)``;
            or ``"remat"``: whole-graph rematerialization at ``budget`` (:mod:`lightning_memplan.core.remat`).
        backend: ``"inductor"`` or ``"aot_eager_decomp_partition"`` (alias ``"aot_eager"``).
        loss_fn: ``output -> scalar``; default ``output.sum()``.
        optimizer: stepped (and ``zero_grad(set_to_none=True)``) at the end of each ``step()``.

    Raises:
        ValueError: bad arguments (each message names the argument and what is allowed).
        RuntimeError: a torch without the features needed (torch < 2.11).
    """
    b = _check_budget(budget, "forecast")
    solver_name, _ = resolve_solver(solver, "forecast")  # type: ignore[arg-type]
    inner = _check_inner(backend, "forecast", "backend")
    inputs = _check_args(model, example_inputs, loss_fn, optimizer)
    be = memplan_backend(budget=b, solver=solver, inner=inner)  # type: ignore[arg-type]
    step, params, compile_seconds, fsdp = _compile_step(be, model, inputs, loss_fn, optimizer)

    return _assemble(be, be.regions, model=model, params=params, inputs=inputs, optimizer=optimizer,
                     inner=inner, budget=b, solver_name=solver_name, compile_seconds=compile_seconds,
                     step=step, stacklevel=3, executions=tuple(be.executions), fsdp=fsdp, owners=tuple(be.owners),
                     early=dict(be.early_frees))


def _assemble(
    be: MemplanBackend,
    be_regions: Sequence[RegionCapture],
    *,
    model: nn.Module,
    params: list[torch.Tensor],
    inputs: tuple[Any, ...],
    optimizer: torch.optim.Optimizer | None,
    inner: str,
    budget: float,
    solver_name: str,
    compile_seconds: float,
    step: Callable[[], torch.Tensor],
    stacklevel: int,
    extra_seconds: float = 0.0,
    opt_mem: OptimizerMemory | None = None,
    executions: Sequence[int] = (),
    fsdp: _compat.Fsdp2Units | None = None,
    owners: Sequence[int | None] = (),
    early: Mapping[tuple[int, int], int] | None = None,
) -> Forecast:
    """The Forecast of one plan from its captured regions (after the compiling run).

    ``executions``: the region indices the compiling run called, in order (a region called several
    times is laid out once per call); empty: each region once, in compile order. ``fsdp``: the
    model's FSDP2 units; ``owners`` (aligned with ``executions``): the unit each call ran in. Their
    buffers are laid into the timeline (:func:`~lightning_memplan.core.fsdp_memory.fsdp_step_events`).
    ``early``: the compiling run's outputs that a later call's backward held last
    (:attr:`~lightning_memplan.forecasting.backend.MemplanBackend.early_frees`; see :func:`_layout`).
    """
    t1 = time.perf_counter()
    problems: list[str] = [f"region {r.index}: {e}" for r in be_regions for e in r.errors]
    seen: set[int] = set()
    storages = {
        "parameters": _compat.unique_storages(params, seen),
        "buffers": _compat.unique_storages(list(model.buffers()), seen),
        "inputs": _compat.unique_storages(list(inputs), seen),
    }
    baseline = {k: sum(n for n, _ in v) for k, v in storages.items()}
    if opt_mem is None and optimizer is not None:
        opt_mem = optimizer_memory(optimizer)
    if opt_mem is not None and opt_mem.problem:
        problems.append(opt_mem.problem)
    baseline["optimizer_state"] = opt_mem.state_bytes if opt_mem is not None else 0
    baseline_bytes = sum(baseline.values())

    plans: list[_Plan] = []
    regions: list[RegionForecast] = []
    calls = Counter(executions)  # calls of each region in one step
    for region in be_regions:
        try:
            mem = _region_memory(region, every_op=inner == "aot_eager")  # inductor: extern kernels only
            plan = _plan(region, mem, use_scheduler=inner == "inductor")
            if inner == "inductor" and plan.method == "fx":
                problems.append(f"region {region.index}: no inductor estimate; used the FX profile")
        except Exception as err:  # noqa: BLE001 - report, never lose the compiled run
            problems.append(f"region {region.index}: forecast failed: {type(err).__name__}: {err}")
            continue
        plans.append(plan)
        regions.append(RegionForecast(
            index=region.index, graph_id=region.graph_id, decision=region.decision, knapsack=region.knapsack,
            method=plan.method, fw_peak_bytes=max(plan.fw_timeline), bw_peak_bytes=plan.bw_peak,
            saved_bytes=plan.saved, gradient_bytes=plan.gradients,
            calls=max(1, calls[region.index]),
            _graphs=(region.fw_graph, region.bw_graph),
        ))
    if not be_regions:
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
    if plans:
        run = _executed(plans, executions)
        device = params[0].device.type if params else "cpu"
        if fsdp is not None:
            overlay = _fsdp_overlay(fsdp, plans, executions, owners, device, problems)
        run_early = _run_early(plans, executions, early or {}) if executions else {}
        if fsdp is not None and overlay and not run_early:
            run_early = _fsdp_unit_chain_early(fsdp, run, executions, owners)
        timeline, peak, (acts, grads, temps, fsdp_bytes) = _layout(run, opt_mem, overlay=overlay, early=run_early)
        requested = peak
        breakdown = MemoryBreakdown(**baseline, activations=acts, gradients=grads, optimizer_temporaries=temps,
                                    fsdp_buffers=fsdp_bytes)
        # the allocation stream does not model outputs dying in a later backward (run_early): where
        # that lowers the peak, the two disagree and the allocator model is not run
        allocations = None if overlay else _allocations(run, opt_mem, [s for v in storages.values() for s in v])
        consistent = allocations is not None and allocations.requested_peak_bytes == requested
        if allocations is not None and not consistent:
            problems.append(f"the step's allocations peak at {allocations.requested_peak_bytes} bytes, the "
                            f"timeline at {requested}: the CUDA allocator model was not run")
        if allocations is not None and consistent and device == "cuda" and len(plans) == len(be_regions):
            try:
                allocator = simulate_cuda_allocator(allocations, device=device)
                peak = allocator.allocated_peak_bytes
            except Exception as err:  # noqa: BLE001 - the requested peak stands
                problems.append(f"CUDA allocator model failed: {type(err).__name__}: {err}")
    status = "failed" if peak is None else ("partial" if len(plans) < len(be_regions) else "ok")
    if status != "ok":
        warnings.warn(f"lightning_memplan.forecast: {status}: " + "; ".join(problems), RuntimeWarning, stacklevel=stacklevel)

    decisions = [r.decision for r in regions]
    solver_est = (sum(d.saved_bytes - max(d.min_act_bytes, 0) for d in decisions if d is not None)
                  if decisions and all(d is not None for d in decisions) else None)
    overhead = sum(r.capture_seconds for r in be_regions) + (time.perf_counter() - t1) + extra_seconds
    return Forecast(
        peak_bytes=peak, requested_peak_bytes=requested, allocations=allocations, cuda_allocator=allocator,
        baseline_bytes=baseline_bytes, breakdown=breakdown, regions=tuple(regions),
        timeline=tuple(timeline), budget=budget, solver=solver_name, backend=inner, status=status,
        problems=tuple(problems), optimizer=opt_mem, solver_estimate_bytes=solver_est,
        compile_seconds=compile_seconds, overhead_seconds=overhead,
        _step=step, _backend=be, _parts=(tuple(plans), tuple(executions), opt_mem, overlay, run_early),
    )


# --------------------------------------------------------------------------- budget sweep
def forecast_sweep(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budgets: Sequence[float],
    solver: str | Callable[..., Any] = "dp",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[float, Forecast]:
    """Forecast several budgets from ONE compile: trace once, partition the same joint graph under
    every budget (``aot_eager``), run forward and backward once with the first budget's plan.

    Returns ``{budget: Forecast}`` in the order of ``budgets`` (duplicates dropped). Each forecast is
    what :func:`forecast` with ``backend="aot_eager"`` gives at that budget (same graphs, decisions,
    peak); only the first budget's ``step()`` trains, the others raise a ``RuntimeError`` (their plan
    was partitioned, never compiled to run: call :func:`forecast` with that budget to train with it).
    ``compile_seconds`` is the shared compiling run's, the same in every forecast.

    Raises:
        ValueError: bad arguments (as :func:`forecast`), or no budget.
        RuntimeError: a torch without the features needed (torch < 2.11).
    """
    grid = _grid(model, example_inputs, budgets=budgets, checkpoint_sets=((),), solver=solver, loss_fn=loss_fn,
                 optimizer=optimizer, call="forecast_sweep")
    return {b: fc for (_, b), fc in grid.items()}


def forecast_grid(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budgets: Sequence[float],
    checkpoint_sets: Sequence[Sequence[str]],
    solver: str | Callable[..., Any] = "dp",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    run: tuple[Sequence[str], float] | None = None,
    remat_budgets: Sequence[float] = (),
) -> dict[GridKey, Forecast]:
    """Forecast every plan (checkpointed blocks, budget) from ONE compile of the unchanged model.

    Like :func:`forecast_sweep`, and each non-empty checkpoint set (qualified names from
    ``model.named_modules()``) is emulated on the same joint graph: the forward nodes traced inside
    those blocks are tagged as ``torch.utils.checkpoint`` tags them under ``torch.compile``, so the
    partitioner recomputes them. Each forecast equals :func:`forecast` (``aot_eager``) of the model
    with those blocks wrapped by :func:`lightning_memplan.planner.checkpointing.checkpointed` (tested on
    residual MLP and transformer blocks). Only the plan compiled to run, ``run`` (default
    ``((), budgets[0])``), trains; the compiling forward and backward run that plan, so naming the
    most frugal one (e.g. every block checkpointed) keeps the search's one real step small when the
    unplanned model would not fit. A plan whose blocks could not be found in the graph gets a
    ``"failed"`` forecast saying so.

    ``remat_budgets`` adds whole-graph rematerialization plans (solver ``"remat"``, see
    :mod:`lightning_memplan.core.remat`) partitioned on the same joint graph, under the keys
    ``("remat", budget)``; each equals :func:`forecast` with ``solver="remat"`` at that budget.

    Returns ``{(checkpoint_set, budget): Forecast}``, sets in the order given, then budgets, then
    ``{("remat", budget): Forecast}`` in the order of ``remat_budgets``.

    Raises:
        ValueError: bad arguments (as :func:`forecast`), no budget, a name that is not a submodule,
            or ``solver="remat"`` (give its budgets as ``remat_budgets``).
        RuntimeError: a torch without the features needed (torch < 2.11).
    """
    return _grid(model, example_inputs, budgets=budgets, checkpoint_sets=checkpoint_sets, solver=solver,
                 loss_fn=loss_fn, optimizer=optimizer, call="forecast_grid", run=run, remat_budgets=remat_budgets)


def _grid(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    budgets: Sequence[float],
    checkpoint_sets: Sequence[Sequence[str]],
    solver: str | Callable[..., Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: torch.optim.Optimizer | None,
    call: str,
    run: tuple[Sequence[str], float] | None = None,
    remat_budgets: Sequence[float] = (),
) -> dict[GridKey, Forecast]:
    if isinstance(budgets, (int, float)) or not budgets:
        raise ValueError(f"`{call}(budgets={budgets!r})` must be a non-empty sequence of budgets in [0, 1].")
    bs = tuple(dict.fromkeys(_check_budget(b, call) for b in budgets))
    if isinstance(remat_budgets, (int, float)):
        raise ValueError(f"`{call}(remat_budgets={remat_budgets!r})` must be a sequence of budgets in [0, 1].")
    rbs = tuple(dict.fromkeys(_check_budget(b, call) for b in remat_budgets))
    solver_name, _ = resolve_solver(solver, call)  # type: ignore[arg-type]
    if solver_name == "remat":
        raise ValueError(f"`{call}(solver='remat')`: the grid's budgets and checkpoint sets are knapsack plans; "
                         "give a knapsack solver and the remat budgets as `remat_budgets=...`.")
    inputs = _check_args(model, example_inputs, loss_fn, optimizer)
    emulated = _check_checkpoint_sets(checkpoint_sets, model, call)
    sets = tuple(dict.fromkeys(tuple(s) for s in checkpoint_sets))
    run_ck, run_b = ((), bs[0]) if run is None else (tuple(run[0]), run[1])
    if run is not None and (run_ck not in sets or run_b not in bs):
        raise ValueError(f"`{call}(run={run!r})` must be one of the plans: a checkpoint set of checkpoint_sets "
                         f"and a budget of budgets, e.g. ({list(sets[-1])!r}, {bs[0]!r}).")
    be = memplan_backend(budget=run_b, solver=solver, inner="aot_eager", sweep=bs,  # type: ignore[arg-type]
                         sweep_checkpoints=emulated, model=model, run_checkpoint=run_ck, sweep_remat=rbs)
    step, params, compile_seconds, fsdp = _compile_step(be, model, inputs, loss_fn, optimizer)

    out: dict[GridKey, Forecast] = {}
    opt_mem = optimizer_memory(optimizer) if optimizer is not None else None  # the same for every plan
    plans: list[tuple[GridKey, str]] = [((ck, b), solver_name) for ck in sets for b in bs]
    plans += [(("remat", b), "remat") for b in rbs]
    for key, name in plans:
        ck, b = key
        if key == (run_ck, run_b):
            view, regions, run_step = be, be.regions, step
        else:
            regions = list(be.remat_regions(b) if ck == "remat" else be.sweep_regions(b, ck))
            for i, (r, own) in enumerate(zip(regions, be.regions)):
                if r.fw_graph is None and not r.errors and own.bw_graph is None and own.decision is None:
                    regions[i] = own  # not partitioned (an inference graph): the same under every plan
            view = memplan_backend(budget=b, solver=name if name == "remat" else solver,  # type: ignore[arg-type]
                                   inner="aot_eager")
            view.regions = regions
            run_step = functools.partial(_not_compiled, b, ck, run_ck, run_b)
        out[key] = _assemble(view, regions, model=model, params=params, inputs=inputs, optimizer=optimizer,
                             inner="aot_eager", budget=b, solver_name=name,
                             compile_seconds=compile_seconds, step=run_step, stacklevel=4,
                             extra_seconds=(sum(r.compile_seconds for r in regions)
                                            if run_step is not step else 0.0),
                             opt_mem=opt_mem, executions=tuple(be.executions), fsdp=fsdp,
                             owners=tuple(be.owners), early=dict(be.early_frees))
    return out


def _not_compiled(budget: float, checkpoint: tuple[str, ...] | str, ran_checkpoint: tuple[str, ...],
                  ran: float) -> torch.Tensor:
    if checkpoint == "remat":
        raise RuntimeError(
            f"this forecast of the remat plan at budget {budget!r} came from the partition of a shared compile; "
            f"call `forecast(..., budget={budget!r}, solver='remat')` to train with it.")
    ck = f" with {list(checkpoint)!r} checkpointed" if checkpoint else ""
    ran_ck = f"with {list(ran_checkpoint)!r} checkpointed" if ran_checkpoint else "without checkpointing"
    raise RuntimeError(
        f"this forecast of budget {budget!r}{ck} came from the partition of a shared compile; only budget "
        f"{ran!r} {ran_ck} was compiled to run. Call `forecast(..., budget={budget!r})` (inside "
        "`checkpointed(model, blocks)` for checkpointed blocks) to train with this plan."
    )
