"""``memplan place FILE.csv --capacity BYTES [--algorithm NAME] [--out OUT.csv] [--time-limit S]``.

Reads minimalloc's CSV (``id,lower,upper,size``; half-open lifetimes), places the buffers in one
memory space of ``--capacity`` bytes, prints the usage table and optionally writes the plan with an
``offset`` column. Exit codes: 0 placed, 1 the buffers do not fit, 2 bad input.

A ``--capacity`` below the peak of live bytes fails at once, before any search. When buffers are
left unplaced no arena is printed (a partial plan has none worth quoting): the summary says how many
were placed, and ``--out`` gets the best partial placement, each unplaced buffer's ``offset`` cell
left empty. The first search on a machine compiles the numba kernels; that is announced on stderr
when their on-disk cache looks cold.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from lightning_memplan.placement._decide import is_warm, kernels_cached
from lightning_memplan.placement.algorithms import ALGORITHMS, get_algorithm
from lightning_memplan.placement.bounds import peak_live
from lightning_memplan.placement.io import read_csv, write_csv
from lightning_memplan.placement.model import MemorySpace, check_fits
from lightning_memplan.placement.search import DEFAULT_TIME_LIMIT
from lightning_memplan.placement.table import format_usage

__all__ = ["parse_bytes", "register", "run"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``"1048576"``, ``"1MiB"``, ``"1.5GB"`` -> bytes (int). Raises ``ValueError`` otherwise."""
    match = _BYTES.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"`--capacity {text!r}` is not valid. Expected a byte count such as 1048576, 1MiB, 512KiB or 2GB."
        )
    number, scale = match.group(1), _UNITS[unit]
    whole, _, frac = number.partition(".")
    value = int(whole) * scale + (int(frac) * scale) // 10 ** len(frac) if frac else int(whole) * scale
    if frac and (int(frac) * scale) % 10 ** len(frac):
        raise ValueError(f"`--capacity {text!r}` is not a whole number of bytes. Expected e.g. 1048576 or 1MiB.")
    return value


def _capacity(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _time_limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"`--time-limit {text!r}` is not valid. Expected a positive number of seconds.")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``place`` subcommand to the ``memplan`` dispatcher."""
    parser = subparsers.add_parser(
        "place",
        help="place buffers with lifetimes in one memory space (minimalloc CSV)",
        description=(
            "Assign an offset to every buffer of FILE.csv (columns id,lower,upper,size; lifetimes are "
            "half-open [lower, upper)) so that buffers live at the same time never share a byte."
        ),
    )
    parser.add_argument("file", metavar="FILE.csv", type=Path, help="buffers in minimalloc's CSV format")
    parser.add_argument("--capacity", required=True, type=_capacity, metavar="BYTES", help="e.g. 1048576 or 1MiB")
    parser.add_argument(
        "--algorithm", default="search", choices=sorted(ALGORITHMS), help="default: search (the strongest)"
    )
    parser.add_argument("--out", type=Path, metavar="OUT.csv", help="write the buffers with an offset column")
    parser.add_argument(
        "--time-limit",
        type=_time_limit,
        default=DEFAULT_TIME_LIMIT,
        metavar="S",
        help=f"seconds for the search (default {DEFAULT_TIME_LIMIT:g}); the best plan so far is kept",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``memplan place``; returns the exit code (0 placed, 1 does not fit, 2 bad input)."""
    try:
        buffers = read_csv(args.file)
        check_fits(buffers, (MemorySpace(name="mem", capacity=args.capacity),))
    except ValueError as err:
        print(f"memplan place: error: {err}", file=sys.stderr)
        return 2
    live, at = peak_live(buffers)
    if live > args.capacity:  # no algorithm can help: say so before any search
        print(
            f"memplan place: error: `--capacity {args.capacity}` bytes is below the peak of live bytes, {live} "
            f"(at time step {at}), so no placement fits. Expected --capacity >= {live}.",
            file=sys.stderr,
        )
        return 1
    if args.algorithm == "search" and not is_warm() and not kernels_cached():
        print("compiling the placement kernels once (about a minute the first time)...", file=sys.stderr, flush=True)
    try:
        plan = get_algorithm(args.algorithm)(
            buffers, MemorySpace(name="mem", capacity=args.capacity), time_limit=args.time_limit
        )
    except ValueError as err:
        print(f"memplan place: error: {err}", file=sys.stderr)
        return 2
    print(format_usage(plan))
    if not plan.feasible:
        placed = len(buffers) - len(plan.unplaced)
        why = (
            "no packing exists" if args.algorithm == "search" and not plan.timed_out
            else "none was found" + (" within the time limit" if plan.timed_out else f" by {args.algorithm}")
        )
        print(f"{args.algorithm}: {placed} of {len(buffers)} buffers placed, {len(plan.unplaced)} not, {plan.seconds:.2f} s")
        print(
            f"memplan place: error: {len(plan.unplaced)} of {len(buffers)} buffers do not fit in "
            f"--capacity {args.capacity} bytes ({why}; peak live bytes {live}). Raise --capacity"
            + (" or --time-limit." if args.algorithm == "search" else " or try --algorithm search."),
            file=sys.stderr,
        )
        if args.out is not None:
            write_csv(args.out, plan, partial=True)
            print(f"wrote {args.out} (partial: the {len(plan.unplaced)} unplaced buffers have an empty offset)")
        return 1
    status = "optimal" if plan.optimal else ("time limit reached, best plan so far" if plan.timed_out else "not proven optimal")
    print(f"{args.algorithm}: {len(buffers)} buffers, arena {plan.arena[0]} bytes ({status}), {plan.seconds:.2f} s")
    if args.out is not None:
        write_csv(args.out, plan)
        print(f"wrote {args.out}")
    return 0
