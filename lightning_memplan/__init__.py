"""lightning_memplan: train under a memory limit without guessing.

Pure libraries (no Trainer): :mod:`lightning_memplan.solvers` (exact 0/1 knapsack solvers and the
one-pass Pareto frontier) and :mod:`lightning_memplan.placement` (static tensor placement).
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
