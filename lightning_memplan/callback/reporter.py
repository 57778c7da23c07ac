"""What the callback reports: each epoch's metrics for the loggers, the plan table, the table of
candidate plans and the epoch line (rank zero, in 100 columns), and the Pareto-front and
memory-timeline pictures (PNG files, and the figures handed to the loggers that keep pictures).
Memory in bytes throughout.

Metric keys (``memplan/*``) are documented on :class:`~lightning_memplan.MemPlanCallback`.
"""
from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.search import held_bytes
from lightning_memplan.planner.step_model import TrainingLoop, lightning_step_timeline
from lightning_memplan.text import COLUMNS, fill, listed
from lightning_memplan.units import format_bytes

__all__ = ["OUTCOME_LEGEND", "candidates_table", "caveats", "emit_figure", "epoch_line", "epoch_metrics", "plan_table",
           "plot_frontier", "plot_timeline", "regions_phrase"]

#: Forecast breakdown keys logged as ``memplan/<key>_bytes`` when the plan has them.
_BREAKDOWN = ("activations", "parameters", "gradients", "optimizer_state", "fsdp_buffers")


def epoch_metrics(plan: MemPlan | None, predicted: int | None, complete: bool,
                  measured: int | None) -> dict[str, float]:
    """The ``memplan/*`` metrics of an epoch: the plan's (budget, blocks, baseline, breakdown),
    ``predicted`` and ``measured`` (bytes above the baseline; ``None``: unknown, not logged) and
    their signed relative error, logged only when every measured batch had a forecast
    (``complete``) and something was measured."""
    metrics: dict[str, float] = {}
    if plan is not None:
        metrics["memplan/budget"] = plan.budget
        metrics["memplan/checkpointed_blocks"] = float(len(plan.checkpoint))
        if predicted is not None:
            metrics["memplan/predicted_peak_bytes"] = float(predicted)
        if plan.baseline_bytes is not None:
            metrics["memplan/baseline_bytes"] = float(plan.baseline_bytes)
        for key in _BREAKDOWN:
            if key in plan.breakdown:
                metrics[f"memplan/{key}_bytes"] = float(plan.breakdown[key])
    if measured is not None:
        metrics["memplan/measured_peak_bytes"] = float(measured)
        if predicted is not None and complete and measured > 0:
            metrics["memplan/prediction_error"] = (predicted - measured) / measured
    return metrics


def plan_table(plan: MemPlan, timings: dict[str, float], planned: str | None = None) -> str:
    """The plan in force as a two-column text table that fits :data:`~lightning_memplan.text.COLUMNS`
    (``timings``: seconds, keys ``decide_seconds`` and ``install_seconds``; ``planned``: which
    module is planned and why). The partitioner's outcome per compiled region is one phrase
    (:func:`regions_phrase`); the forecast's notes are shown only where they change the answer, in
    words (:func:`caveats`); ``plan.notes`` and ``plan.candidates`` keep them all."""
    rows = [("planned module", planned)] if planned else []
    rows += [
        ("plan", f"budget {plan.budget:g}, solver {plan.solver}, backend {plan.backend}"),
        ("checkpointed", ", ".join(plan.checkpoint) or "none"),
        ("compiled regionally", listed(plan.regional, 4) if plan.regional else "none: one compile"),
        ("forecast peak", f"{format_bytes(plan.predicted_peak_bytes)} above the baseline"),
        ("baseline", f"{format_bytes(plan.baseline_bytes)} (params, optimizer, batch)"),
        ("chosen by", plan.reason),
    ]
    why = plan.trade_off()
    if why is not None:
        rows.append(("the trade-off", why))
    if plan.knee is not None:
        rows.append(("knee", f"{plan.candidates[plan.knee].label} (the best balance of memory and compute)"))
    outcomes, others = _outcomes(plan.notes)
    if outcomes:
        rows.append(("partitioner", regions_phrase(outcomes, plan.solver)))
    rows += [("caveat", words) for words in caveats(others)]
    d, i = timings.get("decide_seconds"), timings.get("install_seconds")
    if plan.candidates:
        rows.append(("search", f"{len(plan.candidates)} candidate plans forecast"
                     + (f" in {d:.1f} s" if d is not None else "")))
    if d is not None and i is not None:
        rows.append(("final compile", f"{i:.1f} s, forecast included (the search took {d / max(i, 1e-9):.1f}x "
                     "one compile)"))
    label = max(len(k) for k, _ in rows)
    lines = [fill(f"  {k:<{label}}  {v}", indent=" " * (label + 2)) for k, v in rows]
    return "MemPlan\n" + "\n".join(lines)


