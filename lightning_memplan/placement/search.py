"""The strongest placement: exact search over canonical packings, anytime under a time limit.

For one space, :func:`exact_search` minimizes the arena (bytes) between the lower bound (peak live
bytes) and the best greedy plan: when no greedy plan fits it asks the exact decision procedure (see
:mod:`lightning_memplan.placement._decide`) for a packing at the lower bound and, raced against it,
within the space's capacity, in turns with the same search on coalesced buffers
(:mod:`lightning_memplan.placement.coalesce`) and CP-SAT (:mod:`lightning_memplan.placement._cpsat`)
at the lower bound; then it bisects the range left. Every packing it finds
is kept, so when the time limit hits it returns the best plan so far with ``timed_out=True``;
``optimal=True`` means the arena equals a proven bound. If no packing within capacity is found in
the first :data:`EXACT_SHARE` of the time limit, :data:`LNS_SHARE` of the rest goes to
large-neighbourhood search (:mod:`lightning_memplan.placement.improve`) from the best of greedy and
canonical dives (:func:`_start`); its plan is used when it fits the capacity. For a single space
the time left then completes the partial placement that leaves out the fewest buffers (greedy's,
the improved plan cut at capacity, or the exact search's deepest: :meth:`Decider.deepest`) by
exact window repairs (:mod:`lightning_memplan.placement.complete`); a completion is a plan within
capacity, else the partial placement is returned (``timed_out``, buffers in ``unplaced``).

Over a hierarchy it first tries to put every buffer in the first space. If that is impossible (or
not found in time) it keeps the best greedy plan's choice of space per buffer and minimizes the
arena of each space separately; optimality is then only claimed per space for that choice.
Zero-size buffers occupy no bytes and are put at offset 0 of the first space.
"""
from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import Protocol

from lightning_memplan.placement._cpsat import cp_sat_pack
from lightning_memplan.placement._decide import HEURISTICS, Decider, Timeout, warm_up
from lightning_memplan.placement.bounds import peak_live
from lightning_memplan.placement.coalesce import Coalesced, coalesce
from lightning_memplan.placement.complete import complete
from lightning_memplan.placement.greedy import fill, greedy_by_position, greedy_by_size
from lightning_memplan.placement.improve import improve
from lightning_memplan.placement.model import (
    Buffer,
    MemorySpace,
    Plan,
    as_buffers,
    as_spaces,
    check_fits,
)

__all__ = ["exact_search"]

DEFAULT_TIME_LIMIT = 60.0
"""Seconds the CLI gives the search by default."""


