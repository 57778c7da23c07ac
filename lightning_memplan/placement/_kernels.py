"""Compiled inner loop (numba) of the exact placement search in :mod:`._decide`.

The depth-first search over canonical packings runs as an explicit-stack state machine on flat
int64 arrays, so that it can stop after a node budget and resume exactly where it was (the caller
checks the wall clock between budgets). Units: bytes for offsets and sizes, section indices for
time (a section is a maximal set of buffers live together, as MiniMalloc's sweep builds them).

Stacks (all LIFO):

- frames: one per search node; the node's partition, the canonical lower bound ``(cur, last)``
  (offset and rank of the previous placement), its candidates (a slice of ``cand``), and the
  buffer it has placed now (``-1``: none) with the undo mark of the ``mo`` log;
- partitions: a set of unplaced buffers (a slice of ``pool``, in rank order) confined to sections
  ``[s0, s1)``, solved from offset 0 upward, owned by a decomposition;
- decompositions: the independent partitions a placement split the rest of its partition into,
  solved one after the other; decomposition 0 is the problem itself.

Internal module: the entry point is :class:`lightning_memplan.placement._decide.Decider`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

INF = np.iinfo(np.int64).max // 4
"""``mo`` of a placed buffer (and "no unplaced buffer" for floors)."""

FOUND, INFEASIBLE, BUDGET, GROW = 0, 1, 2, 3
"""Statuses of :func:`run`: a packing is in ``solution``; none exists; node budget used (resume
with another call); a pool is too small (enlarge with :func:`grown` and resume)."""

_ENTER, _NEXT, _FAIL, _SUCCESS, _SOLVED, _UNSOLVABLE = 0, 1, 2, 3, 4, 5
# _SOLVED / _UNSOLVABLE: the top decomposition's partitions all succeeded / one of them failed
# st: mode, frame top, undo top, cand top, partition top, pool top, decomposition top, placements
# placed now (stacked placements plus solved partitions), most placed so far (kept across attempts)
_MODE, _FTOP, _UTOP, _CTOP, _PTOP, _POOLTOP, _DTOP, _STAMP, _PLACED, DEEP = range(10)
ST_LEN = 10
# frame columns
_PART, _CUR, _LAST, _CSTART, _CCOUNT, _CPOS, _C, _OFF, _R, _ULOG, _HAT, _TIGHT = range(12)
NF = 12
# partition columns
_S0, _S1, _MSTART, _MCOUNT, _OWNER, _FRAME0 = range(6)
NP = 6
# decomposition columns
_DFRAME, _DPOOL, _DPART0, _DCOUNT, _DCUR, _DSOLVED = range(6)
ND = 6

KEYS = {"W": 0, "A": 1, "T": 2, "Z": 3}
"""Preordering keys (descending): lifetime Width, Area, max section Total, siZe."""


@njit(cache=True)
def _start_part(p, parts, frames, ftop, pool, heur, width, area, size, sl, su, rem):
    """Sort partition ``p``'s members by the static order ``heur`` (keys descending, then buffer
    index; section totals as they are now) and push its root frame. Returns the new frame top."""
    ms = parts[p, _MSTART]
    mc = parts[p, _MCOUNT]
    members = pool[ms : ms + mc].copy()
    order = np.argsort(members, kind="mergesort")
    members = members[order]
    key = np.empty(mc, dtype=np.int64)
    for h in range(heur.shape[0] - 1, -1, -1):
        code = heur[h]
        for k in range(mc):
            b = members[k]
            if code == 0:
                key[k] = -width[b]
            elif code == 1:
                key[k] = -area[b]
            elif code == 2:
                t = 0
                for s in range(sl[b], su[b]):
                    if rem[s] > t:
                        t = rem[s]
                key[k] = -t
            else:
                key[k] = -size[b]
        order = np.argsort(key, kind="mergesort")
        members = members[order]
        key = key[order]
    pool[ms : ms + mc] = members
    f = ftop
    frames[f, _PART] = p
    frames[f, _CUR] = 0
    frames[f, _LAST] = -1
    frames[f, _C] = -1
    frames[f, _CCOUNT] = 0
    frames[f, _CPOS] = 0
    parts[p, _FRAME0] = f
    return ftop + 1


@njit(cache=True)
def _leave_floor(s, cnt0, mo, ulog_i, ulog_v, utop, dstamp, stamp, dirty, ndirty):
    """One buffer of section ``s`` leaves its floor (placed or raised): count it down (logging the
    count once per placement) and mark the section dirty when none is left there.
    Returns the new undo top and dirty count."""
    if dstamp[s] != stamp:
        dstamp[s] = stamp
        ulog_i[utop] = cnt0 + s
        ulog_v[utop] = mo[cnt0 + s]
        utop += 1
    mo[cnt0 + s] -= 1
    if mo[cnt0 + s] == 0:
        dirty[ndirty] = s
        ndirty += 1
    return utop, ndirty


@njit(cache=True)
def _undo(g, frames, mo, rem, cuts, size, sl, su, ulog_i, ulog_v, utop):
    """Take back frame ``g``'s placement. Returns the new undo top."""
    b = frames[g, _C]
    for s in range(sl[b], su[b] - 1):
        cuts[s] += 1
    for s in range(sl[b], su[b]):
        rem[s] += size[b]
    mark = frames[g, _ULOG]
    while utop > mark:
        utop -= 1
        mo[ulog_i[utop]] = ulog_v[utop]
    mo[b] = frames[g, _OFF]
    frames[g, _C] = -1
    return utop


