"""The results of a forecast: :class:`Forecast` (the predicted memory of one steady-state training
step, and the step itself), :class:`RegionForecast` per compiled region, :class:`MemoryBreakdown`.

Units: bytes. A forecast is laid out again (another number of calls, an eager loss, inputs made in
the step, another optimizer memory) from the parts it keeps, without compiling
(:mod:`lightning_memplan.forecasting.layout`).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from lightning_memplan._torch.inductor import torch_fx_peak_estimate
from lightning_memplan.forecasting.allocations import AllocatorForecast, StepAllocations
from lightning_memplan.forecasting.backend import MemplanBackend
from lightning_memplan.forecasting.capture import KnapsackRecord, PartitionDecision
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.layout import StepParts, TimelineStep, lay_out_calls
from lightning_memplan.forecasting.optim_memory import OptimizerMemory

__all__ = ["Forecast", "MemoryBreakdown", "RegionForecast"]


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
    _graphs: tuple[fx.GraphModule | None, fx.GraphModule | None] = field(default=(None, None), repr=False,
                                                                         compare=False)

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
    #: The device this forecast is an estimate for, made on fake tensors without running
    #: (:mod:`lightning_memplan.forecasting.estimate`; ``step()`` raises); ``None`` when it was made
    #: by running the step.
    target: str | None = None
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
    #: What the timeline was laid out from; ``None`` when nothing was (a forecast built by hand).
    _parts: StepParts | None = field(default=None, repr=False, compare=False)

    def step(self) -> torch.Tensor:
        """Run one training step compiled with this plan; return the (detached) loss.

        Raises:
            RuntimeError: an estimate (``target`` set): there is no step to run.
        """
        return self._step()

    @property
    def estimate(self) -> bool:
        """Whether this forecast was made without running (on fake tensors, for ``target``)."""
        return self.target is not None

    @property
    def reserved_bytes(self) -> int | None:
        """Bytes the CUDA caching allocator reserves for the step, baseline included (what an
        out-of-memory error is about); ``None`` when its model did not run (not CUDA)."""
        return self.cuda_allocator.reserved_peak_bytes if self.cuda_allocator is not None else None

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
        if calls == 1 or self._parts is None or self.peak_bytes is None or self.breakdown is None:
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
        bad = [o for o in others if not isinstance(o, Forecast) or o.peak_bytes is None or o._parts is None
               or (o.budget, o.solver) != (self.budget, self.solver)]
        if not others or bad or self._calls != 1:
            raise ValueError(f"`Forecast.with_calls(others=...)` takes successful forecasts of the same budget "
                             f"({self.budget}) and solver ({self.solver!r}), at least one, on a forecast laid out "
                             f"for one call; got {len(others)} ({len(bad)} unusable) on one laid out for "
                             f"{self._calls}.")
        calls = 1 + len(others)
        extra = _per_later_call(new_input_bytes, calls, "Forecast.with_calls")
        if self._parts is None or self.peak_bytes is None or self.breakdown is None:
            return self
        return dataclasses.replace(self, _others=others)._laid_out(calls, tuple(extra), (), self._made)

    def with_inputs_made_in_step(self, nbytes: int) -> Forecast:
        """This forecast for a step that makes ``nbytes`` of the model's inputs itself
        (``training_step`` converts the batch: ``x.float() / 255``): they are not live before the
        step, so they move from the baseline (``baseline_bytes``, ``breakdown.inputs``) into the
        step, made just before the first forward and live until its backward has run (or until
        ``training_step`` returns, when the compiled graph saves none of them: see
        :func:`~lightning_memplan.forecasting.layout.lay_out`).
        Laid out again (nothing is compiled), as :meth:`repeated`; calls and eager losses laid in
        stay.

        Raises:
            ValueError: ``nbytes`` is not an int in [0, the inputs' bytes].
        """
        inputs = (self.breakdown.inputs + self._made) if self.breakdown is not None else 0
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= inputs:
            raise ValueError(f"`Forecast.with_inputs_made_in_step(nbytes={nbytes!r})` must be an int from 0 to the "
                             f"inputs' {inputs} bytes.")
        if nbytes == self._made or self._parts is None or self.peak_bytes is None or self.breakdown is None:
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
        if self._parts is None or self.peak_bytes is None or self.breakdown is None:
            return self
        return self._laid_out(self._calls, self._extra, losses, self._made)

    def with_optimizer_memory(self, optimizer: OptimizerMemory) -> Forecast:
        """This forecast with another prediction of the optimizer's memory (one that leaves out the
        parameters the step gives no gradient: ``optimizer_memory(opt, gradless=...)``): its state in
        the baseline and the breakdown, its step's temporaries in the timeline. Laid out again
        (nothing is compiled), as :meth:`repeated`; calls, eager losses and inputs made in the step
        stay; the allocation stream and the CUDA allocator model are not (``None``)."""
        if self._parts is None or self.peak_bytes is None or self.breakdown is None:
            return self
        old = self._parts.optimizer
        before = old.state_bytes if old is not None else 0
        fc = dataclasses.replace(
            self, optimizer=optimizer, _parts=dataclasses.replace(self._parts, optimizer=optimizer),
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
        assert self.breakdown is not None and self._parts is not None
        if self._others:  # each later call runs the graphs of its own forecast (with_calls)
            assert calls == 1 + len(self._others)
            runs = [self._parts, *(o._parts for o in self._others)]  # type: ignore[list-item]  # with_calls checked
        else:
            runs = [self._parts] * calls
        timeline, peak, (acts, grads, temps, fsdp) = lay_out_calls(runs, extra=extra, losses=losses, made=made)
        overlay = self._parts.overlay
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



def _torch_fx_peak(fw_graph: fx.GraphModule | None, bw_graph: fx.GraphModule | None) -> int | None:
    """torch's FX-level peak estimate of one region's (forward, backward) graphs in bytes; ``None``
    when a graph is missing or the estimator fails."""
    try:
        if fw_graph is None or bw_graph is None:
            return None
        return torch_fx_peak_estimate(fw_graph.graph, bw_graph.graph)
    except Exception:  # noqa: BLE001 - a peer; absent when torch's estimator fails
        return None


def _per_later_call(new_input_bytes: int | Sequence[int], calls: int, call: str) -> list[int]:
    """``new_input_bytes`` as one number of bytes per call after the first (``calls - 1``); a
    ValueError naming ``call`` when it is not one int >= 0 or that many of them."""
    extra = [new_input_bytes] * (calls - 1) if isinstance(new_input_bytes, int) else list(new_input_bytes)
    if len(extra) != calls - 1 or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in extra):
        raise ValueError(f"`{call}(new_input_bytes={new_input_bytes!r})` must be an int >= 0 or "
                         f"{calls - 1} of them (one per call after the first).")
    return extra