class _Space:
    """Minimizes the arena of one space for a fixed set of buffers."""

    def __init__(self, bufs: tuple[Buffer, ...], members: list[int]) -> None:
        self.members = [i for i in members if bufs[i].size > 0]
        self.bufs = bufs
        #: The members' buffers, in member order.
        self.chosen = [bufs[i] for i in self.members]
        self.decider = Decider.of(self.chosen)
        self.lower_bound = peak_live(self.chosen)[0]
        self.racers: list[Decider] = []

    def coalesced(self) -> list[Coalesced]:
        """The distinct coalescings of the members (:data:`COALESCE_STACKS`) with fewer buffers."""
        out: list[Coalesced] = []
        for most in COALESCE_STACKS:
            c = coalesce(self.chosen, stack=most)
            if len(c.buffers) < len(self.chosen) and all((c.into, c.shift) != (o.into, o.shift) for o in out):
                out.append(c)
        return out

    def arena(self, offsets: list[int]) -> int:
        return max((o + self.bufs[i].size for i, o in zip(self.members, offsets)), default=0)

    def minimize(
        self, capacity: int, incumbent: list[int] | None, deadline: float, race_deadline: float | None = None
    ) -> tuple[list[int] | None, bool, bool]:
        """Best offsets found (per member, bytes), whether proven optimal, whether time cut the search.

        ``incumbent`` (offsets within ``capacity``) seeds the upper bound. A ``None`` result means no
        packing within ``capacity`` exists (not timed out) or none was found in time (timed out):
        by ``race_deadline`` (default ``deadline``) while there is no incumbent, so that the caller
        can spend the rest on :func:`lightning_memplan.placement.improve.improve`.
        ``self.found_at`` is the ``perf_counter`` time when the returned offsets were found.

        The search goes from the bound up: without an incumbent it races a search at the lower bound
        (two thirds of the race's time) against one at ``capacity``, so slack never hides a packing
        that the tight search finds (a packing at the bound answers every capacity), and gives
        the search on coalesced buffers and CP-SAT turns at the bound (:meth:`_first`); then it
        bisects.
        """
        self.found_at = time.perf_counter()
        best = incumbent
        lo = self.lower_bound
        if best is None:
            stop = deadline if race_deadline is None else min(deadline, race_deadline)
            probes = [(lo, self.decider)] + ([(capacity, self.decider.fork())] if capacity > lo else [])
            self.racers = [d for _, d in probes]  # their deepest partial packings answer a failure
            race = _Race(probes)
            best, lo, proven = self._first(race, lo, capacity, stop)
            if best is None:
                return None, False, not proven
            self.found_at = time.perf_counter()
            if self.arena(best) <= lo:
                return best, True, False
        # Probe the lower bound first (often tight), then bisect. A probe gets half the time left,
        # so a hard "no" cannot eat the budget; an undecided target sends the next probe upward.
        hi = self.arena(best)
        target, cut = lo, False
        while lo <= target < hi:
            now = time.perf_counter()
            if now >= deadline:
                return best, False, True
            try:
                found = self.decider.solve(target, min(deadline, now + (deadline - now) / 2))
            except Timeout:
                cut = True
                target = (target + hi + 1) // 2
                continue
            if found is None:
                lo = target + 1
            else:
                best, hi = found, self.arena(found)
                self.found_at = time.perf_counter()
            target = (lo + hi) // 2
        return best, lo >= hi, cut

    def _first(self, race: _Race, lo: int, capacity: int, stop: float) -> tuple[list[int] | None, int, bool]:
        """The first packing within ``capacity``: ``(offsets or None, proven lower bound, whether
        "none" is proven)``. Until ``stop``, :data:`TURNS` turns of equal length alternate the
        compiled race (each resumed where it stopped), the compiled search on coalesced buffers
        at the lower bound (:meth:`coalesced`; resumed too) and CP-SAT at the lower bound (each run
        anew, with the next random seed, from CP-SAT's default 1). The three answer different
        instances (see :mod:`lightning_memplan.placement._cpsat` and
        :mod:`lightning_memplan.placement.coalesce`); the race goes first because it answers most in
        well under a second. CP-SAT's time to answer varies with its seed by an order of magnitude
        (perfect#22: 1 s with seed 1, no answer in 10 s with seed 0), so short runs with new seeds
        answer more often than one long run. The coalesced search proves nothing when it finds
        nothing: then its turns pass."""
        start = time.perf_counter()
        shortcut: _Race | None = None
        for k, turn in enumerate(TURNS):
            until = start + (k + 1) * (stop - start) / len(TURNS)
            while True:
                if lo not in race.capacities() and turn != "race":
                    break  # the race has settled the bound already
                if turn == "coalesced":
                    if lo != self.lower_bound:
                        break
                    if shortcut is None:
                        shortcut = _Race([(lo, _Expanded(c)) for c in self.coalesced()], proves=False)
                    try:
                        target, found = shortcut.until(until)
                    except Timeout:
                        break
                elif turn == "cp-sat":
                    try:
                        found = cp_sat_pack(self.chosen, lo, until, seed=1 + TURNS[:k].count("cp-sat"))
                    except Timeout:
                        break
                    target = lo
                    race.drop(target)
                else:
                    try:
                        target, found = race.until(until)
                    except Timeout:
                        break
                if found is not None:
                    return found, lo, False
                if target == capacity:
                    return None, lo, True  # proven: nothing fits within capacity
                lo = target + 1  # proven: nothing fits at the bound; the race goes on at capacity
        return None, lo, False


