"""The compiled search: resumable in slices, pools that grow, and the hardest shared input (E)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from _oracle import one_space_plan, random_buffers
from perfect_packing import perfect_packing

from lightning_memplan.placement import (
    Buffer,
    _decide,
    exact_search,
    peak_live,
    read_csv,
    validate,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "minimalloc"  # shipped copy of ../shared/data/minimalloc


def _decider(bufs, **kwargs):
    bufs = [b for b in bufs if b.size > 0]
    cols = [b.lower for b in bufs], [b.upper for b in bufs], [b.size for b in bufs], [b.alignment for b in bufs]
    return _decide.Decider(*cols, **kwargs)


def _valid(bufs, offsets: list[int], capacity: int) -> bool:
    """The validator's verdict on these offsets (input order) in one space of ``capacity`` bytes."""
    return bool(validate(one_space_plan([b for b in bufs if b.size > 0], offsets, capacity)))


def test_slices_of_one_node_and_tiny_pools_give_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pausing after every node and growing every pool from almost nothing must not change a thing:
    # under one order the search is the same; with several orders side by side another order may
    # answer first, but whether a packing exists does not change and every answer is valid.
    rng = np.random.default_rng(5)
    cases = []
    for trial in range(60):
        bufs = [b for b in random_buffers(rng, int(rng.integers(2, 14)), horizon=12, align=trial % 3 == 0) if b.size]
        if bufs:
            cap = peak_live(bufs)[0] + int(rng.integers(0, 3))
            cases.append((bufs, cap))
    one = {"heuristics": ("WAT+",), "tight_heuristics": None}
    expected = [(_decider(b, **one).solve(c, float("inf")), _decider(b).solve(c, float("inf"))) for b, c in cases]
    monkeypatch.setattr(_decide, "_SLICE", 1)
    for (bufs, cap), (want_one, want) in zip(cases, expected):
        for kwargs, answer in ((one, want_one), ({}, want)):
            d = _decider(bufs, **kwargs)
            d.parts, d.pool, d.cand = d.parts[:1], d.pool[:1], d.cand[:1]
            d.ulog_i, d.ulog_v = d.ulog_i[: d.ureserve], d.ulog_v[: d.ureserve]
            got = d.solve(cap, float("inf"))
            assert (got == answer) if kwargs else ((got is None) == (answer is None))
            if got is not None:
                assert _valid(bufs, got, cap)


def test_orders_side_by_side_resume_their_searches_instead_of_replaying_them() -> None:
    # perfect#5 of the benchmark at its optimum: one of the tight orders alone needs two slices.
    # Side by side, each order's search resumes where its last turn stopped: the order that answers
    # has searched exactly the nodes it searches alone, and no other order more than a slice beyond
    # (restarting every order under a doubled node limit took three times as many nodes here).
    bufs, _ = perfect_packing(5, 420, alignment=256, pinwheels=0.2)
    both = _decider(bufs)
    offsets = both.solve(2**20, float("inf"))
    assert offsets is not None and _valid(bufs, offsets, 2**20)
    lanes = both.lanes()
    assert len(lanes) == len(_decide.TIGHT_HEURISTICS) and sum(d.searched for d in lanes) == both.nodes
    winner = next(k for k, d in enumerate(lanes) if [int(x) for x in d.solution] == offsets)
    alone = _decider(bufs, heuristics=(_decide.TIGHT_HEURISTICS[winner],), tight_heuristics=None)
    assert alone.solve(2**20, float("inf")) == offsets
    assert lanes[winner].searched == alone.nodes
    assert max(d.searched for d in lanes) <= -(-alone.nodes // _decide._SLICE) * _decide._SLICE


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


def test_a_large_instance_gets_slices_small_enough_to_keep_a_deadline() -> None:
    # A node costs about buffers squared: at 3,000 buffers a full slice of 4,096 nodes would run
    # for seconds between two deadline checks. The first slice's budget is cut to the size, later
    # ones to the time the last took; a small instance keeps full slices.
    rng = np.random.default_rng(0)
    n = 3000
    lower = rng.integers(0, 4 * n, n)
    length, size = rng.integers(1, n // 2, n), rng.integers(1, 65, n) * 1024
    bufs = [Buffer(id=i, lower=int(lower[i]), upper=int(lower[i] + length[i]), size=int(size[i])) for i in range(n)]
    big = _decider(bufs, heuristics=("WAT",), tight_heuristics=None)
    steps = big.steps(peak_live(bufs)[0])
    next(steps)
    assert 1 <= big.nodes <= _decide._SLICE // 4  # one slice (and any the pools growing take)
    small, _ = perfect_packing(13, 800, capacity=2**20)  # 800 buffers: no answer within one slice
    d = _decider(small, heuristics=("WAT",), tight_heuristics=None)
    next(d.steps(2**20))
    assert d.nodes >= _decide._SLICE
