"""Will it fit? Every plan of a training step, forecast for a device without allocating anything.

    table = estimate_plans(model, (input_ids, labels), target="H100", optimizer=opt, loss_fn=...)
    print(table.format())   # one row per plan: memory by category, reserved, fits?, extra compute
    table.best              # the fastest plan that fits, or None

The plans are the search's knapsack plans: each budget of ``budgets``, without checkpointing and
with every repeated block checkpointed (:func:`~lightning_memplan.planner.checkpointing.repeated_blocks`),
from one trace (:func:`~lightning_memplan.forecasting.grid.forecast_grid` with ``target=``). A plan
fits when what an out-of-memory error is about stays under the limit: on a CUDA target the
caching allocator's reserved bytes (its model, baseline included), elsewhere the allocated total
(baseline plus peak). The limit is ``max_memory``, else the named target's usable memory
(:attr:`~lightning_memplan.targets.Target.usable_bytes`); with neither, nothing is judged.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan.forecasting.grid import forecast_grid
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.planner.checkpointing import repeated_blocks
from lightning_memplan.planner.search import DEFAULT_BUDGETS, forecast_flops
from lightning_memplan.targets import Target, resolve_target
from lightning_memplan.units import format_bytes, parse_bytes

__all__ = ["EstimateRow", "EstimateTable", "LabelledStep", "estimate_plans"]


def _plan_words(budget: float, checkpointed: tuple[str, ...]) -> str:
    """``"budget 0.50"``, ``"budget 1.00 + 32 blocks ckpt"`` (checkpointed)."""
    ck = f" + {len(checkpointed)} blocks ckpt" if checkpointed else ""
    return f"budget {budget:.2f}{ck}"


class LabelledStep(nn.Module):
    """A model's training step as one module: ``model(**{main: x, "labels": labels}).loss`` (the
    model's own loss, as ``self.model(**batch).loss`` in a ``training_step``); without labels
    (``labelled=False``), the mean of its first output."""

    def __init__(self, model: nn.Module, main: str = "input_ids", *, labelled: bool = True) -> None:
        super().__init__()
        self.model, self.main, self.labelled = model, main, labelled

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.labelled:
            return self.model(**{self.main: x, "labels": labels}).loss
        return self.model(**{self.main: x})[0].float().mean()


@dataclass(frozen=True, kw_only=True)
class EstimateRow:
    """One plan's forecast (bytes; ``None`` where not known)."""

    #: Activation memory budget, a ratio in [0, 1].
    budget: float
    #: Qualified names of the blocks wrapped in activation checkpointing (empty: none).
    checkpointed: tuple[str, ...]
    parameters: int
    #: Gradients live at the step's peak.
    gradients: int
    optimizer_state: int
    #: Saved activations and intermediates live at the peak.
    activations: int
    #: The rest of the peak: optimizer temporaries (and FSDP buffers).
    other: int
    #: Baseline plus peak, in requested bytes.
    requested: int
    #: Baseline plus peak as the CUDA caching allocator hands it out (blocks); ``requested`` elsewhere.
    allocated: int
    #: The caching allocator's segments (CUDA targets); ``None`` elsewhere.
    reserved: int | None
    #: FLOPs of the step over the unplanned step's, minus 1 (0.1: 10% more compute); NaN if unknown.
    extra_compute: float
    #: ``None`` when no limit was given or the forecast failed.
    fits: bool | None
    #: The forecast's problems (unknown workspaces, failed regions).
    problems: tuple[str, ...] = ()

    @property
    def plan(self) -> str:
        """The plan in words (:func:`_plan_words`)."""
        return _plan_words(self.budget, self.checkpointed)

    @property
    def judged_bytes(self) -> int:
        """What is held against the limit: reserved where the allocator model ran, else allocated."""
        return self.reserved if self.reserved is not None else self.allocated


