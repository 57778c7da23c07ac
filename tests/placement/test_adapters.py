from __future__ import annotations

import pytest

from lightning_memplan.placement import (
    Buffer,
    buffers_from_lifetimes,
    exact_search,
    peak_live,
    validate,
)


def test_exclusive_and_inclusive_ends() -> None:
    assert buffers_from_lifetimes([(0, 3, 8)]) == (Buffer(id=0, lower=0, upper=3, size=8),)
    assert buffers_from_lifetimes([(0, 3, 8)], end="inclusive") == (Buffer(id=0, lower=0, upper=4, size=8),)
    bufs = buffers_from_lifetimes([(2, 2, 4)], end="inclusive", alignment=16, ids=["t"])
    assert bufs == (Buffer(id="t", lower=2, upper=3, size=4, alignment=16),)


def test_live_bytes_next_to_arena_needed() -> None:
    bufs = buffers_from_lifetimes([(0, 2, 4), (0, 4, 4), (2, 6, 4), (4, 6, 4)])
    plan = exact_search(bufs, 1 << 20, time_limit=10)
    assert validate(plan)
    assert peak_live(bufs)[0] == plan.arena[0] == 8


@pytest.mark.parametrize(
    ("lifetimes", "kwargs", "match"),
    [
        ([(3, 3, 8)], {}, r"lifetimes\[0\]=\(3, 3, 8\)` \(end='exclusive'\).*empty lifetime.*upper > lower"),
        ([(0, 1, 8), (0, 2, -1)], {}, r"lifetimes\[1\]=\(0, 2, -1\).*size=-1.*integer >= 0"),
        ([(0, 1)], {}, r"lifetimes\[0\]=\(0, 1\)` is not valid\. Expected a \(start step, end step, bytes\) triple"),
        ([(0, 1, 8)], {"end": "closed"}, r"end='closed'.*Expected 'exclusive' or 'inclusive'"),
        ([(0, 1, 8)], {"ids": [1, 2]}, r"`ids` has 2 entries for 1 lifetimes"),
        ([(0, 1, 8)], {"alignment": 0}, r"alignment=0.*integer >= 1"),
    ],
)
def test_bad_lifetimes_name_the_entry(lifetimes: list, kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=match):
        buffers_from_lifetimes(lifetimes, **kwargs)
