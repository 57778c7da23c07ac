"""Static placement of buffers with lifetimes into one or several memory spaces.

Give buffers (half-open lifetimes ``[lower, upper)`` in time steps, sizes in bytes) and a capacity or
a hierarchy of :class:`MemorySpace`; get a new :class:`Plan` (space and byte offset per buffer, arena
per space) from :func:`exact_search` (the strongest), :func:`greedy_by_size` or
:func:`greedy_by_position`, and check any plan with :func:`validate`.
"""
from __future__ import annotations

from lightning_memplan.placement.adapters import buffers_from_lifetimes
from lightning_memplan.placement.algorithms import ALGORITHMS, get_algorithm
from lightning_memplan.placement.bounds import peak_live
from lightning_memplan.placement.greedy import greedy_by_position, greedy_by_size
from lightning_memplan.placement.io import read_csv, write_csv
from lightning_memplan.placement.model import Buffer, MemorySpace, Plan
from lightning_memplan.placement.search import exact_search
from lightning_memplan.placement.table import format_usage, usage
from lightning_memplan.placement.validate import Failure, Validation, validate

__all__ = [
    "ALGORITHMS",
    "Buffer",
    "Failure",
    "MemorySpace",
    "Plan",
    "Validation",
    "buffers_from_lifetimes",
    "exact_search",
    "format_usage",
    "get_algorithm",
    "greedy_by_position",
    "greedy_by_size",
    "peak_live",
    "read_csv",
    "usage",
    "validate",
    "write_csv",
]
