from __future__ import annotations

import pytest

from lightning_memplan.placement import Buffer, Failure, MemorySpace, Plan, validate

BUFS = (
    Buffer(id="a", lower=0, upper=4, size=4, alignment=2),
    Buffer(id="b", lower=2, upper=6, size=4),
    Buffer(id="c", lower=4, upper=8, size=4),
)
SPACES = (MemorySpace(name="sram", capacity=8), MemorySpace(name="hbm", capacity=16))


def plan(space: tuple[int | None, ...], offset: tuple[int | None, ...]) -> Plan:
    return Plan(buffers=BUFS, spaces=SPACES, space=space, offset=offset, algorithm="hand")


def test_valid_plan_reuses_memory_after_a_lifetime_ends() -> None:
    result = validate(plan((0, 0, 0), (0, 4, 0)))  # c reuses a's bytes: a ended at 4 (half-open)
    assert result
    assert result.failure is Failure.OK


@pytest.mark.parametrize(
    ("space", "offset", "failure", "involved", "match"),
    [
        ((0, 0, None), (0, 4, None), Failure.UNPLACED, (2,), r"'c' is not placed"),
        ((0, 0, None), (0, 2, None), Failure.OVERLAP, (0, 1), r"'a' \[0, 4\) and 'b' \[2, 6\)"),
        ((0, 0, 0), (-2, 4, 0), Failure.NEGATIVE_OFFSET, (0,), r"'a' has offset -2"),
        ((0, 0, 0), (0, 6, 0), Failure.OVER_CAPACITY, (1,), r"'b' ends at byte 10 > capacity 8 of 'sram'"),
        ((0, 0, 0), (1, 5, 0), Failure.MISALIGNED, (0,), r"offset 1 is not a multiple of its alignment 2"),
        ((0, 0, 0), (0, 2, 4), Failure.OVERLAP, (0, 1), r"'a' \[0, 4\) and 'b' \[2, 6\) overlap in space 'sram'.*\[2, 4\)"),
    ],
)
def test_each_failure_is_named(
    space: tuple[int | None, ...], offset: tuple[int | None, ...], failure: Failure, involved: tuple[int, ...], match: str
) -> None:
    import re

    result = validate(plan(space, offset))
    assert not result
    assert result.failure is failure
    assert result.buffers == involved
    assert re.search(match, result.message)


def test_same_addresses_in_different_spaces_do_not_overlap() -> None:
    assert validate(plan((0, 1, 0), (0, 0, 4)))


def test_zero_size_buffers_never_overlap() -> None:
    bufs = (Buffer(id=0, lower=0, upper=2, size=4), Buffer(id=1, lower=0, upper=2, size=0))
    p = Plan(buffers=bufs, spaces=(MemorySpace(name="m", capacity=4),), space=(0, 0), offset=(0, 2), algorithm="hand")
    assert validate(p)
