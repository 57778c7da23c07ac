"""Brute-force oracle over all subsets, and instance generators whose sums are exact in float64.

Memory values are dyadic (k / 2**20), so every subset sum is exact and "within budget" has no
rounding ambiguity in the oracle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_memplan.solvers._problem import quantize_budget, quantize_sizes

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
    b = subsets(len(memory))
    value = b @ runtimes
    real_ok = (b @ memory) <= max_memory
    q = quantize_sizes(memory, scale)
    cap = quantize_budget(max_memory, scale)
    q_ok = (b.astype(np.int64) @ q) <= cap
    return Optima(real=float(value[real_ok].max()), quantized=float(value[q_ok].max()))


def random_instance(rng: np.random.Generator, n: int, family: str) -> tuple[np.ndarray, np.ndarray, float]:
    """One seeded instance. Families: "loguniform" (distinct sizes), "grid" (ties, zeros,
    duplicates, zero runtimes), "wide" (runtimes spanning 1 to 1e12)."""
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
