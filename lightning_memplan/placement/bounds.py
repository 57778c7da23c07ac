"""Live bytes over time: the lower bound no placement can beat.

At every time step the buffers live then (half-open lifetimes ``[lower, upper)``) occupy disjoint
byte ranges of one space, so any single-space arena is at least the peak of their summed sizes.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_memplan.placement.model import Buffer

__all__ = ["peak_live"]


def peak_live(buffers: Sequence[Buffer]) -> tuple[int, int | None]:
    """The peak of live bytes and the first time step where it happens.

    Returns ``(bytes, time_step)``; ``(0, None)`` when there are no buffers.
    """
    if not buffers:
        return 0, None
    lower = np.fromiter((b.lower for b in buffers), dtype=np.int64, count=len(buffers))
    upper = np.fromiter((b.upper for b in buffers), dtype=np.int64, count=len(buffers))
    size = np.fromiter((b.size for b in buffers), dtype=np.int64, count=len(buffers))
    times = np.unique(np.concatenate([lower, upper]))
    delta = np.zeros(times.size, dtype=np.int64)
    np.add.at(delta, np.searchsorted(times, lower), size)
    np.add.at(delta, np.searchsorted(times, upper), -size)
    live = np.cumsum(delta)
    k = int(np.argmax(live))
    return int(live[k]), int(times[k])