#: Each partitioner outcome (:data:`~lightning_memplan.forecasting.capture.DecisionReason`) in a
#: word or two, as the tables say it.
_OUTCOME_WORDS: dict[str, str] = {
    "budget_0": "inputs only", "budget_1": "default", "min_cut_below_inputs": "default",
    "more_aggressive_fits": "cheap ops", "aggressive_fits": "cheap ops", "nothing_recomputable": "nothing to recompute",
    "solved": "solved", "remat": "remat", "unknown": "not partitioned",
}

#: What each of those words means, for a legend under a table.
OUTCOME_LEGEND: dict[str, str] = {
    "default": "torch's fastest choice of what to save, as without a plan",
    "solved": "the knapsack solver chose what to save within the budget",
    "remat": "whole-graph rematerialization chose what to save within the budget",
    "cheap ops": "recomputing cheap ops already fits the budget",
    "inputs only": "only the forward's inputs are saved, the rest is recomputed",
    "nothing to recompute": "nothing in the graph can be recomputed",
    "not partitioned": "no backward was seen for the graph (e.g. it needs no gradients): the budget does not "
                       "apply to it",
}


def _outcomes(notes: Sequence[str]) -> tuple[list[str], list[str]]:
    """The partitioner outcomes in ``notes`` (a plan's ``"region 3: solver not called (budget_1)"``,
    or a candidate's ``"solver called; solver not called (budget_1); <forecast note>"``), one
    :data:`DecisionReason` code per compiled region, and the notes' other parts (the forecast's notes)."""
    codes: list[str] = []
    others: list[str] = []
    for note in notes:
        for part in note.split("; "):
            head, sep, rest = part.partition(": ")
            text = rest if sep and head.startswith("region ") and head[7:].isdigit() else part
            if text == "solver called":
                codes.append("solved")
            elif text.startswith("solver not called (") and text.endswith(")"):
                codes.append(text[len("solver not called ("):-1])
            elif part:
                others.append(part)
    return codes, others


def _outcome_counts(codes: Sequence[str], solver: str) -> Counter[str]:
    """How many regions had each outcome, in :data:`_OUTCOME_WORDS`' words, most first."""
    counts = Counter(_OUTCOME_WORDS.get(c, c) for c in codes)
    if solver == "remat" and "solved" in counts:
        counts["remat"] += counts.pop("solved")
    return Counter(dict(counts.most_common()))


def regions_phrase(codes: Sequence[str], solver: str = "") -> str:
    """The partitioner's outcome in each compiled region (``codes``: one
    :data:`~lightning_memplan.forecasting.capture.DecisionReason` a region) as one phrase:
    ``"6 regions: default"``, ``"7 regions: 6 solved, 1 not partitioned"``. ``solver="remat"``:
    the solver called was whole-graph rematerialization (``"remat"`` rather than ``"solved"``)."""
    counts = _outcome_counts(codes, solver)
    head = f"{len(codes)} region{'s' if len(codes) != 1 else ''}"
    if len(counts) == 1:
        return f"{head}: {next(iter(counts))}"
    return f"{head}: " + ", ".join(f"{k} {words}" for words, k in counts.items())


#: The forecast's notes that change what it says (a substring of the note, and what it means for the
#: reader); any other note is kept on the plan, not shown.
_CAVEATS: tuple[tuple[str, str], ...] = (
    ("allocator model", "the peak counts the bytes the step asks for, not the CUDA caching allocator's "
                        "rounded blocks: the memory it reserves can be higher"),
    ("forecast failed", "a compiled region could not be forecast: the peak leaves it out"),
    ("buffers are not forecast", "FSDP's all-gather buffers are not in the peak"),
    ("counted as 0", "some kernels' workspaces are not known and are counted as 0 in the peak"),
)


def caveats(notes: Sequence[str]) -> list[str]:
    """What the forecast's ``notes`` change about its answer, in words, each once (see
    :data:`_CAVEATS`); the rest of them (how the forecast was made) say nothing."""
    found = {words: None for note in notes for key, words in _CAVEATS if key in note}
    return list(found)