_WEIGHTS = (2, 1)
"""Shares of wall time per racer of :class:`_Race` (the first, tightest, gets more)."""

TURNS = ("race", "coalesced", "cp-sat", "race", "cp-sat", "race")
"""The turns of equal length that :meth:`_Space._first` gives the compiled race, the compiled search
on coalesced buffers and CP-SAT."""

COALESCE_STACKS = (2, None)
"""The largest groups of same-lifetime buffers stacked into one by the coalescings searched
(:func:`lightning_memplan.placement.coalesce.coalesce`; ``None``: any). Pairs alone and whole groups
answer different instances (perfect#29 of ``benchmarks/placement.py`` coalesces to 269 and 239
buffers: the first is packed at the bound in under a second, the second not in 10 s)."""


class _Steps(Protocol):
    """A decision search run one slice at a time (as :meth:`Decider.steps`)."""

    def steps(self, capacity: int) -> Generator[None, None, list[int] | None]: ...


class _Expanded:
    """The compiled search on coalesced buffers, answering with offsets (bytes) of the original
    buffers (in the order given to :func:`lightning_memplan.placement.coalesce.coalesce`). ``None``
    means only that no packing keeps the coalesced buffers together."""

    def __init__(self, coalesced: Coalesced) -> None:
        self.coalesced = coalesced
        self.decider = Decider.of(coalesced.buffers)

    def steps(self, capacity: int) -> Generator[None, None, list[int] | None]:
        found = yield from self.decider.steps(capacity)
        return None if found is None else self.coalesced.expand(found)


class _Race:
    """Decision searches ``(capacity in bytes, decider)`` interleaved slice by slice, resumable:
    :meth:`until` may stop at a deadline and a later call goes on from the same states. The next
    slice always goes to the search with the least wall time spent per share of :data:`_WEIGHTS`,
    so that time splits as the weights say even where one search's slices take longer than
    another's. Each decider must be its own object (:meth:`Decider.fork`). With ``proves=False``
    (heuristic searches) a search that finds nothing is dropped and the others go on."""

    def __init__(self, probes: Sequence[tuple[int, _Steps]], *, proves: bool = True) -> None:
        self.runs = [
            (cap, d, d.steps(cap), _WEIGHTS[min(k, len(_WEIGHTS) - 1)]) for k, (cap, d) in enumerate(probes)
        ]
        self.spent = [0.0] * len(self.runs)
        self.proves = proves

    def capacities(self) -> list[int]:
        """The capacities (bytes) still searched."""
        return [cap for cap, _, _, _ in self.runs]

    def drop(self, capacity: int) -> None:
        """Stop searching at ``capacity`` (answered elsewhere)."""
        keep = [k for k, run in enumerate(self.runs) if run[0] != capacity]
        self.runs, self.spent = [self.runs[k] for k in keep], [self.spent[k] for k in keep]

    def until(self, deadline: float) -> tuple[int, list[int] | None]:
        """Run until one search answers; its capacity and answer (offsets, or ``None``: no packing),
        and that search is dropped (with ``proves``, every search at that capacity). Raises
        :class:`Timeout` at ``deadline``, the states kept, or when no search is left."""
        while True:
            if not self.runs:
                raise Timeout
            k = min(range(len(self.runs)), key=lambda r: self.spent[r] / self.runs[r][3])
            cap, _, steps, _ = self.runs[k]
            now = time.perf_counter()
            if now > deadline:
                raise Timeout
            try:
                next(steps)
            except StopIteration as done:
                if done.value is not None or self.proves:
                    self.drop(cap)
                    return cap, done.value
                del self.runs[k], self.spent[k]
                continue
            self.spent[k] += time.perf_counter() - now


