"""Shared pytest settings: keep the suite deterministic and light on this 2-core machine, and put
every test in one lane (see README, "Tests"):

- ``unit``: pure libraries and Trainer-free parts; no ``torch.compile``, no ``Trainer.fit``
  (the fast lane: ``pytest -m unit``);
- ``compile``: compiles real graphs (forecasts, the backend), no Trainer;
- ``fit``: runs real Lightning Trainers (callback, tuner, examples, demo);
- ``slow``: several processes (DDP, FSDP, tensor parallelism over gloo; the example scripts, run
  as processes of their own, several at once), or minutes each.

A module's lane comes from ``LANES`` below (by its path under ``tests/``) unless it marks itself.
The suite runs lane by lane in that order (a stable sort: files keep their order within a lane); a
line names each lane as it starts, and the summary gives each lane's seconds.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")

#: Path prefix under tests/ -> lane (the longest matching prefix wins).
LANES = {
    "test_layering.py": "unit", "units/": "unit", "core/": "unit", "plan/": "unit", "solvers/": "unit", "placement/": "unit",
    "simulate/": "unit", "report/": "unit", "checkpointing/": "unit", "docs/": "unit",
    "forecast/": "compile", "arena/": "compile", "forecast/test_cuda_allocator.py": "unit",
    "forecast/test_allocations.py": "unit", "forecast/test_torch_surface.py": "unit",
    "callback/": "fit", "examples/": "fit", "callback/test_ddp.py": "slow", "zoo/": "slow",
    "examples/test_examples.py": "slow",
    "forecast/test_fsdp_memory.py": "compile", "docs/test_docs_code.py": "fit",
}
LANE_NAMES = ("unit", "compile", "fit", "slow")
LANE_WHAT = {"unit": "pure libraries and Trainer-free parts, no compile", "compile": "forecasts on real graphs",
             "fit": "real Lightning Trainers", "slow": "several processes, third-party models"}


def pytest_configure(config: pytest.Config) -> None:
    for name in LANE_NAMES:
        config.addinivalue_line("markers", f"{name}: the {name} lane (see tests/conftest.py)")


def _lane(item: pytest.Item) -> str:
    return next(name for name in LANE_NAMES if item.get_closest_marker(name))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.join(str(config.rootpath), "tests") + os.sep
    for item in items:
        if any(item.get_closest_marker(name) for name in LANE_NAMES):
            continue
        rel = str(item.path)[len(root):].replace(os.sep, "/") if str(item.path).startswith(root) else ""
        matches = [prefix for prefix in LANES if rel.startswith(prefix)]
        lane = LANES[max(matches, key=len)] if matches else "fit"
        item.add_marker(getattr(pytest.mark, lane))
    items.sort(key=lambda it: LANE_NAMES.index(_lane(it)))
    _LANE_OF.update({it.nodeid: _lane(it) for it in items})
    _CONFIG.append(config)


_LANE_OF: dict[str, str] = {}  # test node id -> lane
_CONFIG: list[pytest.Config] = []
_LANE_TIMES: dict[str, list[float]] = {}  # lane -> [start, end] (perf_counter seconds)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    lane, now = _LANE_OF.get(nodeid), time.perf_counter()
    if lane is None:
        return
    if lane not in _LANE_TIMES:
        reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
        if reporter is not None:
            reporter.write(f"\n== lane {lane!r}: {LANE_WHAT[lane]}\n")
        _LANE_TIMES[lane] = [now, now]


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    lane = _LANE_OF.get(nodeid)
    if lane in _LANE_TIMES:
        _LANE_TIMES[lane][1] = time.perf_counter()


def pytest_terminal_summary(terminalreporter: object) -> None:
    if _LANE_TIMES:
        lanes = ", ".join(f"{lane} {end - start:.0f} s" for lane, (start, end) in _LANE_TIMES.items())
        terminalreporter.write_line(f"lanes: {lanes}")  # type: ignore[attr-defined]


@pytest.fixture
def emulated_as_wrapped() -> Callable[..., None]:
    """``check(model, inputs, sets, budgets, regional)``: asserts that :func:`forecast_grid`, from
    its one trace, forecasts every checkpoint set of ``sets`` (blocks of ``regional``, compiled on
    their own) at every budget as a trace with those blocks really wrapped does: the same peak and
    FLOPs, and as many calls of each graph."""

    def check(model: Any, inputs: tuple[Any, ...], sets: Sequence[tuple[str, ...]], budgets: tuple[float, ...],
              regional: Sequence[str]) -> dict[Any, Any]:
        from lightning_memplan.forecasting.grid import forecast_grid, forecast_sweep
        from lightning_memplan.planner.checkpointing import checkpointed
        from lightning_memplan.planner.search import forecast_flops

        grid = forecast_grid(model, inputs, budgets=budgets, checkpoint_sets=[(), *sets], regional=regional,
                             run=((), budgets[-1]))
        for ck in sets:
            with checkpointed(model, ck):
                wrapped = forecast_sweep(model, inputs, budgets=budgets, regional=regional)
            for b in budgets:
                emulated = grid[(ck, b)]
                assert emulated.status == "ok", emulated.problems
                assert (emulated.peak_bytes, forecast_flops(emulated)) == (wrapped[b].peak_bytes,
                                                                           forecast_flops(wrapped[b])), (ck, b)
                assert sorted(r.calls for r in emulated.regions) == sorted(r.calls for r in wrapped[b].regions)
        return grid

    return check