@dataclass(frozen=True, kw_only=True)
class EstimateTable:
    """Every plan's :class:`EstimateRow`, fastest first, and the limit they were judged against."""

    target: str
    #: Bytes a plan may use; ``None`` when no limit was known.
    limit: int | None
    #: Where the limit came from, in words.
    limit_source: str
    rows: tuple[EstimateRow, ...]
    #: Plans not in ``rows`` because their forecast failed or missed a region: ``"plan: why"``.
    skipped: tuple[str, ...] = ()
    #: Wall seconds of the whole estimate.
    seconds: float

    @property
    def best(self) -> EstimateRow | None:
        """The fastest plan that fits; ``None`` when none does or nothing was judged."""
        return next((r for r in self.rows if r.fits), None)

    def summary(self) -> str:
        """The answer in one sentence."""
        if self.limit is None:
            low = min(self.rows, key=lambda r: r.judged_bytes, default=None)
            return (f"No memory limit to judge against on {self.target!r} (give max_memory); the smallest plan "
                    f"is {low.plan}: {format_bytes(low.judged_bytes)}." if low else "No plan was forecast.")
        best = self.best
        if best is None:
            low = min(self.rows, key=lambda r: r.judged_bytes)
            return (f"No plan fits {self.target} ({format_bytes(self.limit)}, {self.limit_source}): the smallest, "
                    f"{low.plan}, needs {format_bytes(low.judged_bytes)}.")
        extra = "no recompute" if best.extra_compute <= 0 else f"+{best.extra_compute:.0%} estimated compute"
        return (f"The fastest plan that fits {self.target} ({format_bytes(self.limit)}, {self.limit_source}): "
                f"{best.plan}, {format_bytes(best.judged_bytes)} ({extra}).")

    def format(self) -> str:
        """The table as text (at most 100 columns), then :meth:`summary`."""
        total = "reserved" if any(r.reserved is not None for r in self.rows) else "total"
        head = (f"{'plan':<26}{'params':>12}{'grads':>12}{'optim':>12}{'activ':>12}{total:>12}"
                f"{'compute':>9} fits")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            extra = "?" if math.isnan(r.extra_compute) else f"+{r.extra_compute:.0%}"
            fits = {True: "yes", False: "no", None: "-"}[r.fits]
            cells = [r.parameters, r.gradients, r.optimizer_state, r.activations, r.judged_bytes]
            lines.append(f"{r.plan:<26}" + "".join(f" {format_bytes(c):>11}" for c in cells) + f"{extra:>9} {fits}")
        notes = sorted({p for r in self.rows for p in r.problems})
        return "\n".join([*lines, "", self.summary(), *(f"not forecast: {p}" for p in self.skipped),
                          *(f"note: {p}" for p in notes)])

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``: the target, limit, rows (with ``plan`` in words) and the answer."""
        rows = [{**asdict(r), "plan": r.plan,
                 "extra_compute": None if math.isnan(r.extra_compute) else r.extra_compute} for r in self.rows]
        best = self.best
        return {"target": self.target, "limit_bytes": self.limit, "limit_source": self.limit_source, "rows": rows,
                "skipped": list(self.skipped),
                "best": None if best is None else best.plan, "summary": self.summary(), "seconds": self.seconds}


def _row(fc: Forecast, budget: float, checkpointed: tuple[str, ...], base_flops: float,
         limit: int | None) -> EstimateRow | None:
    bd = fc.breakdown
    if fc.status != "ok" or fc.peak_bytes is None or bd is None:
        return None
    requested = fc.baseline_bytes + (fc.requested_peak_bytes or fc.peak_bytes)
    allocator = fc.cuda_allocator
    flops = forecast_flops(fc)
    extra = max(flops / base_flops - 1.0, 0.0) if base_flops > 0 and not math.isnan(flops) else math.nan
    row = EstimateRow(budget=budget, checkpointed=checkpointed, parameters=bd.parameters + bd.buffers,
                      gradients=bd.gradients, optimizer_state=bd.optimizer_state, activations=bd.activations,
                      other=bd.optimizer_temporaries + bd.fsdp_buffers, requested=requested,
                      allocated=allocator.allocated_max_bytes if allocator is not None else requested,
                      reserved=fc.reserved_bytes, extra_compute=extra, fits=None, problems=fc.problems)
    return row if limit is None else dataclasses.replace(row, fits=row.judged_bytes <= limit)


def _limit_source(tgt: Target, max_memory: object) -> str:
    if max_memory is not None:
        return "max_memory"
    if tgt.memory_bytes is None:
        return "none"
    if tgt.kind == "cuda":
        return f"{tgt.description} less {format_bytes(tgt.memory_bytes - (tgt.usable_bytes or 0))} for the CUDA context"
    return tgt.description


def estimate_plans(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    target: str,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    max_memory: int | str | None = None,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    checkpoint: bool = True,
) -> EstimateTable:
    """Forecast every plan of one training step of ``model`` for ``target`` without allocating
    (the model may live on the meta device) and judge each against the limit.

    Args:
        model, example_inputs, loss_fn, optimizer: as :func:`lightning_memplan.forecast`'s.
        target: the device (:data:`lightning_memplan.targets.TARGETS`).
        max_memory: bytes or a string (``"70GiB"``); default: the target's usable memory.
        budgets: activation memory budgets to forecast.
        checkpoint: also forecast each budget with every repeated block checkpointed.

    Raises:
        ValueError: bad arguments (each names the argument), or a step that depends on tensor values.
    """
    t0 = time.perf_counter()
    tgt = resolve_target(target, "estimate_plans")
    limit = parse_bytes(max_memory, argument="max_memory") if max_memory is not None else tgt.usable_bytes
    source = _limit_source(tgt, max_memory)
    blocks = tuple(repeated_blocks(model)) if checkpoint else ()
    sets: list[tuple[str, ...]] = [()] + ([blocks] if blocks else [])
    grid = forecast_grid(model, example_inputs, budgets=budgets, checkpoint_sets=sets, loss_fn=loss_fn,
                         optimizer=optimizer, target=tgt.name)
    base = grid.get(((), max(budgets)))
    base_flops = forecast_flops(base) if base is not None else math.nan
    rows, skipped = [], []
    for (ck, b), fc in grid.items():
        row = _row(fc, float(b), tuple(ck), base_flops, limit)
        if row is not None:
            rows.append(row)
        else:
            why = fc.problems[0] if fc.problems else "no forecast"
            skipped.append(f"{_plan_words(float(b), tuple(ck))}: {fc.status}: {why}")
    rows.sort(key=lambda r: (math.inf if math.isnan(r.extra_compute) else r.extra_compute, r.judged_bytes))
    return EstimateTable(target=tgt.name, limit=limit, limit_source=source, rows=tuple(rows), skipped=tuple(skipped),
                         seconds=time.perf_counter() - t0)
