"""One planning pipeline for a Lightning training step: :func:`plan_step`.

:func:`~lightning_memplan.tuner.plan_memory` runs it once, after running ``training_step`` once.
:class:`~lightning_memplan.MemPlanCallback` can run it in two parts: at the first forward call, when
nothing is known of the step yet (``step=None``: decide, forecast), and after the first batch
(``earlier=`` the first part's result, ``step=`` what the batch showed: re-judge, lay out). It knows
nothing of the Trainer: what needs one comes in as functions (``agree``: one plan for every process;
``blocks``: the blocks wrapped as the fit holds them; ``on_failure``: a failed stage reported instead
of raised).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from lightning_memplan._torch.fsdp import fsdp_kinds
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.optim_memory import OptimizerMemory, optimizer_memory
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import checkpointed, recompute_trial, uncompiled_blocks
from lightning_memplan.planner.decision import decide_plan, rejudge_plan
from lightning_memplan.planner.messages import (
    MemPlanWarning,
    several_backwards_warning,
    uncompiled_warnings,
)
from lightning_memplan.planner.plan_forecast import (
    forecast_plan,
    lay_out_step,
    other_call_forecasts,
    sum_outputs,
)
from lightning_memplan.planner.search import PlanDoesNotFit, choose
from lightning_memplan.planner.settings import PlanSettings
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    gradless_bytes,
    gradless_parameters,
    step_grad_bytes,
)

if TYPE_CHECKING:
    from lightning_memplan.forecasting.result import Forecast

__all__ = ["PlannedStep", "Stage", "StepObservation", "gradless_optimizer_memory", "plan_step"]

Stage = Literal["rejudge", "forecast", "layout"]
"""A stage of :func:`plan_step` that ``on_failure`` may take the error of."""


@dataclass(frozen=True, kw_only=True)
class StepObservation:
    """What one run of the training step showed of the planned forward (plan_memory's run of
    ``training_step``, the callback's first batch). Sizes in bytes.

    Raises:
        ValueError: ``calls`` is not an int >= 1, both ``reached`` and ``eager_reached`` are given,
            or ``others`` without ``signatures``.
    """

    calls: int = 1
    """Calls of the planned forward per step (>= 1)."""
    new_input_bytes: int | Sequence[int] = 0
    """Bytes of the fresh inputs of each call after the first, one number for all or one per later
    call (:func:`~lightning_memplan.planner.step_model.fresh_input_bytes`; ``Forecast.repeated``)."""
    eager_losses: tuple[EagerLoss, ...] = ()
    """The eager code between the forward and the backward (the loss on the outputs, metrics), one
    per call (:func:`~lightning_memplan.forecasting.eager_loss.measure_eager_losses`); empty: not measured."""
    made_input_bytes: int = 0
    """Bytes of the first call's inputs ``training_step`` made, not in the batch
    (:func:`~lightning_memplan.planner.step_model.made_input_bytes`)."""
    reached: frozenset[int] | None = None
    """The ``id()`` of each parameter of the planned module the step's backward gives a gradient, as
    a real backward showed them (the callback's first batch); ``None`` or empty: not measured so.
    Known before the re-judge, so the candidates are judged with them."""
    eager_reached: frozenset[int] | None = None
    """The ``id()`` of each parameter the loss's eager code reaches when the forward ran without autograd
    (plan_memory's run of ``training_step``): the step's backward reaches these and those the compiled
    graphs read with grad, which the chosen plan's forecast tells (automatic optimization, not FSDP2).
    ``None``: not measured so."""
    backwards: int = 0
    """``manual_backward`` calls in the step (manual optimization); more than one: :func:`plan_step`
    warns that the plan covers the step up to the first."""
    signatures: tuple[tuple[Any, ...], ...] = ()
    """:func:`~lightning_memplan.planner.step_model.call_signature` of every call, in order (needed
    with ``others``)."""
    others: Mapping[tuple[Any, ...], tuple[Sequence[Any], dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """The arguments ``(args, kwargs)`` of one call of each signature other than the first call's:
    dynamo compiles graphs of their own for them, forecast on their own (``Forecast.with_calls``)."""

    def __post_init__(self) -> None:
        n = self.calls
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`StepObservation(calls={n!r})` must be an int >= 1.")
        if self.reached is not None and self.eager_reached is not None:
            raise ValueError("`StepObservation(reached=..., eager_reached=...)`: give one of them (`reached` from a "
                             "real backward, `eager_reached` from a forward run without autograd).")
        if self.others and not self.signatures:
            raise ValueError("`StepObservation(others=...)` needs `signatures`: the call signature of every call.")


@dataclass(frozen=True, kw_only=True)
class PlannedStep:
    """What :func:`plan_step` chose, and its prediction of the Lightning step. Sizes in bytes."""

    plan: MemPlan
    """The chosen plan; ``predicted_peak_bytes`` (above ``baseline_bytes``) and ``breakdown`` are those
    of the Lightning step ``loop`` runs, laid out as ``step`` showed it; none when its forecast failed."""
    forecast: Forecast | None
    """The chosen plan's forecast on ``settings.backend``, laid out for the step; ``None`` when the
    forecast failed and ``on_failure`` took the error."""
    decided: MemPlan
    """The plan before the step was judged: the given one, the search's choice on the first call's
    forecasts, or ``earlier.plan``. ``plan`` differs from it in budget, blocks or solver when the
    re-judge chose another candidate."""
    candidate_forecasts: tuple[Forecast | None, ...] = ()
    """The search's forecasts of the candidates, aligned with ``plan.candidates`` (``None`` where one
    failed; plain data, nothing compiled); empty when no search ran (a given plan; under ``agree``, a
    process that did not run it)."""
    loop: TrainingLoop
    """The training loop the prediction is for, with ``gradless_bytes`` once the step showed them."""
    warnings: tuple[str, ...] = ()
    """The :class:`~lightning_memplan.planner.messages.MemPlanWarning` messages this call issued, in order."""


def _first_line(exc: BaseException) -> str:
    """``TypeName: the first line of the message`` (torch's errors run to pages)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _has_plan_without_checkpointing(plan: MemPlan) -> bool:
    """Whether one of ``plan``'s candidates, forecast, checkpoints no block."""
    return any(not c.checkpoint and c.peak_bytes is not None for c in plan.candidates)


def _without_checkpointing(plan: MemPlan, kept: Sequence[Forecast | None], why: str,
                           settings: PlanSettings, call: str) -> tuple[MemPlan, tuple[Forecast | None, ...]]:
    """``plan``'s checkpointed blocks cannot be used (``why``): the plan chosen again among its
    candidates without activation checkpointing (those with it marked failed, their kept forecasts
    dropped so no re-judge picks them). Raises a RuntimeError when there is none (a plan given
    without candidates)."""
    if not _has_plan_without_checkpointing(plan):
        raise RuntimeError(f"{call}: the plan's checkpointed blocks {list(plan.checkpoint)} cannot be used ({why}), "
                           "and there is no plan without checkpointing to take instead")
    candidates = [dataclasses.replace(c, peak_bytes=None, note=why) if c.checkpoint else c for c in plan.candidates]
    try:
        chosen = choose(candidates, baseline_bytes=plan.baseline_bytes or 0, max_memory=settings.max_memory,
                        limit_name=settings.limit_name,
                        solver=plan.solver)
    except PlanDoesNotFit as exc:  # the smallest of them, as the search takes when nothing fits
        chosen = exc.plan
    chosen = dataclasses.replace(chosen, backend=plan.backend, regional=plan.regional,
                                 reason=f"{chosen.reason}, among the plans without checkpointing")
    forecasts = tuple(None if c.checkpoint else f for c, f in zip(plan.candidates, kept)) if kept else ()
    return chosen, forecasts


def gradless_optimizer_memory(module: nn.Module, optimizer: torch.optim.Optimizer | None,
                               reached: Collection[int]) -> OptimizerMemory | None:
    """The optimizer's memory without its parameters not in ``reached`` (they get no gradient, so
    no state: ``module``'s, and those of the LightningModule outside it that the step does not
    read); ``None`` when there is no optimizer or every parameter is reached."""
    if optimizer is None:
        return None
    gradless = {id(p) for p in gradless_parameters(module, reached)}
    gradless.update(id(p) for g in optimizer.param_groups for p in g["params"]
                    if isinstance(p, torch.Tensor) and p.requires_grad and id(p) not in reached)
    return optimizer_memory(optimizer, gradless=gradless) if gradless else None


def plan_step(
    module: nn.Module,
    *,
    settings: PlanSettings,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    forward: Callable[..., Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    call: str = "plan_step",
    loop: TrainingLoop = TrainingLoop(),
    step: StepObservation | None = None,
    plan: MemPlan | None = None,
    earlier: PlannedStep | None = None,
    agree: Callable[[Callable[[], MemPlan]], MemPlan] | None = None,
    blocks: Callable[[MemPlan], AbstractContextManager[Any]] | None = None,
    on_failure: Callable[[Stage, Exception], None] | None = None,
) -> PlannedStep:
    """Plan ``module``'s training step and predict its memory, in this order:

    1. **Decide** (:func:`~lightning_memplan.planner.decision.decide_plan`): ``plan`` when given, else a
       fixed-budget plan or the search's choice among the candidates forecast on
       ``settings.search_backend`` for one call (their forecasts kept). Skipped with ``earlier``.
    2. **Gradients from a real backward**: with ``step.reached``, the parameters it does not reach
       hold no gradient (``loop.gradless_bytes``) nor optimizer state, from here on.
    3. **Re-judge** (:func:`~lightning_memplan.planner.decision.rejudge_plan`), with ``step`` and a search's
       candidates: their kept forecasts laid out again for the step's calls, eager code and inputs it
       made, and chosen again; nothing is compiled. Not when the step has calls of other shapes (the
       candidates were forecast for the first call's) or nothing to judge by.
       3b. A plan with checkpointed blocks runs one eager trial step with them wrapped
       (:func:`~lightning_memplan.planner.checkpointing.recompute_trial`); when a block does not recompute
       what it computed, the plan is chosen again among those without checkpointing (warned), or, for a
       plan without candidates, the error propagates.
    4. **Forecast** the chosen plan on ``settings.backend``
       (:func:`~lightning_memplan.planner.plan_forecast.forecast_plan`, its blocks wrapped by ``blocks``).
       Skipped with ``earlier`` while the re-judge keeps its plan (its forecast stands). 4b. A checkpointed
       block no compiled graph of that forecast reads (dynamo ran it eagerly) drops the checkpointing
       as in 3b, when there is a plan without it, and the new choice is forecast.
    5. **Warn** (:class:`~lightning_memplan.planner.messages.MemPlanWarning`, ``f"{call}: ..."``) of what
       of the forward runs uncompiled (:func:`~lightning_memplan.planner.messages.uncompiled_warnings`;
       after a forecast of step 4), and of a step of several backward passes (``step.backwards``).
    6. **Gradients from the forecast**: with ``step.eager_reached``, the parameters neither the compiled
       graphs nor the eager code reach hold no gradient nor optimizer state.
    7. **Other calls**: with ``step.others``, the plan forecast on each other signature's arguments
       (:func:`~lightning_memplan.planner.plan_forecast.other_call_forecasts`), joined to the first
       call's (``Forecast.with_calls``).
    8. **Lay out** the plan and its forecast for the Lightning step
       (:func:`~lightning_memplan.planner.plan_forecast.lay_out_step`): the calls, the eager code, the
       inputs made, the gradients and optimizer state of steps 2 and 6.

    Steps 2, 3 and 5 to 8 need ``step``; 6 to 8 a forecast with a peak (one whose compile failed,
    ``peak_bytes=None``, is not laid out, nor are other calls forecast for it). The first part of
    the callback's plan is ``step=None`` (steps 1, 4, 5), its second ``earlier=`` that result with
    ``step``.

    Args:
        module: the planned module (the LightningModule or its ``submodule``); its blocks must not be
            wrapped already unless ``blocks`` says so.
        settings: the validated arguments (:class:`~lightning_memplan.planner.settings.PlanSettings`).
        args, kwargs: one call's arguments, ``forward(*args, **kwargs)`` (the first call's).
        forward: ``module``'s original forward (default: ``module.forward``).
        optimizer: the first optimizer (its state is forecast; others are in ``loop``).
        call: the API name every message starts with (``"plan_memory"``, ``"MemPlanCallback"``).
        loop: how Lightning runs the step (:class:`~lightning_memplan.planner.step_model.TrainingLoop`).
        step: what a run of the step showed; ``None``: nothing yet (steps 1, 4, 5 only).
        plan: a plan decided already (a user's, one restored from a checkpoint): no search.
        earlier: a result of ``plan_step`` for this module with ``step=None``: go on from it.
        agree: runs a decision (step 1, step 3) and returns the plan every process is to use (the
            callback: ``decide_on_rank_zero``); default: runs it here. The decision of step 3 is
            handed over whenever a search ran, also when there is nothing to judge by (it returns the
            plan then), so every process takes part alike.
        blocks: the context a forecast of a plan runs in with its blocks checkpointed (default:
            ``checkpointed(module, plan.checkpoint)`` for the forecast's duration).
        on_failure: takes the error of a failed stage (``"rejudge"``: the plan decided stands;
            ``"forecast"``: no forecast, steps 6 to 8 skipped; ``"layout"``, steps 7 and 8: the plan
            and forecast of one call stand) and the pipeline goes on; default: the error propagates.
            A failed decision always propagates.

    Returns:
        A :class:`PlannedStep`. The "no plan fits" warning of step 1 points at the caller (without
        ``agree``), those of step 5 at the caller's caller, as ``warnings.warn``'s ``stacklevel`` counts.

    Raises:
        ValueError: ``plan`` and ``earlier`` both given; ``settings.backend`` still ``"auto"``.
        RuntimeError: no candidate could be forecast; what a stage raises, without ``on_failure``.
    """
    if plan is not None and earlier is not None:
        raise ValueError(f"`{call}`: plan_step takes `plan` (decided already) or `earlier` (a result to go on "
                         "from), not both.")
    if settings.backend == "auto":  # the device is known to the caller only
        raise ValueError(f"`{call}`: plan_step needs a resolved backend: pass `settings.on_device(device)`.")
    kwargs = {} if kwargs is None else kwargs
    forward = module.forward if forward is None else forward
    wrap = blocks if blocks is not None else (lambda p: checkpointed(module, p.checkpoint))
    issued: list[str] = []

    # 1. decide
    fc: Forecast | None
    if earlier is not None:
        decided, kept, fc, forecast_done = earlier.plan, earlier.candidate_forecasts, earlier.forecast, True
    else:
        found: list[Forecast | None] = []
        given = plan

        def decision() -> MemPlan:
            if given is not None:
                return given
            # stacklevel 4: decide_plan, decision, plan_step, plan_step's caller
            return decide_plan(settings, module, forward, args, kwargs, optimizer, call=call, loop=loop,
                               kept=found, stacklevel=4, warned=issued)

        decided = agree(decision) if agree is not None else decision()
        kept, fc, forecast_done = tuple(found), None, False
    plan = decided

    # 2. the gradients a real backward gives none
    opt_mem: OptimizerMemory | None = None
    if step is not None and step.reached:
        loop = dataclasses.replace(loop, gradless_bytes=gradless_bytes(module, step.reached))
        opt_mem = gradless_optimizer_memory(module, optimizer, step.reached)

    # 3. re-judge the search's candidates for the step
    if step is not None and plan.candidates:
        observed, judged_loop, judged_opt = step, loop, opt_mem

        def rejudged() -> MemPlan:
            if not kept or observed.others or not (observed.calls > 1 or observed.eager_losses
                                                   or observed.made_input_bytes or judged_loop.gradless_bytes):
                return decided  # nothing new to judge by, or candidates forecast for the first call's shapes only
            return rejudge_plan(settings, decided, kept, step_grad_bytes(module, judged_loop), calls=observed.calls,
                                new_input_bytes=observed.new_input_bytes, eager_loss=observed.eager_losses,
                                made_input_bytes=observed.made_input_bytes, loop=judged_loop, optimizer=judged_opt)

        try:
            new = agree(rejudged) if agree is not None else rejudged()
        except Exception as exc:
            if on_failure is None:
                raise
            on_failure("rejudge", exc)
            new = decided
        if forecast_done and (new.budget, new.checkpoint, new.solver) == (decided.budget, decided.checkpoint,
                                                                          decided.solver):
            plan = dataclasses.replace(decided, candidates=new.candidates, knee=new.knee, reason=new.reason)
        else:
            plan, forecast_done = new, False

    # 3b. checkpointed blocks must recompute what they computed: one real step with them first
    if plan.checkpoint and not forecast_done:
        try:
            with wrap(plan):
                recompute_trial(module, forward, args, kwargs, sum_outputs)
        except Exception as exc:
            blocks = ", ".join(repr(n) for n in plan.checkpoint)
            why = f"checkpointed blocks failed when recomputed: {_first_line(exc)}"
            try:
                plan, kept = _without_checkpointing(plan, kept, why, settings, call)
            except RuntimeError as none:
                raise none from exc
            issued.append(f"{call}: activation checkpointing of {blocks} failed in a trial step, when recomputed "
                          f"({_first_line(exc)}): a block that changes state it is passed (a KV cache it appends "
                          f"to) does not recompute what it computed. Took {plan.candidates[plan.chosen].label} "
                          f"instead ({plan.reason}).")
            warnings.warn(issued[-1], MemPlanWarning, stacklevel=2)
            forecast_done = False

    # 4. forecast the chosen plan on the final backend; 5. what of the forward it does not reach
    def forecast_chosen(chosen: MemPlan) -> tuple[MemPlan, Forecast | None]:
        with wrap(chosen):
            try:
                return forecast_plan(settings, chosen, module, forward, args, kwargs, optimizer, loop=loop)
            except Exception as exc:
                if on_failure is None:
                    raise
                on_failure("forecast", exc)
                return chosen, None

    if not forecast_done:
        plan, fc = forecast_chosen(plan)
        # 4b. checkpointed blocks dynamo does not compile run eagerly, unplanned and unforecast
        eager = uncompiled_blocks(module, plan.checkpoint, fc.compiled_parameter_ids if fc is not None else None)
        if eager and _has_plan_without_checkpointing(plan):
            plan, kept = _without_checkpointing(plan, kept, f"dynamo runs {', '.join(eager)} eagerly under "
                                                "checkpointing", settings, call)
            issued.append(f"{call}: dynamo does not compile {', '.join(repr(n) for n in eager)} under activation "
                          "checkpointing (a graph break inside the block, or side effects on a torch without "
                          "skip_fwd_side_effects_in_bwd_under_checkpoint): such a block runs eagerly, so the plan "
                          f"does not reach it and the forecast misses its activations. Took "
                          f"{plan.candidates[plan.chosen].label} instead ({plan.reason}).")
            warnings.warn(issued[-1], MemPlanWarning, stacklevel=2)
            plan, fc = forecast_chosen(plan)
        for message in uncompiled_warnings(module, fc):
            issued.append(f"{call}: {message}")
            warnings.warn(issued[-1], MemPlanWarning, stacklevel=3)  # (plan_step's caller's caller)
    if step is not None and step.backwards > 1:
        issued.append(f"{call}: {several_backwards_warning(step.backwards)}")
        warnings.warn(issued[-1], MemPlanWarning, stacklevel=3)

    if step is not None and fc is not None and fc.peak_bytes is not None:
        # 6. the gradients neither the compiled graphs nor the eager code give
        if step.eager_reached is not None:
            compiled = fc.compiled_parameter_ids
            if compiled is not None and loop.automatic_optimization and not fsdp_kinds(module).fsdp2:
                nograd = fc.compiled_gradless_parameter_ids or frozenset()
                reached = (compiled - nograd) | step.eager_reached
                loop = dataclasses.replace(loop, gradless_bytes=gradless_bytes(module, reached))
                opt_mem = gradless_optimizer_memory(module, optimizer, reached)
        try:
            # 7. the calls of other input shapes
            laid = fc
            if step.others:
                with wrap(plan):
                    others = other_call_forecasts(settings, plan, module, forward, optimizer, loop, laid,
                                                  step.signatures, step.others)
                laid = laid.with_calls(others, new_input_bytes=step.new_input_bytes)
            # 8. lay the forecast out for the Lightning step
            plan, fc = lay_out_step(plan, laid, calls=step.calls, new_input_bytes=step.new_input_bytes,
                                    eager_losses=step.eager_losses, made_input_bytes=step.made_input_bytes,
                                    loop=loop, grads=step_grad_bytes(module, loop), optimizer=opt_mem)
        except Exception as exc:
            if on_failure is None:
                raise
            on_failure("layout", exc)
    return PlannedStep(plan=plan, forecast=fc, decided=decided, candidate_forecasts=kept, loop=loop,
                       warnings=tuple(issued))
