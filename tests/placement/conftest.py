"""Make the helpers of this folder and the benchmarks' instance generators (``perfect_packing``)
importable (pytest runs with --import-mode=importlib)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
