"""Coalescing: fewer, larger buffers whose packings are packings of the original.

Two rules, applied until neither changes anything:

- *stack*: buffers with the same lifetime become one buffer of their summed size, the members
  stacked in a fixed order (each at its offset in the stack);
- *chain*: when exactly one buffer of a size dies at a time step and exactly one of the same size
  is born then, the two become one buffer over both lifetimes, the members at one offset.

The live bytes at every time step are unchanged, so the lower bound (peak live bytes) is too. Any
packing of the coalesced buffers expands (:meth:`Coalesced.expand`) to a packing of the original
ones with the same arena. The converse does not hold: a packing may need two stacked buffers apart,
so "no packing" of a coalesced problem proves nothing about the original. Coalescing is a
heuristic that shrinks the search (a perfect packing of 400 buffers cut by guillotine and pinwheel
cuts coalesces to about 270) and removes the symmetric orders of stacked members.

Units: bytes and time steps; lifetimes half-open. Pure functions on plain data.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_memplan.placement.model import Buffer

__all__ = ["Coalesced", "coalesce"]


@dataclass(frozen=True)
class Coalesced:
    """Coalesced buffers and the way back.

    Invariants: ``buffers`` have ids ``0..m-1`` and sizes > 0; original buffer ``i`` (an index into
    the input) lies ``shift[i]`` bytes above the start of coalesced buffer ``into[i]``, inside it,
    and its alignment divides both ``shift[i]`` and that buffer's alignment.
    """

    buffers: tuple[Buffer, ...]
    into: tuple[int, ...]
    shift: tuple[int, ...]

    def expand(self, offsets: Sequence[int]) -> list[int]:
        """Offsets (bytes) of the original buffers from offsets (bytes) of the coalesced ones."""
        return [int(offsets[m]) + s for m, s in zip(self.into, self.shift)]


# A buffer being built: (lower, upper, size, alignment, members as (input index, shift in bytes)).
_Item = tuple[int, int, int, int, list[tuple[int, int]]]


def _stacks(items: list[_Item], most: int | None) -> list[_Item]:
    """Merge groups of items with one lifetime (of at most ``most`` items; ``None``: any number) whose
    offsets inside the stack keep every member's alignment."""
    groups: dict[tuple[int, int], list[_Item]] = defaultdict(list)
    for it in items:
        groups[(it[0], it[1])].append(it)
    out: list[_Item] = []
    for (lower, upper), group in groups.items():
        if len(group) < 2 or (most is not None and len(group) > most):
            out += group
            continue
        align = math.lcm(*(it[3] for it in group))
        if any(it[2] % align for it in group):
            out += group  # a member's size would misalign the next one
            continue
        members: list[tuple[int, int]] = []
        top = 0
        for it in group:
            members += [(i, top + s) for i, s in it[4]]
            top += it[2]
        out.append((lower, upper, top, align, members))
    return out


def _chains(items: list[_Item]) -> list[_Item]:
    """Merge each item with the one item of its size born when it dies, where both are unique."""
    dying: dict[tuple[int, int], list[int]] = defaultdict(list)
    born: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, (lower, upper, size, _, _) in enumerate(items):
        dying[(upper, size)].append(k)
        born[(lower, size)].append(k)
    out = list(items)
    used: set[int] = set()  # items merged in this pass, either side
    gone: set[int] = set()  # the later halves, now inside their predecessors
    for key, ks in dying.items():
        bs = born.get(key, [])
        if len(ks) != 1 or len(bs) != 1 or ks[0] in used or bs[0] in used:
            continue
        a, b = items[ks[0]], items[bs[0]]
        used.update((ks[0], bs[0]))
        gone.add(bs[0])
        out[ks[0]] = (a[0], b[1], a[2], math.lcm(a[3], b[3]), a[4] + b[4])
    return [it for k, it in enumerate(out) if k not in gone]


def coalesce(buffers: Sequence[Buffer], *, stack: int | None = None) -> Coalesced:
    """Coalesce ``buffers`` (sizes > 0 bytes) by the stack and chain rules until neither applies.

    Args:
        buffers: the buffers, in input order (``into``/``shift`` are indexed by this order).
        stack: the largest group of same-lifetime buffers stacked into one (``None``: any; a larger
            group is left as it is). Pairs alone keep more freedom; whole groups shrink more.
    """
    if stack is not None and (isinstance(stack, bool) or not isinstance(stack, int) or stack < 2):
        raise ValueError(f"`stack={stack!r}` is not valid. Expected an integer >= 2 or None.")
    if any(b.size <= 0 for b in buffers):
        raise ValueError("`coalesce(buffers=...)` got a buffer of size 0. Expected sizes > 0 bytes.")
    items: list[_Item] = [(b.lower, b.upper, b.size, b.alignment, [(i, 0)]) for i, b in enumerate(buffers)]
    while True:
        before = len(items)
        items = _chains(_stacks(items, stack))
        if len(items) == before:
            break
    into, shift = [0] * len(buffers), [0] * len(buffers)
    for m, (_, _, _, _, members) in enumerate(items):
        for i, s in members:
            into[i], shift[i] = m, s
    return Coalesced(
        buffers=tuple(Buffer(id=m, lower=lo, upper=up, size=sz, alignment=al) for m, (lo, up, sz, al, _) in enumerate(items)),
        into=tuple(into),
        shift=tuple(shift),
    )
