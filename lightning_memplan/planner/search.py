"""Choose a memory plan: forecast candidate plans, then take the knee or the fastest that fits.

A candidate plan is (activation memory budget, checkpointed blocks) with the knapsack solver, or a
whole-graph rematerialization plan (solver ``"remat"``, :mod:`lightning_memplan.core.remat`), which can
save less for the same recomputation because it decides every forward value, not only the
knapsack's candidates. Each is forecast on the real
compiled graphs of the model (:func:`lightning_memplan.forecast`): its predicted peak above the
baseline (bytes) and its cost, the FLOPs of the compiled forward and backward graphs (recomputation
shows up in the backward graph, so more recomputation costs more). The choice:

* ``max_memory`` given: the cheapest plan whose ``baseline + peak`` (on CUDA plus the caching
  allocator's reserve beyond it: :func:`held_bytes`) fits it; if none fits, a
  :class:`PlanDoesNotFit` error that names the smallest forecast;
* otherwise the knee: the plan on the Pareto front (lower peak, lower cost; costs within
  :data:`COST_TIE` of each other count as equal) closest to the origin after min-max normalizing
  both axes.

Decisions rest on the forecast peak, not on the budget number: the measured peak is not monotonic
in the budget (budget 0.0 can peak as high as 1.0), and checkpointing blocks reaches lower.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_memplan.core.front import PlanPoint, knee, pareto_indices
from lightning_memplan.plan import Candidate, MemPlan
from lightning_memplan.planner.checkpointing import checkpointed, uncompiled_blocks
from lightning_memplan.units import format_bytes

if TYPE_CHECKING:
    from lightning_memplan.forecasting.result import Forecast

__all__ = ["COST_TIE", "DEFAULT_BUDGETS", "DEFAULT_REMAT_BUDGETS", "MIN_SAVING", "NOT_A_PLAN", "OUT_OF_TIME",
           "PlanDoesNotFit", "SearchResult", "choose", "forecast_flops", "held_bytes", "rejudge", "reserve_bytes",
           "search"]

DEFAULT_BUDGETS: tuple[float, ...] = (1.0, 0.7, 0.5, 0.3, 0.1)
"""Budgets a search tries with each checkpoint set (ratios in [0, 1])."""

MIN_SAVING: float = 0.05
"""The least share of the fastest plan's forecast total (baseline plus peak) another plan must save
for the knee to consider it: below it, a plan costs recomputation for memory nobody would miss."""

COST_TIE = 1e-3
"""Plans whose recompute FLOPs differ by less than this fraction are equally fast for the front: a
plan that saves memory for a handful of pointwise FLOPs dominates the one that does not, so a
near-tie cannot stretch the front (and move the knee) with a point no faster in practice."""

DEFAULT_REMAT_BUDGETS: tuple[float, ...] = (0.55, 0.4, 0.25)
"""Whole-graph rematerialization plans a search adds (solver ``"remat"``; a budget caps the saved
bytes between the least and the cheapest plan's, see :mod:`lightning_memplan.core.remat`). Each costs a
MILP and a partition. A denser grid (0.55, 0.45, 0.35, 0.25) was tried on the 6-block GPT of
``benchmarks/plans.py``: its knee, remat 0.35, saved 67% of full block checkpointing's memory under
inductor (0.25: 82%), and deciding took 20% longer."""


NOT_A_PLAN = "not a plan"
"""How the note of a candidate whose checkpointed blocks dynamo runs eagerly begins: no budget or
batch size makes that checkpoint set a plan (the blocks stay eager whatever the shapes)."""

OUT_OF_TIME = "not forecast: the search's time limit ran out"
"""The note of a candidate the search left unforecast because its ``time_limit`` had passed."""


class PlanDoesNotFit(RuntimeError):
    """No candidate plan's forecast fits ``max_memory``; ``plan`` is the one with the smallest
    forecast, for callers that train anyway."""

    def __init__(self, message: str, plan: MemPlan) -> None:
        super().__init__(message)
        self.plan = plan
        #: The search's kept forecasts (see :class:`SearchResult`), when it kept them.
        self.forecasts: tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The plan chosen and the time the search took."""

    plan: MemPlan
    seconds: float
    """Wall seconds spent forecasting candidates."""
    forecasts: tuple[Any, ...] = ()
    """With ``search(keep_forecasts=True)``: each candidate's forecast, aligned with
    ``plan.candidates`` (``None`` where it failed), without its compiled parts; for :func:`rejudge`."""


def forecast_flops(fc: Forecast) -> float:
    """FLOPs of one step's compiled forward and backward graphs (recomputation included): each
    region's graphs times the calls the step makes of it (one graph serves every block when dynamo
    compiles a block's frame once, as after a graph break in a loop or for each FSDP2 unit); NaN
    when no graph was captured."""
    from lightning_memplan.forecasting.fx import node_flops

    calls = {r.index: r.calls for r in fc.regions}  # a region whose forecast failed: once
    total, seen = 0, False
    for region in fc._backend.regions:
        for gm in (region.fw_graph, region.bw_graph):
            if gm is None:
                continue
            seen = True
            flops = sum(node_flops(n) for n in gm.graph.nodes if n.op == "call_function")
            total += calls.get(region.index, 1) * flops
    return float(total) if seen else math.nan


def _forecast_memory(fc: Forecast) -> tuple[int, int | None]:
    """``forecast()``'s own step: (baseline bytes, predicted peak above it; ``None`` when the
    forecast failed)."""
    return fc.baseline_bytes, fc.peak_bytes


def _note(fc: Forecast) -> str:
    parts = []
    for r in fc.regions:
        if r.decision is not None:
            parts.append("solver called" if r.decision.solver_called else f"solver not called ({r.decision.reason})")
    if fc.problems:
        parts.append("; ".join(fc.problems))
    return "; ".join(parts)


def search(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    checkpoint_sets: Sequence[tuple[str, ...]] = ((),),
    solver: str | Callable[..., Any] = "dp",
    backend: str = "aot_eager",
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    max_memory: int | None = None,
    on_candidate: Callable[[Candidate], None] | None = None,
    remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
    step_memory: Callable[[Any], tuple[int, int | None]] | None = None,
    keep_forecasts: bool = False,
    regional: Sequence[str] = (),
    time_limit: float | None = None,
    limit_name: str = "max_memory",
    target: str | None = None,
) -> SearchResult:
    """Forecast every (checkpoint set, budget) plan and choose one (see the module docstring).

    ``backend`` is the one candidates are compiled with (``"aot_eager"`` avoids code generation);
    the chosen plan's final forecast is the caller's to make on the real backend.
    ``remat_budgets`` adds whole-graph rematerialization plans (solver ``"remat"``) to the
    candidates, forecast from the same trace on ``"aot_eager"`` (``()``: none). With
    ``solver="remat"`` the candidates are remat plans at ``budgets`` only.
    ``step_memory(forecast) -> (baseline bytes, peak bytes above it)``: the memory a candidate is
    judged by, for a training loop whose step differs from ``forecast()``'s (Lightning keeps the
    previous gradients through the forward); default ``(forecast.baseline_bytes, forecast.peak_bytes)``.
    ``keep_forecasts``: keep every candidate's forecast (plain data, see :class:`SearchResult`) so
    the candidates can be judged again without compiling (:func:`rejudge`).
    ``regional``: submodules compiled on their own in every candidate (see
    :func:`~lightning_memplan.forecast`): the partitions, one per distinct block graph, do not grow
    with the number of blocks; a checkpoint set of them is emulated on the same trace, each block
    graph also partitioned with its forward checkpointed
    (:func:`~lightning_memplan.forecasting.grid.forecast_grid`); a set the emulation cannot forecast,
    or one that mixes them with other blocks, is traced with its blocks really wrapped.
    ``time_limit``: seconds (wall clock, from the call) after which no new trace or compile starts
    once one candidate has a forecast; the candidates not forecast by then get the note
    :data:`OUT_OF_TIME` and the plan is chosen among the others (``None``: no limit). A trace
    running when the time passes finishes, and the plans it partitioned count.
    ``limit_name``: what ``max_memory`` is, in the plan's reason and the error (see :func:`choose`).
    ``target``: forecast every candidate without running, for that device (see :func:`~lightning_memplan.forecast`).

    Raises:
        PlanDoesNotFit: ``max_memory`` given and no forecast fits it (its ``forecasts`` attribute
            holds the kept forecasts).
        RuntimeError: every candidate's forecast failed (the message has the first cause).
    """
    from lightning_memplan.forecasting.grid import forecast_grid, forecast_sweep
    from lightning_memplan.forecasting.step_forecast import forecast

    t0 = time.perf_counter()
    deadline = math.inf if time_limit is None else t0 + time_limit

    def out_of_time() -> bool:  # never before one candidate has a forecast: a search always plans
        return time.perf_counter() > deadline and any(c.peak_bytes is not None for c in candidates)

    def add(cand: Candidate, fc: Forecast | None) -> None:
        candidates.append(cand)
        kept.append(_keep(fc) if keep_forecasts else None)
        if on_candidate is not None:
            on_candidate(cand)

    judge = step_memory if step_memory is not None else _forecast_memory
    candidates: list[Candidate] = []
    kept: list[Any] = []  # aligned with candidates when keep_forecasts
    baseline: int | None = None
    sets = [tuple(ck) for ck in checkpoint_sets]
    remat_only = solver == "remat"
    if remat_only:  # remat plans at the given budgets; the knapsack grid is only the frugal run
        remat_budgets, budgets = tuple(budgets), (1.0,)
        sets = [max(sets, key=len)] if sets else []
    remat_budgets = tuple(remat_budgets)
    # aot_eager: ONE trace of the unchanged model; its joint graph is partitioned under every budget
    # and every checkpoint set (emulated by recompute tags, as torch.utils.checkpoint sets them)
    grid: dict[Any, Any] = {}
    sweepable = backend in ("aot_eager", "aot_eager_decomp_partition") and bool(budgets)
    regional = tuple(regional)
    # the grid emulates a set of blocks of the whole graph, or of blocks compiled on their own: not both
    emulable = [ck for ck in sets if not set(ck) & set(regional) or set(ck) <= set(regional)]
    whole_graph = [ck for ck in emulable if not set(ck) & set(regional)] or [()]
    if sweepable and emulable:
        # its one real forward and backward runs the most checkpointed plan of the whole graph
        # (regional: the least budget): the search must not run out of memory where the unplanned
        # model would
        frugal = (max(whole_graph, key=len), float(min(budgets) if regional else budgets[0]))
        emulable = list(dict.fromkeys([*emulable, frugal[0]]))
        try:
            # a plan the grid could not forecast (status not "ok": e.g. blocks whose nodes no region
            # names, as when dynamo compiles each FSDP2 block on its own) is forecast again below,
            # one trace with the blocks really wrapped: its warning would only repeat that
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="lightning_memplan.forecast: ", category=RuntimeWarning)
                grid = forecast_grid(model, tuple(example_inputs), budgets=tuple(budgets), checkpoint_sets=emulable,
                                     solver="dp" if remat_only else solver, loss_fn=loss_fn, optimizer=optimizer,
                                     run=frugal, remat_budgets=remat_budgets, regional=regional, target=target)
        except Exception:  # noqa: BLE001 - fall back to one trace per checkpoint set
            grid = {}
    eager_blocks: set[str] = set()  # blocks dynamo runs eagerly when checkpointed: no set with one is a plan
    for ck in (() if remat_only else sets):
        eager_ones = tuple(name for name in ck if name in eager_blocks)
        if eager_ones:  # a block's graph is its own whatever else is wrapped: nothing to trace
            for b in budgets:
                add(Candidate(budget=b, checkpoint=tuple(ck), note=(
                    f"{NOT_A_PLAN}: dynamo runs {', '.join(eager_ones)} eagerly under checkpointing")), None)
            continue
        with checkpointed(model, ck):
            swept: dict[float, Any] = {b: grid[(ck, b)] for b in budgets
                                       if (ck, b) in grid and grid[(ck, b)].status == "ok"}
            if sweepable and len(swept) < len(budgets) and not out_of_time():
                try:  # the emulation failed for this set: one trace with the blocks really wrapped
                    swept = forecast_sweep(model, tuple(example_inputs), budgets=tuple(budgets), solver=solver,
                                           loss_fn=loss_fn, optimizer=optimizer, regional=regional, target=target)
                except Exception:  # noqa: BLE001 - fall back to one forecast per budget
                    swept = {}
            # the blocks dynamo ran eagerly under the real wrappers: of the trace, whatever the budget
            # (a plan partitioned beside the one run knows no compiled parameters of its own)
            known = next((f.compiled_parameter_ids for f in swept.values() if f.compiled_parameter_ids), None)
            eager = uncompiled_blocks(model, ck, known)
            eager_blocks.update(eager)
            for b in budgets:
                fc = swept.get(float(b)) if swept else None
                if fc is None and out_of_time():
                    add(Candidate(budget=b, checkpoint=tuple(ck), note=OUT_OF_TIME), None)
                    continue
                try:
                    if fc is None:  # a forecast of its own: it knows its compiled parameters
                        fc = forecast(model, tuple(example_inputs), budget=b, solver=solver, backend=backend,
                                      loss_fn=loss_fn, optimizer=optimizer, regional=regional, target=target)
                        eager = eager or uncompiled_blocks(model, ck, fc.compiled_parameter_ids)
                        eager_blocks.update(eager)
                    base, peak = judge(fc)
                    baseline = base if baseline is None else baseline
                    if eager:  # traced really wrapped: those blocks ran eagerly, so the peak misses them
                        cand, fc = Candidate(budget=b, checkpoint=tuple(ck), note=(
                            f"{NOT_A_PLAN}: dynamo runs {', '.join(eager)} eagerly under checkpointing")), None
                    else:
                        cand = Candidate(budget=b, checkpoint=tuple(ck), peak_bytes=peak,
                                         cost=forecast_flops(fc), note=_note(fc), reserve_bytes=reserve_bytes(fc))
                except Exception as exc:  # noqa: BLE001 - one failed candidate must not end the search
                    cand, fc = Candidate(budget=b, checkpoint=tuple(ck), note=f"forecast failed: {exc!r}"), None
                add(cand, fc)
                if b < 1.0 and cand.note and all(
                    part.startswith("solver not called (nothing_recomputable)")
                    for part in cand.note.split("; ")
                ):
                    break  # everything is checkpointed already: lower budgets change nothing
    for b in remat_budgets:
        fc = grid.get(("remat", b))
        if (fc is None or fc.status != "ok") and out_of_time():
            add(Candidate(budget=b, note=OUT_OF_TIME, solver="remat"), None)
            continue
        try:
            if fc is None or fc.status != "ok":
                fc = forecast(model, tuple(example_inputs), budget=b, solver="remat", backend=backend,
                              loss_fn=loss_fn, optimizer=optimizer, regional=regional, target=target)
            base, peak = judge(fc)
            cand = Candidate(budget=b, peak_bytes=peak, cost=forecast_flops(fc), note=_note(fc), solver="remat",
                             reserve_bytes=reserve_bytes(fc))
            baseline = base if baseline is None else baseline
        except Exception as exc:  # noqa: BLE001 - one failed candidate must not end the search
            cand, fc = Candidate(budget=b, note=f"forecast failed: {exc!r}", solver="remat"), None
        add(cand, fc)
    forecasts = tuple(kept) if keep_forecasts else ()
    try:
        plan = choose(candidates, baseline_bytes=baseline or 0, max_memory=max_memory, solver=_solver_name(solver),
                      limit_name=limit_name)
    except PlanDoesNotFit as exc:
        exc.forecasts = forecasts
        raise
    return SearchResult(plan=plan, seconds=time.perf_counter() - t0, forecasts=forecasts)


