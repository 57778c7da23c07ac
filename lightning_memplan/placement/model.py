"""The data model of static placement: buffers, memory spaces and the plan that places them.

Units: sizes, capacities, offsets and alignments are in **bytes**; ``lower``/``upper`` are in
**time steps** (any integer clock: an op index, a microsecond). Lifetimes are half-open:
a buffer is live at time ``t`` iff ``lower <= t < upper``, so two buffers with
``a.upper == b.lower`` never overlap in time and may share addresses.

Everything here is frozen: algorithms read buffers and spaces and return a new :class:`Plan`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Buffer", "MemorySpace", "Plan", "as_buffers", "as_spaces", "check_fits", "columns"]


def _check_int(owner: str, name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"`{owner}({name}={value!r})` is not valid. Expected an integer >= {minimum}."
        )


@dataclass(frozen=True, kw_only=True)
class Buffer:
    """A block of memory that must hold still at one address while it is live.

    Invariant: ``lower < upper`` (a non-empty half-open lifetime ``[lower, upper)``),
    ``size >= 0``, ``alignment >= 1``; the placed offset is a multiple of ``alignment``.
    """

    id: int | str
    """A name unique within one problem (an ``int`` or a ``str``)."""
    lower: int
    """First time step at which the buffer is live (inclusive)."""
    upper: int
    """First time step at which the buffer is dead again (exclusive)."""
    size: int
    """Bytes the buffer occupies."""
    alignment: int = 1
    """The offset must be a multiple of this many bytes."""

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, (int, str)):
            raise ValueError(f"`Buffer(id={self.id!r})` is not valid. Expected an int or a str.")
        _check_int(f"Buffer(id={self.id!r}, ...)", "lower", self.lower, -(2**63))
        _check_int(f"Buffer(id={self.id!r}, ...)", "upper", self.upper, -(2**63))
        _check_int(f"Buffer(id={self.id!r}, ...)", "size", self.size, 0)
        _check_int(f"Buffer(id={self.id!r}, ...)", "alignment", self.alignment, 1)
        if self.upper <= self.lower:
            raise ValueError(
                f"`Buffer(id={self.id!r}, lower={self.lower!r}, upper={self.upper!r})` has an empty "
                "lifetime. Expected upper > lower (lifetimes are half-open [lower, upper))."
            )

    def overlaps_in_time(self, other: Buffer) -> bool:
        """Whether the two half-open lifetimes share at least one time step."""
        return self.lower < other.upper and other.lower < self.upper


@dataclass(frozen=True, kw_only=True)
class MemorySpace:
    """One addressable memory (SRAM, HBM, ...): offsets ``[0, capacity)`` bytes."""

    name: str
    """Shown in tables; unique within a hierarchy."""
    capacity: int
    """Bytes available; every placed buffer satisfies ``offset + size <= capacity``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`MemorySpace(name={self.name!r})` is not valid. Expected a non-empty str.")
        _check_int(f"MemorySpace(name={self.name!r}, ...)", "capacity", self.capacity, 0)


