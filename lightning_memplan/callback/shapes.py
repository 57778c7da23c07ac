"""Batches of other input shapes than the planned one (inputs of varying length, a smaller last
batch): which shapes ran, which dynamo compiled a static graph for, what a forecast at them needs,
and each epoch's prediction from the forecasts of the shapes its measured batches ran.

Shapes are ``planner.step_model.call_signature``s (shape, dtype, device type of each tensor argument);
sizes in bytes. The forecasts themselves are made by the plan controller.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lightning_memplan.callback.first_batch import held_returned
from lightning_memplan.forecasting.eager_loss import EagerLoss, scaled_eager_loss
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.step_model import call_signature, input_storages, made_input_bytes, storage_keys

__all__ = ["BatchShapes", "ShapeCall", "ShapeTracker"]

Signature = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class ShapeCall:
    """A batch's first call of the planned forward at input shapes with no forecast yet: what a
    forecast of a step at those shapes is made from (sizes in bytes)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Bytes of the call's outputs (unique storages), to scale the first batch's eager code.
    out_bytes: int
    #: Bytes of its inputs that training_step made (not in the batch).
    made_bytes: int
    #: Bytes of its tensor inputs (unique storages).
    in_bytes: int


@dataclasses.dataclass(frozen=True)
class BatchShapes:
    """What a training batch ran, against the forecasts (:meth:`ShapeTracker.end_batch`)."""

    #: The input shapes of its first training call of the planned forward (``None``: not noted).
    signature: Signature | None
    #: That call, kept when its shapes had no forecast yet (``None`` otherwise).
    call: ShapeCall | None
    #: The shapes whose eager code the batch measured (``None``: it measured none).
    noted: Signature | None


