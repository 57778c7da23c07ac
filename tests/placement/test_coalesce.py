"""Coalescing: fewer, larger buffers whose packings expand to packings of the original ones."""
from __future__ import annotations

import time

import numpy as np
import pytest
from _oracle import one_space_plan, random_buffers
from perfect_packing import perfect_packing

from lightning_memplan.placement import Buffer, exact_search, greedy_by_size, peak_live, search, validate
from lightning_memplan.placement._decide import Decider
from lightning_memplan.placement.coalesce import coalesce


def _live(bufs: list[Buffer] | tuple[Buffer, ...], horizon: int) -> list[int]:
    return [sum(b.size for b in bufs if b.lower <= t < b.upper) for t in range(horizon)]


def test_buffers_with_one_lifetime_are_stacked_and_groups_above_the_limit_are_left_alone() -> None:
    bufs = [
        Buffer(id="a", lower=0, upper=4, size=3),
        Buffer(id="b", lower=0, upper=4, size=5),
        Buffer(id="c", lower=2, upper=6, size=1),
        Buffer(id="d", lower=2, upper=6, size=2),
        Buffer(id="e", lower=2, upper=6, size=4),
    ]
    c = coalesce(bufs)
    assert sorted((b.lower, b.upper, b.size) for b in c.buffers) == [(0, 4, 8), (2, 6, 7)]
    assert c.expand([10 if c.buffers[m].size == 8 else 20 for m in range(2)]) == [10, 13, 20, 21, 23]
    pairs = coalesce(bufs, stack=2)
    assert sorted((b.lower, b.upper, b.size) for b in pairs.buffers) == [(0, 4, 8), (2, 6, 1), (2, 6, 2), (2, 6, 4)]


def test_a_buffer_born_as_one_of_its_size_dies_takes_its_place_unless_that_is_ambiguous() -> None:
    chain = [Buffer(id=0, lower=0, upper=3, size=4), Buffer(id=1, lower=3, upper=5, size=4), Buffer(id=2, lower=5, upper=9, size=4)]
    c = coalesce(chain)
    assert [(b.lower, b.upper, b.size) for b in c.buffers] == [(0, 9, 4)]
    assert c.expand([7]) == [7, 7, 7]
    # Two buffers of 4 bytes die at step 3: which one the newborn follows is not known.
    two = [*chain[:2], Buffer(id=3, lower=1, upper=3, size=4)]
    assert len(coalesce(two).buffers) == 3


def test_a_stack_that_would_misalign_a_member_is_not_made() -> None:
    bufs = [Buffer(id=0, lower=0, upper=2, size=3, alignment=1), Buffer(id=1, lower=0, upper=2, size=8, alignment=4)]
    assert len(coalesce(bufs).buffers) == 2
    aligned = [Buffer(id=0, lower=0, upper=2, size=4, alignment=1), Buffer(id=1, lower=0, upper=2, size=8, alignment=4)]
    c = coalesce(aligned)
    assert [(b.size, b.alignment) for b in c.buffers] == [(12, 4)]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="stack=1"):
        coalesce([Buffer(id=0, lower=0, upper=1, size=1)], stack=1)
    with pytest.raises(ValueError, match="size 0"):
        coalesce([Buffer(id=0, lower=0, upper=1, size=0)])


@pytest.mark.parametrize("stack", [2, None])
def test_live_bytes_are_kept_and_every_packing_expands_to_a_valid_one_of_equal_arena(stack: int | None) -> None:
    rng = np.random.default_rng(5)
    merged = 0
    for trial in range(200):
        bufs = [b for b in random_buffers(rng, 12, horizon=8, max_size=4, align=trial % 2 == 0) if b.size > 0]
        if not bufs:
            continue
        c = coalesce(bufs, stack=stack)
        merged += len(bufs) - len(c.buffers)
        assert _live(c.buffers, 9) == _live(bufs, 9)
        packed = greedy_by_size(c.buffers, 10**6)
        offsets = c.expand([int(o) for o in packed.offset])  # type: ignore[arg-type]
        plan = one_space_plan(bufs, offsets, 10**6)
        assert validate(plan), (trial, validate(plan).message)
        assert plan.arena == packed.arena
    assert merged > 200  # the rules did apply


def test_a_coalesced_search_that_finds_nothing_proves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # This perfect packing of 15 buffers has no packing at its optimum once coalesced (one same-
    # lifetime group must be split), but has one uncoalesced.
    optimum = 128
    bufs, _ = perfect_packing(16, 12, steps=30, capacity=optimum, granularity=8, pinwheels=0.5)
    c = coalesce(bufs)
    assert len(c.buffers) < len(bufs)
    assert Decider.of(c.buffers).solve(optimum, time.perf_counter() + 30) is None
    monkeypatch.setattr(search, "COALESCE_STACKS", (None,))
    # Its turn alone: no packing found, and the bound is not raised.
    monkeypatch.setattr(search, "TURNS", ("coalesced",))
    sp = search._Space(tuple(bufs), list(range(len(bufs))))
    race = search._Race([(optimum, sp.decider)])
    assert sp._first(race, optimum, int(1.1 * optimum), time.perf_counter() + 10) == (None, optimum, False)
    # Before the race: the exact search still finds the optimum.
    monkeypatch.setattr(search, "TURNS", ("coalesced", "race"))
    plan = exact_search(bufs, int(1.1 * optimum), time_limit=30)
    assert validate(plan) and plan.optimal and plan.arena == (optimum,)


def test_the_coalesced_turn_packs_perfect_29_at_its_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    # perfect#29 of benchmarks/placement.py (401 buffers): neither the compiled race nor CP-SAT
    # found a packing at its optimum in 60 s (CP-SAT: nor in 300 s); coalesced it packs in seconds.
    bufs, _ = perfect_packing(29, 400, capacity=2**20, pinwheels=0.2)
    assert peak_live(bufs)[0] == 2**20
    monkeypatch.setattr(search, "TURNS", ("coalesced",))
    plan = exact_search(bufs, int(1.05 * 2**20), time_limit=60)
    assert validate(plan) and plan.optimal and plan.arena == (2**20,)