LNS_SHARE = 0.5
"""Share of the time left after the exact search that large-neighbourhood search gets when no
packing within capacity is found; the rest goes to completing the best partial placement
(:func:`lightning_memplan.placement.complete.complete`)."""

EXACT_SHARE = 0.5
"""Share of the time limit the exact search may spend finding a first packing within capacity;
the rest goes to improving a packing above capacity (:func:`_improved`) when it finds none."""


def _start(sp: _Space, deadline: float) -> list[int]:
    """A complete placement (per member of ``sp``, bytes, unbounded arena) to improve from: the
    smallest of greedy by size and one canonical dive per plain order (the exact search's first
    descent without a capacity: each buffer at its lowest offset, lowest first; about one node per
    buffer, so n nodes each). Dives are skipped once ``deadline`` has passed."""
    chosen = sp.chosen
    unbounded = sum(b.size + b.alignment for b in chosen)
    best = [int(o) for o in greedy_by_size(chosen, unbounded).offset]  # type: ignore[arg-type]
    for order in HEURISTICS:
        try:
            dive = sp.decider.fork(heuristics=(order,)).solve(unbounded, deadline)
        except Timeout:
            break
        if dive is not None and sp.arena(dive) < sp.arena(best):
            best = dive
    return best


def _improved(sp: _Space, capacity: int, deadline: float) -> tuple[list[int] | None, list[int]]:
    """Large-neighbourhood search from :func:`_start` until ``deadline``: the offsets (per member of
    ``sp``, bytes) if their arena fits ``capacity`` (else ``None``), and the complete placement it
    reached either way (arena possibly above ``capacity``). Sets ``sp.found_at``."""
    offsets, sp.found_at = improve(sp.chosen, _start(sp, deadline), sp.lower_bound, deadline)
    return (offsets if sp.arena(offsets) <= capacity else None), offsets


def _best_partial(
    sp: _Space, capacity: int, partials: list[list[int | None]], incumbent: list[int | None]
) -> list[int | None]:
    """The partial placement (per member of ``sp``: bytes or ``None``) with the fewest buffers left
    out (then the most bytes x steps placed) among ``incumbent`` and ``partials`` completed by
    :func:`lightning_memplan.placement.greedy.fill` within ``capacity``. Each input is a valid
    partial packing whose placed offsets lie within ``capacity`` bytes."""
    chosen = sp.chosen

    def key(offs: list[int | None]) -> tuple[int, int]:
        placed = sum(b.size * (b.upper - b.lower) for b, o in zip(chosen, offs) if o is not None)
        return offs.count(None), -placed

    return min([incumbent] + [fill(chosen, p, capacity) for p in partials], key=key)


