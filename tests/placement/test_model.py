from __future__ import annotations

import dataclasses

import pytest

from lightning_memplan.placement import Buffer, MemorySpace, Plan
from lightning_memplan.placement.model import as_buffers, as_spaces, check_fits


def test_buffer_half_open_overlap() -> None:
    a = Buffer(id=0, lower=0, upper=5, size=8)
    assert a.overlaps_in_time(Buffer(id=1, lower=4, upper=9, size=1))
    assert not a.overlaps_in_time(Buffer(id=2, lower=5, upper=9, size=1))  # touching ends do not overlap


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": -1}, r"size=-1.*integer >= 0"),
        ({"size": 1.5}, r"size=1\.5.*integer >= 0"),
        ({"size": True}, r"size=True.*integer"),
        ({"alignment": 0}, r"alignment=0.*integer >= 1"),
        ({"lower": 3, "upper": 3}, r"lower=3, upper=3.*empty lifetime.*upper > lower"),
        ({"lower": 4, "upper": 2}, r"lower=4, upper=2.*empty lifetime"),
        ({"id": 1.0}, r"id=1\.0.*int or a str"),
        ({"lower": "0"}, r"lower='0'.*integer"),
    ],
)
def test_buffer_rejects_bad_fields(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {"id": 7, "lower": 0, "upper": 2, "size": 4}
    fields.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Buffer(**fields)  # type: ignore[arg-type]


def test_buffer_is_frozen_and_keyword_only() -> None:
    b = Buffer(id="x", lower=0, upper=1, size=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.size = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Buffer("x", 0, 1, 0)  # type: ignore[misc]


def test_memory_space_validation() -> None:
    with pytest.raises(ValueError, match=r"capacity=-5.*integer >= 0"):
        MemorySpace(name="sram", capacity=-5)
    with pytest.raises(ValueError, match=r"name=''.*non-empty str"):
        MemorySpace(name="", capacity=5)


def test_as_spaces_forms_and_errors() -> None:
    assert as_spaces(64) == (MemorySpace(name="mem", capacity=64),)
    sram = MemorySpace(name="sram", capacity=8)
    assert as_spaces(sram) == (sram,)
    assert as_spaces([sram, MemorySpace(name="hbm", capacity=64)])[1].name == "hbm"
    with pytest.raises(ValueError, match=r"duplicate names \['sram'\]"):
        as_spaces([sram, sram])
    with pytest.raises(ValueError, match=r"spaces=\[\].*non-empty sequence of MemorySpace"):
        as_spaces([])
    with pytest.raises(ValueError, match=r"spaces='64'.*capacity in bytes"):
        as_spaces("64")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"spaces=True.*capacity in bytes"):
        as_spaces(True)  # type: ignore[arg-type]


def test_as_buffers_rejects_duplicates_and_strangers() -> None:
    a = Buffer(id=1, lower=0, upper=2, size=4)
    with pytest.raises(ValueError, match=r"buffers\[1\]` has duplicate id 1 \(also buffers\[0\]\)"):
        as_buffers([a, Buffer(id=1, lower=5, upper=6, size=1)])
    with pytest.raises(ValueError, match=r"buffers\[0\]=\(0, 2, 4\).*Expected a Buffer"):
        as_buffers([(0, 2, 4)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"buffers=None.*sequence of Buffer"):
        as_buffers(None)  # type: ignore[arg-type]


def test_check_fits_names_the_buffer() -> None:
    bufs = (Buffer(id="big", lower=0, upper=1, size=100),)
    with pytest.raises(ValueError, match=r"id='big'.*size=100 bytes.*largest holds 64 bytes"):
        check_fits(bufs, (MemorySpace(name="a", capacity=32), MemorySpace(name="b", capacity=64)))


def test_plan_arena_and_unplaced() -> None:
    bufs = (Buffer(id=0, lower=0, upper=2, size=4), Buffer(id=1, lower=1, upper=3, size=2), Buffer(id=2, lower=0, upper=1, size=9))
    spaces = (MemorySpace(name="a", capacity=8), MemorySpace(name="b", capacity=8))
    plan = Plan(buffers=bufs, spaces=spaces, space=(0, 1, None), offset=(2, 0, None), algorithm="hand")
    assert plan.arena == (6, 2)
    assert plan.total_arena == 8
    assert plan.unplaced == (2,)
    assert not plan.feasible
    with pytest.raises(ValueError, match=r"one space and one offset per buffer: got 1 spaces and 3 offsets for 3"):
        Plan(buffers=bufs, spaces=spaces, space=(0,), offset=(0, 0, 0), algorithm="hand")


def test_plan_rejects_a_space_index_outside_the_hierarchy() -> None:
    bufs = (Buffer(id="b", lower=0, upper=1, size=1),)
    with pytest.raises(ValueError, match=r"puts buffer 'b' in space 2. Expected an index in range\(1\) or None"):
        Plan(buffers=bufs, spaces=(MemorySpace(name="m", capacity=4),), space=(2,), offset=(0,), algorithm="hand")