def _solver_name(solver: str | Callable[..., Any]) -> str:
    return solver if isinstance(solver, str) else f"custom:{getattr(solver, '__qualname__', 'solver')}"


def _keep(fc: Forecast | None) -> Forecast | None:
    """A candidate's forecast as :class:`SearchResult` keeps it (``None`` when it failed)."""
    return fc._detached() if fc is not None and fc.peak_bytes is not None else None


def rejudge(
    plan: MemPlan,
    forecasts: Sequence[Any],
    step_memory: Callable[[Any], tuple[int, int | None]],
    *,
    max_memory: int | None,
    solver: str | Callable[..., Any],
    limit_name: str = "max_memory",
) -> MemPlan:
    """``plan``'s candidates judged again by ``step_memory`` (e.g. a step that calls the model
    several times: ``Forecast.repeated``) and chosen again as :func:`search` chooses; nothing is
    compiled. ``forecasts`` are the search's kept forecasts, aligned with ``plan.candidates``; a
    candidate without one keeps no peak (it is not chosen). Costs (FLOPs) stand. ``solver``: the
    search's knapsack solver (the plan's own may be ``"remat"``).

    Raises:
        ValueError: ``forecasts`` does not match ``plan.candidates``.
        PlanDoesNotFit: ``max_memory`` given and no candidate fits it now.
    """
    if len(forecasts) != len(plan.candidates) or not forecasts:
        raise ValueError(f"rejudge: {len(forecasts)} forecasts for {len(plan.candidates)} candidates; "
                         "search with keep_forecasts=True to keep them")
    candidates: list[Candidate] = []
    baseline: int | None = None
    for cand, fc in zip(plan.candidates, forecasts):
        peak = None
        if fc is not None:
            base, peak = step_memory(fc)
            baseline = base if baseline is None else baseline
        candidates.append(dataclasses.replace(cand, peak_bytes=peak))
    return choose(candidates, baseline_bytes=baseline or 0, max_memory=max_memory, solver=_solver_name(solver),
                  limit_name=limit_name)