@njit(cache=True)
def _add_part(src, x, y, owner, parts, ptop, pool, pooltop, mo, sl):
    """Open a partition for sections ``[x, y)`` holding the unplaced buffers of ``src`` that start
    there (none spans its ends), unless it would be empty. Returns the new partition and pool tops."""
    start = pooltop
    for b in src:
        if mo[b] < INF and x <= sl[b] < y:
            pool[pooltop] = b
            pooltop += 1
    if pooltop > start:
        parts[ptop, _S0] = x
        parts[ptop, _S1] = y
        parts[ptop, _MSTART] = start
        parts[ptop, _MCOUNT] = pooltop - start
        parts[ptop, _OWNER] = owner
        ptop += 1
    return ptop, pooltop


@njit(cache=True)
def reset(
    st, frames, parts, decs, pool, mo, rem, cuts, solution, total0, cuts0, heur, width, area, size, sl, su, nsec, secp,
    seci, base,
):
    """Start a fresh attempt with static order ``heur``: split at the sections no buffer spans.

    ``base`` is every buffer's initial ``min_off`` (bytes, aligned): the floor it rests on before
    anything is placed (all zeros for a free arena)."""
    n = size.shape[0]
    mo[:n] = base
    for s in range(nsec):  # a section's floor is the lowest base of its buffers; count those there
        fl = 0
        at = 0
        for e in range(secp[s], secp[s + 1]):
            m = base[seci[e]]
            if at == 0 or m < fl:
                fl = m
                at = 1
            elif m == fl:
                at += 1
        mo[n + s] = fl
        mo[n + nsec + s] = at
    rem[:] = total0
    cuts[:] = cuts0
    solution[:] = 0
    ptop = 0
    pooltop = 0
    decs[0, _DFRAME] = -1
    decs[0, _DPOOL] = 0
    decs[0, _DPART0] = 0
    everything = np.arange(n)
    x = 0
    for y in range(1, nsec + 1):
        if y < nsec and cuts0[y - 1] != 0:
            continue
        ptop, pooltop = _add_part(everything, x, y, 0, parts, ptop, pool, pooltop, mo, sl)
        x = y
    decs[0, _DCOUNT] = ptop
    decs[0, _DCUR] = 0
    decs[0, _DSOLVED] = 0
    st[_FTOP] = _start_part(0, parts, frames, 0, pool, heur, width, area, size, sl, su, rem)
    st[_UTOP] = 0
    st[_CTOP] = 0
    st[_PTOP] = ptop
    st[_POOLTOP] = pooltop
    st[_DTOP] = 1
    st[_STAMP] = 0
    st[_PLACED] = 0
    st[_MODE] = _ENTER


