"""Exact decision procedure: can these buffers be packed below ``capacity`` bytes?

A depth-first search over *canonical* solutions, after the ideas of MiniMalloc (Moffitt, ASPLOS
2023). Every feasible packing can be pushed down until each buffer rests at offset 0 or on top of a
buffer live at the same time (rounded up to its alignment); listing the buffers by offset, each one
sits exactly on the highest top among the earlier ones it overlaps in time. So the search only
chooses an *order*: the next buffer goes to its lowest offset (``min_off``, the highest aligned top of
the placed buffers it overlaps), and offsets never decrease along a branch. Pruning:

- cross sections: time is cut into sections where the set of live buffers is constant; in every
  section the unplaced buffers must stack above ``max(current offset, lowest min_off among them)``,
  so that plus their total size must stay within ``capacity``;
- dominance: a buffer whose ``min_off`` is at or above the lowest possible top of another unplaced
  buffer is not tried, since that other buffer fits in the gap below it;
- decomposition: once no unplaced buffer spans the boundary between two sections, the two sides are
  independent and solved one after the other (a failure of one side fails the branch at once);
- several static orders (by section total, area, lifetime width) are tried round robin under a
  doubling node limit, so that one unlucky order does not sink the search.

Units: bytes and (compressed) time sections; lifetimes half-open. Internal module: the public entry
point is :func:`lightning_memplan.placement.search.exact_search`.
"""
from __future__ import annotations

import sys
import time

import numpy as np

_INF = np.iinfo(np.int64).max // 4


class Timeout(Exception):
    """The deadline passed during the search."""


class _NodeLimit(Exception):
    """The node budget of one round-robin attempt ran out."""


HEURISTICS = ("WAT", "TAW", "TWA")
"""Static orders tried round robin: by lifetime Width, Area, section Total (descending)."""