def replan_candidate(plan: MemPlan, measured: int, max_memory: int) -> tuple[Candidate | None, int, bool]:
    """The plan to switch to once, when ``plan``'s measured peak exceeds ``max_memory``.

    ``measured``: the measured peak of a step, bytes above ``plan.baseline_bytes``. What the forecast
    did not see, ``unseen = max(0, measured - plan.predicted_peak_bytes)``, is taken to be the same
    for every plan: it is eager code outside the compiled forward (the loss ``training_step``
    computes on the outputs, metrics) and memory no plan changes, so a candidate is judged at
    ``baseline + peak + unseen``. (Scaling the peaks by ``measured / predicted`` instead would
    under-count that part for every plan smaller than the current one, the ones a re-plan picks.)

    Returns ``(candidate, unseen, fits)``: the cheapest other candidate that fits (ties: the smaller
    peak); when none does (``fits=False``), the candidate with the smallest forecast below the current
    plan's, else the current plan at half its budget, unless that plan was forecast already and not
    below the current one: then ``None`` (no re-plan; a re-plan never installs a plan forecast above
    the one it replaces).
    """
    if plan.baseline_bytes is None:
        raise ValueError("replan_candidate: the plan has no baseline_bytes")
    unseen = max(0, measured - (plan.predicted_peak_bytes if plan.predicted_peak_bytes is not None else measured))
    current = (plan.budget, plan.checkpoint, plan.solver)
    fits = [c for c in plan.candidates if c.peak_bytes is not None and c.cost is not None
            and plan.baseline_bytes + c.peak_bytes + unseen <= max_memory
            and (c.budget, c.checkpoint, c.solver or plan.solver) != current]
    if not fits:
        now = (plan.candidates[plan.chosen].peak_bytes if plan.chosen is not None and plan.chosen < len(plan.candidates)
               else plan.predicted_peak_bytes)
        known = [c for c in plan.candidates if c.peak_bytes is not None and c.cost is not None
                 and (c.budget, c.checkpoint, c.solver or plan.solver) != current]
        below = [c for c in known if now is not None and c.peak_bytes is not None and c.peak_bytes < now]
        if below:
            return min(below, key=lambda c: (c.peak_bytes or 0, c.cost if c.cost is not None else math.inf)), \
                unseen, False
        half = Candidate(budget=max(0.0, round(plan.budget / 2, 3)), checkpoint=plan.checkpoint,
                         solver="remat" if plan.solver == "remat" else "")
        same = [c for c in known if (c.budget, c.checkpoint, c.solver) == (half.budget, half.checkpoint, half.solver)]
        if same and now is not None and (same[0].peak_bytes or 0) >= now:
            return None, unseen, False
        return half, unseen, False
    return min(fits, key=lambda c: (c.cost if c.cost is not None else math.inf, c.peak_bytes or 0)), unseen, True


