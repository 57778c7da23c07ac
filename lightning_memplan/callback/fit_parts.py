"""The parts of one fit, built fresh in the callback's ``setup``, and what each of its hooks asks
of them together.

Each part owns its state: where the fit stands (:mod:`.phase`), the planned module's ``forward``
(:mod:`.forward_patch`, :mod:`.planned_forward`), the module ``training_step`` calls
(:mod:`.called_module`), the first batch's step (:mod:`.first_batch`), other input shapes
(:mod:`.shapes`), graphs compiled later (:mod:`.recompiles`), measured peaks (:mod:`.peak_meter`)
and the plan in force (:mod:`.controller`). :class:`FitParts` only passes what one part found to
the next; the conditions it asks are predicates of the part that knows. Sizes in bytes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Trainer
from torch import nn

from lightning_memplan.callback import reporter
from lightning_memplan.callback.called_module import FirstBatchCalls
from lightning_memplan.callback.controller import PlanController
from lightning_memplan.callback.epoch_result import EpochResult, end_epoch
from lightning_memplan.callback.first_batch import FirstBatchProfile
from lightning_memplan.callback.forward_patch import ForwardPatch
from lightning_memplan.callback.options import CallbackOptions
from lightning_memplan.callback.peak_meter import PeakMeter
from lightning_memplan.callback.phase import FitProgress
from lightning_memplan.callback.planned_forward import PlannedForward
from lightning_memplan.callback.recompiles import RecompileWatch
from lightning_memplan.callback.shapes import ShapeTracker
from lightning_memplan.callback.trainer_view import TrainerView
from lightning_memplan.forecasting.eager_loss import EagerCalls
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.called_modules import ModuleCall
from lightning_memplan.planner.settings import resolve_submodule

__all__ = ["FitParts"]


class FitParts:
    """The parts of one fit of ``view``'s Trainer, for the callback configured by ``options`` (on
    the fit's device); ``restored()``: the plan a resumed checkpoint gave back, if any.
    :attr:`plans` is ``None`` until a module is attached."""

    def __init__(self, view: TrainerView, options: CallbackOptions, restored: Callable[[], MemPlan | None]) -> None:
        self.view, self.options, self._restored = view, options, restored
        self.progress = FitProgress()
        self.patch = ForwardPatch()
        self.calls = FirstBatchCalls()
        self.profile = FirstBatchProfile()
        self.shapes = ShapeTracker()
        self.watch = RecompileWatch(verbose=options.verbose)
        self.meter = PeakMeter(options.measure_batches)
        self.plans: PlanController | None = None
        self.timeline_plotted = False

    @property
    def planned(self) -> str:
        """Which module is planned and why (the plan table's first row)."""
        return self.plans.planned if self.plans is not None else "nothing yet"

    # ------------------------------------------------------------------ the planned module
    def attach(self, module: nn.Module, why: str | None = None) -> None:
        """Plan ``module`` (the LightningModule or a submodule of it) from its next call on, in place
        of the module attached before, if any: its ``forward`` routed through a
        :class:`PlannedForward`, a fresh :class:`PlanController` made for it. ``why``: which module
        is planned and why, for the plan table (default: the controller's own words)."""
        o, lit = self.options, self.view.lit
        assert lit is not None
        self.patch.detach()
        self.patch.attach(lit, module, PlannedForward(self, o.forecast_new_shapes), backend=o.settings.backend)
        assert self.patch.module is not None and self.patch.original is not None
        self.view.module = self.patch.module
        self.plans = PlanController(o, self.view, module=self.patch.module, forward=self.patch.original,
                                    profile=self.profile, shapes=self.shapes, watch=self.watch,
                                    progress=self.progress, restored=self._restored)
        if why is not None:
            self.plans.planned = why

    def _plan_called(self, call: ModuleCall) -> Callable[..., Any] | None:
        """``training_step``'s first call of a module with trainable parameters, outside
        ``self(...)`` (no ``submodule`` given): that module is planned from this call on, as
        ``submodule=`` plans it; returns its planned forward. ``None`` (it runs as written) outside
        training, or for a path ``get_submodule`` does not take."""
        if not self.view.training_call():
            return None
        try:
            module = resolve_submodule(self.view.lit, call.path, "MemPlanCallback")
        except ValueError:
            return None
        self.attach(module, f"`{call.path}` ({call.kind}): the first module with trainable parameters "
                            "training_step called")
        assert self.patch.module is not None
        return self.patch.module.forward

    def close(self, *, failed: bool = False) -> None:
        """The fit ended (``failed``: by an exception; open measurements are closed first): the
        module calls no longer watched, the forward and the plan's blocks as they were."""
        if failed:
            self.meter.close()
            self.profile.close_window()
        self.calls.close()
        self.patch.detach()
        if self.plans is not None:
            self.plans.close()
        self.view.lit = None

    # ------------------------------------------------------------------ each batch
    def start_batch(self, batch: Any) -> None:
        """A training batch starts: counted; on the first, ``training_step``'s module calls
        watched (no ``submodule`` given) and the batch kept for the step's profile; on a later one,
        a peak window opened if the epoch still measures batches, unless the batch measures the
        eager code at new shapes instead (no profiler is started inside a step)."""
        self.progress.start_batch()
        first = self.progress.first
        if first and self.options.submodule is None and self.plans is not None:
            self.calls.open(self.view.lit, self._plan_called)
        profiled = self.meter.wants_batch()
        if self.shapes.start_batch(batch, track=self.options.forecast_new_shapes, later=self.progress.later,
                                   profiled=profiled, measured_eager=bool(self.profile.eager_losses)):
            return
        if first:
            self.profile.batch = batch
        elif profiled and self.plans is not None:
            self.meter.open(self.view.device(), self.plans.baseline_shift())

    def before_backward(self, loss: Any) -> None:
        """A backward of ``loss`` starts. On the first batch (or a batch of new shapes), with a plan
        in force: measure the eager code between the forward's calls and this backward (the loss
        on the outputs, metrics)."""
        outputs = self.profile.backward_starts(first=self.progress.first)
        if self._measures_eager_code() and self.profile.can_measure(outputs, loss):
            assert outputs is not None
            self._measure_eager_code(loss, outputs)

    def _measures_eager_code(self) -> bool:
        """Whether this batch measures the eager code before its backward: a plan in force, and it
        is the fit's first batch or one that notes new input shapes (``ShapeTracker.noting``)."""
        return (self.plans is not None and self.plans.in_force
                and (self.progress.first or self.shapes.noting is not None))

    def _measure_eager_code(self, loss: torch.Tensor, outputs: EagerCalls) -> None:
        """Measure the eager code before the backward of ``loss`` at the planned shapes (the first
        batch; also which parameters the loss reaches) or at the new shapes this batch notes."""
        plans, profile, shape = self.plans, self.profile, self.shapes.noting
        module, lit = self.patch.module, self.view.lit
        assert plans is not None and module is not None and lit is not None
        # which parameters get no gradient: with automatic optimization this backward is the step's
        # only one (under FSDP2 the graph holds the unsharded parameters, not the module's)
        if shape is None and not plans.fsdp2 and plans.loop().automatic_optimization:
            profile.reached = profile.parameters_reached(loss, outputs, plans.forecast)
            profile.warn_eager_forward(module, loss, profile.reached, outputs, plans.forecast)
        losses = profile.measure(loss, outputs, lit=lit, module=module,
                                 batch=profile.batch if shape is None else self.shapes.batch,
                                 device=self.view.device(), fsdp2=plans.fsdp2, at_shape=shape is not None)
        if losses is not None and shape is None:
            profile.eager_losses = losses
        elif losses is not None:
            self.shapes.eager[shape] = losses

    def end_batch(self, outputs: Any) -> None:
        """The batch ended, ``training_step`` having returned ``outputs``. The first: the step it
        showed judges the plan again and lays out its forecast. Every batch: new graphs reported,
        a step at new shapes forecast, the measured peak kept (the closed loop)."""
        if self.plans is None:
            return
        if self.progress.first:
            called = self.calls.end(verbose=self.options.verbose)
            self.plans.end_first_batch(outputs, self.options.submodule, called)  # plans: maybe the called module's
        plans = self.plans
        assert plans is not None
        new_graphs = self.watch.check(self.progress.batches)
        if self.shapes.noting is not None:  # it measured the eager code at new shapes (the first batch's: above)
            self.profile.close_window()
            self.profile.drop_calls()
        ran = self.shapes.end_batch(outputs, new_static_graph=any(not r.dynamic for r in new_graphs))
        peak = self.meter.close()
        if self.shapes.wants_forecast(ran, measured=self.meter.would_keep(peak)):
            assert ran.signature is not None and ran.call is not None
            plans.forecast_shapes(ran.signature, ran.call)  # after the window: its compile is not measured
        kept = self.meter.finish_batch(peak, ran.signature)
        if kept is not None:
            plans.measured(kept)

    # ------------------------------------------------------------------ each epoch
    def end_epoch(self, strategy: Any) -> EpochResult:
        """The epoch's measured peaks and prediction (every rank calls: maxima over ranks)."""
        plan = self.plans.plan if self.plans is not None else None
        return end_epoch(self.meter, self.shapes, plan, strategy, shapes_per_rank=self.options.forecast_new_shapes)

    def plot_timeline_once(self, trainer: Trainer, epoch: EpochResult) -> None:
        """Draw the planned shapes' forecast memory timeline against ``epoch``'s measured peak at
        those shapes, the first time an epoch measured them (once per fit)."""
        if self.timeline_plotted or epoch.at_planned is None or self.plans is None:
            return
        self.timeline_plotted = True
        reporter.plot_timeline(trainer, self.plans.forecast, self.plans.plan, self.plans.loop(), epoch.at_planned)
