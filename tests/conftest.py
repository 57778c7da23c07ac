"""Shared pytest settings: keep the suite deterministic and light on this 2-core machine, and put
every test in one lane (see README, "Tests"):

- ``unit``: pure libraries and Trainer-free parts; no ``torch.compile``, no ``Trainer.fit``
  (the fast lane: ``pytest -m unit``);
- ``compile``: compiles real graphs (forecasts, the backend), no Trainer;
- ``fit``: runs real Lightning Trainers (callback, tuner, examples, demo);
- ``slow``: several processes (DDP, FSDP, tensor parallelism over gloo), or minutes each.

A module's lane comes from ``LANES`` below (by its path under ``tests/``) unless it marks itself.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")

#: Path prefix under tests/ -> lane (the longest matching prefix wins).
LANES = {
    "test_layering.py": "unit", "units/": "unit", "core/": "unit", "plan/": "unit", "solvers/": "unit", "placement/": "unit",
    "simulate/": "unit", "report/": "unit", "checkpointing/": "unit", "docs/": "unit",
    "forecast/": "compile", "arena/": "compile", "forecast/test_cuda_allocator.py": "unit",
    "forecast/test_allocations.py": "unit", "forecast/test_torch_surface.py": "unit",
    "callback/": "fit", "examples/": "fit", "callback/test_ddp.py": "slow",
    "forecast/test_fsdp_memory.py": "compile",
}
LANE_NAMES = ("unit", "compile", "fit", "slow")


def pytest_configure(config: pytest.Config) -> None:
    for name in LANE_NAMES:
        config.addinivalue_line("markers", f"{name}: the {name} lane (see tests/conftest.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.join(str(config.rootpath), "tests") + os.sep
    for item in items:
        if any(item.get_closest_marker(name) for name in LANE_NAMES):
            continue
        rel = str(item.path)[len(root):].replace(os.sep, "/") if str(item.path).startswith(root) else ""
        matches = [prefix for prefix in LANES if rel.startswith(prefix)]
        lane = LANES[max(matches, key=len)] if matches else "fit"
        item.add_marker(getattr(pytest.mark, lane))
