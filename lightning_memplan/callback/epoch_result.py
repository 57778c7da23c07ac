"""One training epoch's predicted vs measured peak, as the callback logs it.

Bytes above the baseline (the bytes live before a step) throughout. Shapes are
``planner.step_model.call_signature``s, ``None`` where a measured batch's shapes were not noted.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from lightning_memplan.callback.peak_meter import PeakMeter
from lightning_memplan.callback.shapes import ShapeTracker
from lightning_memplan.callback.strategy import max_over_ranks
from lightning_memplan.plan import MemPlan

__all__ = ["EpochResult", "end_epoch"]

Signature = tuple[Any, ...] | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpochResult:
    """What an epoch measured and what was predicted for it.

    Invariant: :attr:`peaks` and :attr:`signatures` are aligned (one per measured batch).
    """

    #: This rank's measured peaks, one per measured batch, in order.
    peaks: list[int]
    #: The input shapes each measured batch ran.
    signatures: list[Signature]
    #: The largest measured peak, over the batches and the ranks (``None``: nothing measured).
    measured: int | None
    #: The largest forecast of the shapes the measured batches ran (the plan's for the planned
    #: shapes; no batch measured: the plan's); ``None`` without a plan or its prediction.
    predicted: int | None
    #: Whether every measured batch ran shapes with a forecast (else no prediction error is logged).
    complete: bool
    #: The largest measured peak of the batches at the planned shapes (what the memory timeline,
    #: the planned shapes' forecast, is drawn against); ``None`` when none ran them.
    at_planned: int | None
    #: How many input shapes other than the planned ones the measured batches ran.
    other_shapes: int


def end_epoch(meter: PeakMeter, shapes: ShapeTracker, plan: MemPlan | None, strategy: Any, *,
              shapes_per_rank: bool) -> EpochResult:
    """The epoch's result from the meter's peaks (the meter starts the next epoch empty) and the
    shapes' forecasts. Every rank calls it (the maxima over ranks are collectives); with
    ``shapes_per_rank`` (new shapes are forecast, each rank for its own batches) the prediction is
    the largest over ranks too."""
    peaks, sigs = meter.end_epoch()
    measured = max_over_ranks(strategy, max(peaks) if peaks else None)
    predicted, complete = shapes.epoch_prediction(plan, sigs)
    if shapes_per_rank and getattr(strategy, "world_size", 1) > 1:
        predicted = max_over_ranks(strategy, predicted)
        complete = max_over_ranks(strategy, 0 if complete else 1) == 0
    planned = [p for p, sig in zip(peaks, sigs) if sig is None or sig == shapes.planned]
    at_planned = measured if len(planned) == len(peaks) else max(planned, default=None)
    other = {sig for sig in sigs if sig is not None and sig != shapes.planned}
    return EpochResult(peaks=peaks, signatures=sigs, measured=measured, predicted=predicted, complete=complete,
                       at_planned=at_planned, other_shapes=len(other))
