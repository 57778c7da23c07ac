"""Test helpers: seeded random instances and a brute-force optimum for tiny ones."""
from __future__ import annotations

import itertools

import numpy as np

from lightning_memplan.placement import Buffer, MemorySpace, Plan


def random_buffers(rng: np.random.Generator, n: int, *, horizon: int = 10, max_size: int = 8, align: bool = False) -> list[Buffer]:
    """``n`` buffers with random half-open lifetimes in ``[0, horizon]`` and sizes in ``[0, max_size]`` bytes."""
    lower = rng.integers(0, horizon, n)
    length = rng.integers(1, horizon // 2 + 2, n)
    size = rng.integers(0, max_size + 1, n)
    alignment = rng.choice([1, 2, 4], n) if align else np.ones(n, dtype=int)
    return [
        Buffer(id=i, lower=int(lower[i]), upper=int(lower[i] + length[i]), size=int(size[i]), alignment=int(alignment[i]))
        for i in range(n)
    ]


def brute_force_arena(buffers: list[Buffer]) -> int:
    """The smallest single-space arena (bytes), by trying every placement order (n <= 7).

    Each order puts every buffer at the lowest aligned offset above the buffers before it that are
    live at the same time; some order yields every canonical packing, hence the optimum.
    """
    best = None
    for perm in itertools.permutations(range(len(buffers))):
        top: dict[int, int] = {}
        offsets: dict[int, int] = {}
        for i in perm:
            b = buffers[i]
            o = max((top[j] for j in offsets if buffers[j].overlaps_in_time(b)), default=0)
            o = -(-o // b.alignment) * b.alignment
            offsets[i], top[i] = o, o + b.size
        arena = max(top.values(), default=0)
        best = arena if best is None else min(best, arena)
    return best or 0


def one_space_plan(buffers: list[Buffer], offsets: list[int], capacity: int) -> Plan:
    """``buffers`` at ``offsets`` (bytes, in order) in one space of ``capacity`` bytes, for the validator."""
    return Plan(buffers=tuple(buffers), spaces=(MemorySpace(name="m", capacity=capacity),), space=(0,) * len(buffers),
                offset=tuple(offsets), algorithm="test")