def choose(
    candidates: Sequence[Candidate],
    *,
    baseline_bytes: int,
    max_memory: int | None,
    solver: str,
    limit_name: str = "max_memory",
) -> MemPlan:
    """Pick the knee, or the cheapest plan within ``max_memory`` (:func:`held_bytes`: the baseline,
    the peak, and the allocator's reserve where known). ``limit_name``: what the limit is, in the
    reason and the error (``"max_memory"``, or ``"the device's memory"`` when it was read from it)."""
    ok = [i for i, c in enumerate(candidates) if c.peak_bytes is not None and c.cost is not None
          and not math.isnan(c.cost)]
    if not ok:
        first = next((c.note for c in candidates if c.note), "no candidates")
        raise RuntimeError(f"every candidate plan's forecast failed; first cause: {first}")
    points = [PlanPoint(label=candidates[i].label, peak_bytes=int(candidates[i].peak_bytes or 0),
                        cost=float(candidates[i].cost or 0.0)) for i in ok]
    front = [ok[k] for k in pareto_indices(points, cost_rel_tol=COST_TIE)]
    worth = _worth_their_compute(candidates, front, baseline_bytes)
    knee = _knee(candidates, worth)
    if max_memory is not None:
        fitting = [i for i in ok if held_bytes(candidates[i], baseline_bytes) <= max_memory]
        if not fitting:
            smallest = min(ok, key=lambda i: (held_bytes(candidates[i], baseline_bytes), i))
            c = candidates[smallest]
            raise PlanDoesNotFit(
                f"no plan fits {_limit(limit_name, max_memory, '=')}: the smallest forecast is "
                f"{format_bytes(held_bytes(c, baseline_bytes))} ({c.label}; "
                f"{format_bytes(baseline_bytes)} of it is parameters, optimizer state and batch). "
                + ("Raise max_memory to at least that, reduce" if limit_name == "max_memory" else "Reduce")
                + " the batch, or allow checkpointing more blocks.",
                _plan(candidates, smallest, knee, baseline_bytes, solver,
                      f"smallest forecast; nothing fits {_limit(limit_name, max_memory)}"),
            )
        chosen = min(fitting, key=lambda i: (float(candidates[i].cost or 0.0), int(candidates[i].peak_bytes or 0), i))
        reason = f"cheapest plan within {_limit(limit_name, max_memory)}"
    elif len(worth) == 1 and len(front) > 1:
        chosen = knee
        reason = (f"no plan saves {MIN_SAVING:.0%} of the step's memory for its extra compute: the fastest plan "
                  "(knee of the plans that buy something)")
    else:
        chosen = knee
        reason = "knee of the forecast Pareto front (peak vs FLOPs)"
    return _plan(candidates, chosen, knee, baseline_bytes, solver, reason)