@njit(cache=True)
def _snapshot(n, mo, solution, decs, dtop, parts, pool, deep_mask, deep_off):
    """Record the partial packing of now: the buffers placed on the stack (``mo`` is ``INF``) and
    those of the solved partitions of every open decomposition, with their offsets (bytes)."""
    for b in range(n):
        deep_mask[b] = 1 if mo[b] == INF else 0
        deep_off[b] = solution[b]
    for d in range(dtop):
        for q in range(decs[d, _DPART0], decs[d, _DPART0] + decs[d, _DCUR]):
            for e in range(parts[q, _MSTART], parts[q, _MSTART] + parts[q, _MCOUNT]):
                deep_mask[pool[e]] = 1


@njit(cache=True)
def run(
    budget, capacity, unit_alignment, zero_slack,
    st, frames, parts, decs, pool, cand, mo, rem, cuts, solution, ulog_i, ulog_v, ureserve, dirty, dstamp,
    heur, width, area, size, align, sl, su, ovp, ovi, secp, seci, deep_mask, deep_off, ceil,
):
    """Search on from the state in ``st`` for at most ``budget`` nodes. Returns (status, nodes).

    ``ceil`` (bytes, per buffer, at most ``capacity``) is the highest top each buffer may reach.
    Pushing a buffer down never crosses its ceiling, so the canonical search stays complete; the
    section pruning keeps using ``capacity`` (a relaxation).

    ``deep_mask``/``deep_off`` receive the partial packing (all within ``capacity``) with the most
    buffers placed so far, whenever ``st[DEEP]`` (its count) is beaten.

    ``mo`` holds the ``min_off`` of the n buffers (``INF`` once placed), then the floor of every
    section (the lowest ``min_off`` of its unplaced buffers, ``INF`` if none), then how many of
    them sit at the floor; all undone through the log ``ulog_i``/``ulog_v`` (one placement logs at
    most ``ureserve`` entries). ``dirty``/``dstamp`` are scratch (one slot per section)."""
    n = size.shape[0]
    nsec = rem.shape[0]
    cnt0 = n + nsec
    stamp = st[_STAMP]
    mode = st[_MODE]
    ftop = st[_FTOP]
    utop = st[_UTOP]
    ctop = st[_CTOP]
    ptop = st[_PTOP]
    pooltop = st[_POOLTOP]
    dtop = st[_DTOP]
    placed = st[_PLACED]
    nodes = 0
    status = BUDGET
    cap = capacity
    while True:
        if mode == _ENTER:
            f = ftop - 1
            p = frames[f, _PART]
            ms = parts[p, _MSTART]
            mc = parts[p, _MCOUNT]
            if (
                ctop + mc > cand.shape[0]
                or pooltop + mc > pool.shape[0]
                or ptop + mc > parts.shape[0]
                or dtop + 1 > decs.shape[0]
                or utop + ureserve > ulog_i.shape[0]
            ):
                status = GROW
                break
            if nodes >= budget:
                status = BUDGET
                break
            nodes += 1
            frames[f, _CSTART] = ctop
            frames[f, _CCOUNT] = 0
            frames[f, _CPOS] = 0
            frames[f, _C] = -1
            height = INF
            for k in range(mc):
                b = pool[ms + k]
                m = mo[b]
                if m < INF:
                    h = m + size[b]
                    if h < height:
                        height = h
            if height == INF:
                mode = _SUCCESS
                continue
            # Every section still to fill stacks from at least the new offset: offset + rem <= cap.
            maxrem = 0
            for s in range(parts[p, _S0], parts[p, _S1]):
                if rem[s] > maxrem:
                    maxrem = rem[s]
            limit = min(height, cap - maxrem + 1)
            cur = frames[f, _CUR]
            last = frames[f, _LAST]
            cs = ctop
            count = 0
            for k in range(mc):
                m = mo[pool[ms + k]]
                if m < limit and (m > cur or (m == cur and k > last)):
                    j = cs + count
                    while j > cs and mo[pool[ms + cand[j - 1]]] > m:
                        cand[j] = cand[j - 1]
                        j -= 1
                    cand[j] = k
                    count += 1
            # Zero slack: a section whose unplaced buffers exactly fill the bytes above its floor has
            # its floor byte covered by one of them, placed there. When that floor is the lowest
            # offset any candidate takes, branch on that buffer only (the tightest such section,
            # fewest at its floor); the others at this offset are time-disjoint from it, so the
            # child admits every rank at this offset again (complete, some orders repeat).
            frames[f, _TIGHT] = 0
            if zero_slack and count > 1:
                low = mo[pool[ms + cand[cs]]]
                tight = -1
                fewest = INF
                for s in range(parts[p, _S0], parts[p, _S1]):
                    if mo[n + s] == low and low + rem[s] == cap and mo[cnt0 + s] < fewest:
                        fewest = mo[cnt0 + s]
                        tight = s
                if tight >= 0:
                    kept = 0
                    for j in range(count):
                        b = pool[ms + cand[cs + j]]
                        if mo[b] == low and sl[b] <= tight < su[b]:
                            cand[cs + kept] = cand[cs + j]
                            kept += 1
                    count = kept
                    frames[f, _TIGHT] = 1
            frames[f, _CCOUNT] = count
            ctop = cs + count
            mode = _NEXT
        elif mode == _NEXT:
            f = ftop - 1
            if frames[f, _C] >= 0:
                utop = _undo(f, frames, mo, rem, cuts, size, sl, su, ulog_i, ulog_v, utop)
                placed -= 1
                if frames[f, _HAT] == 0:
                    # Nothing unplaced lies above the buffer just tried: it sits at its min_off in
                    # every completion, so it comes first in canonical order and the rest fail too.
                    mode = _FAIL
                    continue
            pos = frames[f, _CPOS]
            if pos >= frames[f, _CCOUNT]:
                mode = _FAIL
                continue
            frames[f, _CPOS] = pos + 1
            r = cand[frames[f, _CSTART] + pos]
            p = frames[f, _PART]
            ms = parts[p, _MSTART]
            b = pool[ms + r]
            off = mo[b]
            top = off + size[b]
            if top > ceil[b]:
                continue
            frames[f, _C] = b
            placed += 1
            frames[f, _OFF] = off
            frames[f, _R] = r
            frames[f, _ULOG] = utop
            mo[b] = INF
            hat = 0
            # A section's floor rises once the last buffer at the floor is placed or raised.
            stamp += 1
            ndirty = 0
            for s in range(sl[b], su[b]):
                if mo[n + s] == off:
                    utop, ndirty = _leave_floor(s, cnt0, mo, ulog_i, ulog_v, utop, dstamp, stamp, dirty, ndirty)
            for e in range(ovp[b], ovp[b + 1]):
                j = ovi[e]
                m = mo[j]
                if m < INF:
                    hat = 1
                    t = top
                    if not unit_alignment:
                        a = align[j]
                        t = -((-top) // a) * a
                    if m < t:
                        ulog_i[utop] = j
                        ulog_v[utop] = m
                        utop += 1
                        mo[j] = t
                        for s in range(sl[j], su[j]):
                            if mo[n + s] == m:
                                utop, ndirty = _leave_floor(
                                    s, cnt0, mo, ulog_i, ulog_v, utop, dstamp, stamp, dirty, ndirty
                                )
            frames[f, _HAT] = hat
            sz = size[b]
            for s in range(sl[b], su[b]):
                rem[s] -= sz
            for s in range(sl[b], su[b] - 1):
                cuts[s] -= 1
            # Cross sections: the unplaced buffers stack from the floor, so floor + rem <= cap. Only
            # a risen floor can newly fail (rem only shrinks).
            ok = True
            for k in range(ndirty):
                s = dirty[k]
                fl = INF
                at = 0
                for e in range(secp[s], secp[s + 1]):
                    m = mo[seci[e]]
                    if m < fl:
                        fl = m
                        at = 1
                    elif m == fl:
                        at += 1
                ulog_i[utop] = n + s
                ulog_v[utop] = mo[n + s]
                utop += 1
                mo[n + s] = fl
                mo[cnt0 + s] = at if fl < INF else 0
                if fl < INF and fl + rem[s] > cap:
                    ok = False
                    break
            if not ok:
                continue  # undone at the top of the next iteration
            solution[b] = off
            if placed > st[DEEP]:
                st[DEEP] = placed
                _snapshot(n, mo, solution, decs, dtop, parts, pool, deep_mask, deep_off)
            split = False
            for s in range(sl[b], su[b] - 1):
                if cuts[s] == 0:
                    split = True
                    break
            if not split:
                g = ftop
                frames[g, _PART] = p
                frames[g, _CUR] = off
                frames[g, _LAST] = -1 if frames[f, _TIGHT] else r
                frames[g, _C] = -1
                ftop += 1
                mode = _ENTER
                continue
            # Decompose: the unplaced rest falls apart into independent runs of sections.
            mc = parts[p, _MCOUNT]
            d = dtop
            dtop += 1
            decs[d, _DFRAME] = f
            decs[d, _DPOOL] = pooltop
            decs[d, _DPART0] = ptop
            decs[d, _DCUR] = 0
            decs[d, _DSOLVED] = 0
            x = parts[p, _S0]
            s1 = parts[p, _S1]
            s = sl[b]
            while x < s1:
                while s < su[b] - 1 and cuts[s] != 0:
                    s += 1
                y = s + 1 if s < su[b] - 1 else s1
                s += 1
                ptop, pooltop = _add_part(pool[ms : ms + mc], x, y, d, parts, ptop, pool, pooltop, mo, sl)
                x = y
            decs[d, _DCOUNT] = ptop - decs[d, _DPART0]
            if ptop == decs[d, _DPART0]:
                mode = _SOLVED
                continue
            ftop = _start_part(decs[d, _DPART0], parts, frames, ftop, pool, heur, width, area, size, sl, su, rem)
            mode = _ENTER
        elif mode == _FAIL:
            f = ftop - 1
            ctop = frames[f, _CSTART]
            ftop -= 1
            p = frames[f, _PART]
            mode = _UNSOLVABLE if parts[p, _FRAME0] == f else _NEXT
        elif mode == _SOLVED or mode == _UNSOLVABLE:
            d = dtop - 1
            ptop = decs[d, _DPART0]
            pooltop = decs[d, _DPOOL]
            dtop -= 1
            placed -= decs[d, _DSOLVED]
            if decs[d, _DFRAME] < 0:
                status = FOUND if mode == _SOLVED else INFEASIBLE
                break
            # Back at the decomposing frame: its partition is complete, or its placement failed.
            mode = _SUCCESS if mode == _SOLVED else _NEXT
        else:  # _SUCCESS: the top frame's partition has every buffer placed
            p = frames[ftop - 1, _PART]
            f0 = parts[p, _FRAME0]
            while ftop - 1 >= f0:
                g = ftop - 1
                if frames[g, _C] >= 0:
                    utop = _undo(g, frames, mo, rem, cuts, size, sl, su, ulog_i, ulog_v, utop)
                    placed -= 1
                ctop = frames[g, _CSTART]
                ftop -= 1
            d = parts[p, _OWNER]
            decs[d, _DCUR] += 1
            decs[d, _DSOLVED] += parts[p, _MCOUNT]
            placed += parts[p, _MCOUNT]
            if decs[d, _DCUR] < decs[d, _DCOUNT]:
                ftop = _start_part(
                    decs[d, _DPART0] + decs[d, _DCUR], parts, frames, ftop, pool, heur, width, area, size, sl, su, rem
                )
                mode = _ENTER
                continue
            mode = _SOLVED
    st[_MODE] = mode
    st[_FTOP] = ftop
    st[_UTOP] = utop
    st[_CTOP] = ctop
    st[_PTOP] = ptop
    st[_POOLTOP] = pooltop
    st[_DTOP] = dtop
    st[_STAMP] = stamp
    st[_PLACED] = placed
    return status, nodes


def grown(a: np.ndarray, need: int) -> np.ndarray:
    """``a`` (1-D or rows of 2-D) at least doubled and at least ``need`` long, contents kept."""
    rows = max(2 * a.shape[0], need)
    out = np.zeros((rows,) + a.shape[1:], dtype=a.dtype)
    out[: a.shape[0]] = a
    return out
