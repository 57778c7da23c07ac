"""Brute-force oracle over all subsets, and instance generators whose sums are exact in float64.

Memory values are dyadic (k / 2**20), so every subset sum is exact and "within budget" has no
rounding ambiguity in the oracle.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from lightning_memplan.solvers._problem import effective_scale, quantize_budget, quantize_sizes

DYADIC = 2.0**20


@dataclass(frozen=True)
class Optima:
    real: float
    """Best value of a subset whose real memory is <= max_memory."""
    quantized: float
    """Best value of a subset whose quantized memory is <= the quantized budget."""


def subsets(n: int) -> np.ndarray:
    """(2**n, n) boolean matrix of all subsets."""
    codes = np.arange(2**n, dtype=np.int64)[:, None]
    return ((codes >> np.arange(n)) & 1).astype(bool)


def optima(memory: np.ndarray, runtimes: np.ndarray, max_memory: float, scale: int = 10_000) -> Optima:
    """Both optima by enumeration. Feasibility is decided in exact rational arithmetic, so sizes
    of any magnitude (1e-300 beside 1e30) are judged right; quantization is the solvers' own
    (at :func:`effective_scale`, items larger than the budget never quantized)."""
    b = subsets(len(memory))
    value = b @ runtimes
    exact = [Fraction(float(m)) for m in memory]
    denom = math.lcm(1, *(f.denominator for f in exact), Fraction(max_memory).denominator)
    ints = np.array([int(f * denom) for f in exact], dtype=object)
    real_ok = (b.astype(object) @ ints) <= int(Fraction(max_memory) * denom)
    step = effective_scale(max_memory, scale)
    within = memory <= max_memory
    q = np.zeros(len(memory), dtype=np.int64)
    q[within] = quantize_sizes(memory[within], step)
    cap = quantize_budget(max_memory, step)
    q_ok = ((b.astype(np.int64) @ q) <= cap) & ~(b & ~within).any(axis=1)
    return Optima(real=float(value[real_ok].max()), quantized=float(value[q_ok].max()))


def random_instance(rng: np.random.Generator, n: int, family: str) -> tuple[np.ndarray, np.ndarray, float]:
    """One seeded instance. Families: "loguniform" (distinct sizes), "grid" (ties, zeros,
    duplicates, zero runtimes), "wide" (runtimes spanning 1 to 1e12), "extreme" (issue #24: sizes
    clustered around 2**e for e anywhere in -1000..1000, a fifth of them anywhere in that range,
    so 1e-300 can sit beside 1e300; the budget is a random fraction of a random subset's sum)."""
    if family == "extreme":
        base = int(rng.integers(-1000, 990))
        exponents = base + rng.integers(-30, 10, n)
        outliers = rng.random(n) < 0.2
        exponents[outliers] = rng.integers(-1000, 1000, int(outliers.sum()))
        memory = np.ldexp(rng.integers(1, 2**20, n).astype(np.float64), exponents)
        memory[rng.random(n) < 0.1] = 0.0
        runtimes = np.exp(rng.uniform(0.0, 6.0 * np.log(10), n))
        budget = math.fsum(memory[rng.random(n) < 0.6]) * float(rng.uniform(0.3, 1.2))
        return memory, runtimes, float(budget)
    if family == "grid":
        memory = rng.integers(0, 6, n) / 8.0
        runtimes = rng.integers(0, 5, n).astype(np.float64)
        budget = rng.integers(0, 12) / 8.0
    else:
        memory = np.round(np.exp(rng.uniform(np.log(1e-4), 0.0, n)) * DYADIC) / DYADIC
        memory[rng.random(n) < 0.1] = 0.0
        hi = 12.0 if family == "wide" else 6.0
        runtimes = np.exp(rng.uniform(0.0, hi * np.log(10), n))
        budget = float(rng.uniform(0.0, 1.2) * memory.sum())
        budget = np.floor(budget * DYADIC) / DYADIC
    return memory, runtimes, float(budget)
