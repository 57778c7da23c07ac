"""The brute-force oracle: is a :class:`~lightning_memplan.placement.model.Plan` valid?

It checks every pair of buffers (O(n^2)), trusting nothing the algorithms computed: each buffer is
placed in an existing space, ``0 <= offset``, ``offset + size <= capacity`` (bytes), ``offset`` is a
multiple of the buffer's alignment, and no two buffers in the same space that are live at the same
time step (half-open lifetimes) share a byte (a zero-size buffer holds no byte). Space indices are
checked when the :class:`Plan` is built.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from lightning_memplan.placement.model import Plan

__all__ = ["Failure", "Validation", "validate"]


class Failure(str, enum.Enum):
    """The first thing wrong with a plan, or ``OK``."""

    OK = "ok"
    SHAPE = "shape"
    NEGATIVE_OFFSET = "negative_offset"
    OVER_CAPACITY = "over_capacity"
    MISALIGNED = "misaligned"
    OVERLAP = "overlap"
    UNPLACED = "unplaced"


@dataclass(frozen=True, kw_only=True)
class Validation:
    """The verdict of :func:`validate`; truthy iff the plan is valid."""

    failure: Failure
    """``Failure.OK`` or the first failure found (checked in the order the enum lists them)."""
    buffers: tuple[int, ...] = ()
    """Indices of the buffers involved (one, or two for ``OVERLAP``)."""
    message: str = ""
    """A sentence naming the buffers and the numbers."""

    def __bool__(self) -> bool:
        return self.failure is Failure.OK


def validate(plan: Plan) -> Validation:
    """Check ``plan`` by brute force and return the first failure found (``Failure.OK`` if none).

    The placed buffers are checked first; ``UNPLACED`` is reported only when all of them are valid,
    so a partial plan with that verdict is safe to use for the buffers it places.
    """
    n = len(plan.buffers)
    if len(plan.space) != n or len(plan.offset) != n:
        return Validation(failure=Failure.SHAPE, message="one space and one offset per buffer expected")
    placed = [i for i in range(n) if plan.space[i] is not None and plan.offset[i] is not None]
    for i in placed:
        b, s, o = plan.buffers[i], plan.space[i], plan.offset[i]
        assert s is not None and o is not None  # placed
        if o < 0:
            return Validation(
                failure=Failure.NEGATIVE_OFFSET, buffers=(i,), message=f"buffer {b.id!r} has offset {o!r}"
            )
        cap = plan.spaces[s].capacity
        if o + b.size > cap:
            return Validation(
                failure=Failure.OVER_CAPACITY,
                buffers=(i,),
                message=f"buffer {b.id!r} ends at byte {o + b.size} > capacity {cap} of {plan.spaces[s].name!r}",
            )
        if o % b.alignment:
            return Validation(
                failure=Failure.MISALIGNED,
                buffers=(i,),
                message=f"buffer {b.id!r} at offset {o} is not a multiple of its alignment {b.alignment}",
            )
    for x, i in enumerate(placed):
        a, sa, oa = plan.buffers[i], plan.space[i], plan.offset[i]
        assert oa is not None
        for j in placed[x + 1 :]:
            b, sb, ob = plan.buffers[j], plan.space[j], plan.offset[j]
            assert ob is not None
            if sa != sb or not a.size or not b.size or not (a.lower < b.upper and b.lower < a.upper):
                continue
            if oa < ob + b.size and ob < oa + a.size:
                return Validation(
                    failure=Failure.OVERLAP,
                    buffers=(i, j),
                    message=(
                        f"buffers {a.id!r} [{oa}, {oa + a.size}) and {b.id!r} [{ob}, {ob + b.size}) overlap "
                        f"in space {plan.spaces[sa].name!r} while both live in "
                        f"[{max(a.lower, b.lower)}, {min(a.upper, b.upper)})"
                    ),
                )
    if len(placed) < n:
        i = next(k for k in range(n) if k not in set(placed))
        return Validation(failure=Failure.UNPLACED, buffers=(i,), message=f"buffer {plan.buffers[i].id!r} is not placed")
    return Validation(failure=Failure.OK)
