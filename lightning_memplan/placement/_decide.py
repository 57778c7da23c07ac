"""Exact decision procedure: can these buffers be packed below ``capacity`` bytes?

A depth-first search over *canonical* solutions, after the ideas of MiniMalloc (Moffitt, ASPLOS
2023). Every feasible packing can be pushed down until each buffer rests at offset 0 or on top of a
buffer live at the same time (rounded up to its alignment); listing the buffers by offset, each one
sits exactly on the highest top among the earlier ones it overlaps in time. So the search only
chooses an *order*: the next buffer goes to its lowest offset (``min_off``, the highest aligned top of
the placed buffers it overlaps), and offsets never decrease along a branch. Pruning:

- cross sections: time is cut into sections (maximal sets of buffers live together, one per time a
  buffer dies); in every section the unplaced buffers must stack above ``max(current offset, lowest
  min_off among them)``, so that plus their total size must stay within ``capacity``;
- dominance: a buffer whose ``min_off`` is at or above the lowest possible top of another unplaced
  buffer is not tried, since that other buffer fits in the gap below it;
- "hatless" buffers: when the buffer just tried overlaps no unplaced buffer, it comes first in every
  completion, so the other choices at that node fail as well;
- decomposition: once no unplaced buffer spans the boundary between two sections, the two sides are
  independent and solved one after the other, each from offset 0 with its own static order (a
  failure of one side fails the branch at once);
- several static orders (by lifetime width, area, section total, descending) are searched side by
  side, one compiled slice each in turn, each in its own state that the next turn resumes, so that
  one unlucky order does not sink the search. (The search under one order is deterministic, so a
  restart under a larger node limit would only replay the nodes it has already searched.)

The search itself runs compiled (:mod:`lightning_memplan.placement._kernels`) on an explicit
stack, in slices of at most a few thousand nodes (fewer on large instances, see
:data:`_SLICE_SECONDS`) between which the deadline is checked.

Units: bytes and sections; lifetimes half-open. Internal module: the public entry point is
:func:`lightning_memplan.placement.search.exact_search`.
"""
from __future__ import annotations

import copy
import os
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_memplan.placement import _kernels as K
from lightning_memplan.placement.model import Buffer, columns


class Timeout(Exception):
    """The deadline passed during the search."""


HEURISTICS = ("WAT", "TAW", "TWA")
"""Static orders searched side by side: by lifetime Width, Area, section Total, siZe (descending)."""

TIGHT_HEURISTICS = ("ZWA+", "WAT+", "WAT", "TAW+", "TAW", "TWA")
"""The orders used instead when most sections have no spare bytes at the capacity asked (see
:data:`TIGHT_SHARE`). ``+``: at a node, if a section's unplaced buffers exactly fill the bytes above
its floor and that floor is the lowest offset a candidate takes, branch only on its buffers there
(one of them must cover that byte): far fewer branches when every byte is needed."""

TIGHT_SHARE = 0.75
"""Share of sections (0..1) whose live bytes equal the capacity above which the tight orders are used."""

_SLICE = 4096
"""Most nodes per compiled call; the deadline is checked between calls."""

_SLICE_SECONDS = 0.5
"""Longest a compiled call should take (seconds), so that a deadline is kept to about this much.
A node costs about :data:`_NODE_SECONDS` x buffers squared (35 us at 420 buffers, 13 ms at 8,000),
so the first call's node budget is estimated from the size and each later one from the time the
last call took, never above :data:`_SLICE` (instances of up to about 780 buffers start with full slices)."""

_NODE_SECONDS = 2e-10
"""Seconds per node per buffer squared: the first call's estimate (measured: 2.0e-10 at 420 and at 8,000 buffers)."""


