"""The planned forward: what runs at every call of the planned module's ``forward`` while the
callback is attached (dispatch only: the parts of the fit, :mod:`.fit_parts`, do the work)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_memplan.planner.step_model import call_signature, input_storages

if TYPE_CHECKING:
    from lightning_memplan.callback.fit_parts import FitParts

__all__ = ["PlannedForward"]


class PlannedForward:
    """Called for every call of the planned module's forward during the fit: the first training
    call decides and installs the plan; training calls of the first batch (and of a batch of new
    shapes, with ``track_shapes``) are noted for the step's forecast; the plan's compiled forward
    runs, or the module's own forward when there is none (before a plan, after a fallback)."""

    def __init__(self, fit: FitParts, track_shapes: bool) -> None:
        self._fit = fit
        self._track = track_shapes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fit, plans = self._fit, self._fit.plans
        assert plans is not None and fit.patch.original is not None
        training = fit.view.training_call()
        first, later = fit.progress.first, fit.progress.later
        if first and training:
            fit.calls.lightning_module_called()
            fit.profile.note_call(args, kwargs)
        if plans.plan is None and plans.fallback_reason is None and training:
            plans.activate(args, kwargs)
        elif plans.pending is not None and training:
            fit.meter.discard = fit.meter.is_open
            plans.install_pending(args, kwargs)
        fn = plans.active
        if fn is None:
            return fit.patch.original(*args, **kwargs)
        sig = None  # the input shapes of this batch's first training call, when they are tracked
        if self._track and fit.shapes.batch_sig is None and training:
            sig = fit.shapes.batch_sig = call_signature(args, kwargs)
            if later and fit.shapes.wants_eager_at(sig, args, kwargs, steady=self._steady()):
                fit.shapes.noting = sig
        noting = training and (first or fit.shapes.noting is not None)
        if noting:
            fit.profile.close_window()  # the eager code after the previous call ends here
        # not under FSDP1: its pre-backward hooks sit on the outputs, and a partial backward through
        # the loss would unshard (FSDP2's are made inert while it runs)
        backend = (fit.watch.backend if noting and plans.measurable
                   and fit.profile.eager_calls(fit.view.device()) is not None else None)
        if backend is not None:
            backend.on_output = fit.profile.region_returned
        try:
            out = self._first_run(fn, args, kwargs, sig) if plans.first_call else fn(*args, **kwargs)
        finally:
            if backend is not None:
                backend.on_output = None
        if noting and plans.measurable:
            fit.profile.note_outputs(out, fit.view.device())
        if sig is not None and first:
            fit.profile.first_out_bytes = sum(input_storages((out,), {}).values())
        elif sig is not None:
            fit.shapes.note_call(sig, args, kwargs, out, fit.patch.module)
        return out

    def _first_run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   sig: tuple[Any, ...] | None) -> Any:
        """The compiled forward's first call (it compiles): on failure, fall back and run as written."""
        fit, plans = self._fit, self._fit.plans
        assert plans is not None and fit.patch.original is not None
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a failed compile must not lose the run
            fit.profile.close_window()
            plans.fall_back("compiling the planned forward", exc)
            return fit.patch.original(*args, **kwargs)
        plans.first_call = False
        record = fit.watch.planned_compiled()
        if record is not None:
            if sig is None or sig == fit.shapes.planned:
                fit.watch.planned_shapes = record.input_shapes
            elif not record.dynamic:  # a plan installed after the first batch, first run at other shapes
                fit.shapes.compiled.add(sig)
        return out

    def _steady(self) -> bool:
        """Whether a batch can measure the eager code at new shapes: no peak window open, the first
        batch's measured, one call per step, measurable, no collectives, no plan pending."""
        fit, plans = self._fit, self._fit.plans
        assert plans is not None
        return (not fit.meter.is_open and bool(fit.profile.eager_losses) and fit.profile.calls == 1
                and plans.measurable and not plans.collectives and plans.pending is None)