def exact_search(
    buffers: Sequence[Buffer],
    spaces: int | MemorySpace | Sequence[MemorySpace],
    *,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> Plan:
    """Exact search for the smallest arena, returning the best plan found within ``time_limit``.

    Args:
        buffers: what to place; ids unique, lifetimes half-open time steps, sizes in bytes.
        spaces: capacity in bytes, one :class:`MemorySpace`, or a hierarchy in priority order.
        time_limit: seconds of wall clock (``None``: no limit). The plan returned at the limit is
            the best found and has ``timed_out=True``.

    Returns:
        A new :class:`Plan`. ``plan.optimal`` is True when every used space's arena is proven
        minimal. If buffers are left in ``plan.unplaced`` and ``timed_out`` is False, no packing of
        them exists in the hierarchy's capacities (for a single space: proven).
    """
    warm_up()  # a one-time compile of the search kernels does not count against ``time_limit``
    started = time.perf_counter()
    if time_limit is not None and (isinstance(time_limit, bool) or not time_limit > 0):
        raise ValueError(f"`time_limit={time_limit!r}` is not valid. Expected a positive number of seconds or None.")
    deadline = started + (time_limit if time_limit is not None else float("inf"))
    bufs, hierarchy = as_buffers(buffers), as_spaces(spaces)
    check_fits(bufs, hierarchy)
    n = len(bufs)
    greedy = [greedy_by_size(bufs, hierarchy), greedy_by_position(bufs, hierarchy)]
    best = min(greedy, key=lambda p: (len(p.unplaced), p.total_arena))
    space: list[int | None] = list(best.space)
    offset: list[int | None] = list(best.offset)
    found_at = time.perf_counter() - started
    optimal, timed_out = False, False

    def incumbent(members: list[int], s: int) -> list[int] | None:
        if all(space[i] == s for i in members):
            return [offset[i] for i in members]  # type: ignore[misc]
        return None

    everything = list(range(n))
    solved_in_first = partial_in_first = False
    if peak_live(bufs)[0] <= hierarchy[0].capacity and all(b.size <= hierarchy[0].capacity for b in bufs):
        sp = _Space(bufs, everything)
        race_deadline = started + EXACT_SHARE * (deadline - started)
        offs, optimal, timed_out = sp.minimize(hierarchy[0].capacity, incumbent(sp.members, 0), deadline, race_deadline)
        reached: list[int] | None = None
        if offs is None and timed_out:
            lns_deadline = deadline if len(hierarchy) > 1 else time.perf_counter() + LNS_SHARE * (deadline - time.perf_counter())
            offs, reached = _improved(sp, hierarchy[0].capacity, lns_deadline)
            optimal = offs is not None and sp.arena(offs) <= sp.lower_bound
            timed_out = not optimal
        if offs is None and timed_out and len(hierarchy) == 1:
            # Nothing fits found in time: answer with the partial packing that leaves out the fewest
            # buffers (the greedy plan's, the improved plan cut at capacity, or the exact search's
            # deepest), each completed greedily within capacity.
            cap = hierarchy[0].capacity
            cut: list[int | None] = (
                [o if o + bufs[i].size <= cap else None for i, o in zip(sp.members, reached)] if reached else []
            )
            mine = _best_partial(
                sp, cap, ([cut] if cut else []) + [d.deepest() for d in sp.racers], [offset[i] for i in sp.members]
            )
            mine, _ = complete(sp.chosen, mine, cap, deadline)
            if None not in mine:  # every buffer placed within capacity
                offs = [int(o) for o in mine]  # type: ignore[arg-type]
                sp.found_at = time.perf_counter()
                optimal = sp.arena(offs) <= sp.lower_bound
                timed_out = not optimal
            elif mine.count(None) < len(best.unplaced):
                partial_in_first = True
                space, offset = [0] * n, [0] * n
                for i, o in zip(sp.members, mine):
                    space[i], offset[i] = (None, None) if o is None else (0, o)
                found_at = time.perf_counter() - started
        if offs is not None:
            solved_in_first = True
            space, offset = [0] * n, [0] * n  # zero-size buffers: offset 0 of the first space
            for i, o in zip(sp.members, offs):
                offset[i] = o
            found_at = sp.found_at - started
    if not solved_in_first and not partial_in_first:
        proven_all = True
        for s, mem in enumerate(hierarchy):
            members = [i for i in everything if space[i] == s]
            if not members:
                continue
            sp = _Space(bufs, members)
            offs, ok, out = sp.minimize(mem.capacity, incumbent(sp.members, s), deadline)
            timed_out = timed_out or out
            proven_all = proven_all and ok
            if offs is not None:
                for i, o in zip(sp.members, offs):
                    offset[i] = o
                found_at = max(found_at, sp.found_at - started)
        optimal = proven_all and not best.unplaced
    return Plan(
        buffers=bufs,
        spaces=hierarchy,
        space=tuple(space),
        offset=tuple(offset),
        algorithm="search",
        optimal=optimal,
        timed_out=timed_out,
        seconds=time.perf_counter() - started,
        seconds_to_best=found_at,
    )
