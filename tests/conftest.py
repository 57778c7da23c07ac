"""Shared pytest settings: keep the suite deterministic and light on this 2-core machine."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