def sweep(lower: list[int], upper: list[int]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """MiniMalloc's cross sections: walking through time (deaths before births at equal times), the
    set of live buffers is recorded just before the first death at each time. Returns per buffer the
    half-open range of sections ``[sl, su)`` it belongs to, and the members of every section."""
    n = len(lower)
    events = sorted([(upper[i], 0, i) for i in range(n)] + [(lower[i], 1, i) for i in range(n)])
    active: set[int] = set()
    sections: list[list[int]] = []
    start = [0] * n
    sl = np.zeros(n, dtype=np.int64)
    su = np.zeros(n, dtype=np.int64)
    last = events[0][0] if events else 0
    for t, kind, i in events:
        if kind == 0:
            if last < t:
                last = t
                sections.append(sorted(active))
            active.discard(i)
            sl[i], su[i] = start[i], len(sections)
        else:
            active.add(i)
            start[i] = len(sections)
    return sl, su, sections


_warm = False


def kernels_cached() -> bool:
    """Whether numba's on-disk cache of the search kernels looks current, so that :func:`warm_up`
    only loads them (a fraction of a second) instead of compiling them (about a minute): the cache
    index of the main kernel exists and is newer than the kernels' source. A cheap guess from file
    times; numba itself decides (and recompiles on a stale index)."""
    source = Path(K.__file__)
    roots = [source.parent / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):
        roots.append(Path(os.environ["NUMBA_CACHE_DIR"]))
    mtime = source.stat().st_mtime
    for root in roots:
        for index in root.rglob("_kernels.run-*.nbi") if root.is_dir() else ():
            if index.stat().st_mtime >= mtime:
                return True
    return False


def is_warm() -> bool:
    """Whether :func:`warm_up` has run in this process."""
    return _warm


def warm_up() -> None:
    """Load (or, the first time on a machine, compile: tens of seconds) the compiled kernels by
    solving a tiny problem, so that callers can keep that one-time cost out of their time limits."""
    global _warm
    if not _warm:
        Decider([0, 0, 2], [2, 4, 4], [4, 4, 4], [1, 1, 2]).solve(8, float("inf"))
        _warm = True


class Decider:
    """Search state for one problem; :meth:`solve` answers one capacity."""

    def __init__(
        self,
        lower: list[int],
        upper: list[int],
        size: list[int],
        align: list[int],
        heuristics: tuple[str, ...] = HEURISTICS,
        floor: list[int] | None = None,
        tight_heuristics: tuple[str, ...] | None = TIGHT_HEURISTICS,
        ceiling: list[int] | None = None,
    ) -> None:
        """Precompute sections, overlaps and pools (sizes > 0 bytes, ``lower < upper``).

        ``tight_heuristics`` replace ``heuristics`` at a capacity most sections fill exactly
        (:data:`TIGHT_SHARE`); ``None``: always ``heuristics``.

        ``floor`` (bytes, one per buffer; default all 0) is the lowest offset each buffer may take:
        the top of fixed memory below it (a skyline), rounded up here to the buffer's alignment.
        Packings are then searched above that floor; the search stays exact.

        ``ceiling`` (bytes, one per buffer; default none) is the highest top each buffer may reach,
        besides the capacity asked: a packing then keeps every buffer in its band ``[floor,
        ceiling)`` (a band of exactly its size fixes it); the search stays exact."""
        n = len(size)
        self.n = n
        self.nodes = 0
        #: Nodes searched in this object's own state (the first order's lane; :attr:`nodes` counts every lane).
        self.searched = 0
        self._lanes: list[Decider] = []
        i64 = np.int64
        self.size = np.asarray(size, dtype=i64).reshape(n)
        self.align = np.asarray(align, dtype=i64).reshape(n)
        base = np.zeros(n, dtype=i64) if floor is None else np.asarray(floor, dtype=i64).reshape(n)
        self.base = -(-base // self.align) * self.align
        self.ceiling = np.full(n, K.INF, dtype=i64) if ceiling is None else np.asarray(ceiling, dtype=i64).reshape(n)
        self.ceil = self.ceiling  # ``ceiling`` capped at the capacity of the current attempt
        self.unit_alignment = bool((self.align == 1).all())
        lo = np.asarray(lower, dtype=i64).reshape(n)
        up = np.asarray(upper, dtype=i64).reshape(n)
        self.width = up - lo
        self.area = self.size * self.width
        self.sl, self.su, sections = sweep([int(x) for x in lower], [int(x) for x in upper])
        self.nsec = max(len(sections), 1)
        self.secp = np.zeros(self.nsec + 1, dtype=i64)
        self.secp[1 : len(sections) + 1] = np.cumsum([len(m) for m in sections]) if sections else 0
        self.seci = np.asarray([b for m in sections for b in m], dtype=i64)
        self.total0 = np.zeros(self.nsec, dtype=i64)
        for s, m in enumerate(sections):
            self.total0[s] = int(self.size[m].sum()) if m else 0
        self.cuts0 = np.zeros(self.nsec, dtype=i64)  # buffers spanning sections s and s + 1
        for i in range(n):
            self.cuts0[self.sl[i] : self.su[i] - 1] += 1
        ovp, ovi = [0], []
        for i in range(n):
            js = np.flatnonzero((lo < up[i]) & (lo[i] < up))
            ovi.append(js[js != i])
            ovp.append(ovp[-1] + len(ovi[-1]))
        self.ovp = np.asarray(ovp, dtype=i64)
        self.ovi = np.concatenate(ovi).astype(i64) if ovi else np.zeros(0, dtype=i64)
        self.heuristics = self._orders(heuristics)
        self.tight_heuristics = self.heuristics if tight_heuristics is None else self._orders(tight_heuristics)
        self.ureserve = int(np.diff(self.ovp).max(initial=0)) + 2 * self.nsec + 1
        self._allocate()

    @staticmethod
    def _orders(heuristics: tuple[str, ...]) -> list[tuple[np.ndarray, bool]]:
        """Key codes per order, and whether it branches on a section without spare bytes (``+``)."""
        return [(np.asarray([K.KEYS[c] for c in h.rstrip("+")], dtype=np.int64), h.endswith("+")) for h in heuristics]

    @classmethod
    def of(cls, buffers: Sequence[Buffer], **kwargs: Any) -> Decider:
        """A decider for ``buffers`` (sizes > 0 bytes), in their order; ``kwargs`` as for the constructor."""
        return cls(*(c.tolist() for c in columns(buffers)), **kwargs)

    def _allocate(self) -> None:
        """Fresh search state (reused by every attempt of this object)."""
        n, i64 = self.n, np.int64
        self.st = np.zeros(K.ST_LEN, dtype=i64)
        self.frames = np.zeros((n + 2, K.NF), dtype=i64)
        self.decs = np.zeros((n + 2, K.ND), dtype=i64)
        self.parts = np.zeros((max(4 * n, self.nsec) + 16, K.NP), dtype=i64)
        self.pool = np.zeros(4 * n + 16, dtype=i64)
        self.cand = np.zeros(4 * n + 16, dtype=i64)
        self.mo = np.zeros(n + 2 * self.nsec, dtype=i64)  # min_off per buffer; floor, count per section
        self.rem = np.zeros(self.nsec, dtype=i64)
        self.cuts = np.zeros(self.nsec, dtype=i64)
        self.solution = np.zeros(n, dtype=i64)
        self.deep_mask = np.zeros(n, dtype=i64)  # the partial packing with the most buffers placed
        self.deep_off = np.zeros(n, dtype=i64)
        self.ulog_i = np.zeros(len(self.ovi) + self.ureserve, dtype=i64)
        self.ulog_v = np.zeros(len(self.ovi) + self.ureserve, dtype=i64)
        self.dirty = np.zeros(self.nsec, dtype=i64)
        self.dstamp = np.zeros(self.nsec, dtype=i64)

    def fork(self, heuristics: tuple[str, ...] | None = None) -> Decider:
        """A decider for the same problem with its own search state, so that two searches (say at
        two capacities) can run interleaved; the read-only problem arrays are shared.
        ``heuristics``: the fork searches these orders only, at every capacity (default: this
        object's orders)."""
        other = copy.copy(self)
        other.nodes = other.searched = 0
        other._lanes = []
        if heuristics is not None:
            other.heuristics = other.tight_heuristics = self._orders(heuristics)
        other._allocate()
        return other

    def lanes(self) -> list[Decider]:
        """The search states of the orders :meth:`steps` has run so far, in order (this object first)."""
        return [self, *self._lanes]

    def _lane(self, k: int) -> Decider:
        """The search state that the ``k``-th order of :meth:`steps` runs in: this object for the
        first, a fork for each other one (kept and reused by later calls)."""
        if k == 0:
            return self
        while len(self._lanes) < k:
            self._lanes.append(self.fork())
        return self._lanes[k - 1]

    def deepest(self) -> list[int | None]:
        """The partial packing with the most buffers placed that this object's searches have met
        (over every capacity and attempt so far): per buffer its offset (bytes) or ``None``. Each
        offset lies within the capacity of the search that placed it; the placed buffers overlap
        neither each other nor their floors."""
        lane = max(self.lanes(), key=lambda d: int(d.st[K.DEEP]))
        return [int(o) if m else None for m, o in zip(lane.deep_mask, lane.deep_off)]

    # ------------------------------------------------------------------ search
    def solve(self, capacity: int, deadline: float) -> list[int] | None:
        """Offsets (bytes) of a packing within ``capacity``, or ``None`` when none exists.

        Raises :class:`Timeout` when ``deadline`` (``time.perf_counter()`` seconds) passes first.
        """
        steps = self.steps(capacity)
        while True:
            if time.perf_counter() > deadline:
                raise Timeout
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self, capacity: int) -> Generator[None, None, list[int] | None]:
        """:meth:`solve` one compiled slice at a time: yields between slices (a few milliseconds
        apart) so that the caller can check a clock or interleave several searches; returns the
        offsets (bytes) or ``None`` when no packing within ``capacity`` exists."""
        if self.n == 0:
            return []
        self.ceil = np.minimum(self.ceiling, capacity)
        if int(self.total0.max()) > capacity or bool((self.base + self.size > self.ceil).any()):
            return None
        tight = float((self.total0 == capacity).mean()) > TIGHT_SHARE
        orders = self.tight_heuristics if tight else self.heuristics
        runs: list[tuple[Decider, Generator[None, None, int]]] = []
        while True:
            for k, (heur, zero_slack) in enumerate(orders):
                if k == len(runs):  # an order's state is made when its first turn comes
                    lane = self._lane(k)
                    lane.ceil = self.ceil
                    runs.append((lane, lane._attempt(capacity, heur, zero_slack, self)))
                lane, run = runs[k]
                try:
                    next(run)
                except StopIteration as done:
                    return [int(x) for x in lane.solution] if done.value == K.FOUND else None
                yield

    def _attempt(self, capacity: int, heur: np.ndarray, zero_slack: bool, owner: Decider) -> Generator[None, None, int]:
        """One search with a static order, in this object's state, to its end: FOUND or INFEASIBLE
        (yields after every compiled slice, so the caller can stop or interleave it; ``owner.nodes``
        counts the nodes). ``zero_slack``: branch on the floor of a section without spare bytes (see
        :data:`TIGHT_HEURISTICS`)."""
        if self.pool.shape[0] < self.n or self.parts.shape[0] < self.nsec:  # what ``reset`` fills
            self.pool = K.grown(self.pool, self.n)
            self.parts = K.grown(self.parts, self.nsec)
        K.reset(
            self.st, self.frames, self.parts, self.decs, self.pool, self.mo, self.rem, self.cuts, self.solution,
            self.total0, self.cuts0, heur, self.width, self.area, self.size, self.sl, self.su, self.nsec, self.secp,
            self.seci, self.base,
        )
        budget = max(1, min(_SLICE, int(_SLICE_SECONDS / (_NODE_SECONDS * max(self.n, 1) ** 2))))
        while True:
            started = time.perf_counter()
            status, used = K.run(
                budget, capacity, self.unit_alignment, zero_slack,
                self.st, self.frames, self.parts, self.decs, self.pool, self.cand, self.mo, self.rem, self.cuts,
                self.solution, self.ulog_i, self.ulog_v, self.ureserve, self.dirty, self.dstamp,
                heur, self.width, self.area, self.size, self.align, self.sl, self.su,
                self.ovp, self.ovi, self.secp, self.seci, self.deep_mask, self.deep_off, self.ceil,
            )
            owner.nodes += used
            self.searched += used
            took = time.perf_counter() - started
            if used >= budget and took > 0:  # a full slice: fit the next one to the time it should take
                budget = max(1, min(_SLICE, int(budget * _SLICE_SECONDS / took)))
            if status == K.GROW:
                need = self.n + 16
                self.parts = K.grown(self.parts, int(self.st[4]) + need)
                self.pool = K.grown(self.pool, int(self.st[5]) + need)
                self.cand = K.grown(self.cand, int(self.st[3]) + need)
                self.ulog_i = K.grown(self.ulog_i, int(self.st[2]) + self.ureserve)
                self.ulog_v = K.grown(self.ulog_v, int(self.st[2]) + self.ureserve)
                continue
            if status != K.BUDGET:
                return status
            yield
