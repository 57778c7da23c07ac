"""Partial placements when the exact search finds nothing within capacity in time (issue #25):
the exact search's deepest partial packing, greedy completion, window repairs and the band search."""
from __future__ import annotations

import pytest
from _oracle import one_space_plan
from perfect_packing import perfect_packing

from lightning_memplan.placement import (
    Buffer,
    exact_search,
    greedy_by_position,
    greedy_by_size,
    search,
    validate,
)
from lightning_memplan.placement._decide import Decider
from lightning_memplan.placement.complete import complete
from lightning_memplan.placement.greedy import fill


def _valid_partial(bufs: list[Buffer], offsets: list[int | None], capacity: int) -> bool:
    """Whether the placed buffers (offset not ``None``) form a valid packing within ``capacity``."""
    placed = [(b, o) for b, o in zip(bufs, offsets) if o is not None]
    plan = one_space_plan([b for b, _ in placed], [o for _, o in placed], capacity)
    return bool(validate(plan))


def _cols(bufs: list[Buffer]) -> tuple[list[int], list[int], list[int], list[int]]:
    return [b.lower for b in bufs], [b.upper for b in bufs], [b.size for b in bufs], [b.alignment for b in bufs]


def test_deepest_partial_packing_is_valid_and_grows_with_the_search() -> None:
    # A pinwheel perfect packing that the exact search does not solve in these few slices.
    bufs, _ = perfect_packing(15, 300, pinwheels=0.3)
    d = Decider(*_cols(bufs))
    steps = d.steps(2**20)
    counts = []
    for _ in range(6):
        next(steps)
        deep = d.deepest()
        assert _valid_partial(bufs, deep, 2**20)
        counts.append(len(bufs) - deep.count(None))
    assert counts == sorted(counts) and counts[-1] > 50


def test_deepest_partial_counts_solved_partitions() -> None:
    # Two independent halves in time: the record after a solve holds every buffer of both.
    bufs = [Buffer(id=i, lower=t, upper=t + 2, size=s) for i, (t, s) in enumerate([(0, 4), (0, 4), (2, 3), (2, 5)])]
    d = Decider(*_cols(bufs))
    offsets = d.solve(8, float("inf"))
    assert offsets is not None and d.deepest() == offsets


def test_decider_ceiling_fixes_a_buffer_in_its_band() -> None:
    d = Decider([0, 0, 2], [2, 2, 4], [4, 4, 2], [1, 1, 2], floor=[3, 0, 1], ceiling=[8, 4, 100])
    assert d.solve(8, float("inf")) == [4, 0, 2]
    d = Decider([0, 0, 2], [2, 2, 4], [4, 4, 2], [1, 1, 2], floor=[3, 0, 1], ceiling=[7, 4, 100])
    assert d.solve(8, float("inf")) is None  # buffer 0 cannot rise to 4 below a ceiling of 7
    fixed = Decider([0, 0], [2, 2], [4, 4], [1, 1], floor=[2, 0], ceiling=[6, 8])  # buffer 0 at [2, 6)
    assert fixed.solve(8, float("inf")) is None  # buffer 1 fits neither below (2 bytes) nor above (2)


def test_fill_places_left_out_buffers_in_gaps_and_keeps_the_rest() -> None:
    bufs, witness = perfect_packing(3, 40, steps=100, capacity=2**14)
    partial: list[int | None] = [o if k % 3 else None for k, o in enumerate(witness)]
    out = fill(bufs, partial, 2**14)
    assert all(o == p for o, p in zip(out, partial) if p is not None)
    assert _valid_partial(bufs, out, 2**14) and out.count(None) < partial.count(None)


@pytest.mark.parametrize("seed", [1, 6])
def test_window_repairs_complete_a_perfect_packing_greedy_leaves_incomplete(seed: int) -> None:
    # At the optimum (no spare byte) greedy leaves buffers out; window repairs place them all.
    bufs, _ = perfect_packing(seed, 60, steps=200, capacity=2**16, pinwheels=0.3)
    start = min([greedy_by_size(bufs, 2**16), greedy_by_position(bufs, 2**16)], key=lambda p: len(p.unplaced))
    assert len(start.unplaced) >= 5
    out, _ = complete(bufs, list(start.offset), 2**16, float("inf"), moves=40)
    assert None not in out and _valid_partial(bufs, out, 2**16)
    kept = [o for o, p in zip(out, start.offset) if p is not None]
    assert len(kept) == len(bufs) - len(start.unplaced)  # the placed stay placed


def test_exact_search_answers_a_failure_with_its_best_partial_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # An exact search that finds nothing in time, and no time for the repairs: the plan is the
    # partial placement leaving out the fewest buffers, never more than greedy's.
    monkeypatch.setattr(search, "complete", lambda bufs, offs, cap, deadline: (offs, 0.0))
    monkeypatch.setattr(search, "improve", lambda bufs, offs, lb, deadline: (offs, 0.0))
    monkeypatch.setattr(search, "EXACT_SHARE", 0.3)
    bufs, _ = perfect_packing(15, 300, pinwheels=0.3)
    greedy = min([greedy_by_size(bufs, 2**20), greedy_by_position(bufs, 2**20)], key=lambda p: len(p.unplaced))
    plan = exact_search(bufs, 2**20, time_limit=3.0)  # 0.9 s exact: room on a loaded 2-core machine
    assert plan.timed_out and not plan.optimal and not plan.feasible
    assert _valid_partial(bufs, list(plan.offset), 2**20) and len(plan.unplaced) < len(greedy.unplaced)
