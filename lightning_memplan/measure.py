"""Measured peak memory of a piece of work, on CUDA or CPU, behind one small interface.

* CUDA: ``torch.cuda.reset_peak_memory_stats`` at the start of the window, then
  ``max_memory_allocated() - memory_allocated()`` at its start (allocator statistics: the bytes of
  the blocks handed out, which the caching allocator rounds up to 512 bytes and, when a cached block
  is too little larger to split, to that whole block). ``PeakWindow.requested_peak_bytes`` is the
  same peak counted in the bytes the program asked for (``requested_bytes.all``), without rounding:
  the quantity a forecast predicts; the difference is the allocator's rounding at the peak.
* CPU: ``torch.profiler.profile(activities=[CPU], profile_memory=True)``; the peak of the running sum
  of the profiler's ``[memory]`` events (allocations positive, frees negative) ordered by time. The
  profiler records no event for the free of a block allocated before it started: a caller that knows
  of such frees (the outputs of a call, freed in the eager code after it) adds them
  (:meth:`PeakWindow.note_free`).

Both report bytes *above what was in use when the window opened* (an int >= 0).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from lightning_memplan._native_io import silence_native_output
from lightning_memplan._torch.profiler import kineto_memory_events
from lightning_memplan.core.peaks import running_peak

__all__ = ["PeakWindow", "measure_peak"]


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"`measure_peak(device={device!r})` is not a device. Expected 'cpu' or 'cuda'.") from err
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"`measure_peak(device={device!r})` is not supported. Expected 'cpu' or 'cuda'.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`measure_peak(device={device!r})`: CUDA is not available on this machine; use 'cpu'.")
    return dev


class PeakWindow:
    """Context manager measuring the peak bytes allocated inside it, above those in use at entry.

    ``with PeakWindow("cpu") as w: work()`` then ``w.peak_bytes``. One window at a time per device
    (the CUDA peak statistic is global and is reset at entry).
    """

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = _resolve_device(device)
        #: Peak bytes above the bytes in use at entry; set on exit.
        self.peak_bytes: int = 0
        #: CUDA only: the peak in bytes requested (before the allocator's rounding), above those
        #: requested at entry; on CPU equal to ``peak_bytes``.
        self.requested_peak_bytes: int = 0
        self._requested_start = 0
        self._prof: Any = None
        self._start = 0
        #: ``time.time_ns()`` when the window opened (the clock of the CPU profiler's events).
        self.opened_ns: int = 0
        self._frees: list[tuple[int, int]] = []  # (time_ns, -bytes) of frees the profiler cannot see

    def note_free(self, nbytes: int, at_ns: int) -> None:
        """A block allocated before the window opened was freed inside it: ``nbytes`` at ``at_ns``
        (``time.time_ns()``, ``>= opened_ns``). The CPU profiler records no event for such a free,
        so it is merged into the window's events; on CUDA the allocator's statistics see it already
        and this does nothing. Call it before the window closes."""
        if self.device.type != "cuda" and nbytes > 0:
            self._frees.append((int(at_ns), -int(nbytes)))

    def __enter__(self) -> PeakWindow:
        self.opened_ns = time.time_ns()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            self._requested_start = int(torch.cuda.memory_stats(self.device).get("requested_bytes.all.current", 0))
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with silence_native_output():  # kineto's USDT start line
                self._prof.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(torch.cuda.max_memory_allocated(self.device) - self._start, 0)
            stats = torch.cuda.memory_stats(self.device)
            requested = stats.get("requested_bytes.all.peak")
            self.requested_peak_bytes = (self.peak_bytes if requested is None
                                         else max(int(requested) - self._requested_start, 0))
            return
        with silence_native_output():  # kineto's USDT stop line
            self._prof.__exit__(exc_type, exc, tb)
        if exc_type is None:
            events = sorted([*kineto_memory_events(self._prof), *self._frees], key=lambda e: e[0])
            self.peak_bytes = running_peak([d for _, d in events])
            self.requested_peak_bytes = self.peak_bytes


def measure_peak(step_fn: Callable[[], Any], *, device: str | torch.device | None = None) -> int:
    """Run ``step_fn()`` once; return its peak bytes above the bytes in use when it was called.

    Args:
        step_fn: the work to measure, e.g. ``forecast(...).step``.
        device: where the work allocates: ``"cuda"`` (allocator statistics) or ``"cpu"`` (profiler
            memory events). Default: ``"cuda"`` when available, else ``"cpu"``.
    """
    if not callable(step_fn):
        raise ValueError(f"`measure_peak(step_fn={step_fn!r})` is not callable. Pass a function of no arguments.")
    with PeakWindow(device) as window:
        step_fn()
    return window.peak_bytes
