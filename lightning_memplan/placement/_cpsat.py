"""Decision by constraint programming: OR-Tools' CP-SAT on the same question as the exact search.

Can these buffers be packed below ``capacity`` bytes? Each buffer is a rectangle whose time range
is fixed and whose byte range ``[y, y + size)`` is a variable; CP-SAT's ``NoOverlap2D`` forbids two
rectangles to share a cell. Its propagation (energetic reasoning, conflict learning) and its
portfolio of differently configured workers complement the compiled depth-first search of
:mod:`lightning_memplan.placement._decide`: on the perfect packings of ``benchmarks/placement.py``
each answers some instances in seconds that the other does not answer in a minute, and on
MiniMalloc's inputs CP-SAT answers fewer (so :mod:`lightning_memplan.placement.search` runs it only
after the compiled search has had its turn).

Offsets are searched in units of ``g``, the greatest common divisor of every size and every
alignment above 1 byte. That loses no packing: pushed down (each buffer at 0 or on the aligned top
of a buffer below it), every packing has offsets that are sums of sizes rounded up to alignments,
all multiples of ``g``.

Units: bytes for sizes, offsets and capacity; time steps for lifetimes (half-open); seconds of
``time.perf_counter`` for deadlines. Internal module: the public entry point is
:func:`lightning_memplan.placement.search.exact_search`.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ortools.sat.python import cp_model

from lightning_memplan.placement._decide import Timeout
from lightning_memplan.placement.model import Buffer

__all__ = ["cp_sat_pack"]

WORKERS = 8
"""CP-SAT's parallel workers, each a differently configured subsolver. More than this machine's
cores on purpose: on the hard perfect packings a different subsolver answers each instance, and
with 1-2 workers perfect#22 is not answered in 30 s where 8 answer it in about 1 s."""


def cp_sat_pack(buffers: Sequence[Buffer], capacity: int, deadline: float, *, seed: int = 0) -> list[int] | None:
    """Offsets (bytes, per buffer in order) of a packing within ``capacity`` bytes, or ``None`` if none exists.

    Args:
        buffers: every size > 0 bytes; lifetimes half-open time steps.
        capacity: bytes no buffer's end may pass.
        deadline: ``time.perf_counter()`` seconds; at it the search stops.
        seed: CP-SAT's random seed (the search is parallel, so runs may still differ).

    Raises:
        Timeout: neither a packing nor a proof that none exists by ``deadline``. CP-SAT stops its
            workers at their next check of the clock, which on large models can come late
            (2,000 buffers: a 3 s limit took 5.2 s once; 500-8,000 buffers otherwise within 0.2 s).
    """
    if not buffers:
        return []
    if max(b.size for b in buffers) > capacity:
        return None
    unit = 0
    for b in buffers:
        unit = math.gcd(unit, b.size)
        if b.alignment > 1:
            unit = math.gcd(unit, b.alignment)
    top = capacity // unit
    model = cp_model.CpModel()
    rows, cols, ys = [], [], []  # ys: (slot variable, units per slot) per buffer
    for k, b in enumerate(buffers):
        units = b.size // unit
        step = max(1, b.alignment // unit)
        slot = model.new_int_var(0, (top - units) // step, f"slot{k}")  # offset: slot x step units
        ys.append((slot, step))
        rows.append(model.new_fixed_size_interval_var(slot * step if step > 1 else slot, units, f"bytes{k}"))
        cols.append(model.new_fixed_size_interval_var(b.lower, b.upper - b.lower, f"steps{k}"))
    model.add_no_overlap_2d(cols, rows)
    left = deadline - time.perf_counter()
    if left <= 0:
        raise Timeout
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = left
    solver.parameters.num_workers = WORKERS
    solver.parameters.random_seed = seed
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return None
    if status == cp_model.UNKNOWN:
        raise Timeout
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT rejected the placement model: {model.validate() or solver.status_name(status)}")
    return [int(solver.value(slot)) * step * unit for slot, step in ys]
