"""MemPlan: a memory-plan decision and its forecast, saved to and loaded from JSON.

A plan is what the tuner decides before (or at the start of) a run and what the callback reuses:
the activation memory budget, the knapsack solver, the submodules wrapped in activation
checkpointing, and the forecast that justified it. Plain data only (no torch objects), so it
round-trips through JSON and a Lightning checkpoint.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lightning_memplan.units import format_bytes

__all__ = ["Candidate", "MemPlan"]

PLAN_FORMAT = 1
"""Version of the JSON layout written by :meth:`MemPlan.save`."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One plan that was forecast during the search."""

    budget: float
    """Activation memory budget, a ratio in [0, 1]."""
    checkpoint: tuple[str, ...] = ()
    """Qualified names of the submodules wrapped in activation checkpointing."""
    peak_bytes: int | None = None
    """Forecast peak of one training step above the baseline (bytes); None if it failed."""
    cost: float | None = None
    """Recompute cost of the plan (FLOPs recomputed in backward); None when unknown."""
    note: str = ""
    """Why the forecast failed, or what the partitioner did (e.g. ``"solver not called"``)."""
    solver: str = ""
    """The plan's solver when it is not the search's own: ``"remat"`` for whole-graph
    rematerialization plans; empty for the search's knapsack solver."""
    reserve_bytes: int | None = None
    """Bytes the CUDA caching allocator's segments hold beyond its allocated high-water mark in this
    plan's forecast (block rounding, segments not reused): what ``memory_reserved`` adds to the
    allocated total, and so to what runs out; ``None`` when the allocator model did not run (not CUDA)."""

    @property
    def label(self) -> str:
        if self.solver == "remat":
            return f"remat {self.budget:g}"
        ck = f", {len(self.checkpoint)} ckpt" if self.checkpoint else ""
        return f"budget {self.budget:g}{ck}"


def _in_words(c: Candidate) -> str:
    if c.solver == "remat":
        return f"whole-graph rematerialization at budget {c.budget:g}"
    blocks = len(c.checkpoint)
    return f"budget {c.budget:g}" + (f" with {blocks} block{'s' if blocks > 1 else ''} checkpointed" if blocks else "")