class Decider:
    """Search state for one problem; :meth:`solve` answers one capacity."""

    def __init__(
        self,
        lower: list[int],
        upper: list[int],
        size: list[int],
        align: list[int],
        heuristics: tuple[str, ...] = HEURISTICS,
    ) -> None:
        """Precompute sections, overlaps and static orders (sizes > 0 bytes, ``lower < upper``)."""
        n = len(size)
        self.n = n
        self.size_l = list(size)
        self.size = np.asarray(size, dtype=np.int64)
        self.align = np.asarray(align, dtype=np.int64)
        self.unit_alignment = bool((self.align == 1).all())  # no rounding of min_off needed
        times = np.unique(np.asarray(list(lower) + list(upper), dtype=np.int64))
        sl = np.searchsorted(times, np.asarray(lower, dtype=np.int64)).astype(np.int64)
        su = np.searchsorted(times, np.asarray(upper, dtype=np.int64)).astype(np.int64)
        self.nsec = max(len(times) - 1, 1)
        self.sl, self.su = [int(x) for x in sl], [int(x) for x in su]
        self.sl_np, self.su_np = sl, su
        diff = np.zeros(self.nsec + 1, dtype=np.int64)
        np.add.at(diff, sl, self.size)
        np.add.at(diff, su, -self.size)
        self.total0 = np.cumsum(diff)[: self.nsec]
        members: list[list[int]] = [[] for _ in range(self.nsec)]
        for i in range(n):
            for s in range(self.sl[i], self.su[i]):
                members[s].append(i)
        width_max = max((len(m) for m in members), default=1) or 1
        secmem = np.full((self.nsec, width_max), n, dtype=np.int64)  # n: sentinel, min_off _INF
        for s, m in enumerate(members):
            secmem[s, : len(m)] = m
        self.secmem = secmem
        ov = (sl[:, None] < su[None, :]) & (sl[None, :] < su[:, None])
        np.fill_diagonal(ov, False)
        self.overlaps = [np.flatnonzero(ov[i]) for i in range(n)]
        cdiff = np.zeros(self.nsec + 1, dtype=np.int64)  # cuts[s]: buffers spanning sections s, s+1
        np.add.at(cdiff, sl, 1)
        np.add.at(cdiff, su - 1, -1)
        self.cuts0 = np.cumsum(cdiff)[: self.nsec]
        area = [size[i] * (upper[i] - lower[i]) for i in range(n)]
        width = [upper[i] - lower[i] for i in range(n)]
        total = [int(self.total0[self.sl[i] : self.su[i]].max()) for i in range(n)]
        keys = {"A": area, "W": width, "T": total, "Z": list(size)}
        self.preorders = []
        for h in heuristics:
            order = sorted(range(n), key=lambda i: tuple(-keys[c][i] for c in h) + (i,))
            rank = np.empty(n, dtype=np.int64)
            rank[np.asarray(order, dtype=np.int64)] = np.arange(n)
            self.preorders.append(rank)
        self.nodes = 0

    # ------------------------------------------------------------------ search
    def solve(self, capacity: int, deadline: float) -> list[int] | None:
        """Offsets (bytes) of a packing within ``capacity``, or ``None`` when none exists.

        Raises :class:`Timeout` when ``deadline`` (``time.perf_counter()`` seconds) passes first.
        """
        if self.n == 0:
            return []
        if int(self.total0.max()) > capacity or int(self.size.max()) > capacity:
            return None
        self.capacity = capacity
        self.deadline = deadline
        limit = self.n
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 20 * self.n + 1000))
        try:
            while True:
                limit *= 2
                for rank in self.preorders:
                    self.rank = rank
                    self.remaining = limit
                    try:
                        return self._solve_all()
                    except _NodeLimit:
                        continue
        finally:
            sys.setrecursionlimit(old)

    def _solve_all(self) -> list[int] | None:
        """One complete attempt with the current static order (may raise the node limit)."""
        self.mo = np.zeros(self.n + 1, dtype=np.int64)  # min_off; _INF once placed (and at n)
        self.mo[self.n] = _INF
        self.rem = self.total0.copy()
        self.cuts = self.cuts0.copy()
        self.solution = [0] * self.n
        self.offset = [0] * self.n
        bounds = [0] + [s + 1 for s in np.flatnonzero(self.cuts[:-1] == 0)] + [self.nsec]
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = np.flatnonzero((self.sl_np < b) & (self.su_np > a))
            if part.size and not self._subsolve(part, a, b):
                return None
        return list(self.solution)

    def _subsolve(self, part: np.ndarray, s0: int, s1: int) -> bool:
        """Solve the buffers ``part`` confined to sections ``[s0, s1)`` from offset 0 upward."""
        return self._search(part, s0, s1, 0, -1)

    def _search(self, part: np.ndarray, s0: int, s1: int, cur: int, last: int) -> bool:
        self.remaining -= 1
        if self.remaining < 0:
            raise _NodeLimit
        self.nodes += 1
        if time.perf_counter() > self.deadline:
            raise Timeout
        mo = self.mo[part]
        live = mo < _INF
        if not live.any():
            for i in part:
                self.solution[i] = self.offset[i]
            return True
        p, m = part[live], mo[live]
        height = int((m + self.size[p]).min())
        rk = self.rank[p]
        # Every section still to fill must stack from at least the new offset: offset + rem <= cap.
        limit = min(height, self.capacity - int(self.rem[s0:s1].max()) + 1)
        ok = (m < limit) & ((m > cur) | ((m == cur) & (rk > last)))
        if not ok.any():
            return False
        cp, cm, cr = p[ok], m[ok], rk[ok]
        order = np.lexsort((cr, cm))
        cap = self.capacity
        for k in order:
            c, off, r = int(cp[k]), int(cm[k]), int(cr[k])
            top = off + self.size_l[c]
            if top > cap:
                continue
            # place c
            self.offset[c] = off
            self.mo[c] = _INF
            js = self.overlaps[c]
            old = self.mo[js]
            if self.unit_alignment:
                new = np.maximum(old, top)
            else:
                al = self.align[js]
                new = np.maximum(old, -(-top // al) * al)
            self.mo[js] = new
            a, b = self.sl[c], self.su[c]
            self.rem[a:b] -= self.size_l[c]
            # Only sections under c or under a buffer whose min_off rose can newly fail; the
            # monotone part (offset + rem <= cap) was settled by ``limit`` above.
            raised = js[new > old]
            if raised.size:
                a2, b2 = max(s0, min(a, int(self.sl_np[raised].min()))), min(s1, max(b, int(self.su_np[raised].max())))
            else:
                a2, b2 = max(s0, a), min(s1, b)
            if self._check(a2, b2):
                found = self._decompose(part, s0, s1, off, r, c)
            else:
                found = False
            self.rem[a:b] += self.size_l[c]
            self.mo[js] = old
            self.mo[c] = off
            if found:
                return True
            if not (old < _INF).any():
                # Nothing unplaced lies above c: it sits at min_off in every completion, so
                # putting it first loses nothing and the other choices fail as well.
                return False
        return False

    def _check(self, s0: int, s1: int) -> bool:
        """Cross-section bound on sections ``[s0, s1)``: the unplaced buffers of a section stack
        from the lowest min_off among them, so that plus their total size must fit the capacity."""
        cap = self.capacity
        floor = self.mo[self.secmem[s0:s1]].min(axis=1)  # _INF where nothing is left to place
        np.minimum(floor, cap, out=floor)
        floor += self.rem[s0:s1]
        return int(floor.max()) <= cap

    def _decompose(self, part: np.ndarray, s0: int, s1: int, off: int, r: int, c: int) -> bool:
        self.solution[c] = off
        a, b = self.sl[c], self.su[c]
        seg = self.cuts[a : b - 1]
        seg -= 1
        zeros = np.flatnonzero(seg == 0)
        try:
            if zeros.size == 0:
                return self._search(part, s0, s1, off, r)
            bounds = [s0] + [int(z) + a + 1 for z in zeros] + [s1]
            mo = self.mo[part]
            rest = part[mo < _INF]
            for x, y in zip(bounds[:-1], bounds[1:]):
                sub = rest[(self.sl_np[rest] < y) & (self.su_np[rest] > x)]
                if sub.size and not self._subsolve(sub, x, y):
                    return False
            return True
        finally:
            seg += 1