def as_spaces(spaces: int | MemorySpace | Sequence[MemorySpace]) -> tuple[MemorySpace, ...]:
    """Normalize the ``spaces`` argument of every algorithm to a hierarchy (priority order).

    A plain ``int`` is one space named ``"mem"`` of that many bytes.
    """
    if isinstance(spaces, MemorySpace):
        return (spaces,)
    if isinstance(spaces, int) and not isinstance(spaces, bool):
        return (MemorySpace(name="mem", capacity=spaces),)
    if isinstance(spaces, (str, bytes)) or not isinstance(spaces, Sequence):
        raise ValueError(
            f"`spaces={spaces!r}` is not valid. Expected a capacity in bytes (int), a MemorySpace, "
            "or a sequence of MemorySpace in priority order."
        )
    out = tuple(spaces)
    if not out or not all(isinstance(s, MemorySpace) for s in out):
        raise ValueError(
            f"`spaces={spaces!r}` is not valid. Expected a non-empty sequence of MemorySpace."
        )
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"`spaces` has duplicate names {dup!r}. Expected unique MemorySpace names.")
    return out


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Where every buffer lives: a space and an offset, both per buffer in input order.

    Invariant (checked by :func:`lightning_memplan.placement.validate`): buffers placed in the same
    space that overlap in time occupy disjoint byte ranges ``[offset, offset + size)``, each within
    its space's capacity and aligned. A buffer that could not be placed has ``space`` and ``offset``
    ``None`` and is listed in :attr:`unplaced`; such a plan is not :attr:`feasible`.
    """

    buffers: tuple[Buffer, ...]
    """The input buffers, in input order."""
    spaces: tuple[MemorySpace, ...]
    """The hierarchy, in priority order."""
    space: tuple[int | None, ...]
    """Per buffer: index into :attr:`spaces`, or ``None`` if unplaced."""
    offset: tuple[int | None, ...]
    """Per buffer: byte offset inside its space, or ``None`` if unplaced."""
    algorithm: str
    """The name of the algorithm that made the plan."""
    optimal: bool = False
    """True when every buffer is placed and each space's arena is proven minimal for the buffers
    assigned to it (for a single space: no valid plan needs fewer bytes)."""
    timed_out: bool = False
    """True when a search stopped at its time limit; the plan is then the best one found."""
    seconds: float = 0.0
    """Wall-clock seconds the algorithm took."""
    seconds_to_best: float = 0.0
    """Wall-clock seconds until this plan was found (a search may spend the rest proving it)."""
    arena: tuple[int, ...] = field(init=False)
    """Per space: bytes needed, ``max(offset + size)`` over its buffers (0 if unused)."""

    def __post_init__(self) -> None:
        n = len(self.buffers)
        if len(self.space) != n or len(self.offset) != n:
            raise ValueError(
                f"`Plan` needs one space and one offset per buffer: got {len(self.space)!r} spaces "
                f"and {len(self.offset)!r} offsets for {n!r} buffers."
            )
        arena = [0] * len(self.spaces)
        for i, s in enumerate(self.space):
            if s is not None and not (isinstance(s, int) and 0 <= s < len(self.spaces)):
                raise ValueError(
                    f"`Plan` puts buffer {self.buffers[i].id!r} in space {s!r}. Expected an index in "
                    f"range({len(self.spaces)}) or None."
                )
        for b, s, o in zip(self.buffers, self.space, self.offset):
            if s is not None and o is not None:
                arena[s] = max(arena[s], o + b.size)
        object.__setattr__(self, "arena", tuple(arena))

    @property
    def unplaced(self) -> tuple[int, ...]:
        """Indices of the buffers that could not be placed in any space."""
        return tuple(i for i, (s, o) in enumerate(zip(self.space, self.offset)) if s is None or o is None)

    @property
    def feasible(self) -> bool:
        """True when every buffer has a space and an offset."""
        return not self.unplaced

    @property
    def total_arena(self) -> int:
        """Bytes needed over all spaces together."""
        return sum(self.arena)


def as_buffers(buffers: Sequence[Buffer]) -> tuple[Buffer, ...]:
    """Check the ``buffers`` argument of every algorithm: a sequence of :class:`Buffer`, unique ids."""
    if isinstance(buffers, (str, bytes)) or not isinstance(buffers, Sequence):
        raise ValueError(f"`buffers={buffers!r}` is not valid. Expected a sequence of Buffer.")
    out = tuple(buffers)
    seen: dict[int | str, int] = {}
    for i, b in enumerate(out):
        if not isinstance(b, Buffer):
            raise ValueError(f"`buffers[{i}]={b!r}` is not valid. Expected a Buffer.")
        if b.id in seen:
            raise ValueError(
                f"`buffers[{i}]` has duplicate id {b.id!r} (also buffers[{seen[b.id]}]). "
                "Expected unique ids."
            )
        seen[b.id] = i
    return out


def check_fits(buffers: tuple[Buffer, ...], spaces: tuple[MemorySpace, ...]) -> None:
    """Raise ``ValueError`` for a buffer larger than every space of the hierarchy (bytes)."""
    largest = max(s.capacity for s in spaces)
    for i, b in enumerate(buffers):
        if b.size > largest:
            raise ValueError(
                f"`buffers[{i}]` (id={b.id!r}) has size={b.size!r} bytes, larger than every memory space "
                f"(the largest holds {largest} bytes). Expected size <= {largest}, or a larger capacity."
            )


def columns(buffers: Sequence[Buffer]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lower, upper, size, alignment)`` of ``buffers`` as int64 arrays, in their order (time
    steps, time steps, bytes, bytes)."""
    def col(name: str) -> np.ndarray:
        return np.fromiter((getattr(b, name) for b in buffers), dtype=np.int64, count=len(buffers))

    return col("lower"), col("upper"), col("size"), col("alignment")
