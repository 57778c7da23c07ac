"""Perfect packings: placement inputs whose optimum arena is known and equal to the live peak.

A ``steps x capacity`` rectangle (time steps x bytes) is cut into ``n`` smaller rectangles; each one
is a buffer live during its time range (half-open ``[lower, upper)``) whose size is its byte range.
The live bytes then equal ``capacity`` at every step, so no placement needs fewer bytes and the
cut itself is a placement of exactly ``capacity`` bytes: the optimum is ``capacity``.

Cuts:

- guillotine: a rectangle is split in two by one straight cut through time or through bytes;
- pinwheel (non-guillotine): a rectangle is split in five, four arms around a centre, so that no
  straight cut separates them.

Byte cuts fall on multiples of ``granularity`` bytes; every buffer gets ``alignment`` (a divisor of
``granularity``), so the witness offsets are aligned. Used by ``benchmarks/placement.py`` and by
the placement tests (seeded, deterministic for a given argument set).
"""
from __future__ import annotations

import numpy as np

from lightning_memplan.placement import Buffer

__all__ = ["perfect_packing"]

_Rect = tuple[int, int, int, int]  # t0, t1 (steps), y0, y1 (bytes), half-open


def _guillotine(rng: np.random.Generator, r: _Rect, granularity: int) -> list[_Rect] | None:
    t0, t1, y0, y1 = r
    can_time, can_bytes = t1 - t0 >= 2, (y1 - y0) // granularity >= 2
    if not (can_time or can_bytes):
        return None
    # Through time or through bytes, evenly at random.
    by_time = can_time and (not can_bytes or rng.random() < 0.5)
    if by_time:
        t = int(rng.integers(t0 + 1, t1))
        return [(t0, t, y0, y1), (t, t1, y0, y1)]
    y = y0 + granularity * int(rng.integers(1, (y1 - y0) // granularity))
    return [(t0, t1, y0, y), (t0, t1, y, y1)]


def _pinwheel(rng: np.random.Generator, r: _Rect, granularity: int) -> list[_Rect] | None:
    t0, t3, y0, y3 = r
    units = (y3 - y0) // granularity
    if t3 - t0 < 3 or units < 3:
        return None
    t1, t2 = sorted(int(x) for x in rng.choice(np.arange(t0 + 1, t3), 2, replace=False))
    u1, u2 = sorted(int(x) for x in rng.choice(np.arange(1, units), 2, replace=False))
    y1, y2 = y0 + u1 * granularity, y0 + u2 * granularity
    return [
        (t0, t2, y0, y1),  # bottom arm
        (t2, t3, y0, y2),  # right arm
        (t1, t3, y2, y3),  # top arm
        (t0, t1, y1, y3),  # left arm
        (t1, t2, y1, y2),  # centre
    ]


def perfect_packing(
    seed: int,
    n: int,
    *,
    steps: int = 1000,
    capacity: int = 2**20,
    granularity: int = 512,
    alignment: int = 1,
    pinwheels: float = 0.0,
) -> tuple[list[Buffer], list[int]]:
    """About ``n`` buffers (at least ``n``, at most ``n + 3``) packing ``steps x capacity`` exactly.

    Args:
        seed: for ``numpy.random.default_rng``.
        n: how many buffers to cut (>= 1).
        steps: time steps of the rectangle; buffers live in ``[0, steps)``.
        capacity: bytes of the rectangle (a multiple of ``granularity``): the optimum arena.
        granularity: byte cuts fall on multiples of this many bytes.
        alignment: every buffer's alignment in bytes; must divide ``granularity``.
        pinwheels: probability (0..1) that a split is a five-piece pinwheel instead of a guillotine cut.

    Returns:
        ``(buffers, offsets)``: the buffers (ids ``0..``, in random order) and the witness offsets
        (bytes) of the cut, a valid placement of arena ``capacity``.
    """
    if n < 1 or steps < 1 or granularity < 1 or capacity < granularity or capacity % granularity:
        raise ValueError(
            f"`perfect_packing(n={n!r}, steps={steps!r}, capacity={capacity!r}, granularity={granularity!r})` "
            "is not valid. Expected n, steps >= 1 and capacity a positive multiple of granularity."
        )
    if alignment < 1 or granularity % alignment:
        raise ValueError(f"`alignment={alignment!r}` is not valid. Expected a divisor of granularity={granularity}.")
    if not 0.0 <= pinwheels <= 1.0:
        raise ValueError(f"`pinwheels={pinwheels!r}` is not valid. Expected a probability in [0, 1].")
    rng = np.random.default_rng(seed)
    rects: list[_Rect] = [(0, steps, 0, capacity)]
    stuck: list[_Rect] = []
    while len(rects) + len(stuck) < n and rects:
        # Split a large piece (area-weighted), so sizes and lifetimes spread over several scales.
        area = np.array([(r[1] - r[0]) * (r[3] - r[2]) for r in rects], dtype=float)
        k = int(rng.choice(len(rects), p=area / area.sum()))
        r = rects.pop(k)
        pieces = _pinwheel(rng, r, granularity) if rng.random() < pinwheels else None
        pieces = pieces or _guillotine(rng, r, granularity)
        if pieces is None:
            stuck.append(r)
        else:
            rects.extend(pieces)
    rects += stuck
    order = rng.permutation(len(rects))
    buffers = [
        Buffer(id=i, lower=rects[k][0], upper=rects[k][1], size=rects[k][3] - rects[k][2], alignment=alignment)
        for i, k in enumerate(order)
    ]
    return buffers, [rects[k][2] for k in order]