class ShapeTracker:
    """The input shapes of the fit's batches, against those of the plan in force."""

    def __init__(self) -> None:
        #: Forecast peak (bytes above the baseline) of a step at each input shapes the fit
        #: compiled a graph for after the planned one, with the plan in force; ``None`` where none
        #: was made. Cleared when another plan is installed.
        self.forecasts: dict[Signature, int | None] = {}
        #: The shapes the plan in force was forecast at.
        self.planned: Signature | None = None
        self.compiled: set[Signature] = set()  # shapes dynamo compiled a static graph for
        self.forecast_input_bytes = 0  # the largest inputs (bytes) of a call forecast so far
        #: The eager code measured at each shapes (the planned shapes' is the profile's).
        self.eager: dict[Signature, tuple[EagerLoss, ...]] = {}
        self._seen: set[Signature] = set()  # the shapes of the batches seen
        # the batch running now
        self.batch: Any = None
        self.batch_sig: Signature | None = None  # its first training call's shapes, once noted
        self.batch_call: ShapeCall | None = None  # that call, at shapes with no forecast yet
        #: The shapes whose eager code this batch measures (see :meth:`wants_eager_at`).
        self.noting: Signature | None = None
        # whether this batch may measure it: "profiled" (a batch of new shapes that would have been
        # measured: left unmeasured for it), "larger" (only if its inputs outgrow every forecast), ""
        self._may_note = ""

    def plan_installed(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Signature:
        """A plan was forecast and compiled at these arguments: they are the planned shapes, and
        the compiled function is new (its graphs are its own). Returns the planned signature."""
        self.planned = call_signature(args, kwargs)
        self.forecast_input_bytes = sum(input_storages(args, kwargs).values())
        self.forecasts, self.compiled = {}, set()
        return self.planned

    def start_batch(self, batch: Any, *, track: bool, later: bool, profiled: bool, measured_eager: bool) -> bool:
        """A training batch starts (``track``: new shapes are forecast; ``later``: not the fit's
        first; ``profiled``: it would be measured; ``measured_eager``: the first batch's eager code
        was measured). Returns whether it measures the eager code at new shapes instead of being
        measured (then it opens no peak window: the profiler is not started inside a step)."""
        self.batch, self.batch_sig, self.batch_call, self._may_note = batch, None, None, ""
        if not track:
            return False
        shapes = call_signature((batch,), {})
        if later and shapes not in self._seen and measured_eager:
            self._may_note = "profiled" if profiled else "larger"
        self._seen.add(shapes)
        return self._may_note == "profiled"

    def wants_eager_at(self, sig: Signature, args: Sequence[Any], kwargs: dict[str, Any], *, steady: bool) -> bool:
        """Whether this batch, whose first call has input shapes ``sig``, measures the eager code
        after the forward at those shapes (as the first batch measured it at its own), for their
        forecast: new shapes, a step the callback can measure (``steady``: one call, measurable, no
        collectives, no peak window open, no plan pending), and a batch of new shapes that would
        have been profiled or whose inputs are larger than any forecast so far."""
        return (bool(self._may_note) and steady
                and sig != self.planned and sig not in self.forecasts and sig not in self.eager
                and (self._may_note == "profiled"
                     or sum(input_storages(args, kwargs).values()) > self.forecast_input_bytes))

    def note_call(self, sig: Signature, args: Sequence[Any], kwargs: dict[str, Any], out: Any,
                  module: Any) -> None:
        """After a later batch's first training call, of input shapes ``sig``: at shapes with no
        forecast yet, keep what a forecast at them needs after the batch."""
        if sig != self.planned and sig not in self.forecasts and module is not None:
            inputs = input_storages(args, kwargs)
            made = made_input_bytes([inputs], storage_keys(self.batch, module))
            self.batch_call = ShapeCall(args=tuple(args), kwargs=dict(kwargs),
                                        out_bytes=sum(input_storages((out,), {}).values()), made_bytes=made,
                                        in_bytes=sum(inputs.values()))

    def end_batch(self, outputs: Any, *, new_static_graph: bool) -> BatchShapes:
        """The batch ended (``training_step`` returned ``outputs``; ``new_static_graph``: dynamo
        compiled a static graph for it): what it ran. The eager code it measured keeps what the
        outputs hold (``held_returned``); the tracker is ready for the next batch."""
        ran = BatchShapes(self.batch_sig, self.batch_call, self.noting)
        if ran.noted is not None:
            self.noting = None
            if ran.noted in self.eager:
                self.eager[ran.noted] = held_returned(self.eager[ran.noted], outputs)
        self.batch = self.batch_call = None
        if ran.signature is not None and new_static_graph:
            self.compiled.add(ran.signature)
        return ran

    def wants_forecast(self, ran: BatchShapes, *, measured: bool) -> bool:
        """Whether a step at the shapes a batch ran (``ran``) is forecast now: shapes with no
        forecast yet, and the batch measured the eager code at them, was measured (``measured``:
        its peak is kept), or had inputs larger than any forecast so far."""
        call = ran.call
        return (call is not None and ran.signature is not None
                and (ran.noted == ran.signature or measured or call.in_bytes > self.forecast_input_bytes))

    def eager_at(self, sig: Signature, out_bytes: int, planned: tuple[EagerLoss, ...],
                 planned_out_bytes: int) -> tuple[EagerLoss, ...]:
        """The eager code after the forward at input shapes ``sig``: as measured at them, else the
        planned shapes' (``planned``, with outputs of ``planned_out_bytes``) scaled by the outputs'
        bytes (``out_bytes`` at ``sig``; ``scaled_eager_loss``)."""
        losses = self.eager.get(sig)
        if losses is not None:
            return losses
        ratio = out_bytes / planned_out_bytes if out_bytes and planned_out_bytes else 1.0
        return tuple(scaled_eager_loss(m, ratio) for m in planned)

    def epoch_prediction(self, plan: MemPlan | None, sigs: Sequence[Signature | None]) -> tuple[int | None, bool]:
        """The prediction for an epoch whose measured batches ran input shapes ``sigs``: the
        largest forecast among them (the plan's for the planned shapes), and whether every one
        had a forecast. No batch measured: the plan's."""
        base = plan.predicted_peak_bytes if plan is not None else None
        if base is None or not sigs:
            return base, base is not None
        preds = [base if s is None or s == self.planned else self.forecasts.get(s) for s in sigs]
        known = [p for p in preds if p is not None]
        return (max(known) if known else base), len(known) == len(preds)
