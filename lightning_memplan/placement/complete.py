"""Anytime completion of a partial placement within a fixed capacity: window repairs, exact.

When no complete placement within the capacity is known, the best answer is one that leaves out as
few buffers as possible, and the goal is to leave out none. One move takes a *time window*
``[t0, t1)`` around a buffer left out, frees every placed buffer whose lifetime lies inside it, and
asks the exact decision procedure (:class:`lightning_memplan.placement._decide.Decider`) to pack
the freed buffers together with the left-out buffers inside the window within the capacity. The
placed buffers that cross the window's ends stay where they are: they enter the search clipped to
the window, each with a band ``[floor, ceiling)`` of exactly its size (fixed), so the repair is
exact and the result stays a valid packing. A move that places them all is kept (the count left out
falls); if it fails, the same window is tried with the drawn buffer alone. Window widths adapt:
larger after a success, smaller after a failure, so repairs stay within a fraction of a second.

Units: bytes for offsets, sizes and capacity; time steps for lifetimes (half-open); seconds of
``time.perf_counter`` for deadlines.
"""
from __future__ import annotations

import time

import numpy as np

from lightning_memplan.placement._decide import Decider, Timeout
from lightning_memplan.placement.model import Buffer, columns

__all__ = ["complete"]

_MOVE_SECONDS = 0.3
"""Longest a single repair may search (seconds) before the move counts as failed."""
_MIN_FREED, _MAX_FREED = 8, 250
"""Bounds on how many placed buffers one window frees."""


def _repack(
    lo: np.ndarray, up: np.ndarray, size: np.ndarray, align: np.ndarray, off: np.ndarray,
    free: np.ndarray, fixed: np.ndarray, t0: int, t1: int, capacity: int, deadline: float,
) -> np.ndarray | None:
    """Offsets (bytes) for the buffers of mask ``free`` within ``capacity`` around the buffers of
    mask ``fixed`` (kept at ``off``, lifetimes clipped to ``[t0, t1)``), or ``None``."""
    fi, xi = np.flatnonzero(free), np.flatnonzero(fixed)
    lower = np.concatenate([lo[fi], np.maximum(lo[xi], t0)])
    upper = np.concatenate([up[fi], np.minimum(up[xi], t1)])
    floor = np.concatenate([np.zeros(fi.size, dtype=np.int64), off[xi]])
    ceiling = np.concatenate([np.full(fi.size, capacity, dtype=np.int64), off[xi] + size[xi]])
    decider = Decider(
        lower.tolist(), upper.tolist(), np.concatenate([size[fi], size[xi]]).tolist(),
        np.concatenate([align[fi], align[xi]]).tolist(), floor=floor.tolist(), ceiling=ceiling.tolist(),
    )
    try:
        found = decider.solve(capacity, deadline)
    except Timeout:
        return None
    return None if found is None else np.asarray(found[: fi.size], dtype=np.int64)


def complete(
    buffers: list[Buffer],
    offsets: list[int | None],
    capacity: int,
    deadline: float,
    *,
    seed: int = 0,
    moves: int | None = None,
) -> tuple[list[int | None], float]:
    """Place left-out buffers of a partial placement by window repairs until ``deadline`` or none is left.

    Args:
        buffers: buffers of one space, every size > 0 bytes (ids are not used).
        offsets: a valid partial placement within ``capacity`` (bytes, ``None``: left out).
        capacity: bytes every placed buffer must stay below.
        deadline: ``time.perf_counter()`` seconds at which to return.
        seed: for the random choices.
        moves: at most this many moves (``None``: until ``deadline``). With ``deadline`` far enough
            that no repair is cut short, the result depends only on the inputs.

    Returns:
        ``(offsets, found_at)``: a valid partial placement within ``capacity`` leaving out no more
        buffers than the input (``None`` for those left out), and the ``perf_counter`` time of its
        last improvement (the call's start when there was none).
    """
    found_at = time.perf_counter()
    n = len(buffers)
    lo, up, size, align = columns(buffers)
    placed = np.array([o is not None for o in offsets], dtype=bool)
    off = np.array([0 if o is None else o for o in offsets], dtype=np.int64)
    rng = np.random.default_rng(seed)
    span = int(up.max() - lo.min()) if n else 0
    target = min(_MAX_FREED, max(_MIN_FREED, n // 8))
    done = 0
    while not placed.all() and time.perf_counter() < deadline and (moves is None or done < moves):
        done += 1
        u = int(rng.choice(np.flatnonzero(~placed)))
        # Widen u's lifetime on both sides (random split) until about ``target`` placed buffers lie inside.
        width = int(up[u] - lo[u])
        t0, t1 = int(lo[u]), int(up[u])
        inside = (lo >= t0) & (up <= t1) & placed
        grow = max(1, width // 4, span // 200)
        while int(inside.sum()) < target and (t0 > lo.min() or t1 < up.max()):
            left = int(rng.integers(0, grow + 1))
            t0, t1 = t0 - left, t1 + grow - left
            inside = (lo >= t0) & (up <= t1) & placed
        left_out = (lo >= t0) & (up <= t1) & ~placed
        crossing = placed & ~inside & (lo < t1) & (t0 < up)
        step_deadline = min(deadline, time.perf_counter() + _MOVE_SECONDS)
        for extra in (left_out, np.arange(n) == u):
            free = inside | extra
            found = _repack(lo, up, size, align, off, free, crossing, t0, t1, capacity, step_deadline)
            if found is not None:
                off[free] = found
                placed |= free
                found_at = time.perf_counter()
                break
            if int(left_out.sum()) == 1:
                break
        if found is None:
            target = max(_MIN_FREED, int(target * 0.8))
        else:
            target = min(_MAX_FREED, int(target * 1.25) + 1)
    return [int(o) if p else None for o, p in zip(off, placed)], found_at
