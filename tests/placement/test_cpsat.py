"""CP-SAT's turn in the exact search: the same decision as the compiled search, by constraint programming."""
from __future__ import annotations

import time

import numpy as np
import pytest
from _oracle import brute_force_arena, one_space_plan, random_buffers
from perfect_packing import perfect_packing

from lightning_memplan.placement import Buffer, exact_search, peak_live, search, validate
from lightning_memplan.placement._cpsat import cp_sat_pack
from lightning_memplan.placement._decide import Decider, Timeout


@pytest.mark.parametrize(("seed", "alignment", "pinwheels"), [(0, 1, 0.3), (1, 256, 0.3), (2, 512, 0.0)])
def test_cp_sat_packs_a_perfect_packing_at_its_optimum(seed: int, alignment: int, pinwheels: float) -> None:
    optimum = 2**16
    bufs, _ = perfect_packing(seed, 60, steps=200, capacity=optimum, alignment=alignment, pinwheels=pinwheels)
    offsets = cp_sat_pack(bufs, optimum, time.perf_counter() + 60)
    assert offsets is not None and validate(one_space_plan(bufs, offsets, optimum))
    assert max(o + b.size for o, b in zip(offsets, bufs)) == optimum


def test_cp_sat_agrees_with_brute_force_on_small_random_instances() -> None:
    # Searching offsets in units of the common divisor of sizes and alignments loses no packing:
    # at the optimum it finds one, one byte below it proves that none exists.
    rng = np.random.default_rng(3)
    for trial in range(60):
        bufs = [b for b in random_buffers(rng, int(rng.integers(1, 7)), align=trial % 3 == 0) if b.size > 0]
        if not bufs:
            continue
        best = brute_force_arena(bufs)
        offsets = cp_sat_pack(bufs, best, time.perf_counter() + 30)
        assert offsets is not None and validate(one_space_plan(bufs, offsets, best)), (trial, bufs)
        assert cp_sat_pack(bufs, best - 1, time.perf_counter() + 30) is None, (trial, bufs)


def test_cp_sat_proves_that_nothing_fits_at_the_live_peak_when_alignment_leaves_a_gap() -> None:
    # At step 5 buffers 0 and 2, both aligned to 4 bytes, cannot both start at 0: one starts at 4
    # or above, so no packing fits in the 4 bytes of the live peak.
    bufs = [
        Buffer(id=0, lower=5, upper=9, size=1, alignment=4),
        Buffer(id=1, lower=3, upper=7, size=1),
        Buffer(id=2, lower=5, upper=6, size=2, alignment=4),
    ]
    assert peak_live(bufs)[0] == 4 and brute_force_arena(bufs) == 5
    assert cp_sat_pack(bufs, 4, time.perf_counter() + 30) is None
    offsets = cp_sat_pack(bufs, 5, time.perf_counter() + 30)
    assert offsets is not None and validate(one_space_plan(bufs, offsets, 5))


def test_cp_sat_stops_at_its_deadline() -> None:
    bufs, _ = perfect_packing(29, 400, capacity=2**20, pinwheels=0.2)  # perfect#29: CP-SAT does not answer it quickly
    with pytest.raises(Timeout):
        cp_sat_pack(bufs, 2**20, time.perf_counter() + 0.5)


def test_exact_search_uses_cp_sat_at_the_bound_when_the_compiled_race_has_no_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_answer(*args: object, **kwargs: object) -> tuple[int, list[int] | None]:
        raise Timeout  # stands for a compiled search that does not close in its turns

    asked: list[tuple[int, int]] = []

    def spy(bufs: list[Buffer], capacity: int, deadline: float, *, seed: int = 0) -> list[int] | None:
        asked.append((capacity, seed))
        return cp_sat_pack(bufs, capacity, deadline, seed=seed)

    monkeypatch.setattr(search._Race, "until", no_answer)
    monkeypatch.setattr(search, "cp_sat_pack", spy)
    optimum = 2**16
    bufs, _ = perfect_packing(4, 60, steps=200, capacity=optimum, pinwheels=0.3)
    plan = exact_search(bufs, int(1.05 * optimum), time_limit=30)
    assert asked[0] == (optimum, 1)  # at the live peak, with CP-SAT's default seed
    assert validate(plan) and plan.optimal and plan.arena == (optimum,)


def test_the_race_resumes_across_turns_instead_of_restarting() -> None:
    # Stopped every few milliseconds, the race's searches go on from where they were: the answer
    # costs the nodes of one uninterrupted search, not a replay per turn.
    bufs, _ = perfect_packing(5, 420, capacity=2**20, alignment=256, pinwheels=0.2)  # perfect#5
    cols = [b.lower for b in bufs], [b.upper for b in bufs], [b.size for b in bufs], [b.alignment for b in bufs]
    alone = Decider(*cols)
    assert alone.solve(2**20, float("inf")) is not None
    stopped = Decider(*cols)
    race = search._Race([(2**20, stopped)])
    turns = 0
    while True:
        try:
            capacity, found = race.until(time.perf_counter() + 0.005)
            break
        except Timeout:
            turns += 1
    assert capacity == 2**20 and found is not None and turns > 5
    assert stopped.nodes == alone.nodes
