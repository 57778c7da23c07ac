from __future__ import annotations

from lightning_memplan.placement import Buffer, MemorySpace, Plan, format_usage, usage
from lightning_memplan.placement.bounds import peak_live

BUFS = (
    Buffer(id=0, lower=0, upper=4, size=8),
    Buffer(id=1, lower=2, upper=6, size=4),
    Buffer(id=2, lower=3, upper=5, size=16),
    Buffer(id=3, lower=0, upper=9, size=32),
)
SPACES = (MemorySpace(name="sram", capacity=16), MemorySpace(name="hbm", capacity=64))


def test_peak_live_and_its_time_step() -> None:
    assert peak_live(BUFS) == (60, 3)
    assert peak_live([]) == (0, None)


def test_usage_rows_per_space_all_and_unplaced() -> None:
    plan = Plan(buffers=BUFS, spaces=SPACES, space=(0, 0, 1, None), offset=(0, 8, 0, None), algorithm="hand")
    rows = usage(plan)
    assert [r.name for r in rows] == ["sram", "hbm", "all spaces", "unplaced"]
    sram, hbm, total, left = rows
    assert (sram.capacity, sram.buffers, sram.arena, sram.live_peak, sram.peak_time) == (16, 2, 12, 12, 2)
    assert (hbm.arena, hbm.live_peak, hbm.peak_time) == (16, 16, 3)
    assert (total.capacity, total.buffers, total.arena, total.live_peak, total.peak_time) == (80, 3, 28, 28, 3)
    assert (left.buffers, left.live_peak, left.capacity) == (1, 32, None)
    text = format_usage(plan)
    assert "arena/live" in text and "sram" in text and "unplaced" in text
    # a partial plan quotes no arena and no ratio: the placed buffers' top is no answer
    [row] = [line.split() for line in text.splitlines() if line.startswith("all spaces")]
    assert row == ["all", "spaces", "80", "3", "28", "3"]  # capacity, buffers, live peak, its step: no arena
    whole = Plan(buffers=BUFS, spaces=SPACES, space=(0, 0, 1, 1), offset=(0, 8, 0, 16), algorithm="hand")
    assert "1.000" in format_usage(whole) and "48" in format_usage(whole)
