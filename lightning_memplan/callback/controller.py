"""The plan in force during a fit: decided (rank 0's, shared), installed (blocks wrapped, forecast,
compiled), judged again once the first batch showed the step, laid out for that step, and
corrected at most once when a measured peak, or a batch of new shapes, goes over ``max_memory``.
Every failure falls back to the user's module with a warning; none stops training.

Bytes throughout; a plan's forecast is above the baseline (the bytes live before a step).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
import types
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_memplan._torch.dynamo import isolated_compile_kwargs, with_dynamo_settings
from lightning_memplan._torch.fsdp import fsdp_kinds
from lightning_memplan.callback import reporter
from lightning_memplan.callback.compile_watch import WatchedBackend, describe_shapes
from lightning_memplan.callback.first_batch import FirstBatchProfile
from lightning_memplan.callback.options import CallbackOptions
from lightning_memplan.callback.phase import FitProgress
from lightning_memplan.callback.recompiles import RecompileWatch
from lightning_memplan.callback.shapes import ShapeCall, ShapeTracker
from lightning_memplan.callback.strategy import decide_on_rank_zero, forward_has_collectives
from lightning_memplan.callback.trainer_view import TrainerView
from lightning_memplan.core.fresh_code import fresh_function
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.optim_memory import OptimizerMemory
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.forecasting.unit_compile import UnitCompile
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.called_modules import ModuleCall, nothing_to_plan
from lightning_memplan.planner.checkpointing import checkpointed
from lightning_memplan.planner.decision import decide_plan, rejudge_plan
from lightning_memplan.planner.messages import MemPlanWarning, error_summary
from lightning_memplan.planner.pipeline import (
    PlannedStep,
    Stage,
    StepObservation,
    gradless_optimizer_memory,
    plan_step,
)
from lightning_memplan.planner.plan_forecast import forecast_plan, lay_out_step
from lightning_memplan.planner.rng import rng_kept
from lightning_memplan.planner.search import replan_candidate
from lightning_memplan.planner.device_limit import device_limit
from lightning_memplan.planner.settings import plan_solver
from lightning_memplan.planner.step_model import TrainingLoop, live_grad_bytes, step_grad_bytes
from lightning_memplan.units import format_bytes

__all__ = ["PlanController"]


def _fresh_forward(module: nn.Module) -> Callable[..., Any]:
    """``type(module).forward`` with a new code object, bound to ``module``: dynamo's per-code cache
    starts empty, so a new plan is never served an old compiled graph."""
    return types.MethodType(fresh_function(type(module).forward), module)


def _warn(message: str, stacklevel: int = 3) -> None:
    warnings.warn(f"MemPlanCallback: {message}", MemPlanWarning, stacklevel=stacklevel + 1)


def _key(plan: MemPlan) -> tuple[Any, ...]:
    """What makes two plans compile alike: budget, checkpointed blocks, solver, regional blocks."""
    return plan.budget, plan.checkpoint, plan.solver, plan.regional


class PlanController:
    """The plan of one fit. ``restored``: the plan from a checkpoint, if any (used without
    searching; asked for at the first training call, since Lightning loads the checkpoint after
    ``setup``)."""

    def __init__(self, options: CallbackOptions, view: TrainerView, *, module: nn.Module,
                 forward: Callable[..., Any], profile: FirstBatchProfile, shapes: ShapeTracker,
                 watch: RecompileWatch, progress: FitProgress, restored: Callable[[], MemPlan | None]) -> None:
        self._o, self._s = options, options.settings
        self._view, self._module, self._forward = view, module, forward
        self._profile, self._shapes, self._watch, self._progress = profile, shapes, watch, progress
        self._restored = restored
        #: The plan in force (``None`` before the first training call, or after a fallback).
        self.plan: MemPlan | None = None
        #: The forecast of the plan in force, on ``backend`` (``None`` before or on failure).
        self.forecast: Forecast | None = None
        #: Why the callback fell back to the uncompiled module (``None`` while it did not).
        self.fallback_reason: str | None = None
        self.fallback_error: BaseException | None = None
        #: Seconds the decision took (search included) and the final compile + forecast took.
        self.timings: dict[str, float] = {}
        #: The compiled forward in force (``None``: the module runs as written).
        self.active: Callable[..., Any] | None = None
        #: The next call is the compiled forward's first (it compiles).
        self.first_call = False
        #: The arguments the plan is forecast and compiled at (dropped when no re-plan can follow).
        self.example: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        #: A plan to install at the next training call (the forward runs collectives).
        self.pending: MemPlan | None = None
        self.collectives = False  # the planned module's forward runs collectives (FSDP, TP)
        self.fsdp2 = False  # ... some FSDP2 units among them: their hooks are made inert to measure
        self.measurable = True  # the eager code after the forward can be measured (not under FSDP1)
        self._stack = contextlib.ExitStack()  # the plan's checkpointed blocks (and FSDP2 units compiled)
        self._wrapped: tuple[Any, ...] | None = None  # the _key of the plan whose blocks the stack wraps
        self._kept: tuple[Forecast | None, ...] = ()  # the search's candidate forecasts, kept through the first batch
        self._replanned = False
        #: Which module is planned and why (the plan table's first row).
        self.planned = (f"`{options.submodule}` ({type(module).__name__}): `submodule={options.submodule!r}`"
                        if options.submodule else "the LightningModule (`self(...)` in training_step)")

    # ------------------------------------------------------------------ helpers
    def loop(self) -> TrainingLoop:
        return self._view.loop(self._profile.reached)

    def _optimizer_memory(self) -> OptimizerMemory | None:
        """The optimizer's memory without the parameters the step gives no gradient (``None`` when
        every trainable parameter gets one, or there is no optimizer: the forecast's stands)."""
        reached = self._profile.reached
        return gradless_optimizer_memory(self._module, self._view.optimizer(), reached) if reached else None

    def _limit(self) -> str:
        """The memory limit in words: ``max_memory 6.00 MiB``, or the device's and where it came from."""
        assert self._s.max_memory is not None
        name = self._s.limit_name
        size = format_bytes(self._s.max_memory)
        return f"max_memory {size}" if name == "max_memory" else f"{size} ({name})"

    @property
    def in_force(self) -> bool:
        """Whether a plan was installed and the callback has not fallen back since."""
        return self.plan is not None and self.fallback_reason is None

    def may_replan(self) -> bool:
        """Whether the closed loop may still re-plan (it needs the first batch's inputs)."""
        return self._o.replan and self._s.max_memory is not None and not self._replanned

    def end_first_batch(self, outputs: Any, submodule: str | None, called: list[ModuleCall]) -> None:
        """The first batch ended (``training_step`` returned ``outputs``): without a training call
        of the forward there is nothing to plan (``called``: the outermost module calls the step
        made, for the message); else the step it showed judges the plan again and lays out its
        forecast; warns when it ran several backward passes."""
        p = self._profile
        if self.plan is None and self.fallback_reason is None:
            message = nothing_to_plan(submodule, called)
            self.fallback_reason = message.split(",")[0]
            _warn(message)
        p.finish(outputs, self._module)
        if self.plan is not None and p.calls >= 1 and self.example is not None:
            self._lay_out(judge=True)  # every rank: rank 0 re-judges with its measurement
        if self.plan is not None and p.backwards > 1:
            _warn(f"training_step ran {p.backwards} backward passes in one batch (manual optimization, e.g. a GAN's "
                  "generator and discriminator steps). The forecast covers the planned forward's calls, the code on "
                  "their outputs, one backward and one optimizer step; what runs after the first backward (another "
                  "model's forward, backward and optimizer step) is not forecast, so the measured peak "
                  "(memplan/measured_peak_bytes) can be higher than predicted. Plan the part that dominates memory "
                  "(`submodule=`), or check memplan/prediction_error.")
        self.forget_first_batch()

    def forget_first_batch(self) -> None:
        """The first batch ended: its candidates' forecasts, and its inputs unless a re-plan may follow."""
        self._kept = ()
        if not self.may_replan():
            self.example = None
            self._profile.other_calls = {}

    def close(self) -> None:
        """Unwrap the checkpointed blocks and drop the compiled forward (the fit ended)."""
        self._unwrap()
        self.active = None

    def _unwrap(self) -> None:
        """Unwrap the plan's checkpointed blocks (and its FSDP2 units' compile)."""
        self._stack.close()
        self._stack, self._wrapped = contextlib.ExitStack(), None

    def _forecast_context(self, plan: MemPlan) -> AbstractContextManager[Any]:
        """``plan_step``'s ``blocks``: ``plan``'s blocks wrapped in the fit's stack, where they stay
        (wrapped again only when the stack holds another plan's), and the precision plugin's step
        context, for a forecast of ``plan``. Raises what wrapping raises."""
        if self._wrapped != _key(plan):
            self._unwrap()
            self._stack.enter_context(checkpointed(self._module, plan.checkpoint))
            self._wrapped = _key(plan)
        return self._view.step_context()

    def _step_context(self, plan: MemPlan) -> AbstractContextManager[Any]:
        """``blocks`` after the first batch, for the forecasts of the calls of other shapes with the
        plan in force: the step context, its blocks as they are (wrapped; unwrapped after a
        fallback). Raises when the forward runs collectives (FSDP, tensor parallelism): a forecast
        outside it would read sharded parameters."""
        if forward_has_collectives(self._module):
            raise RuntimeError("calls of other input shapes are not forecast under FSDP or tensor parallelism")
        return self._view.step_context()

    def _agreed(self, decision: Callable[[], MemPlan]) -> MemPlan:
        """``decision()`` as rank 0 made it, on every rank (every rank runs it when the forward runs
        collectives: the candidates' forecasts all-gather); one process: made here."""
        strategy = self._view.strategy
        if strategy is None:
            return decision()
        return decide_on_rank_zero(strategy, decision, all_ranks_run=forward_has_collectives(self._module))

    def _plan_step(self, failed: list[Stage], what: str = "again", quiet: Callable[[], bool] = lambda: False,
                   **kw: Any) -> PlannedStep:
        """:func:`plan_step`'s result for the planned module at ``example``, its blocks wrapped for the
        fit (``blocks`` default: :meth:`_forecast_context`), its failed stages noted in ``failed`` and
        warned of (``what``: what the re-judge judged by, for its message; a failed layout not while
        ``quiet()``) while training goes on; ``kw``:
        ``plan``, ``earlier``, ``step``, ``agree``, ``blocks``. Raises what plan_step raises (a failed
        decision, blocks that cannot be wrapped)."""
        def failure(stage: Stage, exc: Exception) -> None:
            failed.append(stage)
            if stage == "forecast":
                _warn(f"the forecast of the chosen plan failed ({exc!r}); training with the plan, without "
                      "predictions.", 4)
            elif stage == "rejudge":
                _warn(f"judging the candidate plans {what} failed ({exc!r}); keeping the plan chosen at the "
                      "first forward call.", 4)
            elif not quiet():
                _warn(f"laying the forecast out for the step the first batch ran failed ({exc!r}); the "
                      "prediction covers one call of the compiled graphs.", 4)

        assert self.example is not None
        args, kwargs = self.example
        kw.setdefault("blocks", self._forecast_context)
        with rng_kept():  # the forecasts' runs of the forward draw nothing the user's training would
            return plan_step(self._module, settings=self._s, args=args, kwargs=kwargs, forward=self._forward,
                             optimizer=self._view.optimizer(), call="MemPlanCallback", loop=self.loop(),
                             on_failure=failure, **kw)

    # ------------------------------------------------------------------ decide and install
    def activate(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """At the first training call: decide the plan (rank 0's, broadcast; a restored or given one
        without searching), forecast it and install it (``plan_step``'s first part). Never raises."""
        self.example = (args, kwargs)
        restored = self._restored()
        given = self._o.user_plan if self._o.user_plan is not None else restored  # plan= wins (given_plan)
        if given is None:  # budget="auto" without max_memory, on CUDA: the device's memory is the limit
            self._s = self._s.with_device_limit(device_limit(self._view.device(), processes=self._view.world_size))
        t0 = time.perf_counter()
        decided: list[float] = []

        def agree(decision: Callable[[], MemPlan]) -> MemPlan:
            plan = self._agreed(decision)  # FSDP / tensor parallel: every rank runs the candidates' forecasts
            decided.append(time.perf_counter())
            self.timings["decide_seconds"] = decided[0] - t0
            return plan

        self._unwrap()
        try:
            planned = self._plan_step([], plan=given, agree=agree)
        except Exception as exc:  # noqa: BLE001 - planning failure: train unplanned
            self.fall_back("installing the plan" if decided else "planning", exc)
            return
        self._kept = planned.candidate_forecasts
        self._compile(planned.plan, planned.forecast, decided[0])

    def install_pending(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Install the pending plan at this training call's arguments."""
        plan, self.pending = self.pending, None
        assert plan is not None
        self.example = (args, kwargs)
        self.install(plan)

    def install(self, plan: MemPlan) -> None:
        """Wrap the plan's blocks, forecast it on ``backend`` (``plan_step``'s first part) and compile;
        after the first batch, lay it out for the step that batch showed. Falls back on failure."""
        assert self.example is not None
        self._unwrap()
        t0 = time.perf_counter()
        try:
            planned = self._plan_step([], plan=plan)
        except Exception as exc:  # noqa: BLE001 - a failed plan must not lose the run
            self.fall_back("installing the plan", exc)
            return
        self._compile(planned.plan, planned.forecast, t0)

    def _compile(self, plan: MemPlan, fc: Forecast | None, t0: float) -> None:
        """Compile the forward with ``plan`` (forecast as ``fc``, its blocks wrapped) and put it in
        force (``t0``: ``perf_counter`` seconds when installing began); after the first batch, lay it
        out for the step. Falls back on failure."""
        from lightning_memplan.forecasting.backend import memplan_backend

        module = self._module
        assert self.example is not None
        try:
            be = memplan_backend(budget=plan.budget, solver=plan_solver(self._s, plan), inner=self._s.backend,
                                 capture=False)
            backend = WatchedBackend(be, training=self._view.training)
            # static shapes by default: another batch size compiles a graph of its own (with the
            # plan) and the planned graph keeps serving the planned size (see compile_watch)
            ckw = {**isolated_compile_kwargs(), "dynamic": False, **self._o.compile_kwargs}
            compiled = with_dynamo_settings(torch.compile(_fresh_forward(module), backend=backend, **ckw))
            # FSDP2 units and the plan's regional blocks: each compiled on its own (see unit_compile), for this fit
            regional = [module.get_submodule(n) for n in plan.regional]
            self._stack.enter_context(UnitCompile(module, backend, ckw, regional).installed())
        except Exception as exc:  # noqa: BLE001 - a failed plan must not lose the run
            self.fall_back("installing the plan", exc)
            return
        collectives = forward_has_collectives(module)
        kinds = fsdp_kinds(module) if collectives else None
        # tensor parallelism alone: its collectives are in the compiled graphs (functional
        # collectives), so the forecast holds their buffers; FSDP's live outside them
        if fc is not None and kinds and (kinds.fsdp1 or kinds.fsdp2) and not (fc.breakdown and fc.breakdown.fsdp_buffers):
            _warn("the parameters are sharded by FSDP (FSDP1, or FSDP2 internals this version cannot read). The "
                  "forecast counts this rank's shards of the parameters, gradients and optimizer state, and the "
                  "activations of the compiled graphs; FSDP's unsharded parameters and communication buffers are "
                  "not forecast, so the measured peak (memplan/measured_peak_bytes) will be higher than "
                  "predicted.", 3)
        self.forecast, self.plan = fc, plan
        planned = self._shapes.plan_installed(*self.example)
        self._watch.follow(backend, tuple(x[0] for x in planned))  # (the compiled graph's, at its first run)
        self.collectives = collectives
        self.fsdp2 = bool(kinds and kinds.fsdp2)
        self.measurable = not (kinds and kinds.fsdp1)
        self.active, self.first_call = compiled, True
        self.timings["install_seconds"] = time.perf_counter() - t0
        if self._progress.later and self._profile.calls >= 1:  # a re-plan: as many calls as before, the same eager loss
            self._lay_out(judge=False)
        if not self.may_replan() and self._progress.later:
            self.example = None  # no re-plan can follow: do not hold on to the first batch
        if self._o.verbose:
            rank_zero_info(reporter.plan_table(plan, self.timings, planned=self.planned))
        if self._o.log_plots:
            reporter.plot_frontier(self._view.trainer, plan, self._s.max_memory)

    def fall_back(self, what: str, error: BaseException) -> None:
        """Train the module as written from now on, saying why: ``what`` failed with ``error`` (kept,
        its whole chain, as :attr:`fallback_error`; the warning gives its root cause's type and first line)."""
        self.fallback_reason = f"{what} failed: {error_summary(error)}"
        self.fallback_error = error
        self.active = None
        self._unwrap()
        warnings.warn(f"MemPlanCallback: {self.fallback_reason}. Training goes on with the module uncompiled (the "
                      "whole error: callback.fallback_error).", MemPlanWarning, stacklevel=4)

    def _install_soon(self, plan: MemPlan) -> None:
        """Install ``plan`` now, or, when the forward runs collectives (FSDP, tensor parallelism),
        at its next training call: a forecast outside the forward would read sharded parameters."""
        if self.collectives:
            self.pending = plan
        else:
            self.install(plan)

    # ------------------------------------------------------------------ after the first batch
    def _lay_out(self, *, judge: bool) -> None:
        """``plan_step``'s second part for the plan in force: with ``judge`` (the first batch ended)
        the search's kept candidate forecasts judged again for the step that batch showed (rank 0
        decides, every rank takes part; nothing is compiled), a plan that wins installed (at the
        next training call when the forward runs collectives); then the forecast of the plan in
        force laid out for that step (the forward's calls, the inputs training_step made, the eager
        code measured after the forward, the gradients and optimizer state of the parameters its
        backward reached), and what it covers said (:meth:`_note_laid_out`). Failures are warned
        of; training goes on."""
        p, plan = self._profile, self.plan
        assert plan is not None
        calls, losses, made = p.calls, p.eager_losses, p.made_inputs
        what = " and ".join(
            ([f"on {calls} forward calls per step"] if calls > 1 else [])
            + (["with the inputs training_step makes"] if made else [])
            + (["with the loss on the outputs measured"] if losses else [])) or "again"
        switch: list[MemPlan] = []  # the plan the re-judge chose instead, installed here

        def agree(decision: Callable[[], MemPlan]) -> MemPlan:
            new = self._agreed(decision)
            same = _key(new) == _key(plan)
            if calls > 1 or not same:
                rank_zero_info(
                    f"MemPlanCallback: judged {what}, the search {'keeps' if same else 'chooses'} "
                    f"{new.candidates[new.chosen].label}"
                    + ("." if same else f" instead of {plan.candidates[plan.chosen].label} (recompiling once)."))
            if same:
                return new
            if self.collectives:  # installed at the next training call; the plan in force laid out meanwhile
                self.pending = new
            else:  # installed (forecast, compiled) below, then laid out; this call's layout is dropped
                switch.append(new)
            return plan

        earlier = PlannedStep(plan=plan, forecast=self.forecast, decided=plan, loop=self.loop(),
                              candidate_forecasts=self._kept if judge else ())
        # backwards=0: the callback says itself that several backward passes ran (end_first_batch)
        step = StepObservation(calls=calls, new_input_bytes=p.fresh_input_bytes(calls), eager_losses=losses,
                               made_input_bytes=made, reached=p.reached, signatures=tuple(p.signatures),
                               others=p.other_calls)
        failed: list[Stage] = []
        laid = self._plan_step(failed, what, lambda: bool(switch), earlier=earlier, step=step,
                               agree=agree if judge else None, blocks=self._step_context)
        if switch:
            self.install(switch[0])
            self._lay_out(judge=False)  # the plan installed (or, when that failed, the one in force)
            return
        self.plan, self.forecast = laid.plan, laid.forecast
        fc = laid.forecast
        if calls <= 1 and not losses and not made and not self.loop().gradless_bytes:
            return  # nothing to lay out
        if fc is None or fc.peak_bytes is None:
            if calls > 1:
                _warn(f"training_step called the planned forward {calls} times in one step and there is no "
                      "forecast to lay out for them.")
            return
        if "layout" not in failed:
            self._note_laid_out(laid.plan, calls, losses, made)

    def _note_laid_out(self, plan: MemPlan, calls: int, losses: tuple[EagerLoss, ...], made: int) -> None:
        """Say what the laid-out forecast covers (rank zero), and warn when it is over ``max_memory``."""
        baseline, peak, max_memory = plan.baseline_bytes, plan.predicted_peak_bytes, self._s.max_memory
        parts = []
        if made and self._o.verbose:
            parts.append(f"training_step makes {format_bytes(made)} of the forward's inputs (counted in the step, "
                         "not before it)")
        if calls > 1:
            others = len(self._profile.other_calls)
            parts.append(f"training_step called the planned forward {calls} times in one step; the forecast now "
                         f"covers {calls} calls (every call's saved activations live until its backward)"
                         + (f", {others} other input shape(s) forecast with the plan on their own "
                            "compiled graphs" if others else ""))
        if losses and (calls > 1 or self._o.verbose):
            kept = sum(m.kept_bytes for m in losses)
            eager = max(max(m.forward_peak_bytes, m.kept_bytes) for m in losses)
            parts.append(f"the eager code after the forward (the loss on the outputs, measured on "
                         f"{self._profile.eager_from}): {format_bytes(sum(m.outputs_bytes for m in losses))} of "
                         f"outputs, up to {format_bytes(eager)} made, {format_bytes(kept)} kept for backward, a "
                         f"backward of {format_bytes(max(m.backward_peak_bytes for m in losses))}")
        said = f"{'; '.join(parts)}. " if parts else ""
        note = f"MemPlanCallback: {said}Forecast now {format_bytes(peak)} above the baseline."
        if max_memory is not None and peak is not None and baseline + peak > max_memory:
            then = ("the closed loop re-plans if the measured peak exceeds it" if self.may_replan() else
                    "the closed loop has re-planned once already: reduce the batch or raise max_memory")
            warnings.warn(f"{note} With the baseline, {format_bytes(baseline + peak)} in all: "
                          f"{format_bytes(baseline + peak - max_memory)} over {self._limit()}; {then}.",
                          MemPlanWarning, stacklevel=5)
        elif parts:
            rank_zero_info(note)

    # ------------------------------------------------------------------ measured batches
    def baseline_shift(self) -> int:
        """Bytes to add to a window's peak (above the bytes live when it opened) so it is above the
        prediction's baseline. Manual optimization: the prediction's baseline holds no gradients,
        so those live at the start count in the peak. Automatic optimization: the baseline holds
        the previous step's gradients; a batch that starts with none (Lightning freed them before
        validation) makes them all again on top, so their bytes are subtracted."""
        if not self.loop().automatic_optimization:
            return live_grad_bytes(self._module)
        held = self.plan.breakdown.get("gradients", 0) if self.plan is not None else 0
        lit = self._view.lit
        params = lit.parameters() if lit is not None else self._module.parameters()
        if held and not any(p.grad is not None for p in params):
            return -held
        return 0

    def measured(self, measured: int) -> None:
        """The closed loop: a measured peak (bytes above the baseline) over ``max_memory`` re-plans
        once with a candidate forecast to fit (or half the budget), recompiling."""
        plan, max_memory = self.plan, self._s.max_memory
        if (not self._o.replan or self._replanned or max_memory is None or plan is None
                or plan.baseline_bytes is None or plan.baseline_bytes + measured <= max_memory):
            return
        self._replanned = True
        new, unseen, fits = replan_candidate(plan, measured, max_memory)
        if new is None:
            _warn(f"measured peak {format_bytes(plan.baseline_bytes + measured)} exceeds {self._limit()}, and no "
                  "plan is forecast below the one in force; keeping it. Reduce the batch, allow checkpointing more "
                  "blocks, or raise max_memory.", 2)
            return
        if fits:
            expect = (f"forecast {format_bytes(plan.baseline_bytes + (new.peak_bytes or 0) + unseen)}, counting the "
                      f"{format_bytes(unseen)} the forecast did not see (eager code such as the loss)")
        else:
            expect = ("no candidate is forecast to fit; the smallest forecast below the plan's" if new.peak_bytes
                      else "no candidate is forecast to fit; halving the budget")
        _warn(f"measured peak {format_bytes(plan.baseline_bytes + measured)} exceeds {self._limit()}; re-planning "
              f"once with {new.label} ({expect}), recompiling, and going on.", 2)
        self._install_soon(dataclasses.replace(
            plan, budget=new.budget, checkpoint=new.checkpoint, predicted_peak_bytes=new.peak_bytes,
            solver=new.solver or (plan.solver if plan.solver != "remat" else self._s.solver_name),
            reason=f"re-planned: the measured peak was {format_bytes(plan.baseline_bytes + measured - max_memory)} "
                   f"over {self._limit()}"))

    # ------------------------------------------------------------------ other input shapes
    def forecast_shapes(self, sig: tuple[Any, ...], call: ShapeCall) -> None:
        """Forecast a step at the input shapes ``sig`` of the batch that just ran, with the plan in
        force, laid out as the first batch showed the step (one call; the eager code as measured at
        these shapes, else scaled), into the shape tracker's forecasts; over ``max_memory`` it warns,
        or searches again at these shapes (:meth:`_replan_at`). Never raises."""
        plan, shapes, batch = self.plan, describe_shapes([s[0] for s in sig]), self._progress.batches
        if (sig not in self._shapes.compiled or plan is None or self.forecast is None or self._profile.calls != 1
                or self.collectives or self.pending is not None):
            self._shapes.forecasts[sig] = None
            return
        peak: int | None = None
        try:
            loop = self.loop()
            with self._view.step_context(), rng_kept():
                shaped, fc = forecast_plan(self._s, plan, self._module, self._forward, call.args, call.kwargs,
                                           self._view.optimizer(), loop=loop)
            if fc.peak_bytes is None:
                raise RuntimeError("; ".join(fc.problems) or "no forecast")
            shaped, fc = lay_out_step(shaped, fc, calls=1, eager_losses=self._eager_at(sig, call.out_bytes),
                                      made_input_bytes=call.made_bytes, loop=loop,
                                      grads=step_grad_bytes(self._module, loop), optimizer=self._optimizer_memory())
            peak = shaped.predicted_peak_bytes
        except Exception as exc:  # noqa: BLE001 - the batches of these shapes go unpredicted
            rank_zero_info(f"MemPlan: batch {batch}: the forecast for inputs {shapes} failed ({exc!r}); "
                           "epochs that measure such a batch log no prediction error.")
        self._shapes.forecasts[sig] = peak
        if peak is None:
            return
        self._shapes.forecast_input_bytes = max(self._shapes.forecast_input_bytes, call.in_bytes)
        if self._o.verbose:
            rank_zero_info(f"MemPlan: batch {batch}: forecast for inputs {shapes}: {format_bytes(peak)} "
                           f"above the baseline (planned inputs: {format_bytes(plan.predicted_peak_bytes)})")
        baseline, max_memory = shaped.baseline_bytes, self._s.max_memory
        if max_memory is None or baseline is None or baseline + peak <= max_memory:
            return
        over = (f"a step on inputs {shapes} (batch {batch}) is forecast to peak at {format_bytes(baseline + peak)}, "
                f"over {self._limit()}")
        if self._may_replan_at_shapes():
            planned = describe_shapes(self._watch.planned_shapes or ())
            _warn(f"{over}; the plan was chosen at {planned}. Searching the plans again at {shapes} and "
                  "recompiling, once.", 4)
            self._replan_at(sig, call)
            return
        _warn(f"{over}; the plan was chosen at the first batch's shapes. Plan on the largest inputs (put the "
              "largest batch first, or plan_memory(..., train_dataloaders=[longest_batch])), or cap their length.", 4)

    def _eager_at(self, sig: tuple[Any, ...], out_bytes: int) -> tuple[EagerLoss, ...]:
        p = self._profile
        return self._shapes.eager_at(sig, out_bytes, p.eager_losses, p.first_out_bytes)

    def _may_replan_at_shapes(self) -> bool:
        """``budget="auto"``, the closed loop on and unused, and one process (under DDP the ranks
        run other shapes, and the search's decision is a collective every rank must join)."""
        return (self.may_replan() and isinstance(self._s.budget, str) and self._o.user_plan is None
                and self._restored() is None and not self.collectives and self._view.world_size <= 1)

    def _replan_at(self, sig: tuple[Any, ...], call: ShapeCall) -> None:
        """Search the plans again at the input shapes ``sig``, judged with the eager code measured
        at them, and install the cheapest within ``max_memory`` (or the smallest, with a warning):
        these shapes become the planned ones. Once per fit (it uses the closed loop's one re-plan).
        On failure the plan in force stays."""
        old, p = self.plan, self._profile
        assert old is not None
        self._replanned = True
        losses = self._eager_at(sig, call.out_bytes)
        self._unwrap()  # the blocks unwrapped for the search; install wraps the chosen plan's
        plan = old
        try:
            loop = self.loop()
            kept: list[Any] = []
            with self._view.step_context(), rng_kept():
                searched = decide_plan(self._s, self._module, self._forward, call.args, call.kwargs,
                                       self._view.optimizer(), call="MemPlanCallback", loop=loop, kept=kept)
            plan = searched
            if kept and (losses or call.made_bytes):
                plan = rejudge_plan(self._s, searched, kept, step_grad_bytes(self._module, loop), calls=1,
                                    eager_loss=losses or None, made_input_bytes=call.made_bytes, loop=loop,
                                    optimizer=self._optimizer_memory())
            plan = dataclasses.replace(plan, reason=f"{plan.reason}; re-planned at inputs "
                                                    f"{describe_shapes([x[0] for x in sig])} over max_memory")
        except Exception as exc:  # noqa: BLE001 - the plan in force stays
            kept_label = old.candidates[old.chosen].label if old.candidates and old.chosen is not None else "the plan"
            _warn(f"searching the plans at the new shapes failed ({exc!r}); keeping {kept_label}.", 5)
        if plan is not old:  # the new planned shapes: their eager code and made inputs are the step's
            if self._shapes.planned is not None:
                self._shapes.eager[self._shapes.planned] = p.eager_losses
            p.eager_losses, p.made_inputs, p.first_out_bytes = tuple(losses), call.made_bytes, call.out_bytes
            p.eager_from = f"the first batch of inputs {describe_shapes([x[0] for x in sig])}"
        self.example = (call.args, call.kwargs)
        self.install(plan)
