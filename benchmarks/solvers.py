#!/usr/bin/env python3
"""Knapsack solvers vs torch's, side by side. Same as ``memplan bench``; options: ``--help``."""
from __future__ import annotations

import sys

from lightning_memplan.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