@dataclass(frozen=True, kw_only=True)
class MemPlan:
    """The decision: budget, solver, checkpointed submodules, and the forecast behind it."""

    budget: float
    """Activation memory budget installed for the compiled model, a ratio in [0, 1]."""
    solver: str
    """Knapsack solver name (``"dp"``, ``"hirschberg"``, ``"greedy"``, ``"ilp"``), ``"remat"``
    (whole-graph rematerialization: ``budget`` caps the saved bytes, see
    :mod:`lightning_memplan.core.remat`) or ``"custom:<name>"``."""
    checkpoint: tuple[str, ...] = ()
    """Qualified names of submodules wrapped in activation checkpointing."""
    backend: str = "inductor"
    """``torch.compile`` backend the plan was forecast for."""
    predicted_peak_bytes: int | None = None
    """Forecast peak of one training step above the baseline (bytes)."""
    baseline_bytes: int | None = None
    """Bytes live before a step (parameters, buffers, batch, optimizer state)."""
    breakdown: dict[str, int] = field(default_factory=dict)
    """Bytes by category at the forecast peak (activations, parameters, gradients, ...)."""
    reason: str = ""
    """How the plan was chosen, in words (``"knee"``, ``"fastest plan within 20.00 GiB"``, ...)."""
    knee: int | None = None
    """Index of the knee in ``candidates`` (None when no search ran)."""
    chosen: int | None = None
    """Index of the chosen plan in ``candidates`` (None when no search ran)."""
    candidates: tuple[Candidate, ...] = ()
    """Every plan forecast during the search, in the order they were tried."""
    notes: tuple[str, ...] = ()
    """What the partitioner did per region (solver called or which early exit), warnings."""
    regional: tuple[str, ...] = ()
    """Qualified names of the submodules compiled on their own (regional compilation: the repeated
    blocks, whose alike share one compiled graph with the budget applied to it, and the modules the
    frame looping over them calls besides); ``()``: the module is compiled whole."""
    batch_size: int | None = None
    """The batch size the plan was chosen at, when it was searched for (``batch_size="max"``)."""
    batch_trials: tuple[dict[str, Any], ...] = ()
    """Every batch size forecast in that search (:class:`~lightning_memplan.core.batch_search.BatchTrial`
    as a dict: ``batch_size``, ``fits``, ``plan``, ``total_bytes``, ``extra_compute``, ``note``), in the order tried."""

    def __post_init__(self) -> None:
        if not isinstance(self.budget, (int, float)) or isinstance(self.budget, bool) or not (
            math.isfinite(self.budget) and 0.0 <= self.budget <= 1.0
        ):
            raise ValueError(f"`MemPlan(budget={self.budget!r})` must be a number in [0, 1].")
        for name in ("knee", "chosen"):
            idx = getattr(self, name)
            if idx is not None and not 0 <= idx < len(self.candidates):
                raise ValueError(
                    f"`MemPlan({name}={idx!r})` must index `candidates` (0..{len(self.candidates) - 1})."
                )

    def trade_off(self) -> str | None:
        """The choice in plain words, against the two ends of the search: no plan (budget 1, nothing
        checkpointed: the least compute) and the plan forecast to need the least memory. Memory is
        the forecast peak of a step above the baseline; compute the estimated FLOPs of the compiled
        forward and backward, recomputation included. ``None`` when no search ran or either end, or
        the choice, lacks a forecast."""
        if self.chosen is None:
            return None
        known = [c for c in self.candidates if c.peak_bytes is not None and c.cost is not None]
        base = next((c for c in known if c.budget == 1.0 and not c.checkpoint and not c.solver), None)
        chosen = self.candidates[self.chosen]
        if base is None or chosen not in known or not base.peak_bytes or not base.cost:
            return None
        least = min(known, key=lambda c: (c.peak_bytes, c.cost))

        def vs_base(c: Candidate) -> str:
            saved = 1 - c.peak_bytes / base.peak_bytes  # type: ignore[operator]
            more = c.cost / base.cost - 1  # type: ignore[operator]
            side = "less" if saved >= 0 else "more"
            return (f"{format_bytes(c.peak_bytes)}, {abs(100 * saved):.0f}% {side} than no plan's {format_bytes(base.peak_bytes)}, "
                    f"for {100 * more:+.0f}% estimated compute")

        if chosen is base:
            text = f"no plan (budget 1, nothing recomputed): {format_bytes(base.peak_bytes)} of step peak at the least compute"
        else:
            text = f"{_in_words(chosen)}: {vs_base(chosen)}"
        if least is not chosen:
            text += f"; the least memory, {_in_words(least)}, would be {vs_base(least)}"
        return text

    # ----------------------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict (tuples become lists), with a ``format`` version."""
        d = asdict(self)
        d["format"] = PLAN_FORMAT
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "plan") -> MemPlan:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing ones take defaults.

        Raises:
            ValueError: naming ``source`` when the data is not a plan of a known format.
        """
        if not isinstance(data, dict) or "budget" not in data or "solver" not in data:
            raise ValueError(f"{source} is not a MemPlan: expected a JSON object with 'budget' and 'solver'.")
        fmt = data.get("format", PLAN_FORMAT)
        if fmt != PLAN_FORMAT:
            raise ValueError(f"{source} has plan format {fmt!r}; this version reads format {PLAN_FORMAT}.")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["checkpoint"] = tuple(kw.get("checkpoint", ()))
        kw["regional"] = tuple(kw.get("regional", ()))
        kw["notes"] = tuple(kw.get("notes", ()))
        kw["batch_trials"] = tuple(dict(t) for t in kw.get("batch_trials", ()))
        cand_fields = {f.name for f in fields(Candidate)}
        kw["candidates"] = tuple(
            Candidate(**{**{k: v for k, v in c.items() if k in cand_fields},
                         "checkpoint": tuple(c.get("checkpoint", ()))})
            for c in kw.get("candidates", ())
        )
        try:
            return cls(**kw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source} is not a valid MemPlan: {exc}") from exc

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON (directories created); returns the path."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return out

    @classmethod
    def load(cls, path: str | Path) -> MemPlan:
        """Read a plan written by :meth:`save`.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: the file is not valid JSON or not a plan; the message names the file.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"plan file {str(p)!r} is not valid JSON: {exc}") from exc
        return cls.from_dict(data, source=f"plan file {str(p)!r}")
