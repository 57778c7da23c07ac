"""MemPlanCallback: ``Trainer(callbacks=[MemPlanCallback()])`` compiles the LightningModule with a
chosen activation memory budget and knapsack solver, can choose the plan itself on the first batch,
and reports predicted vs measured peak memory every epoch to the Trainer's loggers.

The callback is a thin adapter; the work is in :mod:`.search` (choosing), :mod:`.forecasting`
(predicting), :mod:`.compile` (the scoped backend), :mod:`.measure` (measuring),
:mod:`.strategy` (ranks) and :mod:`.report` (pictures).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import types
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from tabulate import tabulate
from torch import nn
from typing_extensions import override

from lightning_memplan._torch.compat import (
    fsdp2_backward_hooks_inert,
    fsdp_kinds,
    isolated_compile_kwargs,
    recompile_limit,
)
from lightning_memplan.callback.compile_watch import (
    CompileRecord,
    WatchedBackend,
    describe_shapes,
)
from lightning_memplan.callback.strategy import (
    decide_on_rank_zero,
    forward_has_collectives,
    max_over_ranks,
)
from lightning_memplan.core.instance_patch import instance_attributes
from lightning_memplan.forecasting.eager_loss import (
    EagerCalls,
    EagerLoss,
    measure_eager_losses,
    parameters_reached,
    scaled_eager_loss,
)
from lightning_memplan.forecasting.optim_memory import OptimizerMemory, optimizer_memory
from lightning_memplan.forecasting.unit_compile import UnitCompile
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import CheckpointPolicy, checkpointed
from lightning_memplan.planner.precompiled import compiled_by_user
from lightning_memplan.planner.search import (
    DEFAULT_BUDGETS,
    DEFAULT_REMAT_BUDGETS,
    replan_candidate,
)
from lightning_memplan.planner.step import (
    PlanSettings,
    PlanWarning,
    TrainingLoop,
    call_signature,
    check_submodule,
    decide_plan,
    eager_forward_warning,
    forecast_plan,
    fresh_input_bytes,
    gradless_bytes,
    gradless_parameters,
    input_storages,
    lay_out_step,
    lightning_step_timeline,
    live_grad_bytes,
    made_input_bytes,
    other_call_forecasts,
    other_optimizer_state_bytes,
    plan_solver,
    rejudge_plan,
    resolve_submodule,
    step_grad_bytes,
    storage_keys,
    uncompiled_warnings,
)
from lightning_memplan.units import format_bytes

__all__ = ["MemPlanCallback", "MemPlanWarning"]

_MISSING = object()


MemPlanWarning = PlanWarning
"""Planning fell back or changed course; training goes on."""


def _fresh_forward(module: nn.Module) -> Callable[..., Any]:
    """``type(module).forward`` with a new code object, bound to ``module``: dynamo's per-code cache
    starts empty, so a new plan is never served an old compiled graph."""
    from lightning_memplan.core.fresh_code import fresh_function

    return types.MethodType(fresh_function(type(module).forward), module)


@dataclasses.dataclass(frozen=True)
class _ShapeCall:
    """A batch's first call of the planned forward at input shapes with no forecast yet: what
    :meth:`MemPlanCallback._forecast_shapes` forecasts a step from (sizes in bytes)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Bytes of the call's outputs (unique storages), to scale the first batch's eager code.
    out_bytes: int
    #: Bytes of its inputs that training_step made (not in the batch).
    made_bytes: int
    #: Bytes of its tensor inputs (unique storages).
    in_bytes: int


