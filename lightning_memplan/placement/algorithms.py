"""Every placement algorithm by name; they share one signature.

``algorithm(buffers, spaces, *, time_limit=None) -> Plan`` with buffers (half-open lifetimes in
time steps, sizes in bytes), spaces (a capacity in bytes, a MemorySpace or a hierarchy) and a time
limit in seconds that only the search uses.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from lightning_memplan.placement.greedy import greedy_by_position, greedy_by_size
from lightning_memplan.placement.model import Buffer, MemorySpace, Plan
from lightning_memplan.placement.search import exact_search

__all__ = ["ALGORITHMS", "Algorithm", "get_algorithm"]


class Algorithm(Protocol):
    """The common signature of placement algorithms."""

    def __call__(
        self,
        buffers: Sequence[Buffer],
        spaces: int | MemorySpace | Sequence[MemorySpace],
        *,
        time_limit: float | None = ...,
    ) -> Plan: ...


ALGORITHMS: dict[str, Callable[..., Plan]] = {
    "search": exact_search,
    "greedy_by_size": greedy_by_size,
    "greedy_by_position": greedy_by_position,
}
"""Name -> algorithm; ``"search"`` is the strongest (and the CLI default)."""


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (one of :data:`ALGORITHMS`)."""
    if name not in ALGORITHMS:
        raise ValueError(f"`algorithm={name!r}` is not valid. Expected one of {sorted(ALGORITHMS)!r}.")
    return ALGORITHMS[name]