def candidates_table(plan: MemPlan, *, limit_bytes: int | None = None) -> str:
    """The plans the search forecast, one row each, in at most :data:`~lightning_memplan.text.COLUMNS`
    columns: the plan's label, its forecast peak above the baseline, whether it fits ``limit_bytes``
    (a total in bytes: the baseline, the peak and the allocator's reserve; the column only with a
    limit), its estimated compute against no plan (budget 1, nothing checkpointed; GFLOPs when the
    search has no such plan), what it recomputes (the checkpointed blocks, then :func:`regions_phrase`),
    and the choice and the knee marked. A legend of the words used, and the forecasts' caveats
    (:func:`caveats`), follow the table."""
    base = next((c for c in plan.candidates if c.budget == 1.0 and not c.checkpoint and not c.solver and c.cost), None)
    rows, shown, noted = [], set(), {}
    for i, c in enumerate(plan.candidates):
        codes, others = _outcomes([c.note])
        if c.peak_bytes is None:
            what = "forecast failed (see plan.candidates)" if c.note.startswith("forecast failed") else c.note
        else:
            regions = regions_phrase(codes, c.solver) if codes else ""
            shown |= set(_outcome_counts(codes, c.solver))
            blocks = c.checkpoint[0] if len(c.checkpoint) == 1 else f"{len(c.checkpoint)} blocks"
            what = "; ".join(([blocks] if c.checkpoint else []) + ([regions] if regions else []))
            for words in caveats(others):
                noted.setdefault(words, []).append(c.label)
        if c.cost is None or c.peak_bytes is None:
            compute = "-"
        elif base is not None and base.cost:
            compute = f"{100 * (c.cost / base.cost - 1):+.0f}%"
        else:
            compute = f"{c.cost / 1e9:.2f} GFLOPs"
        fits = ([] if limit_bytes is None else ["-" if c.peak_bytes is None else
                "yes" if held_bytes(c, plan.baseline_bytes or 0) <= limit_bytes else "no"])
        mark = ", ".join(m for m, j in (("chosen", plan.chosen), ("knee", plan.knee)) if j == i)
        rows.append([c.label, format_bytes(c.peak_bytes), *fits, compute, what, mark])
    headers = ["plan", "peak", *([] if limit_bytes is None else ["fits"]), "compute", "recomputed", "choice"]
    table = _columns(headers, rows, wrap=headers.index("recomputed"))
    legend = [f"peak: forecast above the {format_bytes(plan.baseline_bytes)} baseline of parameters, "
              "gradients, optimizer state and batch"]
    if limit_bytes is not None:
        legend.append(f"fits: the baseline, the peak and on CUDA the allocator's reserve, within "
                      f"{format_bytes(limit_bytes)}")
    if base is not None:
        legend.append("compute: estimated FLOPs of forward + backward, against no plan (budget 1)")
    legend.append("recomputed: the checkpointed blocks (named, or counted) whole; then in each compiled region:")
    legend += [f"  {w}: {OUTCOME_LEGEND[w]}" for w in OUTCOME_LEGEND if w in shown]
    legend += [f"Caveat ({listed(labels, 3)}): {words}." for words, labels in noted.items()]
    return table + "\n" + "\n".join(fill(line) for line in legend)


def _columns(headers: Sequence[str], rows: Sequence[Sequence[str]], *, wrap: int) -> str:
    """``rows`` under ``headers`` as left-aligned columns two spaces apart, a dashed line under the
    headers, in at most :data:`~lightning_memplan.text.COLUMNS` characters: column ``wrap``'s
    texts are broken onto more lines where the table would be wider (not below 16 characters)."""
    widths = [max(len(x) for x in col) for col in zip(headers, *rows)]
    widths[wrap] = max(16, widths[wrap] - max(0, sum(widths) + 2 * (len(widths) - 1) - COLUMNS))

    def lines(cells: Sequence[str]) -> list[str]:
        kept = re.sub(r"(\d) ", "\\1\xa0", cells[wrap])  # a number stays with its word ("6 regions")
        parts = [p.replace("\xa0", " ") for p in textwrap.wrap(kept, widths[wrap], break_on_hyphens=False)] or [""]
        return ["  ".join((parts[k] if j == wrap else cells[j] if k == 0 else "").ljust(w)
                          for j, w in enumerate(widths)).rstrip() for k in range(len(parts))]

    return "\n".join([*lines(headers), "  ".join("-" * w for w in widths)] + [x for r in rows for x in lines(r)])