def _has_submodule(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


class MemPlanCallback(Callback):
    r"""Compile the LightningModule with a memory plan and report predicted vs measured peak memory.

    A plan is an activation memory budget (the ratio ``torch.compile``'s partitioner gives its
    knapsack solver) plus the set of blocks wrapped in activation checkpointing. On the first
    training batch the callback decides the plan (or takes the one given), compiles the module's
    ``forward`` with it for this fit only, and from then on measures the peak memory of training
    steps. Every torch setting it touches is scoped to the compile and restored; the module's
    ``forward`` is restored at teardown, also after an exception. If planning or compiling fails,
    training goes on with the module as the user wrote it, and a :class:`MemPlanWarning` says why.

    Args:
        budget: a float in [0, 1], or ``"auto"``: forecast candidate plans on the first batch and take
            the knee of the forecast Pareto front (peak memory vs FLOPs), or, with ``max_memory``,
            the cheapest plan that fits.
        max_memory: a byte target (int, or a string such as ``"20GiB"`` or ``"512MB"``) for the
            bytes live during a step: parameters, their gradients (automatic optimization keeps them
            between steps), optimizer state and batch, plus the step's peak.
            With ``budget="auto"`` it selects the plan; with any budget, if the measured peak of the
            first steps exceeds it, the callback re-plans once with a smaller forecast (recompiling)
            when ``replan`` is on. With ``"auto"`` in one process, a batch of new input shapes whose
            forecast exceeds it (``forecast_new_shapes``) is that one re-plan: after the first such
            batch, the search runs again at those shapes.
        solver: ``"dp"`` (default), ``"hirschberg"``, ``"greedy"``, ``"ilp"``, or a callable with
            torch's solver signature ``(memory, runtimes, max_memory) -> (value, saved, recomputed)``:
            the knapsack over torch's recompute candidates; or ``"remat"``: whole-graph
            rematerialization, an exact MILP over every forward value (``budget`` then caps the
            saved bytes; see :mod:`lightning_memplan.core.remat`). With ``budget="auto"`` the search
            tries remat plans next to the knapsack's (``remat_budgets``), and the plan keeps the
            solver it was chosen with.
        checkpoint: blocks the search may wrap in activation checkpointing: ``"auto"`` (the model's
            repeated blocks), a set of module classes, or ``None``. Only used with ``budget="auto"``.
        backend: ``"inductor"`` (default) or ``"aot_eager"`` (inductor's partitioner without code
            generation).
        candidate_budgets: budgets the search tries with each checkpoint set.
        remat_budgets: budgets of the whole-graph rematerialization plans (solver ``"remat"``) the
            search tries besides; ``()`` for none.
        search_backend: backend the candidates are forecast with (``"aot_eager"``: no code
            generation); the chosen plan is forecast again on ``backend``.
        plan: a :class:`~lightning_memplan.plan.MemPlan` or the path of one saved as JSON (from the
            tuner): use it without searching.
        replan: allow the closed-loop correction described under ``max_memory``.
        measure_batches: training batches measured per epoch (the first batch of the fit, which
            compiles, is never measured). On CPU each measured batch runs under the profiler, and
            so does one warm-up batch before them (see :meth:`on_train_batch_start`).
        log_plots: write the Pareto-front and memory-timeline PNGs into the logger's directory (and
            as TensorBoard figures, MLflow run artifacts under ``memplan/``, or W&B images under
            the keys ``memplan/frontier`` and ``memplan/timeline``, when those loggers are used);
            none under ``Trainer(fast_dev_run=...)``, which writes no files.
        compile_kwargs: extra keyword arguments for ``torch.compile``. The callback compiles with
            ``dynamic=False`` unless they set ``dynamic``: a smaller last batch then gets a static
            graph of its own, and the planned graph keeps serving the planned size (see
            :mod:`.compile_watch`; ``recompiles`` lists the graphs compiled after the planned one).
        verbose: print the plan table at fit start and a line per epoch (rank zero).
        submodule: attribute path of the submodule to plan and compile (e.g. ``"model"`` when
            ``training_step`` calls ``self.model(x)``, or ``"model.backbone"``); default: the
            LightningModule itself (``training_step`` calls ``self(x)``). Checked at fit start.
        forecast_new_shapes: when a training batch has other input shapes than the planned one
            (inputs of varying length, a smaller last batch) and dynamo compiled a graph of its own
            for them with the plan, forecast a step at those shapes too, after the batch: one more
            compile on ``backend`` per shape, for the shapes of measured batches and for inputs
            larger than any forecast so far (a smaller last batch that is not measured costs
            none). The eager code after the forward (the loss, metrics) is measured at those
            shapes, as on the first batch, by the first batch of new shapes that would have been
            measured (that batch goes unmeasured: no profiler is started inside a step), else it
            is the first batch's scaled by the outputs' bytes (``scaled_eager_loss``).
            ``shape_forecasts`` holds the forecasts, and each epoch's prediction is that of the
            shapes its measured batches ran. Not under FSDP or tensor parallelism, nor with
            several forward calls per step; ``False``: none.

    Logged metrics, each training epoch, to every logger of the Trainer (``step`` = global step):

    - ``memplan/predicted_peak_bytes``: forecast peak of one training step above the bytes live
      when it starts (Lightning keeps the previous gradients until ``zero_grad`` inside the step,
      so they count as live at the start and are freed before backward; with
      ``accumulate_grad_batches`` > 1, the micro-batch that steps the optimizer; with manual
      optimization, above the bytes live without gradients; when ``training_step`` calls the planned
      forward several times, all of the calls, from the first batch on). When the measured
      batches ran other input shapes than the planned one (``forecast_new_shapes``), the largest
      forecast of the shapes they ran
    - ``memplan/measured_peak_bytes``: measured peak of the measured batches (max over them and
      over ranks), above the bytes live when each batch started (manual optimization: plus the
      gradients live then; automatic optimization, a batch that starts without the previous
      gradients because Lightning freed them before validation: less the gradients the baseline
      holds, so it is this step's peak above the same baseline as the prediction)
    - ``memplan/prediction_error``: (predicted - measured) / measured, signed; not logged for an
      epoch when a measured batch ran input shapes with no forecast (see ``shape_forecasts``)
    - ``memplan/budget``: the activation memory budget in force
    - ``memplan/checkpointed_blocks``: number of blocks wrapped in activation checkpointing
    - ``memplan/baseline_bytes``: bytes live before a step (parameters, buffers, batch, optimizer
      state, the previous step's gradients; of the whole LightningModule, also outside ``submodule``)
    - ``memplan/activations_bytes``, ``memplan/parameters_bytes``, ``memplan/gradients_bytes``,
      ``memplan/optimizer_state_bytes``: the forecast breakdown
    - ``memplan/fsdp_buffers_bytes`` (FSDP2 only): FSDP's all-gathered parameters and communication
      buffers live at the forecast peak

    A metric that is unknown (e.g. no batch measured yet, or a failed forecast) is not logged.
    """

    def __init__(
        self,
        budget: float | Literal["auto"] = "auto",
        *,
        max_memory: int | str | None = None,
        solver: str | Callable[..., Any] = "dp",
        checkpoint: CheckpointPolicy = "auto",
        backend: Literal["inductor", "aot_eager"] = "inductor",
        candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
        search_backend: Literal["inductor", "aot_eager"] = "aot_eager",
        remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
        plan: MemPlan | str | Path | None = None,
        replan: bool = True,
        measure_batches: int = 2,
        log_plots: bool = True,
        compile_kwargs: dict[str, Any] | None = None,
        verbose: bool = True,
        submodule: str | None = None,
        forecast_new_shapes: bool = True,
    ) -> None:
        call = "MemPlanCallback"
        check_submodule(submodule, call)
        self._settings = PlanSettings.from_args(
            call, budget=budget, max_memory=max_memory, solver=solver, checkpoint=checkpoint,
            backend=backend, candidate_budgets=candidate_budgets, search_backend=search_backend,
            remat_budgets=remat_budgets)
        if isinstance(measure_batches, bool) or not isinstance(measure_batches, int) or measure_batches < 1:
            raise ValueError(f"`{call}(measure_batches={measure_batches!r})` must be an int >= 1.")
        if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
            raise ValueError(f"`{call}(compile_kwargs={compile_kwargs!r})` must be a dict of torch.compile options.")
        if not isinstance(forecast_new_shapes, bool):
            raise ValueError(f"`{call}(forecast_new_shapes={forecast_new_shapes!r})` must be True or False.")
        if compile_kwargs and "backend" in compile_kwargs:
            raise ValueError(f"`{call}(compile_kwargs={compile_kwargs!r})`: set the backend with `backend=`.")
        user_plan = None
        if isinstance(plan, MemPlan):
            user_plan = plan
        elif plan is not None:
            if not isinstance(plan, (str, Path)):
                raise ValueError(f"`{call}(plan={plan!r})` must be a MemPlan or the path of a plan JSON file.")
            if not Path(plan).is_file():
                raise ValueError(f"`{call}(plan={str(plan)!r})`: no such file. Save one with `plan_memory(...).save(path)`.")
            user_plan = MemPlan.load(plan)

        self._budget = self._settings.budget
        self._max_memory = self._settings.max_memory
        self._user_plan = user_plan
        self._replan = bool(replan)
        self._measure_batches = measure_batches
        self._log_plots = bool(log_plots)
        self._compile_kwargs = dict(compile_kwargs or {})
        self._verbose = bool(verbose)
        self._submodule = submodule
        self._forecast_new_shapes = forecast_new_shapes

        #: The plan in force (None before the first training batch, or after a fallback).
        self.plan: MemPlan | None = None
        #: The forecast of the plan in force, on ``backend`` (None before the first batch or on failure).
        self.forecast: Any = None
        #: Why the callback fell back to the uncompiled module (None while it did not).
        self.fallback_reason: str | None = None
        #: Measured peak (bytes above the batch's starting bytes) of each measured batch, per epoch.
        self.measured: list[list[int]] = []
        #: The input shapes of each measured batch, aligned with :attr:`measured`: the
        #: ``planner.call_signature`` (shape, dtype, device type of each tensor argument) of the
        #: batch's first training call of the planned forward; ``None`` where it was not noted
        #: (``forecast_new_shapes=False``).
        self.measured_shapes: list[list[tuple[Any, ...] | None]] = []
        #: Seconds the plan decision took (search included) and the final compile + forecast took.
        self.timings: dict[str, float] = {}
        self._restored_plan: MemPlan | None = None
        self._reset_fit_state()

    # ------------------------------------------------------------------ state
    def _reset_fit_state(self) -> None:
        self._lit: LightningModule | None = None
        #: The module whose forward is planned: the LightningModule or its ``submodule``.
        self._module: nn.Module | None = None
        self._trainer: Trainer | None = None
        self._saved_forward: Any = _MISSING
        self._orig_forward: Callable[..., Any] | None = None
        self._active_forward: Callable[..., Any] | None = None
        self._first_call = False
        self._stack = contextlib.ExitStack()
        self._uncompiled = contextlib.ExitStack()  # the user's own torch.compile undone (precompiled.py)
        self._attached_to: nn.Module | None = None  # the module at `submodule` when _attach ran
        self._example: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._window: Any = None
        # bytes the window's peak is shifted by to be above the prediction's baseline (gradients
        # live at its start, or missing there: see _baseline_shift)
        self._window_grads = 0
        self._window_streak = 0
        self._warmup_window = False
        self._epoch_peaks: list[int] = []
        self._fit_batches = 0
        #: Calls of the planned forward in the first training batch (the forecast is laid out for
        #: that many calls after the first batch).
        self.forward_calls_per_step = 0
        self._call_inputs: list[dict[int, int]] = []  # per call of the first batch: storage -> bytes
        #: Per call of the first batch: its arguments' shapes (call_signature); and the arguments
        #: of a call of each other signature than the first's, to forecast them (_other_forecasts)
        self._call_signatures: list[tuple[Any, ...]] = []
        self._other_calls: dict[tuple[Any, ...], tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._before_step: set[int] = set()  # storages live before a step: the batch, parameters, buffers
        #: Bytes of the first call's inputs that training_step made (not in the batch: ``x.float() / 255``).
        self._made_inputs = 0
        #: ``id``s of the parameters the first batch's loss reaches (None until then): the planned
        #: module's others get no gradient (see TrainingLoop.gradless_bytes).
        self._reached: frozenset[int] | None = None
        self._first_batch_backwards = 0  # backward passes in the first batch (manual optimization: several)
        self._other_state: int | None = None  # bytes of the state of the optimizers after the first
        #: This rank's search's candidate forecasts (plain data), kept through the first batch to
        #: judge the candidates again when training_step calls the forward several times.
        self._kept_forecasts: tuple[Any, ...] = ()
        self._replanned = False
        self._timeline_plotted = False
        self._watch: WatchedBackend | None = None
        self._watch_seen = 0  # compiles of the watch already looked at
        self._planned_shapes: tuple[tuple[int, ...], ...] | None = None
        #: Graphs compiled for training after the planned one(s), in order: dynamo compiled the
        #: forward again for inputs of other shapes (a smaller last batch, inputs of varying length).
        self.recompiles: list[CompileRecord] = []
        self._warned_dynamic = self._warned_shapes = False
        #: The eager code between the forward and the backward (the loss training_step computes on
        #: the outputs, metrics, logging), measured on the first batch and laid into the forecasts:
        #: one per call of the forward; empty when it was not measured (under FSDP1, a failure).
        #: Under FSDP2 the partial backward that measures it runs with FSDP's pre-backward hooks
        #: made inert (``_compat.fsdp2_backward_hooks_inert``); under tensor parallelism every
        #: rank runs it at the same point, so any collective in it pairs up.
        self.eager_losses: tuple[EagerLoss, ...] = ()
        # the first batch's calls of the forward and the eager code after each; None once
        # measured or dropped
        self._outputs: EagerCalls | None = None
        self._first_batch: Any = None
        self._collectives = False  # the planned module's forward runs collectives (FSDP, TP)
        self._fsdp2 = False  # ... some FSDP2 units among them: their hooks are made inert to measure
        self._measurable = True  # the eager code after the forward can be measured (not under FSDP1)
        #: A plan chosen outside the forward (judged again after the first batch, or re-planned)
        #: while the forward runs collectives: installed at the next training call of the forward,
        #: where FSDP has unsharded the parameters its forecast reads.
        self._pending: MemPlan | None = None
        self._discard_window = False  # the open window saw a plan installed (its forecast ran)
        #: Forecast peak (bytes above the baseline, as ``memplan/predicted_peak_bytes``) of a step at
        #: each input shapes (``planner.call_signature``) the fit compiled a graph for after the
        #: planned one, with the plan in force; ``None`` where none was made (the shapes ran
        #: uncompiled past dynamo's ``recompile_limit``, or the forecast failed). Cleared when
        #: another plan is installed. See ``forecast_new_shapes``.
        self.shape_forecasts: dict[tuple[Any, ...], int | None] = {}
        self._planned_sig: tuple[Any, ...] | None = None  # the shapes the plan in force was forecast at
        self._batch: Any = None  # the training batch running now
        self._batch_sig: tuple[Any, ...] | None = None  # its first training call's shapes, once noted
        self._batch_call: _ShapeCall | None = None  # that call, at shapes with no forecast yet
        self._first_out_bytes = 0  # bytes of the first batch's first call's outputs
        #: The shapes whose eager code (the loss on the outputs) this batch measures, as the first
        #: batch's is (see _wants_eager_at); and what was measured at each shapes.
        self._shape_noting: tuple[Any, ...] | None = None
        self._shape_eager: dict[tuple[Any, ...], tuple[EagerLoss, ...]] = {}
        # whether this batch may measure it: "profiled" (a batch of new shapes that would have been
        # measured: left unmeasured for it), "larger" (only if its inputs outgrow every forecast), ""
        self._may_note = ""
        self._batch_sigs: set[tuple[Any, ...]] = set()  # the shapes of the batches seen
        self._eager_from = "the first batch"  # the batch eager_losses were measured on (for messages)
        self._forecast_input_bytes = 0  # the largest inputs (bytes) of a call forecast so far
        self._compiled_sigs: set[tuple[Any, ...]] = set()  # shapes dynamo compiled a static graph for
        self._epoch_sigs: list[tuple[Any, ...] | None] = []  # aligned with _epoch_peaks

    @property
    def state_key(self) -> str:
        return self.__class__.__qualname__

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"format": 1, "plan": self.plan.to_dict() if self.plan is not None else None}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        data = state_dict.get("plan")
        if not data:
            return
        plan = MemPlan.from_dict(data, source="the checkpoint's MemPlanCallback state")
        if not isinstance(self._budget, str) and not math.isclose(plan.budget, float(self._budget)):
            warnings.warn(
                f"`MemPlanCallback(budget={self._budget!r})` differs from the plan in the checkpoint "
                f"(budget {plan.budget!r}); resuming with the checkpoint's plan.",
                MemPlanWarning, stacklevel=2,
            )
        self._restored_plan = plan

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning_memplan._torch.compat import check_torch_version

        check_torch_version()
        self._reset_fit_state()
        self.measured, self.measured_shapes = [], []
        self._trainer = trainer
        self._lit = pl_module
        if self._submodule is None or _has_submodule(pl_module, self._submodule):
            self._attach(pl_module, resolve_submodule(pl_module, self._submodule, "MemPlanCallback"))
        # else configure_model makes it (it runs after setup): attached at on_fit_start

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Attach to the planned submodule if ``configure_model`` made it, or again if it replaced
        it (``self.model = torch.compile(self.model)``); a bad ``submodule`` name fails here, before
        any batch."""
        if self._lit is None:
            return
        resolved = resolve_submodule(pl_module, self._submodule, "MemPlanCallback")
        if resolved is not self._attached_to:
            self._detach()
            self._attach(pl_module, resolved)

    def _attach(self, pl_module: LightningModule, resolved: nn.Module) -> None:
        """Route the planned module's ``forward`` through :meth:`_planned_forward` (an instance
        attribute, so every strategy's wrapper calls it), with the user's own torch.compile undone
        for the fit (:mod:`.precompiled`). ``resolved``: the module at ``submodule``."""
        user = compiled_by_user(pl_module, resolved)
        if user.patches:
            self._uncompiled.enter_context(instance_attributes(user.patches))
            warnings.warn(
                f"MemPlanCallback: {user.what} was compiled with torch.compile before fit. For this fit the "
                f"callback compiles the planned forward itself, with the plan (backend {self._settings.backend!r}; "
                "torch.compile options go to `compile_kwargs`), and the rest runs as written; your compiled "
                "module is put back after fit.", MemPlanWarning, stacklevel=3)
        target = user.module
        self._attached_to = resolved
        self._module = target
        self._saved_forward = target.__dict__.get("forward", _MISSING)
        self._orig_forward = target.forward
        target.forward = self._planned_forward  # type: ignore[method-assign]

    def _detach(self) -> None:
        """Undo :meth:`_attach`: the module's ``forward`` and the user's compile as they were."""
        module = self._module
        if module is not None:
            if self._saved_forward is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.forward = self._saved_forward  # type: ignore[method-assign]
        self._uncompiled.close()
        self._module = self._attached_to = None

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._restore()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close_window()
        self._close_eager_window()
        self._restore()

    def _restore(self) -> None:
        self._detach()
        self._stack.close()
        self._active_forward = None
        self._lit = None

    # ------------------------------------------------------------------ the planned forward
    def _planned_forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self._module
        assert module is not None and self._orig_forward is not None
        trainer = self._trainer
        in_training = trainer.training if trainer is not None else module.training
        if self._fit_batches == 1 and in_training and torch.is_grad_enabled():
            self.forward_calls_per_step += 1
            self._call_inputs.append(input_storages(args, kwargs))
            self._call_signatures.append(call_signature(args, kwargs))
            if self._call_signatures[-1] != self._call_signatures[0]:
                self._other_calls.setdefault(self._call_signatures[-1], (args, kwargs))
        if self.plan is None and self.fallback_reason is None and in_training and torch.is_grad_enabled():
            self._example = (args, kwargs)
            self._activate()
        elif self._pending is not None and in_training and torch.is_grad_enabled():
            plan, self._pending = self._pending, None
            self._example = (args, kwargs)
            self._discard_window = self._window is not None
            self._install(plan)
        fn = self._active_forward
        if fn is None:
            return self._orig_forward(*args, **kwargs)
        training_call = in_training and torch.is_grad_enabled()
        sig = None  # the input shapes of this batch's first training call, when they are tracked
        if self._forecast_new_shapes and self._batch_sig is None and training_call:
            sig = self._batch_sig = call_signature(args, kwargs)
            if self._fit_batches > 1 and self._wants_eager_at(sig, args, kwargs):
                self._shape_noting = sig
        noting = training_call and (self._fit_batches == 1 or self._shape_noting is not None)
        if noting:
            self._close_eager_window()  # the eager code after the previous call ends here
        # not under FSDP1: its pre-backward hooks sit on the outputs, and a partial backward through
        # the loss would unshard (FSDP2's are made inert while it runs)
        watch = self._watch if noting and self._measurable and self._eager_calls() is not None else None
        if watch is not None:
            watch.on_output = self._region_returned
        try:
            if self._first_call:
                try:
                    out = fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - a failed compile must not lose the run
                    self._close_eager_window()
                    self._fall_back(f"compiling the planned forward failed: {exc!r}")
                    return self._orig_forward(*args, **kwargs)
                self._first_call = False
                if self._watch is not None and self._watch.compiles:
                    self._watch_seen = len(self._watch.compiles)  # the planned graph(s)
                    first = self._watch.compiles[0]
                    if sig is None or sig == self._planned_sig:
                        self._planned_shapes = first.input_shapes
                    elif not first.dynamic:  # a plan installed after the first batch, first run at other shapes
                        self._compiled_sigs.add(sig)
            else:
                out = fn(*args, **kwargs)
        finally:
            if watch is not None:
                watch.on_output = None
        if noting and self._measurable:
            self._note_outputs(out)
        if sig is not None:
            self._note_shapes(sig, args, kwargs, out)
        return out

    def _wants_eager_at(self, sig: tuple[Any, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """Whether this batch, whose first call has input shapes ``sig``, measures the eager code
        after the forward at those shapes (as the first batch measured it at its own), for their
        forecast: new shapes, the first batch measured some, a step of one call the callback can
        measure, and a batch of new shapes that would have been profiled (it opened no window, see
        :meth:`on_train_batch_start`) or whose inputs are larger than any forecast so far (a
        smaller last batch past the measured ones costs nothing)."""
        return (bool(self._may_note) and self._window is None
                and sig != self._planned_sig and sig not in self.shape_forecasts and sig not in self._shape_eager
                and bool(self.eager_losses) and self.forward_calls_per_step == 1 and self._measurable
                and not self._collectives and self._pending is None
                and (self._may_note == "profiled"
                     or sum(input_storages(args, kwargs).values()) > self._forecast_input_bytes))

    def _note_shapes(self, sig: tuple[Any, ...], args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        """After this batch's first training call, of input shapes ``sig``: at shapes with no
        forecast yet, keep what :meth:`_forecast_shapes` needs after the batch (the arguments, the
        bytes of the outputs, and of the inputs training_step made)."""
        if self._fit_batches == 1:
            self._first_out_bytes = sum(input_storages((out,), {}).values())
        elif sig != self._planned_sig and sig not in self.shape_forecasts and self._module is not None:
            inputs = input_storages(args, kwargs)
            made = made_input_bytes([inputs], storage_keys(self._batch, self._module))
            self._batch_call = _ShapeCall(args=tuple(args), kwargs=dict(kwargs),
                                          out_bytes=sum(input_storages((out,), {}).values()), made_bytes=made,
                                          in_bytes=sum(inputs.values()))

    def _eager_calls(self) -> EagerCalls | None:
        """The first batch's :class:`~lightning_memplan.forecasting.eager_loss.EagerCalls` (made at its first
        call); ``None`` once an earlier call could not be noted (nothing is measured then)."""
        if self._outputs is None and self.forward_calls_per_step <= 1:
            self._outputs = EagerCalls(self._device())
        return self._outputs

    def _region_returned(self, out: Any) -> None:
        """A compiled region of the planned forward returned, on the first batch (see
        :meth:`~lightning_memplan.forecasting.eager_loss.EagerCalls.region_returned`)."""
        calls = self._outputs
        if calls is None:
            return
        try:
            calls.region_returned(out)
        except Exception:  # noqa: BLE001 - the call's own outputs are noted instead
            calls.discard_regions()

    def _note_outputs(self, out: Any) -> None:
        """Note this call's outputs (nothing that keeps them alive) for :meth:`on_before_backward`,
        and open a window on the eager code that follows (:class:`~lightning_memplan.forecasting.eager_loss.EagerCalls`);
        when eager code ran after the call's last compiled region (a head, or a loss, in a forward
        whose frame dynamo skipped), that region's outputs, from its return."""
        calls = self._eager_calls()
        if calls is None:
            return  # an earlier call could not be noted: nothing is measured for this step
        try:
            calls.returned_after_regions(out)
        except Exception:  # noqa: BLE001 - no eager-loss measurement then
            calls.discard_regions()
            self._outputs = None

    def _close_eager_window(self) -> None:
        """End the window on the eager code after the last noted call (see :meth:`_note_outputs`)."""
        if self._outputs is None:
            return
        try:
            self._outputs.close()
        except Exception:  # noqa: BLE001 - no eager-loss measurement then
            self._outputs = None

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        """First batch: measure the eager code between the forward's calls and the backward (the
        loss on the outputs, metrics; :func:`~lightning_memplan.forecasting.eager_loss.measure_eager_losses`)."""
        self._close_eager_window()
        if self._fit_batches == 1:
            self._first_batch_backwards += 1
        outputs, self._outputs = self._outputs, None
        shape = self._shape_noting  # a batch of new input shapes (see _wants_eager_at), else the first
        if (outputs is None or (self._fit_batches != 1 and shape is None) or self.plan is None
                or self.fallback_reason is not None
                or len(outputs.calls) != self.forward_calls_per_step or not any(o.edges for o in outputs.calls)
                or not isinstance(loss, torch.Tensor) or loss.grad_fn is None):
            return
        module = self._module
        assert module is not None
        from lightning_memplan._torch.compat import tree_leaves

        # which parameters get no gradient: with automatic optimization this backward is the step's
        # only one (under FSDP2 the graph holds the unsharded parameters, not the module's)
        if shape is None and not self._fsdp2 and self._loop().automatic_optimization:
            self._reached = self._parameters_reached(loss, outputs)
            self._warn_eager_forward(module, loss, self._reached, outputs)
        batch = [t for t in tree_leaves(self._first_batch if shape is None else self._batch)
                 if isinstance(t, torch.Tensor)]
        # in the baseline: the whole LightningModule's parameters and buffers (a head outside the
        # planned submodule saves its weight for backward), and the batch
        baseline = [*pl_module.parameters(), *pl_module.buffers(), *module.parameters(), *batch]
        try:
            with fsdp2_backward_hooks_inert(module) if self._fsdp2 else contextlib.nullcontext():
                losses = measure_eager_losses(loss, outputs.now(), exclude=baseline,
                                              forecast_params=module.parameters(), device=self._device())
        except Exception as exc:  # noqa: BLE001 - the forecast goes on without it
            then = ("the forecast covers the compiled graphs only" if shape is None
                    else "the first batch's is scaled to these shapes")
            rank_zero_info(f"MemPlan: the loss on the outputs was not measured ({exc!r}); {then}.")
            return
        if shape is None:
            self.eager_losses = losses
        else:
            self._shape_eager[shape] = losses

    def _parameters_reached(self, loss: torch.Tensor, outputs: EagerCalls) -> frozenset[int]:
        """``id``s of the parameters the step's backward gives a gradient: those ``loss``'s autograd
        graph reaches, less those a compiled graph reads under ``torch.no_grad()`` (its backward
        returns none for them, though autograd links them to it) and no eager code reads."""
        reached = parameters_reached(loss)
        fc = self.forecast
        nograd = fc.compiled_gradless_parameter_ids if fc is not None else None
        if nograd and reached & nograd:
            eager = parameters_reached(loss, stop_at=[e for c in outputs.calls for e in c.edges])
            reached -= nograd - eager
        return frozenset(reached)

    def _warn_eager_forward(self, module: nn.Module, loss: torch.Tensor, reached: frozenset[int],
                            outputs: EagerCalls) -> None:
        """Warn when the loss reaches parameters of the module that neither a compiled graph nor
        the code after the forward's calls read: the forward ran their layers eagerly (unless a
        plainer warning, :func:`~lightning_memplan.planner.step.uncompiled_warnings`, said so already)."""
        fc = self.forecast
        compiled = fc.compiled_parameter_ids if fc is not None else None
        if compiled is None or uncompiled_warnings(module, fc):
            return
        after = parameters_reached(loss, stop_at=[e for c in outputs.calls for e in c.edges])
        eager = {id(p) for p in module.parameters() if id(p) in reached and id(p) not in compiled | after}
        message = eager_forward_warning(module, eager)
        if message:
            warnings.warn(f"MemPlanCallback: {message}", MemPlanWarning, stacklevel=3)

    @property
    def eager_loss(self) -> EagerLoss | None:
        """The eager code between the forward and the backward measured on the first batch, when
        ``training_step`` calls the forward once (:attr:`eager_losses` has one per call)."""
        return self.eager_losses[0] if len(self.eager_losses) == 1 else None

    def _training(self) -> bool:
        trainer = self._trainer
        return bool(trainer.training) if trainer is not None else self._module is not None and self._module.training

    def _check_recompiles(self) -> None:
        """Report the graphs compiled for training since the last look (see
        :mod:`.compile_watch`): a line per new graph (rank zero); a warning for a dynamic-shape
        graph (it replaces the planned one) and once when the inputs keep changing shape."""
        watch = self._watch
        if watch is None or len(watch.compiles) <= self._watch_seen:
            return
        new = [r for r in watch.compiles[self._watch_seen:] if r.training]
        self._watch_seen = len(watch.compiles)
        planned = describe_shapes(self._planned_shapes or ())
        for record in new:
            self.recompiles.append(record)
            if record.dynamic and not self._warned_dynamic:
                self._warned_dynamic = True
                warnings.warn(
                    f"MemPlanCallback: batch {self._fit_batches} compiled a dynamic-shape graph (inputs "
                    f"{describe_shapes(record.input_shapes)}), because compile_kwargs allow dynamic shapes. "
                    "Dynamo now runs it for every batch size, and the partitioner chose its saved activations "
                    f"at the sizes of that batch, not at the planned {planned}: the plan and its forecast no "
                    "longer hold (memplan/measured_peak_bytes will show it). Leave `dynamic` out of "
                    "compile_kwargs (the callback compiles with dynamic=False), or drop the incomplete last "
                    "batch (DataLoader(drop_last=True)).", MemPlanWarning, stacklevel=2)
            elif self._verbose:
                rank_zero_info(f"MemPlan: batch {self._fit_batches}: the forward was compiled again, with the "
                               f"plan, for inputs {describe_shapes(record.input_shapes)} (forecast: {planned})")
        shapes = {r.input_shapes for r in self.recompiles if not r.dynamic}
        limit = recompile_limit()
        if not self._warned_shapes and len(shapes) >= max(2, limit // 2):
            self._warned_shapes = True
            warnings.warn(
                f"MemPlanCallback: the inputs keep changing shape ({len(shapes)} new shapes after the planned "
                f"{planned}). Each new shape compiles a static graph with the plan (and, with "
                f"forecast_new_shapes, a forecast of its own), until dynamo's recompile_limit ({limit}); after "
                "that new shapes run uncompiled, without the plan or a forecast. Pad inputs of varying length "
                "to a few fixed lengths (buckets), or raise torch._dynamo.config.recompile_limit to their "
                "number.", MemPlanWarning, stacklevel=2)

    def _activate(self) -> None:
        """Decide the plan (rank 0's, broadcast), wrap blocks, forecast and compile. Never raises."""
        trainer = self._trainer
        t0 = time.perf_counter()
        try:
            if trainer is None:
                plan = self._decide()
            else:  # FSDP / tensor parallel: the candidates' forecasts all-gather, every rank runs them
                lockstep = self._module is not None and forward_has_collectives(self._module)
                plan = decide_on_rank_zero(trainer.strategy, self._decide, all_ranks_run=lockstep)
        except Exception as exc:  # noqa: BLE001 - planning failure: train unplanned
            self._fall_back(f"planning failed: {exc!r}")
            return
        self.timings["decide_seconds"] = time.perf_counter() - t0
        self._install(plan)

    def _decide(self) -> MemPlan:
        if self._restored_plan is not None:
            return self._restored_plan
        if self._user_plan is not None:
            return self._user_plan
        assert self._module is not None and self._example is not None and self._orig_forward is not None
        args, kwargs = self._example
        kept: list[Any] = []
        plan = decide_plan(self._settings, self._module, self._orig_forward, args, kwargs,
                           self._optimizer(), call="MemPlanCallback", loop=self._loop(), kept=kept)
        self._kept_forecasts = tuple(kept)
        return plan

    def _loop(self) -> TrainingLoop:
        """How the Trainer runs this module's training step (accumulation, manual optimization)."""
        loop = TrainingLoop.of(self._trainer, self._lit, self._module)
        if self._other_state is None:  # once: the optimizers are set up before the first batch
            trainer = self._trainer
            self._other_state = other_optimizer_state_bytes(list(getattr(trainer, "optimizers", []) or []))
        return dataclasses.replace(loop, gradless_bytes=self._gradless_bytes(),
                                   other_optimizer_state_bytes=self._other_state)

    def _gradless_bytes(self) -> int:
        """Bytes of the planned module's trainable parameters the first batch's loss did not reach."""
        return gradless_bytes(self._module, self._reached) if self._module is not None and self._reached else 0

    def _optimizer_memory(self) -> OptimizerMemory | None:
        """The optimizer's memory without the parameters the step gives no gradient (``None`` when
        every trainable parameter gets one, or there is no optimizer: the forecast's stands)."""
        optimizer, module, reached = self._optimizer(), self._module, self._reached
        if optimizer is None or module is None or not reached:
            return None
        gradless = {id(p) for p in gradless_parameters(module, reached)}
        return optimizer_memory(optimizer, gradless=gradless) if gradless else None

    def _optimizer(self) -> torch.optim.Optimizer | None:
        trainer = self._trainer
        opts = list(getattr(trainer, "optimizers", []) or []) if trainer is not None else []
        return opts[0] if opts else None

    def _install(self, plan: MemPlan) -> None:
        """Wrap the plan's blocks, forecast it on ``backend`` and compile. Falls back on failure."""
        from lightning_memplan.forecasting.backend import memplan_backend

        module = self._module
        assert module is not None and self._example is not None and self._orig_forward is not None
        self._stack.close()
        self._stack = contextlib.ExitStack()
        t0 = time.perf_counter()
        try:
            self._stack.enter_context(checkpointed(module, plan.checkpoint))
            args, kwargs = self._example
            fc = None
            try:
                with self._step_context():
                    plan, fc = forecast_plan(self._settings, plan, module, self._orig_forward, args, kwargs,
                                             self._optimizer(), loop=self._loop())
            except Exception as exc:  # noqa: BLE001 - no forecast: train with the plan anyway
                warnings.warn(f"MemPlanCallback: the forecast of the chosen plan failed ({exc!r}); "
                              "training with the plan, without predictions.", MemPlanWarning, stacklevel=2)
            be = memplan_backend(budget=plan.budget, solver=plan_solver(self._settings, plan),
                                 inner=self._settings.backend, capture=False)
            watch = WatchedBackend(be, training=self._training)
            # static shapes by default: another batch size compiles a graph of its own (with the
            # plan) and the planned graph keeps serving the planned size (see compile_watch)
            kwargs = {**isolated_compile_kwargs(), "dynamic": False, **self._compile_kwargs}
            compiled = torch.compile(_fresh_forward(module), backend=watch, **kwargs)
            # FSDP2 units: each compiled on its own (see unit_compile), for this fit
            self._stack.enter_context(UnitCompile(module, watch, kwargs).installed())
        except Exception as exc:  # noqa: BLE001 - a failed plan must not lose the run
            self._fall_back(f"installing the plan failed: {exc!r}")
            return
        collectives = forward_has_collectives(module)
        kinds = fsdp_kinds(module) if collectives else None
        # tensor parallelism alone: its collectives are in the compiled graphs (functional
        # collectives), so the forecast holds their buffers; FSDP's live outside them
        if fc is not None and kinds and (kinds.fsdp1 or kinds.fsdp2) and not (fc.breakdown and fc.breakdown.fsdp_buffers):
            warnings.warn(
                "MemPlanCallback: the parameters are sharded by FSDP (FSDP1, or FSDP2 internals this version "
                "cannot read). The forecast counts this rank's shards of the parameters, gradients and optimizer "
                "state, and the activations of the compiled graphs; FSDP's unsharded parameters and "
                "communication buffers are not forecast, so the measured peak (memplan/measured_peak_bytes) "
                "will be higher than predicted.", MemPlanWarning, stacklevel=2)
        for message in uncompiled_warnings(module, fc):
            warnings.warn(f"MemPlanCallback: {message}", MemPlanWarning, stacklevel=2)
        self.forecast = fc
        self.plan = plan
        self._planned_sig = call_signature(*self._example)
        self._planned_shapes = tuple(x[0] for x in self._planned_sig)  # (the compiled graph's, at its first run)
        self._forecast_input_bytes = sum(input_storages(*self._example).values())
        self.shape_forecasts, self._compiled_sigs = {}, set()  # a new compiled function: its own graphs
        self._watch, self._watch_seen = watch, 0
        self._collectives = collectives
        self._fsdp2 = bool(kinds and kinds.fsdp2)
        self._measurable = not (kinds and kinds.fsdp1)
        if not self._may_replan() and self._fit_batches > 1:
            self._example = None  # no re-plan can follow: do not hold on to the first batch
        self._active_forward = compiled
        self._first_call = True
        self.timings["install_seconds"] = time.perf_counter() - t0
        if self._fit_batches > 1:  # a re-plan: as many calls as before, the same eager loss
            self._forecast_step()
        if self._verbose:
            self._print_plan()
        if self._log_plots:
            self._plot_frontier()

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self._active_forward = None
        self._stack.close()
        warnings.warn(f"MemPlanCallback: {reason}. Training goes on with the module uncompiled.",
                      MemPlanWarning, stacklevel=3)

    # ------------------------------------------------------------------ measuring
    def _device(self) -> torch.device:
        module = self._module
        param = next(module.parameters(), None) if module is not None else None
        dev = param.device if param is not None else torch.device("cpu")
        return dev if dev.type in ("cpu", "cuda") else torch.device("cpu")

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._fit_batches += 1
        self._batch, self._batch_sig, self._batch_call, self._may_note = batch, None, None, ""
        profiled = len(self._epoch_peaks) < self._measure_batches
        if self._forecast_new_shapes:
            # a batch of shapes not seen before may measure the eager code after the forward at them
            # (_wants_eager_at): then it opens no window (the profiler is not started inside a step)
            shapes = call_signature((batch,), {})
            if self._fit_batches > 1 and shapes not in self._batch_sigs and self.eager_losses:
                self._may_note = "profiled" if profiled else "larger"
            self._batch_sigs.add(shapes)
            if self._may_note == "profiled":
                return
        if self._fit_batches == 1:
            self._first_batch = batch  # its tensors are in the baseline, not in the eager loss
            return
        if not profiled:
            return
        from lightning_memplan.measure import PeakWindow

        # On CPU the profiler only sees frees of blocks it saw allocated: the previous step's
        # gradients (freed by zero_grad inside this step) are known only if that step was profiled
        # too. So the first window of each run of consecutive windows is a warm-up, not a result.
        self._warmup_window = self._window_streak == 0 and self._device().type == "cpu"
        self._window_grads = self._baseline_shift(pl_module)
        self._window = PeakWindow(self._device())
        self._window.__enter__()

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._fit_batches == 1 and self.plan is None and self.fallback_reason is None:
            call = f"self.{self._submodule}(...)" if self._submodule else "self(...)"
            self.fallback_reason = f"training_step never called the module itself (`{call}`)"
            hint = "" if self._submodule else " If it calls a submodule (`self.model(x)`), pass `submodule=\"model\"`."
            warnings.warn(
                f"MemPlanCallback: training_step did not call `{call}` in the first batch, so there "
                f"is no forward to plan and compile; training goes on uncompiled.{hint}",
                MemPlanWarning, stacklevel=2)
        if self._fit_batches == 1:
            self._close_eager_window()  # no backward ran in this batch
            self.eager_losses = self._held_returned(self.eager_losses, outputs)
            if self._module is not None:
                self._before_step = storage_keys(self._first_batch, self._module)
                self._made_inputs = made_input_bytes(self._call_inputs, self._before_step)
            self._first_batch = self._outputs = None
            if self.plan is not None and self.forward_calls_per_step >= 1:
                self._rejudge(self.forward_calls_per_step)  # every rank: rank 0 decides with its measurement
                self._forecast_step()
            if self.plan is not None and self._first_batch_backwards > 1:
                warnings.warn(
                    f"MemPlanCallback: training_step ran {self._first_batch_backwards} backward passes in one "
                    "batch (manual optimization, e.g. a GAN's generator and discriminator steps). The forecast "
                    "covers the planned forward's calls, the code on their outputs, one backward and one "
                    "optimizer step; what runs after the first backward (another model's forward, backward and "
                    "optimizer step) is not forecast, so the measured peak (memplan/measured_peak_bytes) can be "
                    "higher than predicted. Plan the part that dominates memory (`submodule=`), or check "
                    "memplan/prediction_error.", MemPlanWarning, stacklevel=2)
            self._kept_forecasts = ()
            if not self._may_replan():  # no re-plan can follow: do not hold on to the first batch
                self._example, self._other_calls = None, {}
        seen = len(self.recompiles)
        self._check_recompiles()
        sig, call, noted = self._batch_sig, self._batch_call, self._shape_noting
        if noted is not None:  # its eager code was measured (the first batch's is handled above)
            self._close_eager_window()
            self._outputs = self._shape_noting = None
            if noted in self._shape_eager:
                self._shape_eager[noted] = self._held_returned(self._shape_eager[noted], outputs)
        self._batch = self._batch_call = None
        if sig is not None and any(not r.dynamic for r in self.recompiles[seen:]):
            self._compiled_sigs.add(sig)
        peak = self._close_window()
        kept = peak is not None and not self._discard_window and not self._warmup_window
        larger = call is not None and call.in_bytes > self._forecast_input_bytes
        if call is not None and sig is not None and (noted == sig or kept or larger):
            self._forecast_shapes(sig, call)  # after the window: its compile is not measured
        if self._discard_window:  # a plan was installed (forecast, compiled) inside this window
            self._discard_window, peak = False, None
        if peak is None:
            self._window_streak = 0
            return
        self._window_streak += 1
        if self._warmup_window:
            return
        self._epoch_peaks.append(peak)
        self._epoch_sigs.append(sig)
        self._maybe_replan(peak)

    def _forecast_shapes(self, sig: tuple[Any, ...], call: _ShapeCall) -> None:
        """Forecast a step at the input shapes ``sig`` of the batch that just ran, with the plan in
        force, laid out as the first batch showed the step (one call of the forward; the eager
        code after it as measured at these shapes, else the first batch's scaled by the outputs'
        bytes, ``scaled_eager_loss``) into :attr:`shape_forecasts`. Shapes dynamo compiled no
        static graph for (they ran uncompiled, past its ``recompile_limit``) get no forecast.
        Never raises."""
        args, kwargs, out_bytes, made, in_bytes = call.args, call.kwargs, call.out_bytes, call.made_bytes, call.in_bytes
        plan, module = self.plan, self._module
        shapes = describe_shapes([s[0] for s in sig])
        if (sig not in self._compiled_sigs or plan is None or module is None or self.forecast is None
                or self._orig_forward is None or self.forward_calls_per_step != 1 or self._collectives
                or self._pending is not None):
            self.shape_forecasts[sig] = None
            return
        peak: int | None = None
        try:
            loop = self._loop()
            with self._step_context():
                shaped, fc = forecast_plan(self._settings, plan, module, self._orig_forward, args, kwargs,
                                           self._optimizer(), loop=loop)
            if fc.peak_bytes is None:
                raise RuntimeError("; ".join(fc.problems) or "no forecast")
            shaped, fc = lay_out_step(shaped, fc, calls=1, eager_losses=self._eager_at(sig, out_bytes),
                                      made_input_bytes=made, loop=loop, grads=step_grad_bytes(module, loop),
                                      optimizer=self._optimizer_memory())
            peak = shaped.predicted_peak_bytes
        except Exception as exc:  # noqa: BLE001 - the batches of these shapes go unpredicted
            rank_zero_info(f"MemPlan: batch {self._fit_batches}: the forecast for inputs {shapes} failed ({exc!r}); "
                           "epochs that measure such a batch log no prediction error.")
        self.shape_forecasts[sig] = peak
        if peak is None:
            return
        self._forecast_input_bytes = max(self._forecast_input_bytes, in_bytes)
        if self._verbose:
            rank_zero_info(f"MemPlan: batch {self._fit_batches}: forecast for inputs {shapes}: {format_bytes(peak)} "
                           f"above the baseline (planned inputs: {format_bytes(plan.predicted_peak_bytes)})")
        baseline = shaped.baseline_bytes
        if self._max_memory is None or baseline is None or baseline + peak <= self._max_memory:
            return
        over = (f"a step on inputs {shapes} (batch {self._fit_batches}) is forecast to peak at "
                f"{format_bytes(baseline + peak)}, over max_memory {format_bytes(self._max_memory)}")
        if self._may_replan_at_shapes():
            planned = describe_shapes(self._planned_shapes or ())
            warnings.warn(f"MemPlanCallback: {over}; the plan was chosen at {planned}. Searching the plans again "
                          f"at {shapes} and recompiling, once.", MemPlanWarning, stacklevel=3)
            self._replan_at(sig, call)
            return
        warnings.warn(
            f"MemPlanCallback: {over}; the plan was chosen at the first batch's shapes. Plan on the largest inputs "
            "(put the largest batch first, or plan_memory(..., train_dataloaders=[longest_batch])), or cap their "
            "length.", MemPlanWarning, stacklevel=3)

    def _may_replan_at_shapes(self) -> bool:
        """Whether a batch of shapes forecast over ``max_memory`` may make the callback search the
        plans again at those shapes (:meth:`_replan_at`): ``budget="auto"``, the closed loop on and
        unused, and one process (under DDP the ranks run other shapes, and the search's decision
        is a collective every rank must join)."""
        trainer = self._trainer
        return (self._may_replan() and isinstance(self._budget, str) and self._user_plan is None
                and self._restored_plan is None and not self._collectives
                and getattr(trainer.strategy if trainer is not None else None, "world_size", 1) <= 1)

    def _replan_at(self, sig: tuple[Any, ...], call: _ShapeCall) -> None:
        """Search the plans again at the input shapes ``sig`` (the arguments in ``call``), judged
        with the eager code measured at them, choose the cheapest within ``max_memory`` (or the
        smallest, with a warning) and install it: these shapes become the planned ones (their
        eager code and made inputs the step's), and the others are forecast again as they come.
        Once per fit (it uses the closed loop's one re-plan). On failure the plan in force stays."""
        args, kwargs, out_bytes, made = call.args, call.kwargs, call.out_bytes, call.made_bytes
        module, old = self._module, self.plan
        assert module is not None and self._orig_forward is not None and old is not None
        self._replanned = True
        losses = self._eager_at(sig, out_bytes)
        self._stack.close()  # the blocks unwrapped for the search; _install wraps the chosen plan's
        plan = old
        try:
            loop = self._loop()
            kept: list[Any] = []
            with self._step_context():
                searched = decide_plan(self._settings, module, self._orig_forward, args, kwargs, self._optimizer(),
                                       call="MemPlanCallback", loop=loop, kept=kept)
            plan = searched
            if kept and (losses or made):
                plan = rejudge_plan(self._settings, searched, kept, step_grad_bytes(module, loop), calls=1,
                                    eager_loss=losses or None, made_input_bytes=made, loop=loop,
                                    optimizer=self._optimizer_memory())
            plan = dataclasses.replace(plan, reason=f"{plan.reason}; re-planned at inputs "
                                                    f"{describe_shapes([x[0] for x in sig])} over max_memory")
        except Exception as exc:  # noqa: BLE001 - the plan in force stays
            kept_label = old.candidates[old.chosen].label if old.candidates and old.chosen is not None else "the plan"
            warnings.warn(f"MemPlanCallback: searching the plans at the new shapes failed ({exc!r}); keeping "
                          f"{kept_label}.", MemPlanWarning, stacklevel=4)
        if plan is not old:  # the new planned shapes: their eager code and made inputs are the step's
            if self._planned_sig is not None:
                self._shape_eager[self._planned_sig] = self.eager_losses
            self.eager_losses, self._made_inputs, self._first_out_bytes = tuple(losses), made, out_bytes
            self._eager_from = f"the first batch of inputs {describe_shapes([x[0] for x in sig])}"
        self._example = (args, kwargs)
        self._install(plan)

    def _eager_at(self, sig: tuple[Any, ...], out_bytes: int) -> tuple[EagerLoss, ...]:
        """The eager code after the forward at input shapes ``sig``: as measured at them, else the
        planned shapes' scaled by the outputs' bytes (``out_bytes`` at ``sig``; ``scaled_eager_loss``)."""
        losses = self._shape_eager.get(sig)
        if losses is not None:
            return losses
        ratio = out_bytes / self._first_out_bytes if out_bytes and self._first_out_bytes else 1.0
        return tuple(scaled_eager_loss(m, ratio) for m in self.eager_losses)

    def _epoch_prediction(self, sigs: Sequence[tuple[Any, ...] | None]) -> tuple[int | None, bool]:
        """The prediction for an epoch whose measured batches ran input shapes ``sigs``: the
        largest forecast among them (the plan's for the planned shapes), and whether every one
        had a forecast. No batch measured: the plan's."""
        plan = self.plan
        base = plan.predicted_peak_bytes if plan is not None else None
        if base is None or not sigs:
            return base, base is not None
        preds = [base if s is None or s == self._planned_sig else self.shape_forecasts.get(s) for s in sigs]
        known = [p for p in preds if p is not None]
        return (max(known) if known else base), len(known) == len(preds)

    @staticmethod
    def _held_returned(losses: tuple[EagerLoss, ...], outputs: Any) -> tuple[EagerLoss, ...]:
        """``losses`` with the bytes of their inner outputs that ``outputs`` holds. The outputs of
        the forward that a later compiled region computes the loss from die in that region's
        backward, unless ``training_step`` returned them (``outputs``): Lightning keeps what it
        returned (detached, the same storage) through the backward (``EagerLoss.held_inner_bytes``)."""
        if not any(m.inner_outputs for m in losses):
            return losses
        returned = storage_keys(outputs)
        return tuple(dataclasses.replace(m, held_inner_bytes=sum(b for k, b in m.inner_outputs if k in returned))
                     for m in losses)

    def _may_replan(self) -> bool:
        """Whether the closed loop may still re-plan (it needs the first batch's inputs)."""
        return self._replan and self._max_memory is not None and not self._replanned

    def _fresh_input_bytes(self, calls: int) -> list[int] | int:
        """Bytes of the inputs each call after the first got that no earlier call had (another view
        of the batch), from the first batch; 0 when they were not recorded for every call."""
        return fresh_input_bytes(self._call_inputs, calls, self._before_step)

    def _rejudge(self, calls: int) -> None:
        """The search chose the plan at the first forward call, before the first batch showed how
        the step runs: judge the search's candidates again (their kept forecasts laid out again,
        nothing compiled) on ``calls`` forward calls per step and with the eager loss measured
        since (rank 0 decides with its own measurement; every rank takes part), and recompile once
        if another plan wins."""
        plan, trainer, module = self.plan, self._trainer, self._module
        if plan is None or not plan.candidates or self._example is None:
            return  # the same on every rank: nothing was searched in this fit (a fixed, given or resumed plan)
        assert module is not None
        made = self._made_inputs
        what = " and ".join(
            ([f"on {calls} forward calls per step"] if calls > 1 else [])
            + (["with the inputs training_step makes"] if made else [])
            + (["with the loss on the outputs measured"] if self.eager_losses else [])) or "again"

        def decide() -> MemPlan:
            gradless = self._gradless_bytes()
            if (calls == 1 and not self.eager_losses and not made and not gradless) or not self._kept_forecasts:
                return plan  # nothing new to judge by: the plan stands
            if self._other_calls:  # the candidates were forecast for the first call's shapes only
                return plan
            loop = self._loop()
            return rejudge_plan(self._settings, plan, self._kept_forecasts, step_grad_bytes(module, loop),
                                calls=calls, new_input_bytes=self._fresh_input_bytes(calls),
                                eager_loss=self.eager_losses or None, made_input_bytes=made, loop=loop,
                                optimizer=self._optimizer_memory())

        try:
            lockstep = forward_has_collectives(module)
            new = decide_on_rank_zero(trainer.strategy, decide, all_ranks_run=lockstep) if trainer else decide()
        except Exception as exc:  # noqa: BLE001 - the plan chosen at the first call stands
            warnings.warn(f"MemPlanCallback: judging the candidate plans {what} failed ({exc!r}); keeping the "
                          "plan chosen at the first forward call.", MemPlanWarning, stacklevel=3)
            return
        same = (new.budget, new.checkpoint, new.solver) == (plan.budget, plan.checkpoint, plan.solver)
        if calls > 1 or not same:
            rank_zero_info(
                f"MemPlanCallback: judged {what}, the search {'keeps' if same else 'chooses'} "
                f"{new.candidates[new.chosen].label}"
                + ("." if same else f" instead of {plan.candidates[plan.chosen].label} (recompiling once)."))
        if same:
            self.plan = dataclasses.replace(plan, candidates=new.candidates, knee=new.knee, reason=new.reason)
            return
        self._install_soon(new)

    def _install_soon(self, plan: MemPlan) -> None:
        """Install ``plan`` now, or, when the forward runs collectives (FSDP, tensor parallelism),
        at its next training call: a forecast of the module outside its forward would read the
        sharded parameters."""
        if self._collectives:
            self._pending = plan
        else:
            self._install(plan)

    def _other_forecasts(self, plan: MemPlan, first: Any) -> list[Any]:
        """One forecast per call after the first in the first batch: ``first`` (the first call's)
        for a call of its shapes, else the plan forecast on that call's arguments, which dynamo
        compiles graphs of their own for (a labeled and a larger unlabeled batch). Raises when one
        cannot be made (the forward runs collectives: a forecast outside it would read sharded
        parameters), or fails."""
        module = self._module
        assert module is not None and self._orig_forward is not None
        if forward_has_collectives(module):
            raise RuntimeError("calls of other input shapes are not forecast under FSDP or tensor parallelism")
        with self._step_context():
            return other_call_forecasts(self._settings, plan, module, self._orig_forward, self._optimizer(),
                                        self._loop(), first, self._call_signatures, self._other_calls)

    def _step_context(self) -> contextlib.AbstractContextManager[Any]:
        """The precision plugin's training-step context (autocast for ``"bf16-mixed"``): a forecast
        made outside the training step (after the first batch, or for a re-plan) runs the forward as
        the step does. Inside the step it is entered once more, which changes nothing."""
        trainer = self._trainer
        return trainer.precision_plugin.train_step_context() if trainer is not None else contextlib.nullcontext()

    def _forecast_step(self) -> None:
        """Lay the forecast out for the step the first batch showed (nothing is compiled) and
        predict from it: ``training_step`` called the planned forward several times
        (:meth:`~lightning_memplan.forecasting.step_forecast.Forecast.repeated`), made the forward's inputs itself
        (:meth:`~lightning_memplan.forecasting.step_forecast.Forecast.with_inputs_made_in_step`), and the eager
        code between the forward and the backward was measured
        (:meth:`~lightning_memplan.forecasting.step_forecast.Forecast.with_eager_loss`)."""
        calls, losses, made = self.forward_calls_per_step, self.eager_losses, self._made_inputs
        plan, fc = self.plan, self.forecast
        if plan is None or (calls <= 1 and not losses and not made and not self._gradless_bytes()):
            return
        if fc is None or fc.peak_bytes is None:
            if calls > 1:
                warnings.warn(
                    f"MemPlanCallback: training_step called the planned forward {calls} times in one step and "
                    "there is no forecast to lay out for them.", MemPlanWarning, stacklevel=3)
            return
        try:
            loop = self._loop()
            assert self._module is not None
            if self._other_calls:
                fc = fc.with_calls(self._other_forecasts(plan, fc), new_input_bytes=self._fresh_input_bytes(calls))
            plan, fc = lay_out_step(plan, fc, calls=calls, new_input_bytes=self._fresh_input_bytes(calls),
                                    eager_losses=losses, made_input_bytes=self._made_inputs, loop=loop,
                                    grads=step_grad_bytes(self._module, loop), optimizer=self._optimizer_memory())
        except Exception as exc:  # noqa: BLE001 - the plain prediction stands; training goes on
            warnings.warn(f"MemPlanCallback: laying the forecast out for the step the first batch ran failed "
                          f"({exc!r}); the prediction covers one call of the compiled graphs.",
                          MemPlanWarning, stacklevel=3)
            return
        self.forecast, self.plan = fc, plan
        baseline, peak = plan.baseline_bytes, plan.predicted_peak_bytes
        parts = []
        if made and self._verbose:
            parts.append(f"training_step makes {format_bytes(made)} of the forward's inputs (counted in the step, "
                         "not before it)")
        if calls > 1:
            parts.append(f"training_step called the planned forward {calls} times in one step; the forecast now "
                         f"covers {calls} calls (every call's saved activations live until its backward)"
                         + (f", {len(self._other_calls)} other input shape(s) forecast with the plan on their own "
                            "compiled graphs" if self._other_calls else ""))
        if losses and (calls > 1 or self._verbose):
            kept = sum(m.kept_bytes for m in losses)
            eager = max(max(m.forward_peak_bytes, m.kept_bytes) for m in losses)
            where = self._eager_from
            parts.append(f"the eager code after the forward (the loss on the outputs, measured on {where}): "
                         f"{format_bytes(sum(m.outputs_bytes for m in losses))} of outputs, up to "
                         f"{format_bytes(eager)} made, {format_bytes(kept)} kept for backward, a backward of "
                         f"{format_bytes(max(m.backward_peak_bytes for m in losses))}")
        note = f"MemPlanCallback: {'; '.join(parts)}. Forecast now {format_bytes(peak)} above the baseline."
        if self._max_memory is not None and peak is not None and baseline + peak > self._max_memory:
            then = ("the closed loop re-plans if the measured peak exceeds it" if self._may_replan() else
                    "the closed loop has re-planned once already: reduce the batch or raise max_memory")
            warnings.warn(f"{note} That exceeds max_memory {format_bytes(self._max_memory)}; {then}.",
                          MemPlanWarning, stacklevel=3)
        elif parts:
            rank_zero_info(note)

    def _baseline_shift(self, pl_module: LightningModule) -> int:
        """Bytes to add to a window's peak (above the bytes live when it opened) so it is above the
        prediction's baseline, as the prediction is.

        Manual optimization: the prediction is above a baseline without gradients (see
        ``lightning_step_peak``), so the gradients live at the start count as part of the peak.
        Automatic optimization: the baseline holds the previous step's gradients
        (``plan.breakdown["gradients"]``); a batch that starts with no gradient at all (Lightning's
        ``on_validation_model_zero_grad`` freed them before validation ran inside or at the end of
        the epoch) starts that much lower, and its backward makes them all again on top: its peak
        above its own start was the gradients' bytes higher than a steady step's (+12.9% on the
        demo model), though it peaks no higher in bytes in use. Those bytes are subtracted."""
        module = self._module
        if module is None:
            return 0
        if not self._loop().automatic_optimization:
            return live_grad_bytes(module)
        held = self.plan.breakdown.get("gradients", 0) if self.plan is not None else 0
        if held and not any(p.grad is not None for p in pl_module.parameters()):
            return -held
        return 0

    def _close_window(self) -> int | None:
        w, self._window = self._window, None
        if w is None:
            return None
        w.__exit__(None, None, None)
        return max(int(w.peak_bytes) + self._window_grads, 0)

    def _maybe_replan(self, measured: int) -> None:
        plan = self.plan
        if (not self._replan or self._replanned or self._max_memory is None or plan is None
                or plan.baseline_bytes is None or plan.baseline_bytes + measured <= self._max_memory):
            return
        self._replanned = True
        new, unseen, fits = replan_candidate(plan, measured, self._max_memory)
        if fits:
            expect = (f"forecast {format_bytes(plan.baseline_bytes + (new.peak_bytes or 0) + unseen)}, counting the "
                      f"{format_bytes(unseen)} the forecast did not see (eager code such as the loss)")
        else:
            expect = "no candidate is forecast to fit; halving the budget"
        warnings.warn(
            f"MemPlanCallback: measured peak {format_bytes(plan.baseline_bytes + measured)} exceeds "
            f"max_memory {format_bytes(self._max_memory)}; re-planning once with {new.label} ({expect}), "
            "recompiling, and going on.", MemPlanWarning, stacklevel=2)
        self._install_soon(dataclasses.replace(
            plan, budget=new.budget, checkpoint=new.checkpoint, predicted_peak_bytes=new.peak_bytes,
            solver=new.solver or (plan.solver if plan.solver != "remat" else self._settings.solver_name),
            reason=f"re-planned: measured {format_bytes(measured)} over max_memory"))

    # ------------------------------------------------------------------ reporting
    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        peaks, self._epoch_peaks = self._epoch_peaks, []
        sigs, self._epoch_sigs = self._epoch_sigs, []
        self.measured.append(peaks)
        self.measured_shapes.append(sigs)
        if self._window_streak and len(peaks) >= self._measure_batches:
            self._window_streak = 0  # the rest of the epoch ran unprofiled
        measured = max_over_ranks(trainer.strategy, max(peaks) if peaks else None)
        predicted, complete = self._epoch_prediction(sigs)
        if self._forecast_new_shapes and getattr(trainer.strategy, "world_size", 1) > 1:
            # each rank measured its own batches' shapes: the largest of their forecasts (every rank calls)
            predicted = max_over_ranks(trainer.strategy, predicted)
            complete = max_over_ranks(trainer.strategy, 0 if complete else 1) == 0
        plan = self.plan
        metrics: dict[str, float] = {}
        if plan is not None:
            metrics["memplan/budget"] = plan.budget
            metrics["memplan/checkpointed_blocks"] = float(len(plan.checkpoint))
            if predicted is not None:
                metrics["memplan/predicted_peak_bytes"] = float(predicted)
            if plan.baseline_bytes is not None:
                metrics["memplan/baseline_bytes"] = float(plan.baseline_bytes)
            for key in ("activations", "parameters", "gradients", "optimizer_state", "fsdp_buffers"):
                if key in plan.breakdown:
                    metrics[f"memplan/{key}_bytes"] = float(plan.breakdown[key])
        if measured is not None:
            metrics["memplan/measured_peak_bytes"] = float(measured)
            if predicted is not None and complete and measured > 0:
                metrics["memplan/prediction_error"] = (predicted - measured) / measured
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        if self._verbose:
            other = {sig for sig in sigs if sig is not None and sig != self._planned_sig}
            self._print_epoch(trainer.current_epoch, metrics, len(other))
        # the timeline is the planned shapes' forecast: drawn with the batches of those shapes
        planned = [p for p, sig in zip(peaks, sigs) if sig is None or sig == self._planned_sig]
        at_planned = measured if len(planned) == len(peaks) else max(planned, default=None)
        if self._log_plots and not self._timeline_plotted and at_planned is not None:
            self._timeline_plotted = True
            self._plot_timeline(at_planned)

    @rank_zero_only
    def _print_plan(self) -> None:
        plan = self.plan
        assert plan is not None
        rows = [
            ["budget", f"{plan.budget:g}"], ["solver", plan.solver], ["backend", plan.backend],
            ["checkpointed blocks", ", ".join(plan.checkpoint) or "none"],
            ["forecast peak (above baseline)", format_bytes(plan.predicted_peak_bytes)],
            ["baseline (params, optimizer, batch)", format_bytes(plan.baseline_bytes)],
            ["chosen by", plan.reason],
        ]
        if plan.knee is not None:
            rows.append(["knee", plan.candidates[plan.knee].label])
        for note in plan.notes:
            rows.append(["partitioner", note])
        if plan.candidates:
            rows.append(["candidates forecast", str(len(plan.candidates))])
        d, i = self.timings.get("decide_seconds"), self.timings.get("install_seconds")
        if d is not None and i is not None:
            rows.append(["decision / final forecast+compile", f"{d:.1f} s / {i:.1f} s (ratio {d / max(i, 1e-9):.2f})"])
        rank_zero_info("MemPlan\n" + tabulate(rows, tablefmt="simple"))

    @rank_zero_only
    def _print_epoch(self, epoch: int, metrics: dict[str, float], other_shapes: int = 0) -> None:
        pred = metrics.get("memplan/predicted_peak_bytes")
        meas = metrics.get("memplan/measured_peak_bytes")
        err = metrics.get("memplan/prediction_error")
        shapes = (f" (measured batches of {other_shapes} other input shape(s) than the planned one: the largest "
                  "of their forecasts)" if other_shapes else "")
        rank_zero_info(
            f"MemPlan epoch {epoch}: predicted {format_bytes(pred)}, measured {format_bytes(meas)}, "
            f"error {'-' if err is None else f'{100 * err:+.1f}%'}{shapes}"
        )

    def _plot_dir(self) -> Path:
        """``<first logger's log_dir>/memplan`` (else the Trainer's ``default_root_dir``).

        Not ``trainer.log_dir``: under DDP that property broadcasts, and plots are drawn on rank
        zero only, so the other ranks would never join the collective.
        """
        trainer = self._trainer
        root: Any = None
        if trainer is not None and trainer.loggers:
            logger = trainer.loggers[0]
            root = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
        if root is None and trainer is not None:
            root = trainer.default_root_dir
        return Path(root or ".") / "memplan"

    @rank_zero_only
    def _plot_frontier(self) -> None:
        from lightning_memplan.core.front import PlanPoint
        from lightning_memplan.report import plot_frontier

        plan = self.plan
        if plan is None or not plan.candidates:
            return
        ok = [i for i, c in enumerate(plan.candidates) if c.peak_bytes is not None and c.cost is not None]
        points = [PlanPoint(label=plan.candidates[i].label, peak_bytes=int(plan.candidates[i].peak_bytes or 0),
                            cost=float(plan.candidates[i].cost or 0.0) / 1e9) for i in ok]
        index = {i: k for k, i in enumerate(ok)}
        fig = plot_frontier(points, knee=index.get(plan.knee) if plan.knee is not None else None,
                            chosen=index.get(plan.chosen) if plan.chosen is not None else None,
                            limit_bytes=None if self._max_memory is None or plan.baseline_bytes is None
                            else self._max_memory - plan.baseline_bytes,
                            cost_label="GFLOPs of the compiled forward + backward")
        self._emit_figure(fig, "frontier")

    @rank_zero_only
    def _plot_timeline(self, measured: int) -> None:
        from lightning_memplan.report import plot_timeline

        fc, plan = self.forecast, self.plan
        if fc is None or not fc.timeline or plan is None:
            return
        loop = self._loop()
        timeline = lightning_step_timeline(fc, plan.breakdown.get("gradients", 0), loop)
        n = loop.accumulate_grad_batches
        what = "one Lightning training step" if n == 1 else f"the optimizer's micro-batch (1 in {n})"
        fig = plot_timeline(timeline, predicted_peak=plan.predicted_peak_bytes, measured_peak=measured,
                            title=f"Forecast memory timeline of {what}")
        self._emit_figure(fig, "timeline")

    def _emit_figure(self, fig: Any, name: str) -> None:
        """Save ``fig`` as ``<plot dir>/<name>.png`` and hand it to the loggers that keep pictures:
        a TensorBoard figure, an MLflow run artifact (under ``memplan/``), a W&B image under the key
        ``memplan/<name>`` (at the Trainer's global step)."""
        from lightning.pytorch.loggers import (
            MLFlowLogger,
            TensorBoardLogger,
            WandbLogger,
        )

        from lightning_memplan.report import save_figure

        trainer = self._trainer
        if trainer is not None and trainer.fast_dev_run:
            return  # a debugging run: Lightning writes no logs or checkpoints then, nor do we
        loggers = list(trainer.loggers) if trainer is not None else []
        for logger in loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(f"memplan/{name}", fig, global_step=trainer.global_step, close=False)
        path = save_figure(fig, self._plot_dir() / f"{name}.png")
        rank_zero_info(f"MemPlan: wrote {path}")
        for logger in loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
                logger.experiment.log_artifact(logger.run_id, str(path), artifact_path="memplan")
            elif isinstance(logger, WandbLogger):
                logger.log_image(key=f"memplan/{name}", images=[str(path)], step=trainer.global_step)
