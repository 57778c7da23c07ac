"""What the callback reports: each epoch's metrics for the loggers, the plan table and epoch line
(rank zero), and the Pareto-front and memory-timeline pictures (PNG files, and the figures handed
to the loggers that keep pictures). Memory in bytes throughout.

Metric keys (``memplan/*``) are documented on :class:`~lightning_memplan.MemPlanCallback`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from tabulate import tabulate

from lightning_memplan.forecasting.capture import REASON_WORDS
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.step_model import TrainingLoop, lightning_step_timeline
from lightning_memplan.text import listed
from lightning_memplan.units import format_bytes

__all__ = ["emit_figure", "epoch_line", "epoch_metrics", "plan_table", "plot_frontier", "plot_timeline"]

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
    """The plan in force as a two-column text table (``timings``: seconds, keys
    ``decide_seconds`` and ``install_seconds``; ``planned``: which module is planned and why)."""
    rows = [["planned module", planned]] if planned else []
    rows += [
        ["budget", f"{plan.budget:g}"], ["solver", plan.solver], ["backend", plan.backend],
        ["checkpointed blocks", ", ".join(plan.checkpoint) or "none"],
        ["compiled on their own (regional)", listed(plan.regional, 4) if plan.regional else "none: one compile"],
        ["forecast peak (above baseline)", format_bytes(plan.predicted_peak_bytes)],
        ["baseline (params, optimizer, batch)", format_bytes(plan.baseline_bytes)],
        ["chosen by", plan.reason],
    ]
    why = plan.trade_off()
    if why is not None:
        rows.append(["the trade-off", why])
    if plan.knee is not None:
        rows.append(["knee (best balance of memory and compute on the front)", plan.candidates[plan.knee].label])
    rows += [["partitioner", line] for line in _partitioner_lines(plan.notes)]
    if plan.candidates:
        rows.append(["candidates forecast", str(len(plan.candidates))])
    d, i = timings.get("decide_seconds"), timings.get("install_seconds")
    if d is not None and i is not None:
        rows.append(["plan search / final forecast+compile",
                     f"{d:.1f} s / {i:.1f} s (the search took {d / max(i, 1e-9):.1f}x one compile)"])
    return "MemPlan\n" + tabulate(rows, tablefmt="simple")


def _partitioner_lines(notes: tuple[str, ...]) -> list[str]:
    """The plan's per-region notes (``"region 3: solver not called (budget_1)"``) in words, one
    line per distinct outcome with the regions it holds for (``"regions 0, 3, 4: solver not called
    (budget 1: ...)"``); a note of another form is kept as it is."""
    grouped: dict[str, list[str]] = {}
    for note in notes:
        head, sep, text = note.partition(": ")
        region = head.removeprefix("region ") if sep and head.startswith("region ") else None
        for code, words in REASON_WORDS.items():
            text = text.replace(f"({code})", f"({words})")
        if region is None or not region.isdigit():
            grouped.setdefault(note, [])
        else:
            grouped.setdefault(text, []).append(region)
    return [f"{'region' if len(r) == 1 else f'{len(r)} regions'} {', '.join(r)}: {text}" if r else text
            for text, r in grouped.items()]


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
