"""The measured side of each epoch: one peak window per measured training batch.

A window measures the peak of the bytes in use above those in use when it opened
(:class:`~lightning_memplan.measure.PeakWindow`), shifted by a number of bytes so that it is above
the prediction's baseline, as the prediction is. On CPU the profiler only sees frees of blocks it
saw allocated, so the first window of each run of consecutive windows is a warm-up, not a result.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["PeakMeter"]

#: The input shapes a measured batch ran (``planner.step_model.call_signature``), or ``None`` where not noted.
Signature = tuple[Any, ...] | None


class PeakMeter:
    """Peak windows over up to ``measure_batches`` training batches per epoch (bytes).

    Invariants: at most one window is open; :attr:`peaks` and :attr:`signatures` are aligned and
    hold this epoch's kept results only (no warm-up, no discarded window).
    """

    def __init__(self, measure_batches: int) -> None:
        self.measure_batches = measure_batches
        #: This epoch's measured peaks (bytes above the baseline), in order.
        self.peaks: list[int] = []
        #: The input shapes of each measured batch, aligned with :attr:`peaks`.
        self.signatures: list[Signature] = []
        self._window: Any = None
        self._shift = 0  # bytes added to the open window's peak (see open)
        self._streak = 0  # consecutive batches measured, the open one included
        self._warmup = False  # the open window is a warm-up
        #: The open window saw a plan installed (its forecast ran): its peak is not kept.
        self.discard = False

    @property
    def is_open(self) -> bool:
        return self._window is not None

    def wants_batch(self) -> bool:
        """Whether this epoch still measures batches."""
        return len(self.peaks) < self.measure_batches

    def open(self, device: torch.device, shift: int) -> None:
        """Open a window on ``device``; its peak is reported ``shift`` bytes higher (negative: lower)."""
        from lightning_memplan.measure import PeakWindow

        self._warmup = self._streak == 0 and device.type == "cpu"
        self._shift = shift
        self._window = PeakWindow(device)
        self._window.__enter__()

    def close(self) -> int | None:
        """Close the open window: its peak in bytes (shifted, never below 0), or ``None`` if none was open."""
        w, self._window = self._window, None
        if w is None:
            return None
        w.__exit__(None, None, None)
        return max(int(w.peak_bytes) + self._shift, 0)

    def would_keep(self, peak: int | None) -> bool:
        """Whether :meth:`finish_batch` will keep ``peak`` (not a warm-up, not discarded)."""
        return peak is not None and not self.discard and not self._warmup

    def finish_batch(self, peak: int | None, signature: Signature) -> int | None:
        """Account the batch whose window gave ``peak`` (``None``: no window): the peak kept for
        the epoch, or ``None`` when there was none, it was a warm-up, or it was discarded."""
        if self.discard:
            self.discard, peak = False, None
        if peak is None:
            self._streak = 0
            return None
        self._streak += 1
        if self._warmup:
            return None
        self.peaks.append(peak)
        self.signatures.append(signature)
        return peak

    def end_epoch(self) -> tuple[list[int], list[Signature]]:
        """This epoch's peaks and their input shapes; the meter starts the next epoch empty."""
        peaks, sigs = self.peaks, self.signatures
        self.peaks, self.signatures = [], []
        if self._streak and len(peaks) >= self.measure_batches:
            self._streak = 0  # the rest of the epoch ran unprofiled
        return peaks, sigs
