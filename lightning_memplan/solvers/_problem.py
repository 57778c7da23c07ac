"""Input validation, quantization and exact feasibility for 0/1 knapsack problems.

Every solver in this package takes torch's arguments ``(memory, runtimes, max_memory)``:

* ``memory[i]`` -- the memory an item costs when saved, in *normalized* units (torch divides
  activation bytes by the total; any non-negative unit works as long as ``max_memory`` uses it);
* ``runtimes[i]`` -- what saving the item is worth: the recompute cost avoided (FLOPs or seconds);
* ``max_memory`` -- the budget, in the units of ``memory``.

Quantization (``dp``, ``hirschberg``, ``pareto_frontier``): ``memory * scale`` is rounded **up**
and ``max_memory * scale`` rounded **down**, so a plan that fits the quantized budget fits the real
one. Products within ``1e-9`` (relative) of an integer snap to it, so ``1e-4 * 10000`` costs one
quantum, not two. Snapping can, in rare float-noise cases, admit a plan whose exact sum is a few
ulps over ``max_memory``; :func:`fits` detects that and the solvers then re-solve with *strict*
rounding (exact rational ceil/floor), which can never exceed the budget.

Extreme scales: sizes may be any finite number >= 0 (``1e-300`` to ``1e308``, mixed). Items larger
than ``max_memory`` are never quantized (they are never saved), so no size overflows an integer.
The budget spans at most :data:`MAX_QUANTA` quanta: when ``max_memory * scale`` is larger, the
solvers quantize at ``scale / 2**k`` steps per unit instead, with the least ``k`` that brings the
budget within ``MAX_QUANTA`` (see :func:`effective_scale`; a power of two keeps ``memory * scale``
as exact as before). They are then optimal for the problem quantized at that coarser step, which
still resolves the budget to better than one part in ``MAX_QUANTA / 2``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

DEFAULT_SCALE = 10_000
"""Quantization steps per unit of normalized memory (torch uses the same 10,000)."""

MAX_QUANTA = 2**20
"""Most quanta the budget of ``dp`` / ``hirschberg`` may span (one DP row of float64 is 8 MiB;
``dp``'s decision table is ``n x 128`` KiB). With torch's normalized units (budget <= 1) and the
default scale the budget spans 10,000 quanta, far below this."""

_SNAP = 1e-9


@dataclass(frozen=True, kw_only=True)
class Problem:
    """A validated knapsack instance (float64 arrays, never mutated)."""

    memory: np.ndarray
    """Memory of each item, normalized units, finite and >= 0."""
    runtimes: np.ndarray
    """Value of saving each item (runtime avoided), finite and >= 0."""
    max_memory: float
    """Budget in normalized units, finite and >= 0."""

    @property
    def n(self) -> int:
        return int(self.memory.shape[0])


def _as_vector(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`{name}` must be a sequence of finite non-negative numbers, got {values!r}."
        ) from exc
    if arr.ndim != 1:
        raise ValueError(
            f"`{name}` must be one-dimensional (one number per item), got shape {arr.shape}."
        )
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"`{name}[{i}]` must be a finite non-negative number, got {values[i]!r}."
        )
    return arr


def validate(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    max_memory: float,
) -> Problem:
    """Check the three solver arguments and return them as a :class:`Problem`.

    Raises:
        ValueError: naming the argument and showing the bad value, when an entry is NaN, infinite
            or negative, when the lengths differ, or when ``max_memory`` is not a finite number >= 0.
    """
    mem = _as_vector("memory", memory)
    rt = _as_vector("runtimes", runtimes)
    if mem.shape != rt.shape:
        raise ValueError(
            f"`memory` and `runtimes` must have one entry per item, got {mem.shape[0]} and "
            f"{rt.shape[0]} entries."
        )
    try:
        budget = float(max_memory)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`max_memory` must be a finite number >= 0, got {max_memory!r}."
        ) from exc
    if not math.isfinite(budget) or budget < 0:
        raise ValueError(f"`max_memory` must be a finite number >= 0, got {max_memory!r}.")
    mem.flags.writeable = False
    rt.flags.writeable = False
    return Problem(memory=mem, runtimes=rt, max_memory=budget)


def validate_scale(scale: int) -> int:
    """Return ``scale`` if it is a positive integer, else raise a ValueError naming it."""
    if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)) or scale <= 0:
        raise ValueError(f"`scale` must be a positive integer (steps per unit), got {scale!r}.")
    return int(scale)


def effective_scale(max_memory: float | Fraction, scale: int) -> Fraction:
    """Steps per unit the quantized solvers use for a budget of ``max_memory`` units.

    ``scale`` itself while ``floor(max_memory * scale) <= MAX_QUANTA``; otherwise
    ``scale / 2**k`` with the least ``k >= 1`` that brings ``floor(max_memory * s)`` within
    ``MAX_QUANTA`` (computed exactly, so any finite ``max_memory`` works).
    """
    quanta = math.floor(Fraction(max_memory) * scale)
    if quanta <= MAX_QUANTA:
        return Fraction(scale)
    # q < (q // M + 1) * M <= 2**k * M for k = (q // M).bit_length()
    return Fraction(scale, 2 ** (quanta // MAX_QUANTA).bit_length())


def quantize_sizes(
    memory: np.ndarray, scale: int | Fraction, *, strict: bool = False
) -> np.ndarray:
    """Item sizes in quanta (int64), rounded up; near-integers snap unless ``strict``.

    ``memory * scale`` must stay below ``2**62`` (callers quantize only items that fit the budget
    at an :func:`effective_scale`); a larger product raises ``OverflowError`` rather than wrap.
    Invariant: ``q[i] == 0`` exactly when ``memory[i] == 0``.
    """
    if strict:
        return np.array(
            [math.ceil(Fraction(float(m)) * scale) for m in memory], dtype=np.int64
        )
    x = memory * float(scale)
    if x.size and not float(x.max()) < 2.0**62:
        raise OverflowError(f"{float(x.max())!r} quanta do not fit in int64; quantize fewer items")
    r = np.rint(x)
    snap = np.abs(x - r) <= _SNAP * np.maximum(1.0, np.abs(x))
    q = np.where(snap, r, np.ceil(x)).astype(np.int64)
    # a positive size never becomes free (torch's dp_knapsack bug: round-to-0 items cost nothing)
    return np.where(memory > 0, np.maximum(q, 1), 0)


def quantize_budget(max_memory: float, scale: int | Fraction, *, strict: bool = False) -> int:
    """The budget in quanta, rounded down; a near-integer snaps unless ``strict``."""
    if strict:
        return math.floor(Fraction(max_memory) * scale)
    x = max_memory * float(scale)
    r = round(x)
    if abs(x - r) <= _SNAP * max(1.0, abs(x)):
        return int(r)
    return math.floor(x)


def fits(memory: np.ndarray, saved: Sequence[int] | np.ndarray, max_memory: float) -> bool:
    """True when the exact (rational) sum of ``memory[saved]`` is <= ``max_memory``.

    A float sum can round either way; this is the definition of "within budget in real units"
    that every solver guarantees.
    """
    idx = np.asarray(saved, dtype=np.int64)
    if idx.size == 0:
        return True
    try:
        total = math.fsum(memory[idx])
    except OverflowError:  # sizes are >= 0: a sum beyond the float range exceeds any budget
        return False
    # fsum is the exact sum correctly rounded, and rounding is monotone: only a tie with the
    # budget leaves the answer open, and then exact rational arithmetic settles it.
    if total != max_memory:
        return total < max_memory
    exact = sum((Fraction(float(m)) for m in memory[idx]), Fraction(0))
    return exact <= Fraction(max_memory)


def split_result(
    problem: Problem, saved_mask: np.ndarray
) -> tuple[float, list[int], list[int]]:
    """Torch's solver result ``(value, saved_idx, recomputed_idx)`` from a boolean mask.

    ``value`` is the correctly rounded sum of the saved runtimes; both index lists are ascending
    and together partition ``range(n)``.
    """
    saved = np.flatnonzero(saved_mask)
    recomputed = np.flatnonzero(~saved_mask)
    value = math.fsum(problem.runtimes[saved]) if saved.size else 0.0
    return value, saved.tolist(), recomputed.tolist()


def density_order(problem: Problem, candidates: np.ndarray) -> np.ndarray:
    """``candidates`` sorted by ``runtime / memory`` descending, ties by index ascending.

    Candidates must have positive memory.
    """
    density = problem.runtimes[candidates] / problem.memory[candidates]
    return candidates[np.argsort(-density, kind="stable")]


def fill_by_density(problem: Problem, saved: np.ndarray) -> None:
    """Save, in density order, every unsaved item with positive runtime that still fits, in place.

    This is the greedy solver when started from the zero-size items, and the completion step
    after a quantized optimum (rounding sizes up leaves up to one quantum per saved item unused).
    It only raises the value and never exceeds ``max_memory``: a float running slack decides the
    clear cases, and the few items within its rounding error of the boundary are settled in exact
    rational arithmetic.
    """
    mem, budget = problem.memory, problem.max_memory
    rest = np.flatnonzero(~saved & (problem.runtimes > 0) & (mem <= budget))
    if rest.size == 0:
        return
    slack = budget - math.fsum(mem[saved])
    # |float slack - exact slack| stays below one rounding per addition
    tol = 4.0 * np.finfo(np.float64).eps * budget * (problem.n + 2)
    smallest = float(mem[rest].min())
    for i in density_order(problem, rest).tolist():
        if slack + tol < smallest:
            break
        m = float(mem[i])
        if m <= slack - tol:
            saved[i] = True
            slack -= m
        elif m <= slack + tol:
            saved[i] = True
            if fits(mem, np.flatnonzero(saved), budget):
                slack = budget - math.fsum(mem[saved])
            else:
                saved[i] = False
