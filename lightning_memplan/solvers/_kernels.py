"""Compiled inner loops (numba) of the quantized dynamic programs.

All kernels work on integer item sizes ``q`` (quanta, >= 1: zero-size and oversize items are
removed by the callers) and float64 values ``v`` (> 0), and keep a DP row ``best[j]`` = the best
total value of a subset of the items seen so far whose quantized size is ``<= j``.

Tie rule shared by every kernel: an item replaces the current best for a capacity only when it
makes the value *strictly* larger, so among equal-value plans the one that saves fewer of the
later items wins.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def _extend(best: np.ndarray, reach: int, w: int, capacity: int) -> int:
    """Grow the valid prefix of ``best`` from ``reach`` to ``min(capacity, reach + w)``.

    Above ``reach`` every capacity holds ``best[reach]`` (all items seen so far fit), so the new
    cells are filled with it; returns the new reach.
    """
    new_reach = min(capacity, reach + w)
    fill = best[reach]
    for j in range(reach + 1, new_reach + 1):
        best[j] = fill
    return new_reach


@njit(cache=True, nogil=True)
def dp_bits(q: np.ndarray, v: np.ndarray, capacity: int, keep: np.ndarray) -> np.ndarray:
    """Forward DP over all items for capacities ``0..capacity``; records decisions as bits.

    ``keep`` is a zeroed ``uint8[n, (capacity + 8) // 8]`` array: bit ``j`` of row ``i`` is set
    when item ``i`` is taken in the best plan of capacity ``j`` among items ``0..i``, for
    ``j <= reach_i`` (see :func:`backtrack_bits`). Returns the final row (float64,
    length ``capacity + 1``).

    Speed: after item ``i`` every capacity above ``reach_i = min(capacity, q[0] + ... + q[i])``
    holds the same value (everything seen so far fits), so only ``q[i]..reach_i`` is updated.
    Callers sort items by size, ascending, which makes ``reach`` grow slowly and skips most cells.
    """
    best = np.zeros(capacity + 1)
    reach = 0
    for i in range(q.shape[0]):
        w = q[i]
        if w > capacity:
            continue
        val = v[i]
        new_reach = _extend(best, reach, w, capacity)
        row = keep[i]
        for j in range(new_reach, w - 1, -1):
            cand = best[j - w] + val
            if cand > best[j]:
                best[j] = cand
                row[j >> 3] |= np.uint8(1 << (j & 7))
        reach = new_reach
    _extend(best, reach, capacity, capacity)
    return best


@njit(cache=True, nogil=True)
def backtrack_bits(
    q: np.ndarray, keep: np.ndarray, capacity: int, start: int, out: np.ndarray
) -> None:
    """Walk the decision bits of :func:`dp_bits` back from capacity ``start``.

    Sets ``out[i] = True`` for saved items. Above ``reach_i`` the best plan of items ``0..i`` is
    the one at ``reach_i``, so the walk clamps ``j`` to it first.
    """
    n = q.shape[0]
    reach = np.empty(n, dtype=np.int64)
    r = 0
    for i in range(n):
        if q[i] <= capacity:
            r = min(capacity, r + q[i])
        reach[i] = r
    j = start
    for i in range(n - 1, -1, -1):
        if q[i] > capacity:
            continue
        if j > reach[i]:
            j = reach[i]
        if (keep[i, j >> 3] >> (j & 7)) & 1:
            out[i] = True
            j -= q[i]


@njit(cache=True, nogil=True)
def dp_row(q: np.ndarray, v: np.ndarray, lo: int, hi: int, capacity: int, best: np.ndarray) -> None:
    """Best-value row of items ``lo..hi-1`` (in that order) into ``best[0..capacity]``, in place.

    Same recurrence and ``reach`` bound as :func:`dp_bits`, without decisions.
    """
    for j in range(capacity + 1):
        best[j] = 0.0
    reach = 0
    for i in range(lo, hi):
        w = q[i]
        if w > capacity:
            continue
        val = v[i]
        new_reach = _extend(best, reach, w, capacity)
        for j in range(new_reach, w - 1, -1):
            cand = best[j - w] + val
            if cand > best[j]:
                best[j] = cand
        reach = new_reach
    _extend(best, reach, capacity, capacity)


@njit(cache=True, nogil=True)
def hirschberg(q: np.ndarray, v: np.ndarray, capacity: int, leaf_cells: int) -> np.ndarray:
    """Optimal 0/1 knapsack in O(capacity + n + leaf_cells / 8) memory (divide and conquer).

    A segment of items with capacity ``c`` is split in two halves; the best-value rows of the left
    half (``F``) and the right half (``B``) give the optimal division of the capacity
    ``k = argmax F[k] + B[c - k]`` (the smallest such ``k``), and each half is solved with its
    share. Segments whose decision table has at most ``leaf_cells`` cells are solved directly with
    :func:`dp_bits`. Returns a boolean mask of saved items.
    """
    n = q.shape[0]
    saved = np.zeros(n, dtype=np.bool_)
    front = np.empty(capacity + 1)
    back = np.empty(capacity + 1)
    # explicit stack of (lo, hi, capacity)
    stack = np.empty((2 * (n + 1) + 64, 3), dtype=np.int64)
    top = 0
    stack[0, 0] = 0
    stack[0, 1] = n
    stack[0, 2] = capacity
    top = 1
    while top > 0:
        top -= 1
        lo = stack[top, 0]
        hi = stack[top, 1]
        c = stack[top, 2]
        m = hi - lo
        if m <= 0:
            continue
        if m * (c + 1) <= leaf_cells or m == 1:
            keep = np.zeros((m, (c + 8) // 8), dtype=np.uint8)
            row = dp_bits(q[lo:hi], v[lo:hi], c, keep)
            # smallest capacity that reaches the optimum: the plan with the least memory
            start = c
            target = row[c]
            while start > 0 and row[start - 1] == target:
                start -= 1
            sub = np.zeros(m, dtype=np.bool_)
            backtrack_bits(q[lo:hi], keep, c, start, sub)
            for i in range(m):
                saved[lo + i] = sub[i]
            continue
        mid = lo + m // 2
        dp_row(q, v, lo, mid, c, front)
        dp_row(q, v, mid, hi, c, back)
        k_best = 0
        s_best = front[0] + back[c]
        for k in range(1, c + 1):
            s = front[k] + back[c - k]
            if s > s_best:
                s_best = s
                k_best = k
        stack[top, 0] = mid
        stack[top, 1] = hi
        stack[top, 2] = c - k_best
        top += 1
        stack[top, 0] = lo
        stack[top, 1] = mid
        stack[top, 2] = k_best
        top += 1
    return saved


@njit(cache=True, nogil=True)
def frontier_row(q: np.ndarray, v: np.ndarray, capacity: int) -> np.ndarray:
    """Best value for every capacity ``0..capacity`` in one pass (no decisions kept)."""
    best = np.zeros(capacity + 1)
    dp_row(q, v, 0, q.shape[0], capacity, best)
    return best
