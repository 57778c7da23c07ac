"""Running peaks of signed byte deltas."""
from __future__ import annotations

__all__ = ["running_peak"]


def running_peak(deltas: list[int]) -> int:
    """Peak of the running sum of signed byte deltas, starting at 0 (never below 0)."""
    cur = peak = 0
    for d in deltas:
        cur += d
        peak = max(peak, cur)
    return peak
