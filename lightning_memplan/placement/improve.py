"""Anytime improvement of a complete placement: large-neighbourhood search with exact repairs.

One move frees every buffer that reaches above a byte line ``y`` (its top ``offset + size > y``)
and keeps the rest fixed. Each freed buffer that overlaps a kept one in time lies above it, so
the kept buffers form a *floor* (per freed buffer: the highest top of the kept buffers live with
it), and the exact decision procedure (:class:`lightning_memplan.placement._decide.Decider` with
that floor) re-packs the freed buffers within a target arena, or says it cannot in the time given.
Moves alternate with *flips* (offset -> arena - offset - size, a mirror image, valid when it keeps
every offset aligned), so both the top and the bottom of the plan get repacked. The line is drawn
so that a random number of buffers is freed; that number grows after successes and shrinks after
failures, keeping repairs small enough to answer in a fraction of a second.

Every accepted placement is a valid packing of every buffer (the repair is exact and the floor
keeps it clear of the fixed part), so the result is always complete; its arena never grows.
Units: bytes for offsets, sizes and arenas; seconds of ``time.perf_counter`` for deadlines.
"""
from __future__ import annotations

import time

import numpy as np

from lightning_memplan.placement._decide import Decider, Timeout
from lightning_memplan.placement.model import Buffer, columns

__all__ = ["improve"]

_MOVE_SECONDS = 0.3
"""Longest a single repair may search (seconds) before the move counts as failed."""
_MIN_FREED, _MAX_FREED = 8, 200
"""Bounds on how many buffers one move frees."""


class _Problem:
    """The buffers (all of size > 0) as numpy columns, with their pairwise overlaps in time."""

    def __init__(self, bufs: list[Buffer]) -> None:
        self.lower, self.upper, self.size, self.align = columns(bufs)
        self.overlap = (self.lower[:, None] < self.upper[None, :]) & (self.lower[None, :] < self.upper[:, None])
        np.fill_diagonal(self.overlap, False)

    def lowered(self, off: np.ndarray) -> np.ndarray:
        """``off`` moved down as one block by the largest multiple of every alignment that keeps
        every offset >= 0 (a mirrored repair can leave free bytes at the bottom)."""
        unit = int(np.lcm.reduce(self.align))
        return off - int(off.min()) // unit * unit

    def flippable(self, arena: int) -> bool:
        """Whether mirroring at ``arena`` bytes keeps every offset aligned."""
        return bool(((arena - self.size) % self.align == 0).all())

    def repair(self, off: np.ndarray, y: int, target: int, deadline: float) -> np.ndarray | None:
        """Offsets with every buffer whose top exceeds ``y`` repacked within ``target`` bytes above
        the others (kept in place), or ``None`` (no such packing, or none found by ``deadline``)."""
        top = off + self.size
        freed = np.flatnonzero(top > y)
        kept = top <= y
        if freed.size == 0:
            return None
        below = np.where(self.overlap[freed][:, kept], top[kept][None, :], 0)
        floor = below.max(axis=1) if below.shape[1] else np.zeros(freed.size, dtype=np.int64)
        decider = Decider(
            self.lower[freed].tolist(), self.upper[freed].tolist(), self.size[freed].tolist(),
            self.align[freed].tolist(), floor=floor.tolist(),
        )
        try:
            found = decider.solve(target, deadline)
        except Timeout:
            return None
        if found is None:
            return None
        out = off.copy()
        out[freed] = found
        return out


def improve(
    buffers: list[Buffer],
    offsets: list[int],
    lower_bound: int,
    deadline: float,
    *,
    seed: int = 0,
    moves: int | None = None,
) -> tuple[list[int], float]:
    """Shrink the arena of a complete placement until ``deadline`` or ``lower_bound``.

    Args:
        buffers: buffers of one space, every size > 0 bytes (ids are not used).
        offsets: a valid placement of all of them (bytes), one per buffer.
        lower_bound: bytes no placement can beat (the search stops there).
        deadline: ``time.perf_counter()`` seconds at which to return.
        seed: for the random choices.
        moves: at most this many moves (``None``: until ``deadline``). With ``deadline`` far enough
            that no repair is cut short, the result depends only on the inputs.

    Returns:
        ``(offsets, found_at)``: the best placement found (valid, arena <= the input's) and the
        ``perf_counter`` time it was found (the call's start when nothing better was found).
    """
    found_at = time.perf_counter()
    if not buffers:
        return list(offsets), found_at
    pb = _Problem(buffers)
    rng = np.random.default_rng(seed)
    best = np.asarray(offsets, dtype=np.int64)
    arena = int((best + pb.size).max())
    freed = min(_MAX_FREED, max(_MIN_FREED, len(buffers) // 4))
    step = max(1, (arena - lower_bound) // 2)
    cur = best.copy()
    done = 0
    while arena > lower_bound and time.perf_counter() < deadline and (moves is None or done < moves):
        done += 1
        flip = bool(rng.random() < 0.5) and pb.flippable(arena)
        work = arena - cur - pb.size if flip else cur
        tops = np.sort(work + pb.size)
        k = int(rng.integers(max(1, freed // 2), freed + 1))
        y = int(tops[len(tops) - k]) - 1 if k < len(tops) else 0  # frees the k highest tops (and ties)
        # Ask for a smaller arena (by ``step``), or, after a failure at the smallest step, for the
        # same arena: a repacked neighbourhood moves the free space to the line, for the next move.
        target = max(lower_bound, arena - step)
        out = pb.repair(work, y, target, min(deadline, time.perf_counter() + _MOVE_SECONDS))
        if out is None and step == 1:
            out = pb.repair(work, y, arena, min(deadline, time.perf_counter() + _MOVE_SECONDS))
        if out is None:
            freed = max(_MIN_FREED, int(freed * 0.8))
            step = max(1, step // 2)
            continue
        freed = min(_MAX_FREED, len(buffers), int(freed * 1.25) + 1)
        cur = pb.lowered(arena - out - pb.size if flip else out)
        new = int((cur + pb.size).max())
        if new < arena:
            arena = new
            step = max(step, (arena - lower_bound) // 4, 1)
            best = cur.copy()
            found_at = time.perf_counter()
    return [int(x) for x in best], found_at