def epoch_line(epoch: int, metrics: dict[str, float], other_shapes: int = 0) -> str:
    """One line: the epoch's predicted and measured peak and the error; ``other_shapes``: how many
    input shapes other than the planned one its measured batches ran."""
    pred = metrics.get("memplan/predicted_peak_bytes")
    meas = metrics.get("memplan/measured_peak_bytes")
    err = metrics.get("memplan/prediction_error")
    shapes = (f" (measured batches of {other_shapes} other input shape(s) than the planned one: the largest "
              "of their forecasts)" if other_shapes else "")
    return (f"MemPlan epoch {epoch}: predicted {format_bytes(pred)}, measured {format_bytes(meas)}, "
            f"error {'-' if err is None else f'{100 * err:+.1f}%'}{shapes}")


def plot_dir(trainer: Trainer | None) -> Path:
    """``<first logger's log_dir>/memplan`` (else the Trainer's ``default_root_dir``).

    Not ``trainer.log_dir``: under DDP that property broadcasts, and plots are drawn on rank
    zero only, so the other ranks would never join the collective.
    """
    root: Any = None
    if trainer is not None and trainer.loggers:
        logger = trainer.loggers[0]
        root = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    if root is None and trainer is not None:
        root = trainer.default_root_dir
    return Path(root or ".") / "memplan"


@rank_zero_only
def plot_frontier(trainer: Trainer | None, plan: MemPlan | None, max_memory: int | None) -> None:
    """Draw the plan's candidates (forecast peak vs GFLOPs) with the knee, the choice and the
    ``max_memory`` line (bytes, less the baseline), and emit it as ``frontier``; nothing without
    candidates."""
    from lightning_memplan.core.front import PlanPoint
    from lightning_memplan.report import plot_frontier as draw

    if plan is None or not plan.candidates:
        return
    ok = [i for i, c in enumerate(plan.candidates) if c.peak_bytes is not None and c.cost is not None]
    points = [PlanPoint(label=plan.candidates[i].label, peak_bytes=int(plan.candidates[i].peak_bytes or 0),
                        cost=float(plan.candidates[i].cost or 0.0) / 1e9) for i in ok]
    index = {i: k for k, i in enumerate(ok)}
    fig = draw(points, knee=index.get(plan.knee) if plan.knee is not None else None,
               chosen=index.get(plan.chosen) if plan.chosen is not None else None,
               limit_bytes=None if max_memory is None or plan.baseline_bytes is None
               else max_memory - plan.baseline_bytes,
               cost_label="GFLOPs of the compiled forward + backward")
    emit_figure(trainer, fig, "frontier")


@rank_zero_only
def plot_timeline(trainer: Trainer | None, fc: Forecast | None, plan: MemPlan | None, loop: TrainingLoop,
                  measured: int) -> None:
    """Draw the forecast memory timeline of the Lightning step (``loop``) with the predicted and
    ``measured`` peaks (bytes above the baseline), and emit it as ``timeline``."""
    from lightning_memplan.report import plot_timeline as draw

    if fc is None or not fc.timeline or plan is None:
        return
    timeline = lightning_step_timeline(fc, plan.breakdown.get("gradients", 0), loop)
    n = loop.accumulate_grad_batches
    what = "one Lightning training step" if n == 1 else f"the optimizer's micro-batch (1 in {n})"
    fig = draw(timeline, predicted_peak=plan.predicted_peak_bytes, measured_peak=measured,
               title=f"Forecast memory timeline of {what}")
    emit_figure(trainer, fig, "timeline")


def emit_figure(trainer: Trainer | None, fig: Any, name: str) -> None:
    """Save ``fig`` as ``<plot dir>/<name>.png`` and hand it to the loggers that keep pictures:
    a TensorBoard figure, an MLflow run artifact (under ``memplan/``), a W&B image under the key
    ``memplan/<name>`` (at the Trainer's global step). Nothing under ``fast_dev_run``."""
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

    from lightning_memplan.report import save_figure

    if trainer is not None and trainer.fast_dev_run:
        return  # a debugging run: Lightning writes no logs or checkpoints then, nor do we
    loggers = list(trainer.loggers) if trainer is not None else []
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure(f"memplan/{name}", fig, global_step=trainer.global_step, close=False)
    path = save_figure(fig, plot_dir(trainer) / f"{name}.png")
    rank_zero_info(f"MemPlan: wrote {path}")
    for logger in loggers:
        if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
            logger.experiment.log_artifact(logger.run_id, str(path), artifact_path="memplan")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=f"memplan/{name}", images=[str(path)], step=trainer.global_step)
