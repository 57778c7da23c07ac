"""From a memory timeline to buffers: what connects placement to the rest of the project.

A memory estimator reports, per tensor, when it is allocated, when it is freed and how many bytes it
holds. :func:`buffers_from_lifetimes` turns those plain triples into :class:`Buffer` objects, so a
report can put "live bytes" (:func:`~lightning_memplan.placement.bounds.peak_live`) next to "arena
needed" (the arena of a plan from any placement algorithm).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from lightning_memplan.placement.model import Buffer

__all__ = ["buffers_from_lifetimes"]


def buffers_from_lifetimes(
    lifetimes: Iterable[tuple[int, int, int]],
    *,
    end: Literal["exclusive", "inclusive"] = "exclusive",
    alignment: int = 1,
    ids: Sequence[int | str] | None = None,
) -> tuple[Buffer, ...]:
    """Buffers from ``(start step, end step, bytes)`` triples.

    Args:
        lifetimes: one triple per tensor: first time step live, end step, size in bytes.
        end: ``"exclusive"`` (default): live during ``[start, end)``; ``"inclusive"``: the end step
            is the last one live, so the buffer is ``[start, end + 1)``.
        alignment: bytes every offset must be a multiple of.
        ids: one id per triple (default: ``0, 1, ...``).

    Returns:
        New buffers, in the order of ``lifetimes``. Zero-byte tensors are kept (they cost nothing).
    """
    if end not in ("exclusive", "inclusive"):
        raise ValueError(f"`end={end!r}` is not valid. Expected 'exclusive' or 'inclusive'.")
    triples = list(lifetimes)
    if ids is not None and len(ids) != len(triples):
        raise ValueError(
            f"`ids` has {len(ids)!r} entries for {len(triples)!r} lifetimes. Expected one id per lifetime."
        )
    out: list[Buffer] = []
    for i, triple in enumerate(triples):
        if not isinstance(triple, (tuple, list)) or len(triple) != 3:
            raise ValueError(
                f"`lifetimes[{i}]={triple!r}` is not valid. Expected a (start step, end step, bytes) triple."
            )
        start, stop, size = triple
        upper = stop + 1 if end == "inclusive" and isinstance(stop, int) else stop
        try:
            out.append(
                Buffer(id=ids[i] if ids is not None else i, lower=start, upper=upper, size=size, alignment=alignment)
            )
        except ValueError as err:
            raise ValueError(f"`lifetimes[{i}]={triple!r}` (end={end!r}): {err}") from None
    return tuple(out)
