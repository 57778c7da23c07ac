"""benchmarks/perfect_packing.py: the cut is a valid placement whose live bytes fill the capacity."""
from __future__ import annotations

import numpy as np
import pytest
from perfect_packing import perfect_packing

from lightning_memplan.placement import MemorySpace, Plan, validate


@pytest.mark.parametrize(("n", "alignment", "pinwheels"), [(20, 1, 0.0), (60, 512, 0.0), (100, 256, 0.5), (45, 1, 1.0)])
def test_cut_is_a_perfect_valid_packing(n: int, alignment: int, pinwheels: float) -> None:
    bufs, offsets = perfect_packing(n, n, steps=300, capacity=2**18, alignment=alignment, pinwheels=pinwheels)
    assert n <= len(bufs) <= n + 3
    witness = Plan(buffers=tuple(bufs), spaces=(MemorySpace(name="m", capacity=2**18),), space=(0,) * len(bufs),
                   offset=tuple(offsets), algorithm="cut")
    assert validate(witness) and witness.arena == (2**18,)
    live = np.zeros(300, dtype=np.int64)
    for b in bufs:
        live[b.lower : b.upper] += b.size
    assert (live == 2**18).all()  # every step full: the live peak is the optimum
    assert all(b.alignment == alignment and b.size % 512 == 0 for b in bufs)
    again, _ = perfect_packing(n, n, steps=300, capacity=2**18, alignment=alignment, pinwheels=pinwheels)
    assert again == bufs  # seeded


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"alignment=3.*divisor of granularity=512"):
        perfect_packing(0, 10, alignment=3)
    with pytest.raises(ValueError, match=r"capacity=1000.*multiple of granularity"):
        perfect_packing(0, 10, capacity=1000)
    with pytest.raises(ValueError, match=r"pinwheels=2.*probability"):
        perfect_packing(0, 10, pinwheels=2)