def _limit(name: str, nbytes: int, sep: str = " ") -> str:
    """The limit in words: ``max_memory 6.00 MiB`` (``sep``: ``"="`` for an argument), or the named one."""
    return f"max_memory{sep}{format_bytes(nbytes)}" if name == "max_memory" else f"{format_bytes(nbytes)} ({name})"


def held_bytes(candidate: Candidate, baseline_bytes: int) -> int:
    """What ``candidate``'s step holds against a memory limit (bytes): the baseline, its forecast peak
    above it, and on CUDA the caching allocator's segments beyond the allocated blocks
    (``reserve_bytes``), since reserved memory is what runs out."""
    return baseline_bytes + int(candidate.peak_bytes or 0) + int(candidate.reserve_bytes or 0)


def reserve_bytes(fc: Forecast) -> int | None:
    """Bytes ``fc``'s caching-allocator model reserves beyond its allocated high-water mark (``None``
    when the model did not run: not CUDA)."""
    allocator = fc.cuda_allocator
    if allocator is None:
        return None
    return max(int(allocator.reserved_peak_bytes) - int(allocator.allocated_max_bytes), 0)


def _worth_their_compute(candidates: Sequence[Candidate], front: list[int], baseline_bytes: int) -> list[int]:
    """The plans of ``front`` (sorted by cost) the knee may take: the fastest, and every other whose
    forecast total (``baseline_bytes + peak``) is at least :data:`MIN_SAVING` of the fastest one's
    below it. A plan that saves less buys nothing worth its recomputation."""
    fastest = min(front, key=lambda i: (float(candidates[i].cost or 0.0), int(candidates[i].peak_bytes or 0), i))
    top = baseline_bytes + int(candidates[fastest].peak_bytes or 0)
    return [i for i in front
            if i == fastest or baseline_bytes + int(candidates[i].peak_bytes or 0) <= (1.0 - MIN_SAVING) * top]


def _plan(candidates: Sequence[Candidate], chosen: int, knee: int, baseline_bytes: int, solver: str,
          reason: str) -> MemPlan:
    c = candidates[chosen]
    return MemPlan(
        budget=c.budget, solver=c.solver or solver, checkpoint=c.checkpoint, predicted_peak_bytes=c.peak_bytes,
        baseline_bytes=baseline_bytes, reason=reason, knee=knee, chosen=chosen,
        candidates=tuple(candidates), notes=(c.note,) if c.note else (),
    )


def _knee(candidates: Sequence[Candidate], front: list[int]) -> int:
    """The knee (:func:`~lightning_memplan.core.front.knee`) of the candidates on ``front``, by peak and cost."""
    index, _ = knee([float(candidates[i].peak_bytes or 0) for i in front],
                    [float(candidates[i].cost or 0.0) for i in front])
    return front[index]
