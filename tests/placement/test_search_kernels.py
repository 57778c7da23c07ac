"""The compiled search: resumable in slices, pools that grow, and the hardest shared input (E)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from _oracle import random_buffers

from lightning_memplan.placement import (
    MemorySpace,
    Plan,
    _decide,
    exact_search,
    peak_live,
    read_csv,
    validate,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "minimalloc"  # shipped copy of ../shared/data/minimalloc


def _decider(bufs):
    bufs = [b for b in bufs if b.size > 0]
    return _decide.Decider([b.lower for b in bufs], [b.upper for b in bufs], [b.size for b in bufs], [b.alignment for b in bufs])


def _valid(bufs, offsets: list[int], capacity: int) -> bool:
    """The validator's verdict on these offsets (input order) in one space of ``capacity`` bytes."""
    bufs = tuple(b for b in bufs if b.size > 0)
    plan = Plan(buffers=bufs, spaces=(MemorySpace(name="m", capacity=capacity),), space=(0,) * len(bufs),
                offset=tuple(offsets), algorithm="test")
    return bool(validate(plan))


def test_slices_of_one_node_and_tiny_pools_give_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pausing after every node and growing every pool from almost nothing must not change a thing.
    rng = np.random.default_rng(5)
    cases = []
    for trial in range(60):
        bufs = [b for b in random_buffers(rng, int(rng.integers(2, 14)), horizon=12, align=trial % 3 == 0) if b.size]
        if bufs:
            cap = peak_live(bufs)[0] + int(rng.integers(0, 3))
            cases.append((bufs, cap))
    expected = [_decider(b).solve(c, float("inf")) for b, c in cases]
    monkeypatch.setattr(_decide, "_SLICE", 1)
    for (bufs, cap), want in zip(cases, expected):
        d = _decider(bufs)
        d.parts, d.pool, d.cand = d.parts[:1], d.pool[:1], d.cand[:1]
        d.ulog_i, d.ulog_v = d.ulog_i[: d.ureserve], d.ulog_v[: d.ureserve]
        got = d.solve(cap, float("inf"))
        assert got == want
        if got is not None:
            assert _valid(bufs, got, cap)


def test_deadline_stops_the_compiled_search() -> None:
    bufs = read_csv(DATA / "D.1048576.csv")
    d = _decider(bufs)
    started = time.perf_counter()
    with pytest.raises(_decide.Timeout):
        d.solve(peak_live(bufs)[0], started + 0.5)
    assert time.perf_counter() - started < 10  # slices are milliseconds (slack for a loaded machine)


def test_hardest_shared_input_e_is_packed_at_one_mebibyte() -> None:
    bufs = read_csv(DATA / "E.1048576.csv")
    plan = exact_search(bufs, 1048576, time_limit=60)
    assert validate(plan)
    assert plan.arena == (1048576,) == (peak_live(bufs)[0],)
    assert plan.optimal and not plan.timed_out
