"""Buffers from and plans to minimalloc's CSV format.

Input header: ``id,lower,upper,size`` (any column order; an optional ``alignment`` column in bytes
and an ``offset`` column, which is ignored, are also accepted). Lifetimes are half-open
``[lower, upper)`` time steps, sizes in bytes. Output: the same columns plus ``offset`` (bytes),
and ``space`` when the plan has more than one memory space. A partial plan (``write_csv(...,
partial=True)``) marks each unplaced buffer with an **empty** ``offset`` (and ``space``) cell; every
other row is placed and valid.
"""
from __future__ import annotations

import csv
from pathlib import Path

from lightning_memplan.placement.model import Buffer, Plan

__all__ = ["read_csv", "write_csv"]

_REQUIRED = ("id", "lower", "upper", "size")
_OPTIONAL = ("alignment", "offset", "space")


def _int(path: Path, line: int, name: str, text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{path}:{line}: `{name}={text!r}` is not valid. Expected an integer.") from None


def read_csv(path: str | Path) -> tuple[Buffer, ...]:
    """Read buffers from a minimalloc CSV; errors name the file and line. Ids that look like ints become ints."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise ValueError(f"`{path}` cannot be read ({err.strerror}). Expected a readable CSV file.") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: the file is empty. Expected the header `id,lower,upper,size`.")
        header = [h.strip() for h in header]
        missing = [c for c in _REQUIRED if c not in header]
        unknown = [c for c in header if c not in _REQUIRED + _OPTIONAL]
        if missing or unknown or len(set(header)) != len(header):
            raise ValueError(
                f"{path}:1: header {','.join(header)!r} is not valid. Expected the columns "
                f"`id,lower,upper,size` (optionally `alignment`), each once."
            )
        col = {name: header.index(name) for name in header}
        buffers: list[Buffer] = []
        seen: dict[int | str, int] = {}
        for line, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path}:{line}: row {','.join(row)!r} has {len(row)} fields. Expected {len(header)} "
                    f"({','.join(header)})."
                )
            raw_id = row[col["id"]].strip()
            if not raw_id:
                raise ValueError(f"{path}:{line}: `id={raw_id!r}` is not valid. Expected a non-empty id.")
            ident: int | str = int(raw_id) if raw_id.lstrip("-").isdigit() else raw_id
            if ident in seen:
                raise ValueError(
                    f"{path}:{line}: duplicate `id={ident!r}` (first on line {seen[ident]}). Expected unique ids."
                )
            seen[ident] = line
            values = {c: _int(path, line, c, row[col[c]].strip()) for c in ("lower", "upper", "size")}
            alignment = _int(path, line, "alignment", row[col["alignment"]].strip()) if "alignment" in col else 1
            try:
                buffers.append(Buffer(id=ident, alignment=alignment, **values))
            except ValueError as err:
                raise ValueError(f"{path}:{line}: {err}") from None
    return tuple(buffers)


def write_csv(path: str | Path, plan: Plan, *, partial: bool = False) -> None:
    """Write ``plan`` as CSV: ``id,lower,upper,size,offset`` (+ ``alignment``, ``space`` when needed).

    With ``partial=True`` a plan that leaves buffers unplaced is written too, with an empty
    ``offset`` (and ``space``) cell for each unplaced buffer; otherwise such a plan is an error.
    """
    if not plan.feasible and not partial:
        raise ValueError(
            f"`plan` leaves {len(plan.unplaced)} buffer(s) unplaced. Expected a feasible plan to write "
            "(or partial=True to write the unplaced ones with an empty offset)."
        )
    aligned = any(b.alignment != 1 for b in plan.buffers)
    several = len(plan.spaces) > 1
    header = ["id", "lower", "upper", "size"] + (["alignment"] if aligned else []) + ["offset"]
    header += ["space"] if several else []
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for b, s, o in zip(plan.buffers, plan.space, plan.offset):
            placed = s is not None and o is not None
            row: list[object] = [b.id, b.lower, b.upper, b.size] + ([b.alignment] if aligned else [])
            row.append(o if placed else "")
            if several:
                row.append(plan.spaces[s].name if placed and s is not None else "")
            writer.writerow(row)
