"""One-pass greedy placement over a memory hierarchy.

Two orders, one packing rule. Buffers are taken one at a time in a fixed order; each goes into the
first space of the hierarchy where it fits (else the next one, else it stays unplaced), at an offset
chosen among the gaps left by already-placed buffers of that space that are live at the same time:

- :func:`greedy_by_size`: largest buffer first (ties: longer lifetime first, then input order), the
  *smallest* gap that holds it (best fit), else on top of them all. This is "greedy by size for
  offset calculation" of Pisarchyk & Lee, arXiv 2001.03288, with the gap rule done right: the gap
  below a placed buffer starts at the highest end of *every* buffer below it, not just the previous
  one, so a tall block further down can never be overlapped.
- :func:`greedy_by_position`: earliest lifetime first (ties: larger first, then input order), the
  *lowest* gap that holds it (first fit).

Both run in O(n * k) numpy work for n buffers with at most k live at once and never mutate inputs.
Offsets are bytes, lifetimes half-open ``[lower, upper)`` time steps.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from lightning_memplan.placement.model import (
    Buffer,
    MemorySpace,
    Plan,
    as_buffers,
    as_spaces,
    check_fits,
)

__all__ = ["fill", "greedy_by_position", "greedy_by_size"]


class _Space:
    """The buffers already placed in one space, as preallocated numpy columns."""

    def __init__(self, capacity: int, n: int) -> None:
        self.capacity = capacity
        self.count = 0
        self.lower = np.empty(n, dtype=np.int64)
        self.upper = np.empty(n, dtype=np.int64)
        self.offset = np.empty(n, dtype=np.int64)
        self.end = np.empty(n, dtype=np.int64)

    def find(self, b: Buffer, best_fit: bool) -> int | None:
        """The offset (bytes) where ``b`` goes in this space, or ``None`` if it does not fit."""
        k = self.count
        live = (self.lower[:k] < b.upper) & (b.lower < self.upper[:k])
        off, end = self.offset[:k][live], self.end[:k][live]
        a = b.alignment
        if off.size == 0:
            where = 0
        else:
            order = np.argsort(off, kind="stable")
            off, end = off[order], end[order]
            below = np.empty_like(end)  # highest end among all buffers at lower offsets
            below[0] = 0
            np.maximum.accumulate(end[:-1], out=below[1:])
            start = -(-below // a) * a
            gap = off - start
            fits = np.flatnonzero(gap >= b.size)
            if fits.size:
                pick = fits[np.argmin(gap[fits])] if best_fit else fits[0]
                where = int(start[pick])
            else:
                top = int(end.max())
                where = -(-top // a) * a
        return where if where + b.size <= self.capacity else None

    def add(self, b: Buffer, offset: int) -> None:
        k = self.count
        self.lower[k], self.upper[k], self.offset[k], self.end[k] = b.lower, b.upper, offset, offset + b.size
        self.count = k + 1


def _greedy(
    buffers: Sequence[Buffer],
    spaces: int | MemorySpace | Sequence[MemorySpace],
    *,
    name: str,
    order: list[int],
    best_fit: bool,
    started: float,
) -> Plan:
    bufs, hierarchy = as_buffers(buffers), as_spaces(spaces)
    check_fits(bufs, hierarchy)
    packers = [_Space(s.capacity, len(bufs)) for s in hierarchy]
    space: list[int | None] = [None] * len(bufs)
    offset: list[int | None] = [None] * len(bufs)
    for i in order:
        b = bufs[i]
        for s, packer in enumerate(packers):
            where = packer.find(b, best_fit)
            if where is not None:
                packer.add(b, where)
                space[i], offset[i] = s, where
                break
    seconds = time.perf_counter() - started
    return Plan(
        buffers=bufs,
        spaces=hierarchy,
        space=tuple(space),
        offset=tuple(offset),
        algorithm=name,
        seconds=seconds,
        seconds_to_best=seconds,
    )


def greedy_by_size(
    buffers: Sequence[Buffer],
    spaces: int | MemorySpace | Sequence[MemorySpace],
    *,
    time_limit: float | None = None,
) -> Plan:
    """Largest first, best-fit gap, first space of the hierarchy that holds it.

    Args:
        buffers: what to place; ids unique, lifetimes half-open time steps, sizes in bytes.
        spaces: capacity in bytes, one :class:`MemorySpace`, or a hierarchy in priority order.
        time_limit: accepted for the common signature; a single pass needs none (seconds).

    Returns:
        A new :class:`Plan`; buffers that fit nowhere are in ``plan.unplaced``.
    """
    started = time.perf_counter()
    bufs = as_buffers(buffers)
    order = sorted(range(len(bufs)), key=lambda i: (-bufs[i].size, bufs[i].lower - bufs[i].upper, i))
    return _greedy(bufs, spaces, name="greedy_by_size", order=order, best_fit=True, started=started)


def greedy_by_position(
    buffers: Sequence[Buffer],
    spaces: int | MemorySpace | Sequence[MemorySpace],
    *,
    time_limit: float | None = None,
) -> Plan:
    """Earliest start first, lowest gap that holds it, first space of the hierarchy that holds it.

    Args and returns as :func:`greedy_by_size`.
    """
    started = time.perf_counter()
    bufs = as_buffers(buffers)
    order = sorted(range(len(bufs)), key=lambda i: (bufs[i].lower, -bufs[i].size, i))
    return _greedy(bufs, spaces, name="greedy_by_position", order=order, best_fit=False, started=started)


def fill(buffers: Sequence[Buffer], offsets: Sequence[int | None], capacity: int) -> list[int | None]:
    """Complete a partial placement of one space greedily: the buffers without an offset go, largest
    first, into the best-fitting gap within ``capacity`` bytes (as :func:`greedy_by_size`); those that
    fit nowhere keep ``None``. ``offsets`` (bytes) must be a valid partial packing; it is not mutated.
    """
    packer = _Space(capacity, len(buffers))
    out = list(offsets)
    for b, o in zip(buffers, offsets):
        if o is not None:
            packer.add(b, o)
    rest = sorted((i for i, o in enumerate(offsets) if o is None),
                  key=lambda i: (-buffers[i].size, buffers[i].lower - buffers[i].upper, i))
    for i in rest:
        where = packer.find(buffers[i], True)
        if where is not None:
            packer.add(buffers[i], where)
            out[i] = where
    return out
